"""constraints.txt pins every package a fresh checkout installs, at versions pyproject.toml allows.

``make setup`` installs with ``-c constraints.txt``; a dependency added to pyproject.toml (or pulled in
by a new version of one) without ``make lock`` would be installed at whatever PyPI has that day.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    """constraints.txt as {canonical name: version}; every line a comment or ``name==version``."""
    pinned: dict[str, str] = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name and version and " " not in line, f"constraints.txt:{number}: not name==version: {line!r}"
        assert canonicalize_name(name) not in pinned, f"constraints.txt:{number}: {name} pinned twice"
        pinned[canonicalize_name(name)] = version
    return pinned


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether a requirement is needed here, for a distribution installed with ``extras``."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**default_environment(), "extra": extra}) for extra in extras or {""})


def test_constraints_are_plain_pins_and_include_pip() -> None:
    pinned = pins()
    assert "pip" in pinned, "constraints.txt should pin pip, which make setup upgrades"


def test_the_project_requirements_allow_their_pins() -> None:
    pinned = pins()
    for requirement in project_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not in constraints.txt: run make lock"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pinned[name]}, outside pyproject.toml's {requirement}")


def test_everything_the_requirements_pull_in_is_pinned() -> None:
    """The installed closure of the project's requirements (extras included) is pinned, to what is installed."""
    pinned = pins()
    missing: list[str] = []
    mismatched: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(r, set(r.extras)) for r in project_requirements()]
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        if name not in pinned:
            missing.append(requirement.name)
        installed = metadata.version(requirement.name)
        if name in pinned and installed != pinned[name]:
            mismatched.append(f"{requirement.name} {installed} installed, {pinned[name]} pinned")
        for text in metadata.requires(requirement.name) or []:
            child = Requirement(text)
            if applies(child, extras):
                todo.append((child, set(child.extras)))
    assert not missing, f"not pinned in constraints.txt (run make lock): {sorted(set(missing))}"
    assert not mismatched, f"installed versions differ from constraints.txt (run make setup): {mismatched}"
