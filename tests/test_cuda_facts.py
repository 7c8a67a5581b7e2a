"""CUDA logic driven from recorded facts of real GPUs (tests/data/cuda_facts.json: the
H100 and H200 this project is lent, where each figure came from), so that it runs, and
fails when it breaks, on a machine without a GPU: the env key names the GPU, its compute
capability and the CUDA runtime; the device facts carry them; the memory peak comes from
the CUDA allocator, a CUDA graph's pool included; the drift reference's spread marks a
CPU run disturbed, never a GPU run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.factories import make_result

from gatekeeper.gate.drift import disturbance
from gatekeeper.key import compile_env, env_facts, env_key
from gatekeeper.runtime import gpu_facts
from gatekeeper.worker.memory import allocated, peak_memory

RECORDED = json.loads((Path(__file__).parent / "data" / "cuda_facts.json").read_text())
GPUS = RECORDED["gpus"]
MIB = 1 << 20

# the env keys of the recorded machines: a bundle compiled there is found under these
KEYS = {
    "h100": "torch2.11.0+cu130-py3.12-cuda13.0-sm90-h100-80gb-hbm3-56ab76",
    "h200": "torch2.11.0+cu130-py3.12-cuda13.0-sm90-h200-208fd2",
}


def props(gpu: dict) -> SimpleNamespace:
    """What ``torch.cuda.get_device_properties`` returned there (the fields read)."""
    return SimpleNamespace(
        name=gpu["name"],
        major=gpu["major"],
        minor=gpu["minor"],
        total_memory=gpu["total_memory_mib"] * MIB,
        multi_processor_count=gpu["multi_processor_count"],
    )


def recorded_facts(gpu: dict, keep_env: bool = False, **change) -> dict:
    """:func:`gatekeeper.key.env_facts` of the recorded machine: its torch's facts
    through :func:`gatekeeper.runtime.gpu_facts`, its Python, Triton and architecture;
    this process's compile environment only with ``keep_env``."""
    torch = {"torch": gpu["torch"], "torch_git": gpu["torch_git"]}
    device = props(gpu)
    for field in ("name", "major", "minor"):
        if field in change:
            setattr(device, field, change.pop(field))
    torch.update(gpu_facts(device, change.pop("cuda", gpu["cuda"]), gpu["hip"]))
    facts = env_facts("cuda", torch_facts=torch)
    facts.update(python=gpu["python"], triton=gpu["triton"], arch=gpu["arch"], **change)
    if not keep_env:
        facts.pop("compile_env", None)
    return facts


@pytest.mark.parametrize("name", sorted(GPUS))
def test_the_env_key_of_a_recorded_gpu_names_its_runtime_capability_and_model(name):
    facts = recorded_facts(GPUS[name])
    assert env_key(facts) == KEYS[name]


def test_the_device_facts_carry_the_gpus_name_capability_and_runtime():
    got = gpu_facts(props(GPUS["h100"]), "13.0", None)
    assert got == {
        "device": "cuda",
        "gpu": "NVIDIA H100 80GB HBM3",
        "capability": "9.0",
        "cuda": "13.0",
        "hip": None,
    }
    rocm = gpu_facts(SimpleNamespace(name="AMD Instinct MI300X", major=9, minor=4), None, "6.2")
    assert rocm["capability"] == "9.4" and rocm["hip"] == "6.2"
    assert "-hip6.2-sm94-amd-instinct-mi300x-" in env_key({**recorded_facts(GPUS["h100"]), **rocm})


def test_the_key_computed_here_is_the_one_the_h200_itself_printed():
    """The H200's facts, its compile environment (CC, CXX, TORCH_CUDA_ARCH_LIST) and the
    env keys were read on the machine (benchmarks/cuda_facts.py, 2026-11-28): the same
    facts give the same key on this CPU machine, so a bundle compiled there is found."""
    h200 = GPUS["h200"]
    assert env_key(recorded_facts(h200)) == h200["env_key_bare"] == KEYS["h200"]
    facts = {**recorded_facts(h200), "compile_env": h200["compile_env"]}
    assert env_key(facts) == h200["env_key"]


