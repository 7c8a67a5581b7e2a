"""The paired measurement's set-up (gatekeeper.worker.measure)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.helpers import stock_lm
from torch import nn

from gatekeeper.config import MeasureConfig, ModelConfig
from gatekeeper.gate.stats import compare
from gatekeeper.worker import timing
from gatekeeper.worker.calls import Inputs
from gatekeeper.worker.measure import eager_model
from gatekeeper.worker.placement import same_placement, share_identical
from gatekeeper.worker.recompiles import start_counting
from gatekeeper.worker.spill import spilled
from gatekeeper.worker.task import compile_again, fresh_frames, measure_calls
from gatekeeper.worker.timing import latency
from gatekeeper.worker.train_step import Trainer, make_loss

HOUR = 3600.0


def test_paired_eager_runs_on_weights_of_its_own():
    """Eager runs in every round right after base and head: on the head's own
    parameters it would warm the caches for the head alone (an identical head then read
    2-7% faster than its base). Paired, it gets a copy: the same values, other storage."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    eager = eager_model(head, paired=True)
    head_ptrs = {p.data_ptr() for p in head.parameters()}
    assert not head_ptrs & {p.data_ptr() for p in eager.parameters()}
    x = torch.randn(3, 8)
    assert torch.equal(eager(x), head(x))


def test_paired_eager_runs_on_the_heads_own_weights_when_they_outgrow_the_cache():
    """A copy for eager was a whole model's bytes more (a 1B fp32 model: 4.4 GB), for a
    reason, cache warmth, that holds only for weights the caches can hold. Weights past
    twice the last-level cache run eager on the head's own; the machine's own cache
    size keeps a tiny model copied. Fails on the old eager_model, which always copied."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))  # 17 KiB
    assert eager_model(head, paired=True, cache=4 << 10) is head
    assert eager_model(head, paired=True, cache=16 << 10) is not head
    assert eager_model(head, paired=True) is not head  # this machine's cache: MiBs


def test_unpaired_eager_is_the_model_itself():
    """Alone, eager and compiled share the model: nothing to favour, no copy to hold."""
    head = nn.Linear(4, 4)
    assert eager_model(head, paired=False) is head


class _Tied(nn.Module):
    """A tied weight (one Parameter in two modules), a buffer that views a parameter,
    and a plain buffer: what a stock model's weights look like."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight
        self.mid = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))
        self.register_buffer("mid_row", self.mid.weight[0])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.emb(ids)) * self.scale + self.mid_row))


def _storages(m: nn.Module) -> dict[str, int]:
    return {
        n: t.untyped_storage().data_ptr()
        for n, t in [*m.named_parameters(remove_duplicate=False), *m.named_buffers()]
    }


def test_paired_head_and_base_weights_move_to_new_memory_and_compute_the_same():
    """Paired, the head's and the base's weights are copied into new memory, alternately,
    before either is compiled, so neither keeps the placement its build order gave it
    (with 2 threads an identical head read +1.7% slower than its base without this:
    docs/statistics.md). The modules' own Parameter objects stay, with their values; a
    tied weight stays tied, and a buffer that views a parameter is left where it is."""
    torch.manual_seed(0)
    head, base = _Tied(), _Tied()
    base.load_state_dict(head.state_dict())
    ids = torch.tensor([[1, 2, 3]])
    want = head(ids).detach()
    params = {n: id(p) for n, p in head.named_parameters(remove_duplicate=False)}
    before_head, before_base = _storages(head), _storages(base)

    same_placement(head, base)

    after_head, after_base = _storages(head), _storages(base)
    for before, after in ((before_head, after_head), (before_base, after_base)):
        moved = {n for n in before if before[n] != after[n]}
        # the tied weight (both names), the Linear's bias and the plain buffer move; the
        # Linear's weight, which a buffer views, and that view stay
        assert moved == {"emb.weight", "head.weight", "mid.bias", "scale"}, moved
    assert head.head.weight is head.emb.weight  # still tied
    assert {n: id(p) for n, p in head.named_parameters(remove_duplicate=False)} == params
    assert torch.equal(head(ids), want) and torch.equal(base(ids), want)


