"""``bisect``'s report: markdown for people (report.md, the job summary, an issue
comment) and one JSON document for tools. Nothing here measures or decides."""

from __future__ import annotations

import json
from pathlib import Path

from tabulate import tabulate

from ..errors import GatekeeperError
from ..report.markdown import md_code, md_text
from .engine import TargetBisect
from .measure import Measurement

VERDICT = {"good": "like good", "bad": "changed", "undecided": "undecided", "skip": "skipped"}


def document(done: list[TargetBisect], *, min_effect: float | None, report: Path) -> dict:
    rng = done[0].range if done else None
    return {
        "command": "bisect",
        "metric": done[0].metric if done else None,
        "min_effect": min_effect,
        "range": rng.as_dict() if rng else None,
        "targets": [tb.as_dict() for tb in done],
        "exit_code": exit_code(done),
        "report": str(report),
    }


def exit_code(done: list[TargetBisect]) -> int:
    """0: every target has its culprit; 1: one has none (not reproducible, or the
    commits that may be it could not be told apart)."""
    return 0 if done and all(tb.found for tb in done) else 1


def _commit(c) -> str:
    return f"{md_code(c.short)} {md_text(c.subject, 80)}"


def _table(rows: list[list[str]], headers: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _steps(steps: list[Measurement]) -> list[str]:
    tested = [m for m in steps if m.outcome != "skip"]
    skipped = [m for m in steps if m.outcome == "skip"]
    out = []
    if tested:
        rows = [
            [
                str(n),
                _commit(m.commit),
                md_text(m.figure.text if m.figure else "", 160),
                VERDICT[m.outcome],
                str(m.attempts),
            ]
            for n, m in enumerate(tested, 1)
        ]
        headers = ["#", "commit", "against good", "verdict", "measurements"]
        out += ["**Measured**, in order, each paired with the good commit:\n"]
        out += [_table(rows, headers), ""]
    if skipped:
        rows = [[_commit(m.commit), md_text(m.why or "", 200)] for m in skipped]
        out += ["**Skipped** (could not be measured):\n", _table(rows, ["commit", "why"]), ""]
    return out


def _headline(tb: TargetBisect) -> list[str]:
    c = tb.conclusion
    if c.status == "found":
        culprit = tb.culprit
        assert culprit is not None
        effect = tb.effect() or {}
        vs_good = effect.get("vs_good") or {}
        lines = [
            f"**Culprit: {_commit(culprit)}** by {md_text(culprit.author)}, {culprit.date}\n",
            f"- against its parent {md_code(tb.parent.short if tb.parent else '')}: "
            f"{md_text(effect.get('text', 'not measured'))}",
            f"- against good {md_code(tb.range.good.short)}: {md_text(vs_good.get('text', ''))}",
        ]
        if effect.get("outcome") == "good":
            lines.append(
                "- alone, this commit's change is not past the threshold: it is the first "
                "commit past it, and the change built up over the commits before it"
            )
        elif not effect.get("confirmed"):
            lines.append("- against its parent alone, the change was not decided")
        lines += ["", f"Reproduce: {md_code(tb.reproduce())}", ""]
        return lines
    if c.status == "ambiguous":
        names = ", ".join(_commit(tb.range.commits[i]) for i in c.candidates)
        return [
            "**No single culprit**: the first changed commit is one of "
            f"{names} (the others were skipped or undecided; see below).",
            "",
        ]
    bad = tb.bad_step()
    said = bad.figure.text if bad and bad.figure else (bad.why if bad else "bad was not measured")
    return [
        f"**Not reproducible**: bad {md_code(tb.range.bad.short)} against good "
        f"{md_code(tb.range.good.short)}: {md_text(said)}"
        + (" (undecided)" if bad and bad.outcome == "undecided" else ""),
        "",
    ]


def _section(tb: TargetBisect) -> list[str]:
    out = [f"## {md_code(tb.target)}", "", *_headline(tb), *_steps(tb.steps)]
    if tb.stored:
        used = f"{len(tb.hints)} of them narrowed the range" if tb.hints else "none narrowed it"
        out += [f"Stored baselines: {len(tb.stored)} commit(s) of the range have one; {used}.", ""]
    if tb.confirm_report is not None and tb.confirm_report.is_file():
        out += [
            "<details><summary>The culprit against its parent: the gate's report, "
            "with the profile diff</summary>",
            "",
            tb.confirm_report.read_text(),
            "</details>",
            "",
        ]
    return out


def markdown(done: list[TargetBisect], *, min_effect: float | None) -> str:
    rng = done[0].range
    effect = f", min effect {min_effect:.0%}" if min_effect is not None else ""
    head = [
        f"# gatekeeper bisect: {done[0].metric}",
        "",
        f"{rng.size} commit(s) after good {_commit(rng.good)} up to bad {_commit(rng.bad)}"
        f"{effect}.",
        "",
    ]
    return "\n".join(head + [line for tb in done for line in _section(tb)]).rstrip() + "\n"


def write(done: list[TargetBisect], path: Path, *, min_effect: float | None) -> tuple[str, dict]:
    """report.md and report.json; both returned."""
    text = markdown(done, min_effect=min_effect)
    doc = document(done, min_effect=min_effect, report=path)
    try:
        path.write_text(text)
        path.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    except OSError as e:
        raise GatekeeperError(f"cannot write the report {path}: {e.strerror or e}") from None
    return text, doc
