"""Inductor's precompiled C++ headers are built once per machine by a worker that runs no
model code (gatekeeper/boundary/headers.py, gatekeeper/worker/headers.py) and lent to
every other worker: a model's worker builds none, and a warm start's first call builds
none. Issue 54: after c15577a gave each worker a temp dir of its own, every worker built
the header again (about 10 CPU-seconds), the warm start's first call among them (1.40 s
-> 6.66 s on the quick start).

Who built what is read from a recording compiler (``CXX``, a ``g++`` that logs its
``TMPDIR`` and arguments, then runs the real one) used by every step alike, so the keys
agree between them. One tiny model: a compile and a ``warm --probe``."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from support.helpers import TINY_CONFIG, gk, gk_json, write_project
from support.outbox import Outbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="CPU kernels built by g++")

# the same tiny model as an AOTInductor package: its build includes two more headers
AOT_MODEL = """
    [[tool.gatekeeper.models]]
    name = "packaged"
    factory = "tinymodel:make"
    inputs = [{ shape = [4, 16] }]
    strategies = ["aot"]
""".replace("\n    ", "\n")
RECORDER = '#!/bin/sh\necho "${{TMPDIR:-?}} $*" >> {log}\nexec {gxx} "$@"\n'
HEADER = "-x c++-header"


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What the compiler was asked during a compile, then during ``warm --probe``."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++")
    tmp = tmp_path_factory.mktemp("headers")
    service_tmp = tmp / "service-tmp"  # the temp dir of the deploy (and its service)
    service_tmp.mkdir()
    # a FIFO this test reads: a box leaves its worker nothing else to write that outlives it
    log, recorder = Outbox(), tmp / "bin" / "g++"
    recorder.parent.mkdir()
    recorder.write_text(RECORDER.format(log=log.path, gxx=gxx))
    recorder.chmod(0o755)
    root = write_project(tmp / "p", config=TINY_CONFIG + AOT_MODEL)
    env = {"CXX": str(recorder), "GATEKEEPER_PCH_DIR": str(tmp / "shared")}
    gk("compile", cwd=root, env=env, check=True)
    compiled = log.take()
    env["TMPDIR"] = str(service_tmp)
    deploy = ("--cache-dir", str(tmp / "deploy"), "--target", "tiny/*")
    warm = gk_json("warm", "--probe", *deploy, cwd=root, env=env)
    return {
        "compile": compiled,
        "warm": log.close(),
        "doc": warm,
        "shared": tmp / "shared",
        "service_tmp": service_tmp,
        "root": root,
        "recorder": recorder,
    }


def kernels_stamp(shared: Path) -> Path:
    """The JIT kernels' stamp, ``.built-<key>``: not the package's ``.built-aoti-<key>``.
    The key is hex: a glob of ``.built-[!a]*`` missed a key that starts with ``a`` (one
    run in 16; three of this file's tests failed so, twice)."""
    (stamp,) = [p for p in shared.glob(".built-*") if not p.name.startswith(".built-aoti-")]
    return stamp


def test_only_the_header_worker_builds_a_header(steps: dict) -> None:
    """The compile's kernels were built by its workers (``gk-worker-`` temp dir) against
    the headers the header worker (``gk-headers-``) built in the shared folder; fails when
    a model's worker builds one of its own (as every worker did since c15577a, and the
    AOTInductor package's worker did its wrapper's and kernels' until the header worker
    built those too: about 20 of an ``aot`` target's 40 CPU-seconds)."""
    built = [line for line in steps["compile"] if HEADER in line]
    assert built and all("/gk-headers-" in line.split()[0] for line in built), built
    kernels = [line for line in steps["compile"] if "/gk-worker-" in line.split()[0]]
    assert any(".cpp" in line for line in kernels), steps["compile"]
    assert list(steps["shared"].glob("*.h.gch")), sorted(steps["shared"].iterdir())


def test_the_aot_packages_headers_are_built_once_and_named_apart(steps: dict) -> None:
    """The ``aot`` target's package was built with headers (its compile included one),
    those the header worker built for its ``aoti`` part, which the stamps name apart
    from the JIT kernels' header: a service is lent only the latter."""
    shared = steps["shared"]
    kernels = kernels_stamp(shared)
    (aoti,) = shared.glob(".built-aoti-*")
    own = json.loads(kernels.read_text())["headers"]
    package = json.loads(aoti.read_text())["headers"]
    assert own and package and not set(own) & set(package), (own, package)
    assert all((shared / name).is_file() for name in own + package)
    worker = [line for line in steps["compile"] if "/gk-worker-" in line.split()[0]]
    included = {name for name in package if name.endswith(".h")}
    assert any(f"{name} " in f"{line} " for line in worker for name in included), worker
    lent = steps["service_tmp"].glob("torchinductor_*/precompiled_headers/*")
    assert sorted(p.name for p in lent) == sorted(own)


def test_a_warm_starts_first_call_builds_no_header(steps: dict) -> None:
    """The probe's first call on the warmed cache dir loads cached kernels: it asks the
    compiler for no header (and the model is a hit, its graphs loaded, not compiled).
    The recorder heard the probe (it asks the compiler its version), so silence is not
    a log it could not write."""
    (target,) = steps["doc"]["targets"]
    assert target["status"] == "hit", target
    assert any("/gk-worker-" in line.split()[0] for line in steps["warm"]), steps["warm"]
    assert not [line for line in steps["warm"] if HEADER in line], steps["warm"]


def test_the_service_finds_the_headers_in_its_temp_dir(steps: dict) -> None:
    """``warm`` copies the shared headers where a service's inductor looks for them (its
    temp dir), so a service started after it builds none either: same names, same
    bytes, real files (a link would dangle once the shared folder is cleared)."""
    import getpass

    dest = steps["service_tmp"] / f"torchinductor_{getpass.getuser()}" / "precompiled_headers"
    stamp = kernels_stamp(steps["shared"])
    names = json.loads(stamp.read_text())["headers"]
    headers = [steps["shared"] / n for n in names if n.endswith(".gch")]
    assert headers
    for header in headers:
        copy = dest / header.name
        assert copy.is_file() and not copy.is_symlink(), copy
        assert copy.stat().st_size == header.stat().st_size


def _sources(lines: list[str], temp: str) -> set[str]:
    """The C++ sources the compiler was asked to build by processes of that temp dir."""
    return {
        m for line in lines if temp in line.split()[0] for m in re.findall(r"[\w.]+\.cpp\b", line)
    }


def test_no_models_worker_builds_the_isa_check(steps: dict) -> None:
    """Inductor checks that the compiler builds the CPU's vector instructions by building
    small programs into its cache dir (about 4 CPU-seconds, most of a small model's cold
    compile after the header), once per new cache dir: every compile worker. The header
    worker keeps those it built (``isa-<key>``) and the parent lends each worker a copy,
    so the model's worker asks the compiler for none of them: fails where it builds its
    own, as it did for AVX-512's bf16 and VNNI checks and AMX's (each its own program)
    until every program was kept, not the vector ISA's own only."""
    kept = sorted(p.name for p in steps["shared"].glob("isa-*/*/*.cpp"))
    assert kept, sorted(steps["shared"].iterdir())
    worker = _sources(steps["compile"], "/gk-worker-")
    assert worker and not worker & set(kept), (worker, kept)
    # a header worker built them: the same programs, under the same names; and nothing
    # it built (ISA checks, its own small kernel) is built again by a model's worker
    header_worker = _sources(steps["compile"], "/gk-headers-")
    assert set(kept) <= header_worker, (kept, header_worker)
    assert not header_worker & worker, header_worker & worker


def test_a_folder_stamped_before_the_isa_check_was_kept_is_built_again(steps: dict) -> None:
    """A machine's folder stamped by a gatekeeper that kept no ISA check (no
    ``isa-<key>``), and whose stamp named no headers, is built again once, so its workers
    stop building their own and are lent this key's headers only."""
    shared = steps["shared"]
    for isa in shared.glob("isa-*"):
        shutil.rmtree(isa)
    stamp = kernels_stamp(shared)
    stamp.write_text(sys.version)  # and its stamp as older ones were: no headers named
    root = steps["root"]
    # the same compiler as the compile's (it names the key); its log is gone by now
    env = {"CXX": str(steps["recorder"]), "GATEKEEPER_PCH_DIR": str(shared)}
    gk("key", cwd=root, env=env, check=True)
    assert list(shared.glob("isa-*/*/*.so")), sorted(shared.iterdir())
    named = json.loads(stamp.read_text())["headers"]
    assert named and all((shared / name).is_file() for name in named), named