@pytest.mark.parametrize(
    "change",
    [
        {"name": "NVIDIA H200"},  # another GPU of the same capability
        {"name": "NVIDIA H100 80GB HBM3 (a different board)"},  # past the readable 24 chars
        {"major": 8},  # another capability, same name
        {"minor": 9},
        {"cuda": "12.8"},
        {"torch": "2.11.1+cu130"},
    ],
    ids=["gpu", "gpu-beyond-the-slug", "capability-major", "capability-minor", "cuda", "torch"],
)
def test_a_bundle_from_another_gpu_capability_or_runtime_is_never_found(change):
    """A bundle's kernels are built for one GPU: a key that dropped any of these facts
    would hand an H100's kernels to another GPU."""
    assert env_key(recorded_facts(GPUS["h100"], **change)) != KEYS["h100"]


def test_on_a_gpu_the_key_holds_no_cpu_facts_and_counts_the_compile_env(monkeypatch):
    for name in compile_env():
        monkeypatch.delenv(name)
    facts = recorded_facts(GPUS["h200"], keep_env=True)
    assert not {"isa_flags", "cpu_capability", "threads"} & set(facts), facts
    assert env_key(facts) == KEYS["h200"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    arch = recorded_facts(GPUS["h200"], keep_env=True)
    assert arch["compile_env"] == {"TORCH_CUDA_ARCH_LIST": "9.0a"}
    assert env_key(arch) != KEYS["h200"] and env_key(arch).startswith(KEYS["h200"][:-6])


class RecordedAllocator:
    """The CUDA allocator's statistics as ``torch.cuda`` gives them, replaying readings
    of the recorded run: ``live`` bytes before the call, ``during`` more at its peak."""

    def __init__(self, live: int, during: int) -> None:
        self.live, self.during = live, during
        self.peak = live
        self.calls: list[str] = []

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def reset_peak_memory_stats(self) -> None:
        self.calls.append("reset")
        self.peak = self.live

    def memory_allocated(self) -> int:
        return self.live

    def max_memory_allocated(self) -> int:
        return self.peak

    def call(self) -> None:  # what one call of the model does to the allocator
        self.peak = max(self.peak, self.live + self.during)


MEMORY = RECORDED["memory_mib"]


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_the_peak_on_a_gpu_is_the_allocators_beyond_what_was_live(device):
    weights = int(0.5 * MIB)  # live before the call: counted out
    eager = RecordedAllocator(weights, int(MEMORY["eager_peak"] * MIB))
    calls = []

    def fn():
        calls.append(1)
        eager.call()

    assert peak_memory(fn, device, cuda=eager) == int(MEMORY["eager_peak"] * MIB)
    assert len(calls) == 3 and eager.calls[:2] == ["synchronize", "reset"], eager.calls
    assert allocated(device, cuda=eager) == weights
    assert allocated("cpu", cuda=eager) == 0


def test_a_cuda_graphs_peak_is_the_pool_it_keeps_not_its_replays_zero():
    """reduce-overhead and max-autotune replay a graph whose pool was filled when it
    recorded: the replays allocate nothing (docs/gpu.md read 0 MiB); what the compiled
    model holds is its peak."""
    held = int(MEMORY["compiled_peak"] * MIB)
    graph = RecordedAllocator(held, int(MEMORY["cuda_graph_replay_peak"] * MIB))
    assert peak_memory(graph.call, "cuda", held=held, cuda=graph) == held
    plain = RecordedAllocator(0, int(MEMORY["compiled_peak"] * MIB))
    assert peak_memory(plain.call, "cuda", held=int(0.25 * MIB), cuda=plain) == held


def scattered(device: str, noise: float):
    result = make_result("m/b1/default", seed=3)
    lat = result.latency.model_copy(
        update={
            "disturbance": result.latency.disturbance.model_copy(update={"reference_noise": noise})
        }
    )
    return result.model_copy(update={"device": device, "latency": lat})


@pytest.mark.parametrize("noise", RECORDED["reference_noise_idle"])
def test_the_drift_references_jitter_on_an_idle_gpu_does_not_mark_the_run_disturbed(noise):
    """On a GPU the reference (small matmuls) is launch-bound: its 5-18% spread within a
    run on an idle H100 is not contention. The same spread on a CPU is."""
    assert disturbance(scattered("cuda", noise)) is None
    on_cpu = disturbance(scattered("cpu", noise))
    if noise > 0.10:  # gate.drift.DISTURBED_REFERENCE_NOISE
        assert on_cpu and "reference workload scattered" in on_cpu, on_cpu
    else:
        assert on_cpu is None
