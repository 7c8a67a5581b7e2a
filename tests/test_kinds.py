"""The artifact kinds' registry and interface, in this process (no compile; the whole
way through with a real compile: tests/e2e/test_kinds.py). A kind registered here is
a value of ``strategies`` like gatekeeper's own: it names targets, keys them apart,
says which (task, precision) it applies to, and refuses an add-on package it does
not carry."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import registered

from gatekeeper import kinds
from gatekeeper.errors import ConfigError
from gatekeeper.key import compile_spec
from gatekeeper.project import definition, expand, load_config


class Toy(kinds.Kind):
    name = "toy"
    worker = "toy_kind:BUILDER"  # imported only by a worker: never here

    def check_model(self, model):
        return "'strategies': \"toy\" needs fullgraph = true" if not model.fullgraph else None


@pytest.fixture
def toy() -> Iterator[kinds.Kind]:
    with registered(Toy()) as kind:
        yield kind


def config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "gatekeeper.toml"
    path.write_text(
        textwrap.dedent("""
            [[models]]
            name = "m"
            factory = "m:make"
            inputs = [{ shape = [2, 4] }]
            tasks = ["infer", "train"]
            precisions = ["fp32", "bf16"]
        """)
        + extra
    )
    return path


def test_gatekeepers_own_kinds_in_their_order():
    assert kinds.names()[:3] == ["whole", "regional", "aot"]
    assert kinds.package_names()[:2] == ["precompile", "aot"]
    assert kinds.get("aot").package is kinds.package("aot")
    assert kinds.of_id("m/b1/default+bf16") is kinds.get("whole")
    assert kinds.of_id("m/b1/default+regional") is kinds.get("regional")


def test_a_registered_kind_names_and_keys_its_targets(toy, tmp_path):
    cfg = load_config(config(tmp_path, 'strategies = ["whole", "toy"]\nfullgraph = true\n'))
    targets = {t.id: t for t in expand(cfg)}
    # inference only by default: a training step is compiled whole
    assert sorted(targets) == [
        "m/fixed/default",
        "m/fixed/default+bf16",
        "m/fixed/default+bf16+toy",
        "m/fixed/default+toy",
        "m/fixed/default+train",
        "m/fixed/default+train+bf16",
    ]
    t = targets["m/fixed/default+toy"]
    assert kinds.of(t) is toy and compile_spec(t)["strategy"] == "toy"
    assert "strategy" not in compile_spec(targets["m/fixed/default"])  # keys stay as they were
    assert not {"regions", "export"} & set(definition(t))
    assert kinds.of_id(t.id) is toy and kinds.target_id(toy, "m/fixed/default") == t.id
    precompile = kinds.package("precompile")
    assert [p.name for p in kinds.packages_of(t, cfg)] == ["precompile"]
    assert precompile.refusal(t) == "a toy target carries no precompile package"
    assert precompile.refusal(targets["m/fixed/default"]) is None


def test_a_kinds_own_checks_are_config_errors_naming_the_field(toy, tmp_path):
    with pytest.raises(ConfigError, match="models\\[0\\]: 'strategies': \"toy\" needs fullgraph"):
        load_config(config(tmp_path, 'strategies = ["toy"]\n'))
    with pytest.raises(ConfigError, match="'regions' is set but 'strategies' has no \"regional\""):
        load_config(config(tmp_path, 'strategies = ["toy"]\nfullgraph = true\nregions = ["a"]\n'))


def test_an_unknown_kind_lists_those_there_are(toy, tmp_path):
    with pytest.raises(ConfigError, match="strategies\\[1\\]: expected 'whole', .* or 'toy'"):
        load_config(config(tmp_path, 'strategies = ["whole", "nograd"]\n'))
