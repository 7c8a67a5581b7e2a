"""gpu_smoke's tables: ``smoke.json`` as markdown, and the generated part of docs/gpu.md
(between its ``<!-- gpu_smoke -->`` markers), with the machine, torch and commit."""

from __future__ import annotations

import statistics
from pathlib import Path

DEFAULT = ("study", "paths", "detection", "parity")
BEGIN, END = "<!-- gpu_smoke: begin -->", "<!-- gpu_smoke: end -->"
COMMAND = "python benchmarks/gpu_smoke.py --out OUT --docs docs/gpu.md"
THRESHOLD = 0.05  # the default latency_regression


def _s(x: float | None, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}f} s"


def _table(rows: list[list], headers: list[str]) -> str:
    """A markdown table as docs/ writes them (no padding; a ``|`` in a cell escaped)."""
    if not rows:
        return "(nothing measured)"

    def line(cells: list) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(headers), "|" + "---|" * len(headers), *map(line, rows)])


def study(sec: dict) -> str:
    rows = [[step, said] for step, said in sec.get("steps", {}).items()]
    return f"{sec.get('model', '')}\n\n" + _table(rows, ["child process", "how it ended"])


def paths(sec: dict) -> str:
    """The mode × strategy table: what each deploy path costs on this machine."""
    compiled, warm = sec.get("compile", {}), sec.get("warm", {})
    alone = sec.get("precompiled", {})
    checked, loaded, pr = sec.get("check", {}), sec.get("load_aot", {}), sec.get("pr", {})
    rows = []
    for target in sorted(set(compiled) | set(checked)):
        if target == "error":
            continue
        c, w, k = compiled.get(target, {}), warm.get(target, {}), checked.get(target, {})
        aot = loaded.get(target, {})
        first = w.get("first_call_seconds")
        calls = w.get("call_seconds") or []
        p = alone.get(target, {})
        served = p.get("first_call_seconds") if p.get("dynamo") == "skipped" else None
        vs = ((k.get("parity") or {}).get("vs_eager") or {}).get("method")
        p50, eager = k.get("p50"), k.get("eager_p50")
        rows.append(
            [
                target,
                c.get("status") if c.get("status") != "unavailable" else c.get("error"),
                _s(c.get("compile_seconds"), 1),
                "" if target.endswith("+aot") else _s(first),
                _s(served) if served else p.get("precompile_reason") or "",
                _s(aot.get("load_and_first_call_s")) if aot else "",
                _s(calls[1]) if len(calls) > 2 and "reduce-overhead" in target else "",
                f"{p50 * 1e3:.3f} ms" if p50 else k.get("error") or "",
                f"{eager / p50:.2f}x" if p50 and eager else "",
                vs or "",
                pr.get(target, ""),
            ]
        )
    table = _table(
        rows,
        [
            "target",
            "compile",
            "cold compile",
            "warm first call (Dynamo traced)",
            "precompiled first call",
            "aot: load + first call",
            "CUDA graph capture (2nd call)",
            "p50",
            "speedup",
            "parity",
            "unchanged PR",
        ],
    )
    notes = [
        f"- `{t}` through `gatekeeper.load_aot` in a fresh process: import torch "
        f"{_s(a.get('import_torch_s'))}, then load + first call "
        f"{_s(a.get('load_and_first_call_s'))}; torch._inductor imported: "
        f"{a.get('inductor_imported')}; vs eager: "
        f"{(a.get('parity') or {}).get('method')} "
        f"({'pass' if (a.get('parity') or {}).get('passed') else 'FAIL'})"
        if "error" not in a
        else f"- `{t}` through `gatekeeper.load_aot`: {a['error']}"
        for t, a in loaded.items()
    ]
    return table + ("\n\n" + "\n".join(notes) if notes else "")


def detection(sec: dict) -> str:
    groups: dict[int, list[dict]] = {}
    for t in sec.get("trials", []):
        groups.setdefault(t["slowdown"], []).append(t)
    rows, note = [], ""
    for pct, ts in sorted(groups.items()):
        deltas = [t["delta"] for t in ts if t.get("delta") is not None]
        widths = [(t["ci"][1] - t["ci"][0]) / 2 for t in ts if t.get("ci") and None not in t["ci"]]
        rows.append(
            [
                f"{pct}%",
                len(ts),
                sum(t["verdict"] == "regressed" for t in ts),
                sum(t["verdict"] == "improved" for t in ts),
                sum(t["verdict"] == "inconclusive" for t in ts),
                f"{statistics.median(deltas):+.1%}" if deltas else "",
                f"±{statistics.median(widths):.1%}" if widths else "",
            ]
        )
        if pct == 0 and widths:  # regressed needs the whole interval beyond the threshold
            smallest = THRESHOLD + statistics.median(widths)
            note = (
                f"\n\nSmallest slowdown the paired gate calls `regressed` here: about "
                f"{smallest:.1%} (the {THRESHOLD:.0%} threshold plus the median half-width "
                "of an unchanged run's 95% interval)."
            )
    return (
        _table(
            rows,
            [
                "slowdown",
                "trials",
                "regressed",
                "improved",
                "inconclusive",
                "median Δ",
                "median CI",
            ],
        )
        + note
        + (f"\n\n{sec['error']}" if sec.get("error") else "")
    )


def parity(sec: dict) -> str:
    rows = [
        [t, x.get("verdict"), "; ".join(x.get("reasons") or []) or ""]
        for t, x in (sec.get("pr") or {}).items()
        if isinstance(x, dict)
    ]
    out = _table(rows, ["target (pull request, paired with main)", "verdict", "reasons"])
    errors = sec.get("errors") or {}
    if errors:
        rows = [[k, f"{v:.2e}" if isinstance(v, float) else v] for k, v in errors.items()]
        out += "\n\n" + _table(rows, ["ResNet logits", "RMSE from float64"])
    return out


RENDER = {"study": study, "paths": paths, "detection": detection, "parity": parity}
TITLES = {
    "study": "AOTInductor by hand",
    "paths": "Every deploy path",
    "detection": "Detection power, paired",
    "parity": "Parity: the stock ResNet and planted changes",
    "zoo": "The zoo",
}


def render(doc: dict) -> str:
    m = doc.get("machine") or {}
    size = "tiny models" if (doc.get("run") or {}).get("tiny") else "smoke sizes"
    out = [
        f"Measured on {m.get('device', '?')} with torch {m.get('torch', '?')} at commit "
        f"`{m.get('commit', '?')}` ({size}):",
        "",
        "```bash",
        COMMAND,
        "```",
    ]
    for name in (*DEFAULT, "zoo"):
        sec = doc.get(name)
        if sec is None:
            continue
        body = sec["error"] if "error" in sec and len(sec) <= 2 else RENDER.get(name, _zoo)(sec)
        out += ["", f"### {TITLES[name]} ({sec.get('seconds', 0):.0f} s)", "", body]
    return "\n".join(out) + "\n"


def _zoo(sec: dict) -> str:
    rows = [
        [f.get("name"), ", ".join(f"{k}: {v}" for k, v in f.get("stages", {}).items())]
        for f in sec.get("families", [])
    ]
    return _table(rows, ["family", "stages"])


def write_docs(path: Path, doc: dict) -> None:
    """Replace the generated part of ``path`` (between its markers) with the tables."""
    text = path.read_text()
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"gpu_smoke: {path} has no {BEGIN} ... {END} part to rewrite")
    path.write_text(f"{head}{BEGIN}\n\n{render(doc)}\n{END}{tail}")
