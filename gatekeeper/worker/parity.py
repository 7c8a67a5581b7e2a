"""Parity: does the compiled model compute what eager (or the baseline) computed?

First the structure: the output tree (container types, dict keys as a set, sequence
lengths) and each leaf's dtype and shape must match, or the check fails naming the leaf.
Then the numbers, leaf by leaf (dict keys matched by name, so their order is free), as
PyTorch's accuracy checks judge a compiled model (``torch._dynamo.utils.same``): a tensor
passes by allclose; else by the fp64-reference RMSE test: no further from the float64
eager output than RMSE_MULTIPLIER times eager's own error (the comparand's); else, for
fp16/bf16 leaves only, by cosine similarity. NaN/Inf always fails.

On a GPU with TF32 tensor cores, :mod:`gatekeeper.worker.tf32` says under which settings
the calls compared run (cuDNN's TF32 off, as in PyTorch's accuracy runs, where that does
not change the compiled model) and, where the compiled model's kernels may still use
TF32, eager's own error is also taken at TF32 (the ``tf32-rmse`` rung).
"""

from __future__ import annotations

import copy
import functools
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import ParityTolerance
from ..errors import first_line
from .calls import Inputs, entry
from .filed import let_go
from .fp64 import COPY_LIMIT, Float64Kernels, in_float64, plain, weight_bytes
from .memory import give_back
from .outputs import Outputs, UnreadableOutput
from .tf32 import accuracy_settings, precise, tf32_eager, tf32_in_force

__all__ = [
    "Later",
    "Outputs",
    "UnreadableOutput",
    "check_parity",
    "load_reference",
    "save_reference",
    "vs_eager",
]

LOW_PRECISION = (torch.float16, torch.bfloat16)
MAX_NAMED = 8  # leaves named in a failure's detail besides the first
# compiled may be this many times further from fp64 than eager is (PyTorch's same(): 3 for
# fp16/bf16 and small tensors, 2 for larger fp32 ones)
RMSE_MULTIPLIER = 3.0
#: elements of a leaf compared at a time: each float64 temporary of a comparison is at
#: most 8 MiB, not the leaf's size (the logits of a 152k-word vocabulary over 128 tokens
#: are 155 MB in float64: compared whole, a Qwen2-0.5B check held about 1 GB more)
CHUNK = 1 << 20
# reference files: {"format", "structure", "leaves", "fp64"}; a distributed target's
# (rank 0's) adds "ranks": {"<rank>": the same three of each other rank}
REFERENCE_FORMAT = 2


def save_reference(path: str, compiled: Outputs, fp64: Outputs | None) -> None:
    """The reference file: ``compiled``'s leaves and their float64 twin, written a
    chunk at a time (:func:`gatekeeper.worker.saving.save`: a leaf that lies in a file
    of the scratch is not read into memory whole)."""
    from .saving import save

    doc = {
        "format": REFERENCE_FORMAT,
        "structure": compiled.structure,
        "leaves": compiled.to_cpu().leaves,
        "fp64": fp64.to_cpu().leaves if fp64 is not None else None,
    }
    save(path, doc)


def gather_references(path: str | None) -> None:
    """A distributed target's ranks, once each wrote its reference outputs (rank ``n``
    to ``<path>.rank<n>``, :func:`gatekeeper.worker.team.localize`): rank 0's file
    made to hold every rank's."""
    from .team import current

    team = current()
    if team is None or not path:
        return
    team.barrier()  # every rank's file is written
    if team.rank != 0:
        return
    doc = torch.load(path, weights_only=True)
    doc["ranks"] = {}
    for rank in range(1, team.world_size):
        other = Path(f"{path}.rank{rank}")
        doc["ranks"][str(rank)] = torch.load(other, weights_only=True)
        other.unlink()
    torch.save(doc, path)


def load_reference(path: str) -> tuple[Outputs, dict[str, Any] | None]:
    """A baseline's reference outputs (and their fp64 twin), of either format; a
    distributed target's rank reads its own."""
    try:  # mapped: a leaf's pages are read as it is compared, the fp64 ones only if needed
        doc = torch.load(path, weights_only=True, mmap=True)
    except RuntimeError:  # a file of torch's legacy (not zip) format cannot be mapped
        doc = torch.load(path, weights_only=True)
    from .team import current

    if (team := current()) is not None and team.rank != 0:
        doc = doc.get("ranks", {}).get(str(team.rank), doc)
    if doc.get("format") == REFERENCE_FORMAT:
        return Outputs(doc["structure"], doc["leaves"]), doc.get("fp64")
    # format 1: flat lists in tree_flatten order, no structure
    flat = {f"[{i}]": v for i, v in enumerate(doc["compiled"])}
    fp64 = doc.get("fp64")
    return Outputs(None, flat), (
        {f"[{i}]": v for i, v in enumerate(fp64)} if fp64 is not None else None
    )


