"""The report's "Which mode?" section: each model's modes (and strategies) side by side,
compile cold, deploy first call, p50, speedup, peak memory and the calls that pay a
compile back (:mod:`.advice` decides; this renders)."""

from __future__ import annotations

import math
from typing import Any

from .. import units
from ..gate import GateReport
from ..units import DASH
from .advice import Advice, advise
from .text import MAX_REASON_CHARS, md_code, md_table, md_text


def _calls(n: float | None) -> str:
    if n is None:
        return DASH
    return "never" if math.isinf(n) else f"{math.ceil(n):,}"


def _advice_note(f: Any) -> str:
    if not f.ok:
        return "❌ parity"
    if f.loads_package and f.verified is not True:
        return "package not verified" if f.verified is None else "❌ package rejected"
    return ""


def _advice_block(a: Advice) -> str:
    rows = [
        [
            md_code(f.label, table=True),
            units.seconds(f.cold_s),
            units.seconds(f.warm_s),
            units.seconds(f.p50),
            units.speedup(f.speedup),
            units.mib(f.peak),
            f"{_calls(f.break_even(f.cold_s))} / {_calls(f.break_even(f.warm_s))}",
            _advice_note(f),
        ]
        for f in a.modes
    ]
    rows += [
        [md_code(label, table=True), *[DASH] * 6, md_text(why, MAX_REASON_CHARS)]
        for label, why in a.unavailable
    ]
    table = md_table(
        rows,
        [
            "mode+strategy" if a.strategies else "mode",
            "compile cold",
            "deploy first call",
            "p50",
            "speedup vs eager",
            "peak MiB",
            "break-even calls (cold / warm)",
            "note",
        ],
    )
    lines = [f"**{md_text(a.model)} / {md_text(a.shapes)}**", "", table, ""]
    if a.serving:
        lines.append(f"- serving: {md_code(a.serving)} — {md_text(a.serving_rule)}")
    if a.short_job:
        lines.append(f"- short jobs: {md_code(a.short_job)} — {md_text(a.short_job_rule)}")
    return "\n".join(lines)


def mode_advice(report: GateReport) -> str | None:
    advice = advise([row.result for row in report.rows])
    if not advice:
        return None
    strategies = any(a.strategies for a in advice)
    return "\n\n".join(
        [
            "### Which mode and strategy?" if strategies else "### Which mode?",
            "<sub>Break-even: compile time ÷ time saved per "
            "call against eager. Cold: an empty cache; deploy first call: the first call "
            "in a new process after a warm start from the bundle (aot: the package "
            "loaded).</sub>",
            *[_advice_block(a) for a in advice],
        ]
    )
