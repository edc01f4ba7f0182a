"""The environment-failure taxonomy, kept as data (``failure_classes.yaml``) so it can grow."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

import yaml


@cache
def failure_classes() -> dict[str, dict[str, Any]]:
    """Known failure classes -> {description, origin}; events may carry others (counted as given)."""
    text = files("schemas").joinpath("failure_classes.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return {str(k): dict(v) for k, v in data["classes"].items()}