def read_reference(path: str) -> tuple[Outputs, dict[str, Any] | None] | None:
    """:func:`load_reference`, or None (and a warning on stderr) for a file that does
    not load with ``weights_only=True``: a reference an older gatekeeper wrote while it
    pickled a cache object. Parity against it is skipped, never failed."""
    try:
        return load_reference(path)
    except Exception as e:  # an unreadable reference is no comparison
        print(
            f"gatekeeper: the baseline's reference outputs do not load ({first_line(e, 200)}): "
            "parity against them is skipped",
            file=sys.stderr,
        )
        return None


def fp64_reference(model: Any, inputs: Inputs, call: str | None = None) -> Outputs | None:
    """The eager model's outputs (its method ``call``'s; a plain function's) computed in
    float64, under :func:`precise` (for whatever a model computes in another dtype
    inside), or None where it cannot run so. A module computes in float64 module by
    module on its own weights (:func:`gatekeeper.worker.fp64.in_float64`), not on a
    float64 copy of itself; one that cannot (a weight read outside its own module) is
    copied whole only while small (``COPY_LIMIT``)."""
    if not isinstance(model, torch.nn.Module):
        return _in_fp64(model, inputs, call)
    out = None
    if plain(model):  # a sharded model's (DTensor) weights: the copy, as it always had
        with in_float64(model):
            out = _in_fp64(model, inputs, call)
    if out is None and (weight_bytes(model) <= COPY_LIMIT or not plain(model)):
        try:
            return _in_fp64(copy.deepcopy(model).double(), inputs, call)
        except Exception:  # FSDP2 refuses a deep copy: the RMSE test is skipped
            return None
    return out


def _in_fp64(model: Any, inputs: Inputs, call: str | None) -> Outputs | None:
    try:
        with torch.no_grad(), precise(), Float64Kernels():
            return Outputs.of(inputs.double().call(entry(model, call)))
    except Exception:  # a model with fp32-only kernels: the RMSE test is skipped
        return None


def vs_eager(
    candidate: Outputs,
    eager: Callable,
    model: Any,
    inputs: Inputs,
    call: str | None,
    device: str,
    tol: ParityTolerance,
    baked: bool = False,
) -> tuple[dict, Later]:
    """The compiled outputs ``candidate`` against ``eager``'s, computed under the same
    :func:`~gatekeeper.worker.tf32.accuracy_settings` (``baked``: the compiled model's
    convolutions read cuDNN's TF32 flag when compiled), eager's own error measured from
    the fp64 reference and, where the compiled kernels may use TF32, at TF32 too; and
    that fp64 reference as a :class:`Later` (its ``value()``: None where the model
    cannot run in float64), computed by then only if a leaf needed it."""
    with torch.no_grad(), accuracy_settings(device, baked):
        out = Outputs.of(inputs.call(eager))
        tf32 = tf32_eager(eager, inputs, *tf32_in_force(device, baked))
    ref64 = Later(lambda: fp64_reference(model, inputs, call))
    got = check_parity(candidate, out, ref64, tol, tf32.leaves if tf32 else None)
    del out, tf32
    give_back()  # eager's outputs and its call's temporaries, before the float64 model runs
    return got, ref64


class Later:
    """The float64 reference, computed the first time something needs it: a leaf that
    allclose refused (its RMSE rung), else whoever saves the reference, once eager's
    outputs are gone. Where allclose decides every leaf, eager's outputs, the compiled
    ones and the float64 ones are never held at once (a 152k-word vocabulary's logits
    over 128 tokens: 78 MB, 78 MB and 156 MB)."""

    def __init__(self, make: Callable[[], Outputs | None]) -> None:
        self._make: Callable[[], Outputs | None] | None = make
        self._value: Outputs | None = None

    def value(self) -> Outputs | None:
        if self._make is not None:
            make, self._make = self._make, None
            self._value = make()
        return self._value

    def get(self, key: str) -> Any:
        value = self.value()
        return None if value is None else value.leaves.get(key)


