"""Sub-commands of the ``rollout`` CLI, one module each with a ``register(app)`` function."""

from __future__ import annotations

from importlib import import_module

import typer

MODULES = ("infra", "simulate", "schemas", "worker", "status", "replay", "sql", "audit", "grafana", "bench", "demo")


def register_all(app: typer.Typer) -> None:
    """Add every command module's commands to the root app."""
    for name in MODULES:
        module = import_module(f"rollout.commands.{name}")
        module.register(app)
