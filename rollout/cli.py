"""The ``rollout`` command: infrastructure, simulator, worker, SQL, demo."""

from __future__ import annotations

import sys

import typer

from rollout.cli_support import fail
from rollout.errors import RolloutError

app = typer.Typer(
    name="rollout",
    help="Telemetry for RL post-training: events to Kafka, live metrics in ClickHouse, Grafana on top.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from rollout.commands import register_all

    register_all(app)


def main() -> None:
    """Entry point of the console script: every RolloutError becomes a one-line message."""
    _register()
    try:
        app(standalone_mode=True)
    except RolloutError as exc:
        try:
            fail(str(exc))
        except typer.Exit as stop:
            sys.exit(stop.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
