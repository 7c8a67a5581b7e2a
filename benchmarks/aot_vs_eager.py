"""Eager, ``torch.compile`` (whole) and the AOTInductor package (``+aot``, weights bound as
gatekeeper builds it) of one causal LM in one process on this machine: median call time
of each, interleaved, and where each spends it (torch.profiler, the top operators by
self CPU time), so a package slower than eager on a CPU says why.

The model is benchmarks/scale.py's (``--arch``, ``--size``: transformers' model built
from its config, random weights, fp32), called as the targets call it: batch 1,
sequence 128, ``use_cache=False`` (what every call of an ``+aot`` target gets).

    python benchmarks/aot_vs_eager.py --arch qwen2 --size 0.5b [--rounds 30] [--top 12]
        [--kernels] [--threads N]

``--kernels`` builds both with inductor's ``cpp.enable_kernel_profile``, so the profile
names the generated kernels (an AOTInductor package's are otherwise invisible to it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from scale import ARCHS


def build(arch: str, size: str) -> torch.nn.Module:
    import transformers

    config_cls, model_cls, tied, sizes = ARCHS[arch]
    config = getattr(transformers, config_cls)(
        **sizes[size], max_position_embeddings=2048, tie_word_embeddings=tied
    )
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


def package(model: torch.nn.Module, kwargs: dict) -> object:
    """The +aot target's package as the worker builds it: exported non-strict, built
    without its weights, bound to the model's own."""
    from torch._inductor import aoti_compile_and_package

    from gatekeeper.kinds.aot.worker_build import record_weights
    from gatekeeper.runtime import load_package

    out = Path(tempfile.mkdtemp(prefix="gk-aot-bench-"), "model.pt2")
    program = torch.export.export(model, (), kwargs, strict=False)
    options = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}
    aoti_compile_and_package(program, package_path=str(out), inductor_configs=options)
    record_weights(out, model, model)
    return load_package(out, model=model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=tuple(ARCHS), default="qwen2")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="inductor's generated kernels in the profile too (cpp.enable_kernel_profile)",
    )
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.kernels:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    model = build(a.arch, a.size)
    vocab = ARCHS[a.arch][3][a.size]["vocab_size"]
    ids = torch.randint(0, vocab, (1, 128), generator=torch.Generator().manual_seed(0))
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    with torch.no_grad():
        start = time.perf_counter()
        aot = package(model, kwargs)
        print(f"export + package: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        compiled = torch.compile(model)
        start = time.perf_counter()
        compiled(**kwargs)
        print(f"torch.compile first call: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        calls = {
            "eager": lambda: model(**kwargs),
            "whole": lambda: compiled(**kwargs),
            "+aot": lambda: aot(input_ids=ids, attention_mask=kwargs["attention_mask"]),
        }
        for fn in calls.values():  # warm
            fn(), fn()
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(a.rounds):  # interleaved: drift falls on all three alike
            for name, fn in calls.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        eager = statistics.median(times["eager"])
        print(f"\n{ARCHS[a.arch][1]} {a.size}, {torch.get_num_threads()} threads, "
              f"torch {torch.__version__}, {a.rounds} interleaved rounds\n")  # fmt: skip
        print("| | p50 | vs eager |\n|---|---|---|")
        for name, ts in times.items():
            p50 = statistics.median(ts)
            print(f"| {name} | {p50 * 1e3:.1f} ms | {eager / p50:.2f}x |")
        from torch.profiler import ProfilerActivity, profile

        for name, fn in calls.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    fn()
            print(f"\n{name}, 3 calls:\n")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top))


if __name__ == "__main__":
    main()