def test_a_tensor_that_is_its_own_mapping_is_not_placed_again():
    """A CPU tensor of 32 MiB or more is a fresh mmap whatever glibc's state (its mmap
    threshold never rises past 32 MiB): placed alike on both sides already. Copying it
    held it twice at once: a Qwen2 embedding (151,936 x 896: 0.28x of the weights) on
    top of the paired peak halfway through the rounds (issue 53). The small tensors
    still move; memory by the profiler's allocation events."""
    from gatekeeper.worker.memory import peak_memory

    def model() -> nn.Module:
        return nn.Sequential(nn.Embedding(40_000, 256), nn.Linear(256, 8))  # 39 MiB, 8 KiB

    head, base = model(), model()
    before = {"head": _storages(head), "base": _storages(base)}
    peak = peak_memory(lambda: same_placement(head, base), "cpu")
    for name, m in (("head", head), ("base", base)):
        moved = {n for n, ptr in _storages(m).items() if before[name][n] != ptr}
        assert moved == {"1.weight", "1.bias"}, (name, moved)
    assert peak is not None and peak < 1 << 20, peak  # the small ones' copies only


def test_placement_leaves_a_plain_function_alone():
    """A ``function`` target has no weights of its own: nothing to place."""
    same_placement(torch.tanh, torch.tanh)


