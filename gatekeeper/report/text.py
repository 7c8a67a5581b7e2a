"""What the markdown report is written with: its marks, caps and arrows, the escaping
that keeps text from the measured code literal, and tables. No I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from ..gate import GateReport, GateRow, Verdict
from ..gate.verdicts import severity
from ..units import DASH

MAX_MARKDOWN_CHARS = 60_000
ARROW = "→"
EMOJI: dict[Verdict, str] = {
    "pass": "✅",
    "improved": "🚀",
    "regressed": "❌",
    "parity-failed": "❌",
    "inconclusive": "🟡",
    "accepted": "☑️",
    "no-baseline": "⚪",
    "error": "⚠️",
}

# caps that keep one pathological target from filling the whole report
MAX_BREAKS_LISTED = 50  # graph breaks listed per target in its details
MAX_REASON_CHARS = 500  # one graph-break reason / gate reason in a table or list
MAX_ERROR_CHARS = 3000  # an error's text in its details (the tail is kept)
MAX_LIST_ITEMS = 100  # added / removed / re-measured target lists

MD_ESCAPES = str.maketrans(
    {
        **{c: "\\" + c for c in "\\`*_[]|~#!"},
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "@": "@\u200b",
    }
)
NEWLINES = re.compile(r"\r\n|\r|\n")


# ------------------------------------------------------------------------------ escaping


def truncate(text: str, limit: int | None) -> str:
    if limit is not None and len(text) > limit:
        return text[: max(0, limit - 1)].rstrip() + "…"
    return text


def md_text(text: Any, limit: int | None = None) -> str:
    """``text`` as one line of literal markdown, safe in a table cell and in a list item.

    Markdown punctuation (backslash, backticks, ``*``, ``_``, brackets, ``|``, ``~``,
    ``#``, ``!``) is backslash-escaped, ``&``/``<``/``>`` become entities, newlines
    become ``<br>``, and ``@`` gets a zero-width space so that ``@torch.no_grad`` in a
    reason mentions nobody. ``limit`` truncates the raw text first (with "…").
    """
    s = truncate(str(text), limit)
    return NEWLINES.sub("<br>", s.strip().translate(MD_ESCAPES))


def md_code(text: Any, *, table: bool = False) -> str:
    """``text`` as an inline code span (a fence longer than any backtick run inside it).
    In a table cell ``|`` must still be escaped, even inside code (GFM)."""
    s = " ".join(str(text).split())  # no newlines in a code span
    run = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (run + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    if table:
        s = s.replace("|", "\\|")
    return f"{fence}{pad}{s}{pad}{fence}"


def code_block(text: str) -> str:
    run = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (run + 1)
    return f"{fence}text\n{text.rstrip()}\n{fence}"


# ----------------------------------------------------------------------------- formatting


def sides(base: str | None, pr: str | None) -> str:
    """``base → PR``; a missing side is "–", both missing is "–"."""
    b = DASH if base is None else base
    p = DASH if pr is None else pr
    return DASH if b == DASH and p == DASH else f"{b} {ARROW} {p}"


def emoji(verdict: Verdict) -> str:
    return EMOJI[verdict]


def verdict_label(verdict: Verdict) -> str:
    return f"{emoji(verdict)} {verdict}"


def sorted_rows(report: GateReport) -> list[GateRow]:
    """Worst first (the order of :data:`gatekeeper.gate.ORDER`), else as measured."""
    return sorted(report.rows, key=lambda row: severity(row.verdict.verdict))


def error_line(error: str | None) -> str:
    """The line of an error worth showing: the exception line of a traceback, else the
    first non-empty line."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    if not lines:
        return "measurement failed"
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def md_table(rows: Iterable[list[str]], headers: list[str]) -> str:
    """A GitHub table. Cells are already escaped; newlines are made ``<br>`` here as a
    last guard, since one would split the row."""
    safe = [[NEWLINES.sub("<br>", str(c)) for c in row] for row in rows]
    return tabulate(safe, headers=headers, tablefmt="github", disable_numparse=True)
