"""benchmarks/gpu_smoke.py's plumbing on a CPU (the GPU figures are what a GPU run
writes): it refuses a missing GPU in one line, reports how a child process died, and
regenerates docs/gpu.md's generated part (and nothing else) from its JSON; the CUDA knob
of benchmarks/detection_power.py leaves the model's outputs and FLOPs as they were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.helpers import load_file

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "benchmarks" / "gpu_smoke.py"


def smoke(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SMOKE), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


# what a GPU run leaves in OUT/smoke.json, in small
DOC = {
    "machine": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "commit": "abc1234"},
    "run": {"device": "cuda", "tiny": False, "min_time": 0.5},
    "study": {
        "model": "decoder, 8 layers of width 256, b1-s64",
        "steps": {"torch.export, aoti_compile_and_package": "SIGSEGV in first call (40 s)"},
        "seconds": 60.0,
    },
    "paths": {
        "compile": {
            "dec/b1-s64/default": {"status": "published", "compile_seconds": 12.5},
            "dec/b1-s64/default+aot": {
                "status": "unavailable",
                "error": "unavailable: torch's AOTInductor killed the worker (SIGSEGV) in load "
                "package with torch 2.11.0+cu130 on cuda; the target's other strategies are "
                "unaffected",
            },
        },
        "check": {"dec/b1-s64/default": {"p50": 0.0005, "eager_p50": 0.001, "parity": {}}},
        "warm": {"dec/b1-s64/default": {"first_call_seconds": 2.5, "dynamo": "traced"}},
        "load_aot": {},
        "pr": {"dec/b1-s64/default": "pass"},
        "seconds": 120.0,
    },
    "detection": {
        "trials": [
            {"slowdown": 0, "verdict": "pass", "delta": 0.004, "ci": [0.99, 1.02]},
            {"slowdown": 10, "verdict": "regressed", "delta": 0.11, "ci": [1.09, 1.13]},
        ],
        "error": None,
        "seconds": 100.0,
    },
    "parity": {
        "pr": {"resnet/b4/default": {"verdict": "pass", "reasons": [], "parity": {}}},
        "errors": {"compiled, cuDNN TF32 on": 1.5e-4, "eager, cuDNN TF32 off": 1.3e-7},
        "seconds": 90.0,
    },
}


def test_the_docs_part_between_the_markers_is_regenerated_from_the_json(tmp_path):
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "smoke.json").write_text(json.dumps(DOC))
    page = tmp_path / "gpu.md"
    original = (ROOT / "docs" / "gpu.md").read_text()
    page.write_text(original)
    proc = smoke("--out", str(tmp_path / "smoke"), "--report-only", "--docs", str(page), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    head, _, rest = text.partition("<!-- gpu_smoke: begin -->")
    generated, _, tail = rest.partition("<!-- gpu_smoke: end -->")
    assert head == original.partition("<!-- gpu_smoke: begin -->")[0]
    assert tail == original.partition("<!-- gpu_smoke: end -->")[2]
    assert "NVIDIA H100 80GB HBM3 with torch 2.11.0+cu130 at commit `abc1234`" in generated
    for shown in (
        "SIGSEGV in first call",  # the study's death
        "| dec/b1-s64/default+aot | unavailable: torch's AOTInductor killed the worker",
        "| 0.500 ms | 2.00x |",  # p50 and speedup
        "| 10% | 1 | 1 | 0 | 0 | +11.0% | ±2.0% |",  # the detection table
        "calls `regressed` here: about 6.5%",  # 5% + the unchanged run's half-width
        "| compiled, cuDNN TF32 on | 1.50e-04",  # the errors behind the TF32 rule
    ):
        assert shown in generated, (shown, generated)
    assert (tmp_path / "smoke" / "smoke.md").read_text().strip() in generated
    # again: the same page (the markers stay, nothing piles up)
    smoke("--out", str(tmp_path / "smoke"), "--report-only", "--docs", str(page), cwd=ROOT)
    assert page.read_text() == text


def test_bad_requests_are_one_line(tmp_path):
    no_markers = tmp_path / "page.md"
    no_markers.write_text("# a page\n")
    proc = smoke("--out", str(tmp_path), "--report-only", "--docs", str(no_markers), cwd=ROOT)
    assert proc.returncode != 0 and "has no <!-- gpu_smoke: begin -->" in proc.stderr
    proc = smoke("--out", str(tmp_path), "--only", "paths,benchmarks", cwd=ROOT)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "gpu_smoke: unknown section(s) benchmarks; known: "
        "('study', 'paths', 'detection', 'parity', 'zoo')"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there")
@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_no_gpu_is_one_line_and_exit_2(tmp_path):
    proc = smoke("--out", str(tmp_path), "--device", "cuda", cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu_smoke: --device cuda, but torch sees no CUDA device"


def test_a_child_that_dies_is_its_signal_and_step():
    gpu_smoke = load_file("gpu_smoke", SMOKE)
    code = "print('STEP load', flush=True); import ctypes; ctypes.string_at(0)"
    crashed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert gpu_smoke.died(crashed) == "SIGSEGV in load"
    code = "print('STEP call', flush=True); raise SystemExit('the loader refused it')"
    exited = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert gpu_smoke.died(exited) == "exit 1 in call: the loader refused it"
    fine = subprocess.run([sys.executable, "-c", "print('STEP x')"], capture_output=True, text=True)
    assert gpu_smoke.died(fine) == "ok (x)"


def test_the_cuda_knob_costs_work_but_leaves_outputs_and_flops_unchanged(tmp_path):
    from torch.utils.flop_counter import FlopCounterMode

    bench = load_file("detection_power", ROOT / "benchmarks" / "detection_power.py")
    bench.DEVICE.update(device="cuda", work=4096)  # the model text only: run on the CPU here
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(0))
    outs, flops = [], []
    for sines in (0, 64):
        space: dict = {}
        exec(bench.model_text(10, "compute", sines), space)  # our own template
        torch.manual_seed(0)
        model = space["make"]()
        assert model.work.numel() == 4096  # the chain runs over the buffer, not x
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            outs.append(model(x))
        flops.append(counter.get_total_flops())
    assert torch.equal(outs[0], outs[1]) and flops[0] == flops[1]