def _checkpoint_lm(where: Path, vocab: int = 512) -> tuple[nn.Module, nn.Module]:
    """A stock Qwen2 (tied embeddings), saved once as safetensors and loaded twice with
    ``from_pretrained``, as a service's factory loads its weights: the head's and the
    base's tensors lie in two mappings of the one file, unread."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(where)
    cls = transformers.Qwen2ForCausalLM
    return cls.from_pretrained(where).eval(), cls.from_pretrained(where).eval()


def _in_file(m: nn.Module, path: Path) -> set[str]:
    """The parameters of ``m`` whose bytes lie in a mapping of ``path``."""
    maps = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            maps.append(tuple(int(x, 16) for x in fields[0].split("-")))
    return {
        n
        for n, p in m.named_parameters()
        if any(lo <= p.data_ptr() and p.data_ptr() + p.nbytes <= hi for lo, hi in maps)
    }


def test_weights_a_checkpoint_maps_stay_in_the_file_and_the_base_shares_the_heads(tmp_path):
    """Issue 53: a Qwen2-0.5B that ``from_pretrained`` loads, paired, peaked at 4.05x its
    weights (8.00 GB): each side's tensors lie in a mapping of the checkpoint file, and
    ``same_placement`` copied every one under 32 MiB into the heap while the file's pages
    stayed mapped, and the two sides' mappings of the one file counted its pages twice.
    Now, where the weights outgrow the cache (here: a 1-byte one), the base's tensors
    that are the same bytes of the same file become the head's (unread: a mapped page
    is the file's own), and nothing in a file is copied: every weight stays in the file,
    one mapping serves both sides, and both compute as before. Fails on the old
    ``same_placement``, which moved them out of the file."""
    head, base = _checkpoint_lm(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    names = {n for n, _ in head.named_parameters()}
    assert _in_file(head, weights) == names and _in_file(base, weights) == names
    ids = torch.tensor([[5, 7, 11, 13]])
    with torch.no_grad():
        want = head(ids).logits
    before = {n: p.data_ptr() for n, p in head.named_parameters()}

    shared = share_identical(head, base, cache=1)
    same_placement(head, base, cache=1)

    total = sum(p.nbytes for p in head.parameters())
    assert shared == total
    assert {n: p.data_ptr() for n, p in head.named_parameters()} == before
    assert {n: p.data_ptr() for n, p in base.named_parameters()} == before
    assert base.lm_head.weight is base.model.embed_tokens.weight  # still tied
    with torch.no_grad():
        assert torch.equal(head(ids).logits, want) and torch.equal(base(ids).logits, want)


def test_a_checkpoints_weights_stay_in_the_file_while_the_base_loads(tmp_path):
    """The spill (gatekeeper.worker.spill) wrote every head weight that owns its storage
    to a file of its own while the base built, a checkpoint's mapped weights too: they
    came back as copies in memory, out of the checkpoint, so the base's load of the
    same file was no longer the same bytes of it, and a Qwen2-0.5B loaded by
    ``from_pretrained`` peaked at 3.21x its weights paired (1.59x before the spill).
    A weight in a mapped file is the page cache's already: it stays, and the base
    shares it unread. Fails on the old spill, which moved them."""
    transformers = pytest.importorskip("transformers")
    head, _ = _checkpoint_lm(tmp_path / "ckpt", vocab=8192)  # a 2 MiB embedding: spillable
    weights = tmp_path / "ckpt" / "model.safetensors"
    names = {n for n, _ in head.named_parameters()}
    with spilled(head, cache=1, least=0, folder=str(tmp_path)) as spill:
        base = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
        shared = share_identical(head, base, cache=1, restore=spill.restore if spill else None)
    assert spill is None  # nothing to spill: every weight lies in the checkpoint
    assert _in_file(head, weights) == names == _in_file(base, weights)
    assert shared == sum(p.nbytes for p in head.parameters())


def test_a_checkpoints_weights_within_the_cache_get_a_copy_for_each_side(tmp_path):
    """Weights the cache holds are not shared, from a file or not: the side that runs
    second would read what the other just read from the cache. Each side's are copied
    out of the file into memory of its own, as any small weights are, and compute as
    before."""
    head, base = _checkpoint_lm(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    ids = torch.tensor([[5, 7, 11, 13]])
    with torch.no_grad():
        want = head(ids).logits
    assert share_identical(head, base, cache=1 << 40) == 0
    same_placement(head, base, cache=1 << 40)
    assert not _in_file(head, weights) and not _in_file(base, weights)
    assert not {p.data_ptr() for p in head.parameters()} & {p.data_ptr() for p in base.parameters()}
    with torch.no_grad():
        assert torch.equal(head(ids).logits, want) and torch.equal(base(ids).logits, want)


def test_a_weight_written_after_its_load_is_compared_not_taken_as_the_files(tmp_path):
    """A page of the file's mapping that the model wrote (copied on write) no longer
    holds the file's bytes: the base's weight of the same place is compared by value
    (here: the weights outgrow a 1-byte cache), and kept apart where it differs."""
    head, base = _checkpoint_lm(tmp_path / "ckpt")
    with torch.no_grad():
        base.model.layers[0].mlp.up_proj.weight.mul_(2)  # the PR's factory scales it
    shared = share_identical(head, base, cache=1)
    up = "model.layers.0.mlp.up_proj.weight"
    params = dict(base.named_parameters())
    assert params[up].data_ptr() != dict(head.named_parameters())[up].data_ptr()
    assert shared == sum(p.nbytes for n, p in params.items() if n != up)


def test_equal_weights_in_the_heap_are_shared_only_past_the_cache():
    """Two sides built from one seed hold equal weights in memory of their own. Where
    the weights outgrow twice the last-level cache, the base takes the head's (one copy
    held, not two: a whole model's bytes); within it, each keeps its own, or the side
    that runs second would find the weights the other just read in the cache."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))  # 17 KiB

    head, base = model(), model()
    assert share_identical(head, base, cache=16 << 10) == 0  # 17 KiB < 2 x 16 KiB
    assert share_identical(head, base) == 0  # this machine's cache: MiBs
    assert not {p.data_ptr() for p in head.parameters()} & {p.data_ptr() for p in base.parameters()}
    with torch.no_grad():
        base[2].bias.add_(1)  # a PR that changes one weight
    assert share_identical(head, base, cache=4 << 10) == 64 * 64 * 4 + 64 * 4 + 2 * 64 * 4
    assert base[0].weight.data_ptr() == head[0].weight.data_ptr()
    assert base[2].bias.data_ptr() != head[2].bias.data_ptr()
    before = {n: p.data_ptr() for n, p in base.named_parameters()}
    same_placement(base, head)  # halfway: what both hold stays one copy
    assert base[0].weight.data_ptr() == head[0].weight.data_ptr()
    assert {n: p.data_ptr() for n, p in base.named_parameters()}["2.bias"] != before["2.bias"]


