"""``python -m bench``: the same command as ``rollout bench``."""

from __future__ import annotations

import typer

from rollout.commands.bench import HELP, bench

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command(help=HELP)(bench)

if __name__ == "__main__":
    app()