def _chunks(*ts: torch.Tensor, dtype: torch.dtype = torch.float64) -> Iterator[list[torch.Tensor]]:
    """Tensors of one shape, flattened, :data:`CHUNK` elements at a time, in ``dtype``;
    the pages of a chunk of one that lies in a file of the scratch (the first call's
    kept outputs, the float64 logits) handed back once it is used."""
    flat = [t.reshape(-1) for t in ts]
    n = flat[0].numel()
    for i in range(0, n, CHUNK):
        yield [f[i : i + CHUNK].to(dtype) for f in flat]
        for f in flat:
            let_go(f, i * f.element_size(), min(CHUNK, n - i) * f.element_size())


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.numel():
        return 0.0
    return math.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in _chunks(a, b)) / a.numel())


@dataclass
class _Leaf:
    """One leaf against its comparand, in float64 (:data:`CHUNK` by chunk)."""

    max_abs: float = 0.0
    rmse: float = 0.0
    cosine: float = 1.0

    @classmethod
    def of(cls, c: torch.Tensor, o: torch.Tensor) -> _Leaf:
        if not c.numel():
            return cls()
        big, squares, dot, cc, oo = 0.0, 0.0, 0.0, 0.0, 0.0
        for x, y in _chunks(c, o):
            d = x - y
            big = max(big, float(d.abs().max()))
            squares += float((d * d).sum())
            dot += float((x * y).sum())
            cc += float((x * x).sum())
            oo += float((y * y).sum())
        # torch's cosine_similarity: x.y / max(|x| |y|, eps)
        cos = dot / max(math.sqrt(cc) * math.sqrt(oo), 1e-8)
        return cls(big, math.sqrt(squares / c.numel()), cos)


def _allclose(c: torch.Tensor, o: torch.Tensor, tol: ParityTolerance) -> bool:
    """``torch.allclose`` of the two in float32, chunk by chunk."""
    return all(
        torch.allclose(x, y, atol=tol.atol, rtol=tol.rtol)
        for x, y in _chunks(c, o, dtype=torch.float32)
    )


def _fail(method: str, detail: str, **extra: Any) -> dict:
    return {"passed": False, "method": method, "detail": detail, **extra}


def _pairs(candidate: Outputs, other: Outputs) -> list[tuple[str, Any, Any, str]] | dict:
    """(path, candidate leaf, other leaf, the other's key) to compare, or a failure."""
    if other.structure is None:  # an old reference: leaves in order
        cand, oth = list(candidate.leaves.items()), list(other.leaves.items())
        if len(cand) != len(oth):
            return _fail("structure", f"{len(cand)} output leaves, expected {len(oth)}")
        return [(p, c, o, k) for (p, c), (k, o) in zip(cand, oth, strict=True)]
    mine = candidate.structure or {}
    if mine != other.structure:
        for path in sorted(set(mine) | set(other.structure)):
            got, want = mine.get(path), other.structure.get(path)
            if got != want:
                return _fail("structure", f"{path}: {got or 'a leaf'}, expected {want or 'a leaf'}")
    if candidate.leaves.keys() != other.leaves.keys():
        path = sorted(candidate.leaves.keys() ^ other.leaves.keys())[0]
        return _fail(
            "structure",
            f"{path}: only in {'the candidate' if path in candidate.leaves else 'the reference'}",
        )
    return [(p, c, other.leaves[p], p) for p, c in candidate.leaves.items()]


def within_error(c: torch.Tensor, o: torch.Tensor, ref: Any, tf32: Any) -> str | None:
    """The RMSE rungs for one leaf that allclose refused: ``fp64-rmse`` when ``c`` is no
    further from the fp64 reference ``ref`` than RMSE_MULTIPLIER times eager's own
    error (``o``'s, or at TF32 ``tf32``'s where that is larger); ``tf32-rmse`` when only
    eager's TF32 error admits it (measured from ``ref``, else from ``o`` itself where no
    fp64 reference could be computed); None when neither does."""
    shaped = [
        x.cpu() if isinstance(x, torch.Tensor) and x.shape == c.shape else None for x in (ref, tf32)
    ]
    ref, tf32 = shaped
    if ref is not None:
        own = _rmse(o, ref)
        if _rmse(c, ref) <= RMSE_MULTIPLIER * own + 1e-12:
            return "fp64-rmse"
        if tf32 is not None and _rmse(c, ref) <= RMSE_MULTIPLIER * _rmse(tf32, ref) + 1e-12:
            return "tf32-rmse"
        return None
    if tf32 is not None and _rmse(c, o) <= RMSE_MULTIPLIER * _rmse(tf32, o) + 1e-12:
        return "tf32-rmse"
    return None


_RUNGS = ["allclose", "fp64-rmse", "tf32-rmse", "cosine"]