class _Plus(nn.Module):
    def forward(self, x):
        return x + 1


class _Times(nn.Module):
    def forward(self, x):
        return x * 2


def test_compile_again_compiles_every_frame_anew_in_the_order_given():
    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.append("head" if "add" in str(gm.graph) else "base")
        return gm.forward

    x = torch.ones(3)
    head, base = torch.compile(_Plus(), backend=backend), torch.compile(_Times(), backend=backend)
    head(x), base(x)
    assert seen == ["head", "base"]
    compile_again(lambda: base(x), lambda: head(x))()
    assert seen == ["head", "base", "base", "head"]
    head(x), base(x)  # compiled again, not a third time
    assert len(seen) == 4


def test_paired_timing_runs_halfway_once_between_two_halves_and_does_not_time_it(monkeypatch):
    """Halfway's seconds are not timed: it moves the clock the rounds read an hour on
    (instead of sleeping), so counted, they would read over an hour, and a loaded
    machine, however slow it makes the rounds, cannot make them read that long."""
    calls = {"compiled": 0}
    at: list[int] = []
    skipped = [0.0]
    monkeypatch.setattr(
        timing, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + skipped[0])
    )

    def compiled():
        calls["compiled"] += 1

    def halfway():
        at.append(calls["compiled"])
        skipped[0] += HOUR

    lat = latency(
        lambda: None,
        compiled,
        "cpu",
        MeasureConfig(warmup=1, min_time=0.4, max_samples=100_000),
        base=lambda: None,
        halfway=halfway,
    )
    assert len(at) == 1
    n = len(lat["samples"]["compiled"])
    per_sample = lat["inner_loops"]
    before = (at[0] - 1 - 1) // per_sample  # warmup and the calibrating call came first
    assert 1 <= before and n - before >= before
    assert n == len(lat["samples"]["base"]) == len(lat["samples"]["eager"])
    assert lat["disturbance"]["seconds"] < HOUR


@pytest.mark.parametrize("stalled", [3, 5])
def test_a_round_that_stalls_across_half_the_time_still_gets_a_whole_second_half(stalled):
    """A round that stalls from before half of min_time to past all of it (a loaded CI
    machine did so) ended the rounds before halfway ran (round 5: one half only), or,
    stalling before the fifth round, left the second half the few rounds up to five
    (round 3: four, then one). Either way one half's order effects outweighed the
    other's. The second half takes at least as many rounds as the first."""
    calls: list[int] = []
    at: list[int] = []

    def eager():
        calls.append(0)
        time.sleep(0.003)  # one call per sample
        if len(calls) == 2 + stalled + 1:  # after the warmup and the calibrating call
            time.sleep(0.6)  # from before half of min_time to past all of it

    lat = latency(
        eager,
        lambda: None,
        "cpu",
        MeasureConfig(warmup=1, min_time=0.5, max_samples=100_000),
        base=lambda: None,
        halfway=lambda: at.append(len(calls) - 2),
    )
    n = len(lat["samples"]["compiled"])
    assert lat["inner_loops"] == 1 and len(at) == 1
    assert n == len(lat["samples"]["base"]) == len(lat["samples"]["eager"])
    assert at[0] >= 1 and n - at[0] >= at[0], (at, n)


