"""What the benchmark scripts' command lines share: checked counts and progress on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of at least ``minimum`` (otherwise a one-line usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:,}, got {value:,}")
        return value

    return parse


def log(text: str) -> None:
    """A progress line on stderr (stdout carries the report)."""
    print(text, file=sys.stderr, flush=True)
