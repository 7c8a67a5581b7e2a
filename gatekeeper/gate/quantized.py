"""The rules of quantized targets (docs/quantization.md), beside the usual ones (parity
of a quantized target is its compiled model against its own quantized eager run):

* SQNR floor: the quantized model's eager output against its own float model's (same
  seed, same inputs), in dB, below ``gate.sqnr_floor`` for its config (torchao's
  defaults: 20 dB int8 and float8, 18 dB int4): ``regressed``.
* SQNR fall: more than ``gate.sqnr_regression`` dB below the base commit's quantized
  model's SQNR (paired) or the baseline's: ``regressed`` ("SQNR vs float 41.3 -> 28.0 dB").
* the float twin (:func:`twins`, over a whole run): the quantized target's p50 and
  weight bytes as ratios of the same model's float target in the same run; slower than
  its twin is a note, or ``regressed`` with ``gate.quantized_slower = "fail"``; a twin
  whose numerics changed (parity failed) is said on the quantized target too.
"""

from __future__ import annotations

from typing import Any

from .. import metrics
from ..config import GateConfig
from ..quantize import twin_id
from ..results import Quantization, TargetResult
from .verdicts import FAILING, TargetVerdict, Verdict, worst


def _db(x: float | None) -> str:
    return metrics.get("sqnr").fmt(x)


def sqnr(
    v: TargetVerdict,
    found: set[Verdict],
    result: TargetResult,
    base: Quantization | None,
    rules: GateConfig,
) -> None:
    """The SQNR floor, and the fall from the base's SQNR (``base``: the base commit's
    quantized model, paired, else the baseline's)."""
    q = result.quantization
    if q is None or q.sqnr_db is None:
        return
    floor = rules.sqnr_floor.get(q.config)  # type: ignore[call-overload]
    if floor is not None and q.sqnr_db < floor:
        found.add("regressed")
        v.reasons.append(
            f"{metrics.get('sqnr').label} {_db(q.sqnr_db)} is below the {q.config} floor "
            f"of {floor:g} dB (gate.sqnr_floor)"
        )
    if base is None or base.sqnr_db is None:
        return
    fall = base.sqnr_db - q.sqnr_db
    m = metrics.get("sqnr")
    said = f"{m.label} {_db(base.sqnr_db)} -> {_db(q.sqnr_db)}"
    threshold = m.setting(rules) or 0.0
    if fall > threshold:
        found.add("regressed")
        v.reasons.append(f"{said} (-{fall:.1f} dB, threshold {m.amount_text(threshold)})")
    elif abs(fall) >= 0.05:
        v.notes.append(said)


def requantized(result: TargetResult, base: Quantization | None) -> bool:
    """Whether the change quantizes otherwise than the base (another config argument,
    other modules, another torchao): its outputs are then meant to differ from the
    base's, and SQNR vs float, not parity vs the base, judges them."""
    q = result.quantization
    if q is None or base is None:
        return False
    return (q.config, q.options, q.modules, q.torchao) != (
        base.config,
        base.options,
        base.modules,
        base.torchao,
    )


def ratios(result: TargetResult, twin: TargetResult) -> dict[str, float | str | None]:
    """A quantized target's p50 and weight bytes as ratios of its float twin's."""
    lat = result.latency.compiled.p50 if result.latency else None
    twin_lat = twin.latency.compiled.p50 if twin.latency else None
    q = result.quantization
    return {
        "twin": twin.target,
        "latency": lat / twin_lat if lat and twin_lat else None,
        "weights": q.weight_bytes / q.float_weight_bytes
        if q is not None and q.float_weight_bytes
        else None,
    }


def twins(rows: list[Any]) -> None:
    """Each quantized row beside its float twin in the same run: the ratios on its
    verdict (``twin``), the slower-than-float rule, and the twin's parity failure.
    ``rows``: :class:`gatekeeper.gate.rules.GateRow` (which imports this module)."""
    by_id = {row.result.target: row for row in rows}
    for row in rows:
        twin = by_id.get(twin_id(row.result.target) or "")
        if twin is None or row.result.quantization is None:
            continue
        v, name = row.verdict, row.result.quantization.config
        v.twin = ratios(row.result, twin.result)
        if twin.verdict.verdict == "parity-failed":
            said = (
                f"its float model {twin.result.target} failed parity: the float model's "
                "numerics changed, so this quantized model's did too"
            )
            (v.reasons if v.verdict in FAILING else v.notes).append(said)
        lat = v.twin["latency"]
        if not isinstance(lat, float) or lat <= 1.0:
            continue
        said = f"{name} is slower than its float twin: {lat:.2f}x its latency"
        if v.rules is not None and v.rules.quantized_slower == "fail" and not v.disturbed:
            v.reasons.append(f'{said} (gate.quantized_slower = "fail")')
            v.verdict = worst([v.verdict, "regressed"])
        else:
            v.notes.append(said)