def test_paired_forward_halves_mirror_each_other_and_memory_is_measured_before_them():
    """Paired forwards: the peak memory (a profiler run on the head, whose frames are
    compiled again first: they were forgotten for the base's compile) is measured before
    the sides are compiled again for the timed rounds; the head is compiled first for
    the first half, and halfway the weights are placed again, the base's first, before
    the base is compiled first for the second half. Measured after the compiles, the
    profiler had made the head alone slower in the first half (+1.1% there, −0.0% in
    the second, docs/statistics.md). Both sides compute the same on their new memory."""
    events: list[tuple[str, ...]] = []
    weights: dict[str, list[tuple[int, int]]] = {"head": [], "base": []}
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    base = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    module = {"head": head, "base": base}

    def backend(gm, example_inputs):
        side = "head" if "tanh" in str(gm.graph) else "base"
        events.append(("compile", side))

        def run(*args):
            if torch.autograd._profiler_enabled():
                events.append(("profiled", side))
            weights[side].append((len(events), module[side][0].weight.data_ptr()))
            return gm.forward(*args)

        return run

    eager = eager_model(head, paired=True)
    same_placement(head, base)
    head_c, base_c = torch.compile(head, backend=backend), torch.compile(base, backend=backend)
    x = torch.randn(3, 4)

    def placed_again():
        events.append(("placed",))
        same_placement(base, head)

    req = SimpleNamespace(
        device="cpu",
        budget=MeasureConfig(warmup=1, min_time=0.2, max_samples=100),
        trace_out=None,
        sweep=False,
        decide_at=None,
    )
    with torch.no_grad():
        head_out = head_c(x)  # the first compiles, as the worker makes them
        fresh_frames()
        want = head_out, base_c(x)
        start = len(events)
        start_counting()
        paired: dict = {}
        graphs: dict = {}
        _, lat, _ = measure_calls(
            eager,
            head_c,
            Inputs((x,)),
            req,
            graphs,
            base_fn=lambda: base_c(x),
            paired=paired,
            place_base_first=placed_again,
        )
        got = head_c(x), base_c(x)
    seen = [e for i, e in enumerate(events[start:]) if i == 0 or e != events[start + i - 1]]
    assert seen == [
        ("compile", "head"),  # forgotten for the base's compile, so compiled again
        ("profiled", "head"),  # before its peak memory is measured
        ("compile", "head"),
        ("compile", "base"),  # first half
        ("placed",),
        ("compile", "base"),
        ("compile", "head"),  # second half
        ("profiled", "head"),
        ("profiled", "base"),  # the profiles after the timed rounds
    ], seen
    halfway = events.index(("placed",))
    for side in ("head", "base"):  # timed on new memory in the second half
        before = {ptr for at, ptr in weights[side] if start < at <= halfway}
        after = {ptr for at, ptr in weights[side] if at > halfway}
        assert len(before) == len(after) == 1 and before != after, (side, before, after)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert graphs["recompiles"] == 0, graphs["recompile_guards"]
    assert len(paired["samples"]) == len(lat["samples"]["compiled"]) >= 5


@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_paired_training_steps_are_timed_in_two_halves_each_side_compiled_first_in_one():
    """measure_calls, which times forwards and training steps alike, compiles both sides
    again before the timed rounds (head first) and halfway through them (base first), so
    neither side's guards are always the slower-checked ones; fresh compiles after a
    reset are not counted as recompiles."""
    seen: list[str] = []

    def backend(gm, example_inputs):
        graph = str(gm.graph)
        if "tanh" in graph or "sigmoid" in graph:
            seen.append("head" if "tanh" in graph else "base")
        return gm.forward

    cfg = ModelConfig(name="m", factory="m:make", inputs=[{"shape": [2, 4]}], tasks=["train"])
    loss = make_loss(cfg, None, torch.zeros(1))
    torch.manual_seed(0)
    eager, head, base = (
        Trainer(nn.Sequential(nn.Linear(4, 2), act()), cfg, loss, "cpu", "fp32")
        for act in (nn.Tanh, nn.Tanh, nn.Sigmoid)
    )
    head_step = torch.compile(head.step, backend=backend)
    base_step = torch.compile(base.step, backend=backend)
    inputs = Inputs((torch.randn(3, 4),))
    for _ in range(3):  # the first compiles and the parity steps, as the worker's
        inputs.call(head_step), inputs.call(base_step)
    assert seen[0] == "head" and set(seen) == {"head", "base"}
    first = len(seen)
    start_counting()
    req = SimpleNamespace(
        device="cpu",
        budget=MeasureConfig(warmup=1, min_time=0.2, max_samples=100),
        trace_out=None,
        sweep=False,
        decide_at=None,
    )
    paired: dict = {}
    graphs: dict = {}
    _, lat, _ = measure_calls(
        eager.step,
        head_step,
        inputs,
        req,
        graphs,
        base_fn=lambda: inputs.call(base_step),
        paired=paired,
    )
    assert seen[first:] == ["head", "base", "base", "head"]
    assert graphs["recompiles"] == 0, graphs["recompile_guards"]
    assert len(paired["samples"]) == len(lat["samples"]["compiled"]) >= 5


