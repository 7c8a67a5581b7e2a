"""Helpers for tests that run the real CLI and real compiles in subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TINY_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    def make():
        return Tiny()
""")

TINY_CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"  # packages: tests/e2e/test_precompile.py

    [[tool.gatekeeper.models]]
    name = "tiny"
    factory = "tinymodel:make"
    inputs = [{ shape = ["batch", 16] }]
    shapes = [{ batch = 4 }]
""")


TINY_LLAMA = '''
from transformers import LlamaConfig, LlamaForCausalLM


def make_lm():
    """A stock LlamaForCausalLM, {layers} layer(s), random weights."""
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size={hidden},
        intermediate_size={intermediate},
        num_hidden_layers={layers},
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)
'''


def tiny_llama(hidden: int = 64, intermediate: int = 128, layers: int = 1) -> str:
    """A factory module whose ``make_lm()`` returns a stock LlamaForCausalLM of one
    layer (or ``layers``), a vocabulary of 2048 (tests/e2e/test_generate.py's generate
    targets)."""
    return TINY_LLAMA.format(hidden=hidden, intermediate=intermediate, layers=layers)


def tiny_llama_config(strategies: str | None = None, warmup: int = 1, min_time: float = 0.3) -> str:
    """The gatekeeper.toml of :func:`tiny_llama`'s generate target, the minimal form (16
    new tokens after a 32-token prompt) with the local store, no precompile package and
    no shape sweep; ``strategies``: its strategies (a TOML list), else the default."""
    line = f"strategies = {strategies}\n" if strategies else ""
    return TINY_LLAMA_CONFIG.format(warmup=warmup, min_time=min_time, strategies=line)


TINY_LLAMA_CONFIG = """
store = "store"
precompile = "off"

[measure]
warmup = {warmup}
min_time = {min_time}
shape_sweep = false

