"""Helpers shared by CLI commands: settings from the environment, one-line errors."""

from __future__ import annotations

from typing import NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from rollout.errors import ConfigurationError
from rollout.settings import Settings

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a one-line error (no traceback) and exit."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def load_settings() -> Settings:
    """Build the settings once, turning a bad environment value into a clear error."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigurationError(f"setting {where}: {first['msg']}") from exc