@dataclass
class _Tally:
    """What a parity check found over the leaves so far."""

    method: str = "allclose"  # the highest rung of the ladder a leaf needed
    max_abs: float = 0.0
    worst_rmse: float = 0.0
    min_cos: float = 1.0
    failed: list[tuple[str, str]] = field(default_factory=list)  # every leaf that differs

    def figures(self) -> dict[str, float]:
        return {"max_abs_err": self.max_abs, "rmse": self.worst_rmse, "cosine": self.min_cos}


def check_parity(
    candidate: Outputs,
    other: Outputs,
    ref64: dict[str, Any] | Later | None,
    tol: ParityTolerance,
    tf32: dict[str, Any] | None = None,
) -> dict:
    """Is ``candidate`` the same computation as ``other`` (see the module docstring)?
    ``ref64``: the float64 reference's leaves, read only for a leaf allclose refused
    (a :class:`Later` is computed then). ``tf32``: eager's outputs at TF32
    (:func:`tf32_eager`), where the device runs so."""
    pairs = _pairs(candidate, other)
    if isinstance(pairs, dict):
        return pairs
    tally = _Tally()
    for path, c, o, key in pairs:
        if (mismatch := _mismatch(path, c, o)) is not None:
            return mismatch
        if not isinstance(c, torch.Tensor):
            if c != o:
                tally.failed.append((path, f"{path}: {c!r}, expected {o!r}"))
            continue
        c, o = c.detach().cpu(), o.detach().cpu()
        if not c.is_floating_point():
            if not torch.equal(c, o):
                tally.failed.append((path, f"{path} differs"))
            continue
        if not all(bool(torch.isfinite(x).all()) for (x,) in _chunks(c, dtype=c.dtype)):
            return _fail("nan-inf", f"{path} has NaN or Inf")
        ref = functools.partial(ref64.get, key) if ref64 is not None else lambda: None
        _compare(tally, path, c, o, tol, ref, (tf32 or {}).get(key))
    if tally.failed:
        detail = tally.failed[0][1]
        if len(tally.failed) > 1:
            others = [p for p, _ in tally.failed[1:]]
            shown = ", ".join(others[:MAX_NAMED])
            more = f" and {len(others) - MAX_NAMED} more" if len(others) > MAX_NAMED else ""
            detail += f"; also differ: {shown}{more}"
        return _fail("failed", detail, **tally.figures())
    return {"passed": True, "method": tally.method, **tally.figures()}


def _mismatch(path: str, c: Any, o: Any) -> dict | None:
    """A leaf of another kind, dtype or shape: the outputs differ in structure."""
    if isinstance(c, torch.Tensor) != isinstance(o, torch.Tensor):
        return _fail(
            "structure",
            f"{path}: {'a tensor' if isinstance(c, torch.Tensor) else type(c).__name__}"
            f", expected {'a tensor' if isinstance(o, torch.Tensor) else type(o).__name__}",
        )
    if not isinstance(c, torch.Tensor):
        return None
    if c.dtype != o.dtype:
        return _fail(
            "dtype",
            f"{path}: dtype {str(c.dtype).removeprefix('torch.')}, "
            f"expected {str(o.dtype).removeprefix('torch.')}",
        )
    if c.shape != o.shape:
        return _fail("shape", f"{path}: shape {tuple(c.shape)}, expected {tuple(o.shape)}")
    return None


def _compare(
    tally: _Tally,
    path: str,
    c: torch.Tensor,
    o: torch.Tensor,
    tol: ParityTolerance,
    ref: Callable[[], Any],
    tf32: Any,
) -> None:
    """One floating-point leaf up the ladder: allclose, the fp64 (or TF32) reference's
    error (``ref()``: the reference's leaf, read only past allclose), cosine for a
    low-precision dtype; else it differs. Compared a chunk at a time (:data:`CHUNK`):
    never a float64 copy of a whole leaf."""
    leaf = _Leaf.of(c, o)
    tally.max_abs = max(tally.max_abs, leaf.max_abs)
    tally.worst_rmse = max(tally.worst_rmse, leaf.rmse)
    cos = leaf.cosine
    tally.min_cos = min(tally.min_cos, cos)
    if _allclose(c, o, tol):
        return
    rung = within_error(c, o, ref(), tf32)
    if rung is not None:
        tally.method = max(tally.method, rung, key=_RUNGS.index)
        return
    if c.dtype in LOW_PRECISION and cos >= tol.cosine:
        tally.method = "cosine"
        return
    tally.failed.append(
        (
            path,
            f"{path}: max |diff| {leaf.max_abs:.3g} beyond atol {tol.atol:g} / rtol {tol.rtol:g}",
        )
    )
