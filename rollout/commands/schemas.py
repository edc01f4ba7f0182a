"""``rollout schemas``: export the event catalog as JSON Schema and check the committed copy."""

from __future__ import annotations

from pathlib import Path

import typer

from rollout.cli_support import console, fail
from schemas.export import DEFAULT_DIR, check_json_schemas, export_json_schemas

OUT_OPTION = typer.Option(DEFAULT_DIR, "--out", "-o", help="Folder of the JSON Schema files.")


def register(app: typer.Typer) -> None:
    """Add the ``schemas`` sub-commands."""
    sub = typer.Typer(
        name="schemas",
        help="JSON Schema of the event catalog, for producers in other languages.",
        no_args_is_help=True,
    )
    sub.command("export")(export)
    sub.command("check")(check)
    app.add_typer(sub, name="schemas")


def export(out: Path = OUT_OPTION) -> None:
    """Write one JSON Schema file per event type and an index.json (topics, key fields)."""
    paths = export_json_schemas(out)
    console.print(f"wrote {len(paths)} files to {out}", highlight=False)


def check(out: Path = OUT_OPTION) -> None:
    """Exit 1, naming the files, when the JSON Schema files are not a current export."""
    stale = check_json_schemas(out)
    if stale:
        fail(f"JSON schemas in {out} are not current: {', '.join(stale)}; run `rollout schemas export`")
    console.print(f"JSON schemas in {out} are current", highlight=False)