[[models]]
name = "lm"
factory = "lm:make_lm"
inputs = {{ input_ids = {{ shape = [1, 32], dtype = "int64", high = 2048 }} }}
tasks = ["generate"]
{strategies}generate = {{ new_tokens = 16 }}
"""


def generated_by_tokens(r: dict, target: str, graphs: int) -> dict:
    """A tiny Llama generate target's result (:func:`tiny_llama_config`) checked as each
    must pass: ok, ``graphs`` graphs and no break, no recompile during decode, the same
    1x16 greedy tokens as eager from 2 prompts, timed; its generation document."""
    assert r["target"] == target and r["status"] == "ok", r
    assert r["graphs"]["count"] == graphs and r["graphs"]["breaks"] == 0, r["graphs"]
    gen = r["generation"]
    assert gen["decode_recompiles"] == 0 and gen["loop"] == "generate", gen
    parity = r["parity"]["vs_eager"]
    assert parity["passed"], parity
    assert parity["detail"] == "tokens: the same 1x16 greedy tokens from 2 prompt(s)"
    assert 0 < gen["compiled"]["tpot_s"] and 0 < gen["compiled"]["ttft_s"]
    return gen


def stock_lm(
    arch: str = "Llama", layers: int = 1, vocab: int = 2048, hidden: int = 64, heads: int = 4
) -> Any:
    """A stock transformers ``<arch>ForCausalLM`` built from a tiny config (random
    weights), in eval mode: ``layers`` layers, MLP twice ``hidden``, half as many KV
    heads as heads."""
    import transformers

    config = getattr(transformers, f"{arch}Config")(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=64,
    )
    return getattr(transformers, f"{arch}ForCausalLM")(config).eval()


def docs_code(page: str, heading: str) -> str:
    """The first Python block after ``heading`` on ``docs/<page>``, as the page shows it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text()
    section = text.split(heading, 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"no python block after {heading!r} on docs/{page}"
    return found.group(1)


def inductor_counters(code: str, cwd: Path, cache: Path) -> dict[str, int]:
    """``code`` in a fresh interpreter on the inductor cache dir ``cache``: torch's
    inductor counters when it ends (``fxgraph_cache_hit``, ``fxgraph_cache_miss``)."""
    code += (
        "\nimport json\nfrom torch._dynamo.utils import counters\n"
        "print(json.dumps(dict(counters['inductor'])))\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


def parity_only_config(shapes: str, precompile: bool = False) -> str:
    """The tiny model's config with timing rules so wide that only parity and errors
    decide a verdict (tests of plumbing, not of detection rates). Precompile packages
    are off unless asked for (then the default setting records them)."""
    text = textwrap.dedent("""
        [tool.gatekeeper]
        store = "store"
        precompile = "off"  # packages: tests/e2e/test_precompile.py

        [tool.gatekeeper.measure]
        warmup = 2
        min_time = 0.3

        [tool.gatekeeper.gate]
        latency_regression = 0.95
        speedup_regression = 0.95
        compile_time_regression = 100.0
        memory_regression = 100.0

        [[tool.gatekeeper.models]]
        name = "tiny"
        factory = "tinymodel:make"
        inputs = [{ shape = ["batch", 16] }]
    """)
    if precompile:  # not set at all: the default records them
        text = text.replace('precompile = "off"', "# precompile: the default")
    return text + f"shapes = {shapes}\n"


def write_project(root: Path, model: str = TINY_MODEL, config: str = TINY_CONFIG) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tinymodel.py").write_text(model)
    (root / "gatekeeper.toml").write_text(config)
    return root


def gk(
    *args: str, cwd: Path, env: dict | None = None, check: bool = False, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the real CLI in a new process."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"gatekeeper {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def git(root: Path, *args: str) -> None:
    """A git command in a scratch repository, as a committer named t."""
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def main_branch(root: Path, files: dict[str, str]) -> Path:
    """``root`` a git repository whose one commit, on ``main``, holds ``files``."""
    for name, text in files.items():
        (root / name).write_text(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-qm", "main")
    return root


def gk_json(
    *args: str, cwd: Path, env: dict | None = None, expect: int = 0, timeout: float = 600
) -> dict:
    proc = gk(*args, "--json", cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == expect, proc.stderr
    return json.loads(proc.stdout)


def shared_objects(cache_dir: Path) -> dict[str, float]:
    """Every compiled kernel (.so) in an inductor cache dir, with its mtime.

    Watching the cache dir (rather than swapping in a recording compiler, which changes
    inductor's own cache key) shows whether a process compiled any C++ kernel.
    """
    return {str(p): p.stat().st_mtime for p in cache_dir.rglob("*.so")}


def run_threads(count: int, work: Callable[[int], Any], timeout: float = 120) -> list[Any]:
    """``work(i)`` in ``count`` threads released at once; their results, or the first error."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as e:  # handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]
    return results


def hash_pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every ``name==version \\ --hash=...`` entry of a
    hash-pinned requirements file (requirements/pinned.txt), names canonical."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in path.read_text().replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert m, f"not a hash-pinned requirement: {line!r}"
        pins[canonicalize_name(m[1])] = (m[2], re.findall(r"[0-9a-f]{64}", m[3]))
    return pins


def _timing_reasons() -> tuple[str, ...]:
    """How the timing rules' reasons start: each timed metric's label (latency, speedup
    vs eager, a generate target's TTFT, TPOT and tokens/s)."""
    from gatekeeper import metrics

    return tuple(f"{m.label} " for m in metrics.registry() if m.timing)


TIMING_REASONS = _timing_reasons()


def unchanged_passes(t: dict) -> bool:
    """An unchanged target's gate verdict (a report.json target) is right: ``pass``; or
    ``inconclusive`` only where the run marked itself disturbed (other processes used
    the CPU while it was timed: ``disturbed`` set) and every reason is a timing rule's
    that names that disturbance. An unchanged target that is inconclusive on a quiet
    run, or for any other reason, is a finding."""
    if t["verdict"] == "pass":
        return True
    timing = bool(t["reasons"]) and all(
        r.startswith(TIMING_REASONS) and "the run was disturbed" in r for r in t["reasons"]
    )
    return t["verdict"] == "inconclusive" and bool(t.get("disturbed")) and timing


@contextmanager
def registered(item: Any) -> Iterator[Any]:
    """``item``, a :class:`gatekeeper.kinds.Kind` or ``Package``, registered for the
    with-block only (a test's toy kind must not outlive the test)."""
    from gatekeeper import kinds

    kinds.register(item)
    try:
        yield item
    finally:
        (kinds._kinds if isinstance(item, kinds.Kind) else kinds._packages).pop(item.name)


def load_file(name: str, path: Path) -> Any:
    """The Python file ``path`` imported as a module named ``name`` (a benchmark script,
    or a module a benchmark wrote), not registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
