"""Generation, the parent's side: a ``generate`` target's settings (the config's
``generate`` table) and the figures its check records (docs/generation.md).

A causal LM's generation is a prefill over the prompt and one decode step per new token
over a KV cache. A ``generate`` target compiles the model's ``forward`` as transformers
documents it (``model.forward = torch.compile(model.forward, ...)``) and calls
``generate()`` greedily with EOS ignored, so that every run makes exactly
``new_tokens`` tokens; the worker's half is :mod:`gatekeeper.worker.generate`.

No torch here: the schema (imported by :mod:`gatekeeper.config`) and the documents
(imported by :mod:`gatekeeper.results`), which import neither.
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .inputs import Strict

_CALLABLE = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
# the model's tasks value that makes generation targets, and its id suffix
TASK = "generate"
# the top-k of a near-tie: where compiled and eager first pick different tokens, each
# run's token must be among the other run's k best (vLLM's check) ...
TIE_TOP_K = 5


class GenerateConfig(Strict):
    """How a ``generate`` target generates: ``new_tokens`` per run (greedy, EOS
    ignored), its KV ``cache`` (``static``: the shapes a compiled decode step keeps;
    ``dynamic``: transformers' default, which grows every step) and the static cache's
    length (default: prompt + new tokens). ``prefill`` and ``decode`` (``module:function``
    both): the model's own loop instead of ``generate()``, gpt-fast style:
    ``prefill(model, input_ids, cache_length)`` returns the first token's logits
    ``[batch, vocab]`` and ``decode(model, token, position)`` the next token's, with
    ``token`` ``[batch, 1]`` and ``position`` a 1-element tensor; both compiled (decode
    with the target's mode)."""

    new_tokens: int = Field(16, ge=2, le=8192)
    cache: Literal["static", "dynamic"] = "static"
    cache_length: int | None = Field(None, ge=2)
    prefill: str | None = Field(None, pattern=_CALLABLE)
    decode: str | None = Field(None, pattern=_CALLABLE)

    def spec(self) -> dict[str, Any]:
        """What the key records (all of it changes what is compiled)."""
        spec: dict[str, Any] = {"new_tokens": self.new_tokens, "cache": self.cache}
        if self.cache_length is not None:
            spec["cache_length"] = self.cache_length
        if self.prefill is not None:
            spec["loop"] = {"prefill": self.prefill, "decode": self.decode}
        return spec

    def check(self) -> str | None:
        """Why these settings cannot work (None: they can)."""
        if (self.prefill is None) != (self.decode is None):
            return "generate: give both 'prefill' and 'decode' (the model's own loop), or neither"
        if self.cache_length is not None and self.cache_length <= self.new_tokens:
            return (
                f"generate.cache_length ({self.cache_length}) must hold the prompt and "
                f"{self.new_tokens} new tokens"
            )
        return None


def refusal(model: Any) -> str | None:
    """Why a model's config (a :class:`gatekeeper.config.ModelConfig`) cannot make
    generation targets (None: it can, or it makes none)."""
    if TASK not in model.tasks:
        if model.generate is not None:
            return (
                "'generate' is set but 'tasks' has no \"generate\" (add it: tasks = [\"generate\"])"
            )
        return None
    if model.function is not None:
        return 'tasks: "generate" needs a causal LM module (a factory), not a function'
    if model.distributed is not None or model.dynamic:
        what = "distributed" if model.distributed is not None else "dynamic = true"
        return f'tasks: "generate" compiles one process\'s static shapes; drop {what}'
    if model.inputs is not None and not (
        isinstance(model.inputs, dict) and "input_ids" in model.inputs
    ):
        return 'tasks: "generate" needs the prompt as inputs = { input_ids = {...} }'
    return model.generation.check()


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Side(_Doc):
    """One side's generation timed: medians over the timed rounds (one generation a
    round), in seconds."""

    ttft_s: float  # time to first token: the prefill (and the first token chosen)
    tpot_s: float  # time per output token after the first: decode, the rounds' median
    tpot_p95_s: float  # p95 over every token of every round
    tokens_per_s: float  # decode: batch / tpot
    e2e_s: float  # the whole generation


class Generation(_Doc):
    """A generate target's figures (docs/generation.md): the prompt (``batch`` x
    ``prompt`` tokens), ``new_tokens`` per run, the cache; the compiled side's medians
    (``compiled``) and eager's (``eager``); per round (``samples``: ``ttft``, ``tpot``),
    what the paired gate compares with the base commit's; the first compiled generation
    (its compile included) and its first token; the compiles Dynamo made during steady
    decode (after the first decode step compiled: each one a regression, with the
    guard that failed); what parity by tokens said; on a GPU, the decode's bandwidth
    (weight and KV-cache bytes read per step x steps per second) and its fraction of the
    device's peak."""

    batch: int
    prompt: int
    new_tokens: int
    cache: str
    loop: Literal["generate", "own"] = "generate"
    compiled: Side | None = None  # None: compile's and probe's first generations only
    eager: Side | None = None
    samples: dict[str, list[float]] = Field(default_factory=dict)
    first_generate_s: float | None = None
    first_token_s: float | None = None
    decode_recompiles: int = 0
    decode_recompile_guards: list[str] = Field(default_factory=list)
    tokens: str | None = None  # parity by tokens, in words (a near-tie said here)
    bytes_per_step: int | None = None  # weights and KV cache a decode step reads
    bandwidth_gbs: float | None = None
    peak_fraction: float | None = None


def merged(a: Generation, b: Generation) -> Generation:
    """Two measurements of one generate target pooled (a re-measured borderline
    result): the per-round samples joined, the compiled side's medians taken again."""
    samples = {k: a.samples.get(k, []) + b.samples.get(k, []) for k in a.samples}
    if a.compiled is None or b.compiled is None or not samples.get("per_token"):
        return a
    tpot = statistics.median(samples["per_token"])
    compiled = a.compiled.model_copy(
        update={
            "ttft_s": statistics.median(samples.get("first_token") or [a.compiled.ttft_s]),
            "tpot_s": tpot,
            "tpot_p95_s": max(a.compiled.tpot_p95_s, b.compiled.tpot_p95_s),
            "tokens_per_s": a.batch / tpot,
            "e2e_s": statistics.median([a.compiled.e2e_s, b.compiled.e2e_s]),
        }
    )
    return a.model_copy(update={"samples": samples, "compiled": compiled})
