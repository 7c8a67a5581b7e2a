"""A ``generate`` target's generation, in the worker (docs/generation.md): the model's
``forward`` compiled as transformers documents it and ``generate()`` called greedily
with EOS ignored (:class:`HFLoop`), or the model's own prefill and decode functions,
gpt-fast style (:class:`OwnLoop`); each token timed as it comes (:class:`Clock`), so one
run gives its time to first token, the gaps between the tokens after it, and its end.

``compile`` and ``probe`` run :func:`first_generations`; ``check`` runs
:mod:`gatekeeper.worker.generate_measure`.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..boundary import breadcrumbs
from ..boundary.protocol import Build, CompileRequest, ProbeRequest, Response
from ..errors import ConfigError
from ..generation import TIE_TOP_K, Generation
from .calls import Inputs
from .compiler import compile_kwargs, import_inductor, snapshot_counters
from .counters import record_inductor_metrics
from .kinds import Built, Job, Refused, builder
from .model import build_recorded, load_callable
from .plan import fits
from .precision import check_precision
from .timing import sync


class Clock:
    """A transformers streamer that notes when each token reaches it (``generate()``
    hands it the prompt first, then every token as it is chosen, synchronously);
    ``at``: called with the count of tokens so far after each one."""

    def __init__(self, device: str, at: Callable[[int], None] | None = None) -> None:
        self.device, self.at = device, at
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        sync(self.device)
        self.times.append(time.perf_counter())
        if self.at is not None and len(self.times) > 1:
            self.at(len(self.times) - 1)

    def end(self) -> None:
        pass


@dataclass
class Run:
    """One generation: seconds to its first token, between each later token and the
    one before, and to its end; what it chose (``tokens`` ``[batch, new]``) and, when
    asked, each step's scores' top-k (``top_idx``/``top_val`` ``[batch, new, k]``) and
    the prefill's logits (``[batch, vocab]``, raw)."""

    ttft: float
    gaps: list[float]
    e2e: float
    tokens: torch.Tensor | None = None
    top_idx: torch.Tensor | None = None
    top_val: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    @property
    def tpot(self) -> float:
        """Its time per output token after the first: the median gap."""
        return statistics.median(self.gaps) if self.gaps else self.e2e


@dataclass
class Loop:
    """A model's generation, compiled or eager (:meth:`run`)."""

    model: Any
    req: Build
    inputs: Inputs
    prompt: tuple[int, int] = (1, 1)  # batch, tokens
    extra: dict[str, Any] = field(default_factory=dict)
    out: Path | None = None  # where its kind's package goes (compile)
    load: Path | None = None  # its kind's package, from the bundle
    built: Built | None = None  # what its kind's build did (regional, aot)

    def compile(self) -> None:
        raise NotImplementedError

    def by_kind(self, dynamic: bool = False) -> bool:
        """The target's kind's model for generating (regional: a copy of the model
        sharing its weights, its blocks compiled; aot: a generation on its package),
        kept as ``extra["model"]``; False when the kind compiles the loop's own entry
        points (whole). Raises :class:`~gatekeeper.worker.kinds.Refused` when the kind
        cannot build it."""
        job = Job(self.model, self.inputs, self.req, out=self.out, load=self.load)
        found = builder(self.req).generation(job, self.kwargs(dynamic))
        if found is None:
            return False
        self.extra["model"], self.built = found
        return True

    def checked(self) -> None:
        """After the first compiled generation: the kind's check that it compiled what
        the config asks (a regional target's blocks: a ConfigError when none ran)."""
        if self.built is not None and (check := self.built.after_first_calls) is not None:
            self.built.after_first_calls = None
            check()

    def moved(self) -> None:
        """Once the model's weights were copied into new memory (paired placement): a
        package bound to them binds them again (:attr:`Built.moved`)."""
        if self.built is not None and self.built.moved is not None:
            self.built.moved()

    def built_docs(self) -> dict[str, Any]:
        """What its kind's build did, as a response's fields: torch.export's outcome and
        its package's document (aot)."""
        built, own = self.built or Built(), builder(self.req).package
        return {
            "export": built.export,
            "packages": {own: built.package} if own and built.package else {},
        }

    def of(self, compiled: bool) -> Any:
        """The model a generation calls: the kind's compiled copy, else the model."""
        return self.extra.get("model", self.model) if compiled else self.model

    def generate(
        self, inputs: Inputs, compiled: bool, scores: bool, clock: Clock
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One generation, each token handed to ``clock`` (the prompt first); with
        ``scores``, its tokens ``[batch, new]``, each step's scores ``[batch, new,
        vocab]`` and the prefill's raw logits ``[batch, vocab]``."""
        raise NotImplementedError

    def run(
        self,
        inputs: Inputs,
        *,
        compiled: bool = True,
        scores: bool = False,
        at: Callable[[int], None] | None = None,
    ) -> Run:
        """One generation timed token by token (``at``: called with the count of tokens
        so far after each one)."""
        clock = Clock(self.req.device, at)
        with torch.no_grad():
            sync(self.req.device)
            start = time.perf_counter()
            made = self.generate(inputs, compiled, scores, clock)
            sync(self.req.device)
            end = time.perf_counter()
        times = clock.times[1:]  # the first is the prompt, handed over before prefill
        run = Run(times[0] - start, [b - a for a, b in itertools.pairwise(times)], end - start)
        if made is not None:
            run.tokens = made[0].cpu()
            run.top_idx, run.top_val = _top(made[1])
            run.logits = made[2].detach().float().cpu()
        return run

    def kwargs(self, dynamic: bool = False) -> dict[str, Any]:
        """``torch.compile``'s arguments as configured; ``dynamic``: with automatic
        dynamic shapes (``dynamic`` left out), as ``generate()``'s compiled ``forward``
        is, whose cache lengths grow each step."""
        req = self.req
        kw = compile_kwargs(req.model, req.mode, req.dynamic)
        if dynamic:
            kw.pop("dynamic")
        return kw


