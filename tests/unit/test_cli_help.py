"""Every command's --help: present, and its paragraphs free of hard line breaks (the terminal wraps them).

Typer keeps a single line break inside a help paragraph as it is, so a docstring wrapped at the source's width
shows as lines broken halfway across the terminal; the commands therefore give their help as paragraphs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rollout.cli import _register, app


def _commands() -> Iterator[tuple[list[str], Any]]:
    _register()
    root = typer.main.get_command(app)

    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    yield from walk(root, [])


COMMANDS = list(_commands())


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "rollout" for p, _ in COMMANDS])
def test_help_paragraphs_have_no_hard_line_breaks(path: list[str], command: Any) -> None:
    text = inspect.cleandoc(command.help or "")
    assert text, f"rollout {' '.join(path)} has no help"
    broken = [paragraph for paragraph in text.split("\n\n") if "\n" in paragraph]
    assert broken == []


def test_every_command_answers_help() -> None:
    runner = CliRunner()
    for path, _ in COMMANDS:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output