def _virtual_calls(monkeypatch, head_factor: float, spread: float):
    """Base and head calls that take no real time but move the clock the rounds read by
    1 s (base) and ``head_factor`` s (head) times ``exp(+spread)`` and ``exp(-spread)``
    in turn: rounds whose samples and durations do not depend on the machine's speed."""
    skipped = [0.0]
    monkeypatch.setattr(
        timing, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + skipped[0])
    )
    calls = [0]

    def base():
        skipped[0] += 1.0

    def head():
        calls[0] += 1
        skipped[0] += head_factor * math.exp(spread if calls[0] % 2 else -spread)

    return base, head


@pytest.mark.parametrize(
    ("factor", "spread", "decided"),
    [(1.0, 0.001, "at min_time"), (1.04, 0.08, "never"), (1.10, 0.08, "later")],
)
def test_paired_rounds_go_on_past_min_time_while_the_interval_straddles_the_threshold(
    monkeypatch, factor, spread, decided
):
    """At ~1 s per call, 10 s gave 8 rounds whose interval reached past the 5% threshold;
    the rounds went no further. Now they go on, up to max_time, while the interval of
    the paired estimate straddles the threshold: an unchanged head decides at min_time,
    a 10% slower one decides (regressed) before max_time, and a +4% one with this
    spread takes rounds until max_time and stays undecided. Fails on the old loop,
    which stopped at min_time whatever the interval."""
    from gatekeeper.gate.rounds import paired_decisive

    base, head = _virtual_calls(monkeypatch, factor, spread)
    budget = MeasureConfig(warmup=1, min_time=10.0, max_time=120.0, max_samples=100_000)
    lat = latency(lambda: None, head, "cpu", budget, base=base, decide_at=0.05)
    b, h = lat["samples"]["base"], lat["samples"]["compiled"]
    seconds = lat["disturbance"]["seconds"]
    at_min_time = 6  # rounds of ~2 virtual seconds before 10 s passed
    if decided == "at min_time":
        assert len(b) <= at_min_time, (len(b), seconds)
    elif decided == "never":  # up to max_time: 120 s of ~2 s rounds
        assert seconds >= 100 and 20 <= len(b) <= 61, (len(b), seconds)
        assert not paired_decisive(b, h, threshold=0.05)
    else:
        assert len(b) > at_min_time and seconds < 100, (len(b), seconds)
        assert paired_decisive(b, h, threshold=0.05)
        assert compare(b, h, paired=True, threshold=0.05).verdict == "regressed"
    without = latency(lambda: None, head, "cpu", budget, base=base)  # no threshold: min_time
    assert len(without["samples"]["base"]) <= at_min_time


def test_the_regional_kinds_compiled_copy_shares_the_models_weights():
    """A regional target compiles its blocks in place on a copy, so that eager stays
    eager: a deep copy held the weights twice. The copy's modules are its own (a block
    compiled there leaves the model's eager) and its weights the model's."""
    from gatekeeper.kinds.regional.worker import shared_copy

    model = _Tied()
    twin = shared_copy(model)
    assert twin.mid is not model.mid and twin.head.weight is twin.emb.weight
    assert {id(t) for t in [*twin.parameters(), *twin.buffers()]} == {
        id(t) for t in [*model.parameters(), *model.buffers()]
    }
    twin.mid.compile(backend="eager")
    assert model.mid._compiled_call_impl is None and twin.mid._compiled_call_impl is not None
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(twin(ids), model(ids))


