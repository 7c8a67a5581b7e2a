"""requirements/pinned.txt, what the action and the light workflows install with
``--require-hashes``, stays in step with pyproject.toml's dependencies."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.helpers import hash_pins

ROOT = Path(__file__).resolve().parents[1]
PINNED = ROOT / "requirements" / "pinned.txt"
SOURCE = ROOT / "requirements" / "pinned.in"


def _requirements(path: Path) -> list[Requirement]:
    lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    return [Requirement(ln) for ln in lines if ln and not ln.startswith("-")]


def test_pinned_in_is_pyprojects_dependencies_without_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        canonicalize_name(r.name): r.specifier for r in map(Requirement, project["dependencies"])
    }
    assert "torch" in declared  # torch stays a dependency of the package
    listed = {canonicalize_name(r.name): r.specifier for r in _requirements(SOURCE)}
    assert listed == {k: v for k, v in declared.items() if k != "torch"} | {
        "setuptools": listed["setuptools"]
    }


def test_every_requirement_is_pinned_with_hashes_and_torch_never() -> None:
    pins = hash_pins(PINNED)
    assert "torch" not in pins  # the runner's torch is never replaced
    for req in _requirements(SOURCE):
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in {PINNED.name}: run pip-compile"
        version, hashes = pins[name]
        assert req.specifier.contains(version, prereleases=True), (req, version)
    assert all(hashes for _, hashes in pins.values())
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for req in map(Requirement, build):  # gatekeeper builds from the pinned backend
        assert req.specifier.contains(pins[canonicalize_name(req.name)][0])
