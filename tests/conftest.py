"""Shared fixtures. Service fixtures live in their own modules, loaded as plugins.

The order in which files are handed to the xdist workers: longest first. ``--dist
loadfile`` hands out whole files in collection order, here sorted by
:func:`pytest_collection_modifyitems` (:func:`pytest_configure` turns off xdist's own
order, by number of tests per file alone, which put the few-test files that compile most,
the zoo, the call forms, the shard merge, last: one worker then finished a long file
while the other had nothing left). The files under ``SLOWEST`` go first, longest first
(``pytest -n 2 --dist loadfile --durations=40`` on them names their setups), then the
rest of ``tests/e2e/`` and ``tests/action/`` (real compiles, the Action's steps), then
the others, short ones, which even out the two workers' ends; within each of the last
two groups, files with more tests first, as xdist orders them.

The fast tier: every test under ``HEAVY`` and in ``E2E_FILES`` (real compiles in
subprocesses, the Action's steps, a browser) is marked ``e2e``, so that
``pytest -m "not e2e" -n auto`` runs the rest for everyday work (CONTRIBUTING.md)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

pytest_plugins = ["support.s3_server", "support.github_server", "support.cpu_budget"]

TESTS = Path(__file__).parent
SLOWEST = (  # CI's --durations (2 workers, PR 42's run) and single-file runs, longest first
    "e2e/test_quantize.py",  # ~16 min alone under load: it must not start last
    "e2e/test_distributed.py",
    "e2e/test_base_as_it_was.py",
    "e2e/test_zoo.py",
    "e2e/test_aot_causal_lm.py",  # ~5 min alone
    # the example's 38 targets, a quarter each (~4 min idle; 16 min as one file)
    "e2e/test_example_config_1.py",
    "e2e/test_example_config_2.py",
    "e2e/test_example_config_3.py",
    "e2e/test_example_config_4.py",
    "e2e/test_generate.py",  # ~6 min alone under load (5 paired or cold LM compiles)
    "e2e/test_bisect.py",
    "e2e/test_call_forms.py",
    "e2e/test_paired.py",
    "e2e/test_quickstart.py",
    "action/test_gate_flow.py",
    "e2e/test_train.py",
    "e2e/test_strategies.py",
    "e2e/test_shard_merge.py",
    "e2e/test_gate.py",
    "e2e/test_seeded_compile.py",
    "action/test_base_commit.py",
    "e2e/test_kinds.py",
)
HEAVY = ("e2e/", "action/")
# outside HEAVY, the files that compile for real in subprocesses or drive a browser
E2E_FILES = (
    "test_distributed.py",
    "test_untrusted_input.py",
    "test_secrecy.py",
    "test_workflow_installs.py",
    "test_warm_packages.py",
    "test_docs.py",
    "dashboard/test_browser.py",
)


def relative(path: Path) -> str:
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else str(path)


def rank(path: Path) -> int:
    """Where a test file goes in the order: 0 for the slowest, then the heavy, then the rest."""
    name = relative(path)
    if name in SLOWEST:
        return SLOWEST.index(name)
    return len(SLOWEST) + (0 if name.startswith(HEAVY) else 1)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist's --no-loadscope-reorder
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a stable sort by file: each file's tests stay together and in their own order
    tests = Counter(item.path for item in items)
    items.sort(key=lambda item: (rank(item.path), -tests[item.path]))
    for item in items:
        name = relative(item.path)
        if name.startswith(HEAVY) or name in E2E_FILES:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session", autouse=True)
def shared_headers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every worker of the session shares inductor's precompiled C++ headers
    (``GATEKEEPER_PCH_DIR``, docs/configuration.md): built once per session by the
    header worker, read-only to the others. The folder is the session's (not the user's
    cache, which a session must not depend on), above each xdist worker's own temp dir,
    so both workers share it."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if base.name.startswith("popen-gw") else base) / "pch"
    folder.mkdir(exist_ok=True)
    os.environ["GATEKEEPER_PCH_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def fork_server(tmp_path_factory: pytest.TempPathFactory, shared_headers: Path):
    """The session's worker servers (``GATEKEEPER_FORK_SERVER``,
    gatekeeper/boundary/forks.py): each gatekeeper process of the session whose workers'
    environment is one of theirs forks them from it, so a worker does not import torch
    again (about 5 CPU-seconds each, a few hundred workers). Two environments: the
    session's, and the session's with one OpenMP thread (``QUIET``, which most
    end-to-end runs set: without its server each of them started one of its own). A
    process whose workers' environment differs (a test's own variables) starts its own
    server, as a run does."""
    import secrets
    import subprocess
    import sys

    from support.projects import QUIET

    from gatekeeper.boundary import forks, spawn

    if not forks.enabled():
        yield None
        return
    base = tmp_path_factory.getbasetemp()
    env = {k: v for k, v in spawn.cache_env(base).items() if k not in forks.PER_CHILD}
    env |= {"TMPDIR": str(base), "TORCHINDUCTOR_CACHE_DIR": str(base / "server-cache")}
    started = []
    for name, its in (("fork", env), ("fork-quiet", env | QUIET)):
        sock, token = base / f"{name}.sock", secrets.token_hex(16)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gatekeeper.worker.server", "--listen", str(sock)],
            env=its,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append((proc, sock, token))
    for proc, _, token in started:  # both import torch at once
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(token + "\n")
        proc.stdin.close()
    for proc, _, _ in started:
        ready = proc.stdout.readline()  # type: ignore[union-attr]
        if not ready.startswith("ready"):
            for p, _, _ in started:
                p.kill()
            pytest.fail(f"the session's worker server did not start: {ready!r}")
    os.environ["GATEKEEPER_FORK_SERVER"] = ",".join(f"{s}#{t}" for _, s, t in started)
    from support import cpu_budget

    cpu_budget.watched.extend(p.pid for p, _, _ in started)  # forked workers' CPU, per file
    yield started[0][1]
    os.environ.pop("GATEKEEPER_FORK_SERVER", None)
    for proc, _, _ in started:
        proc.kill()
        proc.wait()