class _SequentialMlp(nn.Module):
    """A block whose MLP region is a bare ``nn.Sequential`` (torch's own forward), as
    examples/tiny_models.py's transformer block had it."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.inp(x)).sum(-1)


def test_a_region_whose_forward_is_torchs_own_is_compiled_and_explained():
    """``nn.Sequential.compile()`` captured no graph (Dynamo skips a frame of torch's
    own files it starts in): the example's ``regions = ["mlp"]`` ran eager, 0 graphs, an
    empty bundle. The region now compiles through a function of gatekeeper's, and check's
    graph count sees its graph too."""
    from torch._dynamo.utils import counters

    from gatekeeper.kinds.regional.worker import compile_regions, regional_graphs

    cfg = ModelConfig(name="m", factory="m:make", inputs=[{"shape": [2, 4]}], regions=["mlp"])
    model, x = _SequentialMlp(), torch.randn(2, 4)
    expected = model(x)
    torch._dynamo.reset()
    counters.clear()
    ((name, block),) = compile_regions(model, cfg, {"backend": "eager"})
    assert name == "mlp" and torch.allclose(model(x), expected)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    graphs = regional_graphs(_SequentialMlp(), cfg, Inputs((x,), {}), Path("."), nullcontext)
    assert graphs["count"] == 1 and graphs["breaks"] == 0


def test_regional_keeps_a_graph_per_stock_layer_past_dynamos_default_limit():
    """A stock transformers decoder layer reads its own entry of the cache its forward
    makes (``use_cache`` at its default) and Dynamo guards on that index: each of ten
    layers is a graph of its own. Dynamo keeps 8 per code object by default, and a
    regional target's layers past the eighth ran eager without a word."""
    from torch._dynamo.utils import counters

    from gatekeeper.kinds.regional.worker import compile_regions

    pytest.importorskip("transformers")
    model = stock_lm(layers=10, vocab=512, hidden=32, heads=2)
    assert model.config.use_cache
    cfg = ModelConfig(name="m", factory="m:make", inputs=[{"shape": [1, 16]}])
    torch._dynamo.reset()
    counters.clear()
    ids = torch.randint(0, 512, (1, 16))
    with torch._dynamo.config.patch(recompile_limit=8), torch.no_grad():  # restored after
        blocks = compile_regions(model, cfg, {"backend": "eager"})
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert len(blocks) == 10 and counters["stats"]["unique_graphs"] == 10, dict(counters["stats"])


class _TwoKinds(nn.Module):
    """Two repeated block classes in one list; the forward calls only the first kind
    (``skip`` is never called)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.skip = nn.ModuleList([nn.Tanh(), nn.Tanh()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_region_the_model_never_calls_is_a_config_error_naming_it():
    """A named region the forward never calls compiled nothing: the regional bundle held
    nothing of it, and nothing said so. The first calls now end in a config error naming
    it; the default regions (every repeated block) are an error only when none ran."""
    from gatekeeper.errors import ConfigError
    from gatekeeper.kinds.regional.worker import compile_regions, uncalled

    def compiled(regions: list[str] | None, *, call: bool = True) -> None:
        cfg = ModelConfig(name="m", factory="m:make", inputs=[{"shape": [2, 4]}], regions=regions)
        model, called = _TwoKinds(), set()
        blocks = compile_regions(model, cfg, {"backend": "eager"}, called)
        for _ in range(2 if call else 0):  # the hooks remove themselves after one call
            model(torch.randn(2, 4))
        assert called == ({"blocks.0", "blocks.1"} & dict(blocks).keys() if call else set())
        uncalled(blocks, called, cfg)

    compiled(["blocks.*"])
    compiled(None)  # default: blocks.* and skip.* (both repeated); blocks ran
    with pytest.raises(ConfigError, match=r"regions: skip\.0, skip\.1: never called by"):
        compiled(["blocks.0", "skip.*"])
    never = r"regions: blocks\.0, blocks\.1, skip\.0 and 1 more: never called by forward of model"
    with pytest.raises(ConfigError, match=never):
        compiled(None, call=False)
