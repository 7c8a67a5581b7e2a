"""``aot``'s generation (docs/generation.md, "AOTInductor"): a transformers causal LM's
forward over a static KV cache exported as transformers' own export recipe wraps it
(``TorchExportableModuleWithStaticCache``: the cache's tensors are the module's buffers;
each call's ``cache_position`` says where its tokens go, and a call at position 0
starts a new generation), its prompt length dynamic, then one AOTInductor package. The
prefill is one call of it over the prompt, each decode step one call over the token
before (:class:`PackagedLM`): no Dynamo, inductor or model code runs, so a generation
never recompiles.

A deploy calls the package the same way (docs/generation.md shows the loop). A model
that is no transformers causal LM, or that torch.export refuses, is ``not-exportable``
with the reason.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ...worker.kinds import Built, Job
from .worker_build import NotExportable, exporting, package_of

# transformers' recipe exports strict: non-strict export refuses its cache's own
# in-place update (torch 2.13: "mutating a non-functional tensor with a functional tensor")
STRICT = True


def _refused(reason: str) -> NotExportable:
    return NotExportable({"exportable": False, "reason": reason, "strict": STRICT})


def cache_length(job: Job, prompt: int) -> int:
    """The static cache's length: the config's, else the prompt and its new tokens."""
    cfg = job.req.model.generation
    return cfg.cache_length or prompt + cfg.new_tokens


def static_cache_module(model: Any, batch: int, length: int) -> torch.nn.Module:
    """transformers' exportable wrapper of ``model`` over a static cache of ``batch`` x
    ``length`` (NotExportable when the model is none it wraps)."""
    try:
        from transformers import PreTrainedModel
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    except ImportError as e:  # an older transformers: no export recipe
        raise _refused(f"transformers has no static-cache export recipe here ({e})") from None
    if not isinstance(model, PreTrainedModel) or model.generation_config is None:
        raise _refused(
            f"{type(model).__name__} is no transformers causal LM: aot exports "
            "transformers' static-cache forward"
        )
    gen = model.generation_config
    was = gen.cache_implementation
    gen.cache_implementation = "static"  # what the recipe asks of the model
    try:
        return TorchExportableModuleWithStaticCache(model, batch_size=batch, max_cache_len=length)
    except Exception as e:  # the recipe refused the model (its cache, its config)
        raise _refused(f"{type(e).__name__}: {e}") from None
    finally:
        gen.cache_implementation = was


def export_generation(module: torch.nn.Module, ids: torch.Tensor, length: int, job: Job) -> Any:
    """The module's forward exported with the prompt's length dynamic (1 to the cache's
    length), so that the prefill and every decode step are calls of one program; its
    logits the last position's only (:func:`last_logits`)."""
    from torch.export import Dim

    tokens = Dim("tokens", min=1, max=length - 1)
    if ids.shape[1] < 2:  # an example of one token would be specialised to one
        ids = ids.repeat(1, 2)
    positions = torch.arange(ids.shape[1], device=ids.device)

    def export() -> Any:
        with last_logits(getattr(module, "model", None)):
            return torch.export.export(
                module,
                (),
                {"input_ids": ids, "cache_position": positions},
                dynamic_shapes={"input_ids": {1: tokens}, "cache_position": {0: tokens}},
                strict=STRICT,
            )

    return exporting(export, STRICT, job.req.base_path)


@contextmanager
def last_logits(model: Any) -> Iterator[None]:
    """While the block runs, ``model``'s forward computes its LM head over the last
    position only (transformers' ``logits_to_keep=1``, what ``generate()`` passes): the
    prefill reads one token's logits, and a 152k-word vocabulary's head over every
    prompt position is most of a prefill's multiply-adds. A model whose forward takes no
    ``logits_to_keep`` is left as it is; its own ``forward`` attribute, where it has one,
    is put back."""
    try:
        takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):  # no model, or no signature to read
        takes = False
    if not takes:
        yield
        return
    own = model.__dict__.get("forward")
    model.forward = functools.partial(model.forward, logits_to_keep=1)
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


def eos_of(model: Any) -> list[int]:
    """The model's end-of-sequence tokens (none without a model)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


@dataclass
class PackagedLM:
    """A generation on the package, called as the generation loop calls transformers'
    ``generate()`` (greedy; EOS masked until ``min_new_tokens``, as transformers masks
    it): the prefill one call over the prompt at positions 0 to P-1, each decode step one
    call over the token before at its position."""

    step: Any
    eos: list[int]

    def generate(
        self,
        input_ids: torch.Tensor,
        *,
        max_new_tokens: int,
        min_new_tokens: int = 0,
        streamer: Any = None,
        return_dict_in_generate: bool = False,
        **_: Any,
    ) -> Any:
        prompt = input_ids.shape[1]
        if streamer is not None:
            streamer.put(input_ids)
        positions = torch.arange(prompt, device=input_ids.device)
        logits = self.step(input_ids=input_ids, cache_position=positions)[:, -1]
        tokens, scores, raw = [], [], []
        for n in range(max_new_tokens):
            raw.append(logits)
            chosen = logits.float()
            # transformers masks the EOS tokens of the vocabulary (a tiny config's vocabulary
            # may not hold its family's EOS id: GPT-2's 50256 with 2048 words)
            eos = [e for e in self.eos if 0 <= e < chosen.shape[-1]]
            if n < min_new_tokens and eos:
                chosen = chosen.clone()
                chosen[:, eos] = -torch.inf
            scores.append(chosen)
            token = chosen.argmax(dim=-1, keepdim=True)
            tokens.append(token)
            if streamer is not None:
                streamer.put(token)
            if n + 1 < max_new_tokens:
                at = torch.tensor([prompt + n], device=input_ids.device)
                logits = self.step(input_ids=token, cache_position=at)[:, -1]
        sequences = torch.cat([input_ids, *tokens], dim=1)
        if not return_dict_in_generate:
            return sequences
        return SimpleNamespace(sequences=sequences, scores=tuple(scores), logits=tuple(raw))


def packaged_generation(job: Job) -> tuple[PackagedLM, Built]:
    """The job's generation on its package: the bundle's (``job.load``), else the model's
    static-cache forward exported and packaged (into ``job.out``)."""
    from ...worker.generate import prompt_of

    built, module, program = Built(), None, None
    if job.load is None:
        ids = prompt_of(job.inputs)
        length = cache_length(job, ids.shape[1])
        module = static_cache_module(job.model, ids.shape[0], length)
        program, built.export = export_generation(module, ids, length, job)
    step, built.package = package_of(program, module, job.model, job)
    built.moved = getattr(step, "rebind", None)  # its kernels keep each weight's address
    if program is not None:
        _generates(step, ids)
    return PackagedLM(step, eos_of(job.model)), built


def _generates(step: Any, ids: torch.Tensor) -> None:
    """A prefill and one decode step on the package just built. torch.export may keep a
    program whose runtime checks refuse one of them (a stock tiny OPT's refuses the
    one-token decode: "Expected u14 >= 2 but received 1"): NotExportable, saying which."""
    from .worker_build import _reason

    prompt = ids.shape[1]
    call = "prefill"
    try:
        with torch.no_grad():
            logits = step(input_ids=ids, cache_position=torch.arange(prompt, device=ids.device))
            call = "decode step"
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            step(input_ids=token, cache_position=torch.tensor([prompt], device=ids.device))
    except Exception as e:  # whatever the package's runtime raises
        raise _refused(
            f"torch exported it, but its program refuses a {call}: {_reason(e)}"
        ) from None