def prompt_of(inputs: Inputs) -> torch.Tensor:
    """The prompt: the ``input_ids`` keyword input, else the first positional one."""
    ids = inputs.kwargs.get("input_ids", inputs.args[0] if inputs.args else None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ConfigError(
            'tasks "generate": the prompt (input_ids) must be an integer tensor [batch, tokens]'
        )
    return ids


def _top(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = min(TIE_TOP_K, scores.shape[-1])
    top = torch.topk(scores.float(), k, dim=-1)
    return top.indices.cpu(), top.values.cpu()


class HFLoop(Loop):
    """``generate()`` of a transformers causal LM, its ``forward`` compiled (the
    transformers way: ``model.forward = torch.compile(model.forward, ...)``; a regional
    target: ``generate()`` of a copy whose decoder layers are compiled; an aot target:
    the same loop over its package, :mod:`gatekeeper.kinds.aot.worker_generate`), greedy,
    ``min_new_tokens = max_new_tokens`` (EOS ignored), the configured cache; eager runs
    the same ``generate()`` on the eager ``forward`` with transformers' default dynamic
    cache (as its own tests compare them)."""

    def compile(self) -> None:
        if not callable(getattr(self.model, "generate", None)):
            raise ConfigError(
                f'tasks "generate": {type(self.model).__name__} has no generate() '
                "(a transformers causal LM has; else give generate.prefill and decode)"
            )
        # as a service compiles it (docs/generation.md): no ``dynamic``, so that a
        # Python int a cache keeps per step (a sliding-window layer's length: a stock
        # Mistral's static cache) goes dynamic on its first change, as in the service,
        # instead of recompiling every decode step (an nn.Module's int still does)
        if not self.by_kind(dynamic=True):
            self.extra["forward"] = torch.compile(self.model.forward, **self.kwargs(dynamic=True))

    def generate_kwargs(self, compiled: bool, scores: bool) -> dict[str, Any]:
        """``generate()``'s arguments: greedy, exactly ``new_tokens`` tokens."""
        from transformers import GenerationConfig

        cfg = self.req.model.generation
        kw: dict[str, Any] = {
            "max_new_tokens": cfg.new_tokens,
            "min_new_tokens": cfg.new_tokens,
            "do_sample": False,
            "cache_implementation": cfg.cache if compiled else "dynamic",
        }
        if hasattr(GenerationConfig(), "disable_compile"):  # ours, not generate()'s own
            kw["disable_compile"] = True
        if compiled and cfg.cache == "static" and cfg.cache_length is not None:
            kw["max_cache_len"] = cfg.cache_length
        if scores:
            kw.update(return_dict_in_generate=True, output_scores=True, output_logits=True)
        return kw

    @contextlib.contextmanager
    def _forward(self, compiled: bool) -> Iterator[None]:
        own = self.model.__dict__.get("forward")
        if compiled and "forward" in self.extra:
            self.model.forward = self.extra["forward"]
        elif own is not None:
            del self.model.forward
        try:
            yield
        finally:
            self.model.__dict__.pop("forward", None)
            if own is not None:
                self.model.forward = own

    def generate(
        self, inputs: Inputs, compiled: bool, scores: bool, clock: Clock
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        kw = {**self.generate_kwargs(compiled, scores), "streamer": clock}
        ids = prompt_of(inputs)
        if "attention_mask" not in inputs.kwargs:
            # as a tokenizer returns one prompt: every token attended. Left to
            # generate(), a prompt that holds the model's pad token (a seeded one may)
            # gets a mask that masks it, and a decode step of other inputs: graphs a
            # service's prompt never asks for, and the ones it asks for left out
            kw["attention_mask"] = torch.ones_like(ids)
        model = self.of(compiled)
        with self._forward(compiled):
            out = inputs.call(lambda *a, **k: model.generate(*a, **k, **kw))
        if not scores:
            return None
        prompt = ids.shape[1]
        return out.sequences[:, prompt:], torch.stack(out.scores, dim=1), out.logits[0]


class OwnLoop(Loop):
    """The model's own loop, gpt-fast style: ``prefill(model, input_ids, cache_length)``
    returns the first token's logits and sets up the model's cache; ``decode(model,
    token, position)`` the next token's. Compiled, both are ``torch.compile``'d with
    the target's mode (a regional target: both run as they are on a copy whose blocks
    are compiled); eager, they run as they are."""

    def compile(self) -> None:
        cfg, base = self.req.model.generation, self.req.base_path
        assert cfg.prefill is not None and cfg.decode is not None  # the config says both
        prefill, decode = load_callable(cfg.prefill, base), load_callable(cfg.decode, base)
        self.extra.update(prefill=prefill, decode=decode)
        if self.by_kind():  # the functions run eager over the compiled blocks
            self.extra.update(cprefill=prefill, cdecode=decode)
            return
        self.extra["cprefill"] = torch.compile(prefill, **self.kwargs())
        self.extra["cdecode"] = torch.compile(decode, **self.kwargs())

    def generate(
        self, inputs: Inputs, compiled: bool, scores: bool, clock: Clock
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        ids, cfg = prompt_of(inputs), self.req.model.generation
        prefill = self.extra["cprefill" if compiled else "prefill"]
        decode = self.extra["cdecode" if compiled else "decode"]
        model = self.of(compiled)
        clock.put(ids)  # the prompt, as generate() hands it over first
        steps = []
        logits = prefill(model, ids, cfg.cache_length or ids.shape[1] + cfg.new_tokens)
        for n in range(cfg.new_tokens):
            token = logits.argmax(dim=-1, keepdim=True)
            steps.append((token, logits))
            clock.put(token)
            if n + 1 < cfg.new_tokens:
                position = torch.tensor([ids.shape[1] + n], device=ids.device)
                logits = decode(model, token, position)
        if not scores:
            return None
        stacked = torch.stack([s for _, s in steps], dim=1)
        return torch.cat([t for t, _ in steps], dim=1), stacked, steps[0][1]


# a generate target's precision is its weights' dtype (as a service loads a model in
# bf16), not autocast: a static KV cache is allocated in the model's dtype
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def loop_of(
    model: Any, req: Build, inputs: Inputs, *, out: Path | None = None, load: Path | None = None
) -> Loop:
    """The target's generation: its own loop when the config gives one, else
    ``generate()``; the model in the target's precision. ``out``: where its kind's
    package goes; ``load``: the bundle's package to load instead."""
    if req.precision in DTYPES:
        model.to(DTYPES[req.precision])
    ids = prompt_of(inputs)
    kind = OwnLoop if req.model.generation.prefill is not None else HFLoop
    return kind(model, req, inputs, prompt=(ids.shape[0], ids.shape[1]), out=out, load=load)


def describe(loop: Loop, **figures: Any) -> Generation:
    """The generation's settings and ``figures`` as its document."""
    cfg = loop.req.model.generation
    return Generation(
        batch=loop.prompt[0],
        prompt=loop.prompt[1],
        new_tokens=cfg.new_tokens,
        cache=cfg.cache if isinstance(loop, HFLoop) else "own",
        loop="own" if isinstance(loop, OwnLoop) else "generate",
        **figures,
    )


def first_generations(
    req: CompileRequest | ProbeRequest, out: Path | None = None
) -> tuple[Response, Callable]:
    """``compile`` and ``probe`` of a generate target: the compiled generation of the
    configured prompt until settled (the first compiles the prefill and the decode
    step; a CUDA-graph mode records on a later one), every graph it compiled now in the
    cache dir; its first generation's time and first token. ``out``: where the kind's
    own package goes (aot: its export and package come before the first generation).
    Also returns a function that generates on other inputs."""
    model, inputs, found = build_recorded(
        req.model, req.shapes, req.base_path, req.device, req.quantize
    )
    if isinstance(req, CompileRequest):
        fits(model, req)
    check_precision(req.device, req.precision)
    record_inductor_metrics()  # so the bundle's FX entries replay bytes accessed on hits
    imports = import_inductor()
    loop = loop_of(model, req, inputs, out=out)
    breadcrumbs.enter("compile")
    start = time.perf_counter()
    try:
        loop.compile()
    except Refused as e:
        return e.response(found), lambda ins: None
    ahead = imports + time.perf_counter() - start  # aot: its export and package
    runs = []
    for n in range(3 if isinstance(req, CompileRequest) else 2):
        breadcrumbs.enter("first generation" if n == 0 else "generation")
        runs.append(loop.run(inputs))
        loop.checked()
    first = runs[0]
    resp = Response(
        ok=True,
        compile_seconds=first.e2e + ahead,
        call_seconds=[r.e2e for r in runs],
        import_seconds=imports,
        counters=snapshot_counters(),
        torch=torch.__version__,
        deps=found,
        **loop.built_docs(),
        generation=describe(
            loop, first_generate_s=first.e2e + ahead, first_token_s=first.ttft + ahead
        ),
    )
    return resp, lambda ins: loop.run(ins)
