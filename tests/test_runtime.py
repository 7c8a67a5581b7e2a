"""gatekeeper.runtime, the parent's one door to torch: importing the parent side never
imports torch, and load_aot says clearly why it has no package to load (the loading
itself: tests/e2e/test_strategies.py, on a real package in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gatekeeper.config import Config
from gatekeeper.errors import UsageError
from gatekeeper.runtime import INFO, AotUnavailable, load_aot, package_dir

PARENT = (
    "gatekeeper, gatekeeper.cli, gatekeeper.runtime, gatekeeper.key, gatekeeper.warm, "
    "gatekeeper.check.run, gatekeeper.compile, gatekeeper.pipeline, gatekeeper.results, "
    "gatekeeper.gate, gatekeeper.report, gatekeeper.store, gatekeeper.github, "
    "gatekeeper.dashboard, gatekeeper.commands.comment, gatekeeper.boundary.client, "
    "gatekeeper.boundary.protocol, gatekeeper.check.verify, gatekeeper.shards, "
    "gatekeeper.check.paired, gatekeeper.kinds, gatekeeper.kinds.aot, "
    "gatekeeper.kinds.precompile"
)
# what the probe prints: whether torch was imported
PROBE = "; print('torch' in sys.modules)"


def _torch_imported(code: str, cwd: str | None = None) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys, {PARENT}; {code}{PROBE}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=cwd,
    ).stdout
    return out.strip().splitlines()[-1] == "True"


@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_the_parent_side_never_imports_torch(tmp_path):
    assert not _torch_imported("pass")
    # commands that need no worker run without torch too
    (tmp_path / "gatekeeper.toml").write_text(
        'store = "store"\n[[models]]\nname = "m"\nfactory = "m:f"\ninputs = [{ shape = [2] }]\n'
    )
    for argv in (["store", "ls"], ["store", "verify"]):
        assert not _torch_imported(
            f"from gatekeeper.cli import main; main({argv!r})", str(tmp_path)
        )
    # the probe sees torch when something does import it (the positive control)
    assert _torch_imported("import gatekeeper.runtime as r; r.default_cache_dir()")


def test_only_runtime_imports_torch_in_the_parent():
    """The parent's torch uses live in gatekeeper/runtime.py, each inside a function: no
    other module outside gatekeeper/worker/ names torch in an import, but for the ranks'
    launcher (gatekeeper/boundary/elastic.py), run as a process of its own, and a
    kind's worker half (gatekeeper/kinds/<name>/worker*.py), imported only in a worker."""
    import ast
    import re
    from pathlib import Path

    import gatekeeper

    root = Path(gatekeeper.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("worker/") or rel in ("runtime.py", "boundary/elastic.py"):
            continue
        if re.fullmatch(r"kinds/[^/]+/worker(_\w+)?\.py", rel):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            found += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] == "torch"]
    assert found == []


@pytest.fixture
def config() -> Config:
    model = {
        "name": "mlp",
        "factory": "m:make",
        "inputs": [{"shape": ["batch", 4]}],
        "shapes": [{"batch": 1}],
        "strategies": ["whole", "aot"],
    }
    return Config.model_validate({"models": [model]})


def test_load_aot_without_an_installed_package_is_a_clear_error(config, tmp_path):
    with pytest.raises(AotUnavailable, match="no AOTInductor package installed.*gatekeeper warm"):
        load_aot(config, "mlp/b1/default", cache_dir=tmp_path)  # "+aot" may be left out
    with pytest.raises(UsageError, match=r"not an aot target .*aot targets: mlp/b1/default\+aot"):
        load_aot(config, "mlp/b9/default+aot", cache_dir=tmp_path)


def test_load_aot_refuses_a_package_that_is_not_verified(config, tmp_path):
    where = package_dir(tmp_path, "mlp/b1/default+aot")
    where.mkdir(parents=True)
    (where / "model.pt2").write_bytes(b"not loaded")
    (where / INFO).write_text(json.dumps({"target": "mlp/b1/default+aot", "verified": False}))
    with pytest.raises(AotUnavailable, match="not verified"):
        load_aot(config, "mlp/b1/default+aot", cache_dir=tmp_path)
    (where / INFO).write_text(json.dumps({"target": "other/b1/default+aot", "verified": True}))
    with pytest.raises(AotUnavailable, match="not this target's"):
        load_aot(config, "mlp/b1/default+aot", cache_dir=tmp_path)


@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_the_default_cache_dir_is_inductors(tmp_path):
    code = textwrap.dedent("""
        import sys
        from gatekeeper.runtime import inductor_cache_dir
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        assert str(inductor_cache_dir()) == cache_dir(), (inductor_cache_dir(), cache_dir())
    """)
    env_free = subprocess.run(
        [sys.executable, "-c", code],
        env={k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"},
        capture_output=True,
        text=True,
    )
    assert env_free.returncode == 0, env_free.stderr
