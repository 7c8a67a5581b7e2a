"""Parity by tokens: does the compiled generation choose the tokens eager chooses?

Compiled and eager (eager on transformers' default dynamic cache, as transformers' own
tests compare them) generate greedily from two different prompts of one shape; their
tokens must be the same. Where they first differ, a near-tie is parity still (as vLLM
and transformers accept one): each run's token is among the other's top
:data:`~gatekeeper.generation.TIE_TOP_K`, and in each run the two tokens' scores are
within the parity tolerance (``atol + rtol * |score|``); it is said, with the step and
both tokens. Anything else fails, naming the step, the prompt and both tokens. After a
divergence the runs continue from different tokens, so nothing after it is compared.

The prefill's logits (the first token's, raw) go through the parity ladder of every
target (:func:`gatekeeper.worker.parity.check_parity`: allclose, then the float64
reference's error, ...). The same two checks compare the compiled generation with the
base commit's (paired) or the baseline's stored one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import ParityTolerance
from .fp64 import Float64Kernels, in_float64
from .outputs import Outputs
from .parity import check_parity
from .tf32 import precise


@dataclass
class Generated:
    """Generations of the prompts (stacked on a first dimension, one per prompt):
    tokens ``[P, batch, new]``, each step's top-k scores (``top_idx``, ``top_val``
    ``[P, batch, new, k]``), the prefill's raw logits ``[P, batch, vocab]``."""

    tokens: torch.Tensor
    top_idx: torch.Tensor
    top_val: torch.Tensor
    logits: torch.Tensor

    @classmethod
    def of(cls, runs: list[Any]) -> Generated:
        return cls(
            torch.stack([r.tokens for r in runs]),
            torch.stack([r.top_idx for r in runs]),
            torch.stack([r.top_val for r in runs]),
            torch.stack([r.logits for r in runs]),
        )

    def outputs(self) -> Outputs:
        """As reference outputs (the file every target's check saves)."""
        return Outputs.of(
            {
                "tokens": self.tokens,
                "top_idx": self.top_idx,
                "top_val": self.top_val,
                "logits": self.logits,
            }
        )

    @classmethod
    def read(cls, out: Outputs) -> Generated | None:
        """Reference outputs saved by :meth:`outputs` (None: another target's kind)."""
        leaf = {k.split("'")[-2]: v for k, v in out.leaves.items() if k.count("'") == 2}
        if not {"tokens", "top_idx", "top_val", "logits"} <= leaf.keys():
            return None
        return cls(leaf["tokens"], leaf["top_idx"], leaf["top_val"], leaf["logits"])


def _score(idx: torch.Tensor, val: torch.Tensor, token: int) -> float | None:
    """A token's score among a step's top-k (None: not among them)."""
    hit = (idx == token).nonzero()
    return float(val[hit[0, 0]]) if hit.numel() else None


def _divergence(
    a: Generated, b: Generated, tol: ParityTolerance, names: tuple[str, str]
) -> tuple[bool, str] | None:
    """The first step where the tokens differ, judged (near-tie: True), in words;
    None where every token is the same."""
    diff = (a.tokens != b.tokens).nonzero()
    if not diff.numel():
        return None
    order = sorted(diff.tolist(), key=lambda x: (x[2], x[0], x[1]))  # earliest step first
    p, row, step = order[0]
    ta, tb = int(a.tokens[p, row, step]), int(b.tokens[p, row, step])
    rows = f", row {row + 1}" if a.tokens.shape[1] > 1 else ""
    where = f"token {step + 1} of prompt {p + 1}{rows}"
    found = []
    for g, own, other in ((a, ta, tb), (b, tb, ta)):
        idx, val = g.top_idx[p, row, step], g.top_val[p, row, step]
        found.append((_score(idx, val, own), _score(idx, val, other)))
    said = f"{where}: {names[0]} {ta}, {names[1]} {tb}"
    (a_own, a_other), (b_own, b_other) = found
    if a_own is None or b_own is None or a_other is None or b_other is None:
        missing = names[1] if a_other is None else names[0]
        return False, f"{said} ({missing}'s token is not in the other run's top-k)"
    gaps = (a_own - a_other, b_own - b_other)
    within = all(
        gap <= tol.atol + tol.rtol * abs(own) for gap, own in zip(gaps, (a_own, b_own), strict=True)
    )
    text = f"{said} (scores {max(gaps):.3g} apart)"
    return within, (f"near-tie at {text}" if within else text)


def token_check(
    cand: Generated, other: Generated, tol: ParityTolerance, names: tuple[str, str]
) -> tuple[bool, str]:
    """Whether ``cand``'s tokens are ``other``'s (up to a near-tie), in words."""
    if cand.tokens.shape != other.tokens.shape:
        return False, f"tokens {tuple(cand.tokens.shape)}, expected {tuple(other.tokens.shape)}"
    found = _divergence(cand, other, tol, names)
    if found is None:
        n, rows, new = cand.tokens.shape
        return True, f"the same {rows}x{new} greedy tokens from {n} prompt(s)"
    return found


def check(
    cand: Generated,
    other: Generated,
    tol: ParityTolerance,
    names: tuple[str, str],
    ref64: torch.Tensor | None = None,
) -> dict[str, Any]:
    """One parity check (a :class:`gatekeeper.results.ParityCheck`): the prefill's
    logits up the ladder, then the tokens; the tokens' verdict is in its detail."""
    logits = check_parity(
        Outputs.of({"prefill_logits": cand.logits}),
        Outputs.of({"prefill_logits": other.logits}),
        {"output['prefill_logits']": ref64} if ref64 is not None else None,
        tol,
    )
    if not logits["passed"]:
        return logits
    same, said = token_check(cand, other, tol, names)
    if not same:
        return {**logits, "passed": False, "method": "tokens", "detail": said}
    return {**logits, "detail": f"tokens: {said}"}


def prefill_fp64(model: Any, prompts: list[Any]) -> torch.Tensor | None:
    """The prefill's logits computed in float64 (the eager model module by module on
    its own weights, under :func:`precise`; an op with no float64 kernel by others,
    :class:`~gatekeeper.worker.fp64.Float64Kernels`), one per prompt, or None where the
    model cannot run so (its forward then returns no logits we can read)."""
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        found = []
        with torch.no_grad(), precise(), in_float64(model), Float64Kernels():
            for prompt in prompts:
                out = prompt.call(model)
                logits = out if isinstance(out, torch.Tensor) else out.logits
                found.append(logits[:, -1].detach().cpu())
        return torch.stack(found)
    except Exception:  # a model that cannot run in float64: the RMSE rung is skipped
        return None
