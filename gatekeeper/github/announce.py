"""A gate report → the Actions run: step outputs, the job summary and annotations.

(Not "publish": that word now only means writing to the store. The sticky comment is
``comment.py``'s job.) Everything here is a no-op outside GitHub Actions, so commands call
it unconditionally.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..gate import GateReport
from . import actions


def _repo_path(base_dir: Path, file: str | None) -> str | None:
    """A graph break's file as a path relative to the workspace (what annotations want)."""
    if not file:
        return None
    path = Path(file) if Path(file).is_absolute() else base_dir / file
    workspace = Path(os.environ.get("GITHUB_WORKSPACE") or Path.cwd())
    try:
        return path.resolve().relative_to(workspace.resolve()).as_posix()
    except ValueError:
        return None  # outside the repository: annotate the run, not a file


def announce(
    report: GateReport, *, markdown: str, report_path: Path, results_path: Path, base_dir: Path
) -> None:
    """Outputs, summary and annotations for a gate verdict."""
    if not (actions.in_actions() or os.environ.get("GITHUB_OUTPUT")):
        return
    actions.set_output("verdict", report.verdict)
    actions.set_output("report", str(report_path.absolute()))
    actions.set_output("results", str(results_path.absolute()))
    cache = [row.result.compile.cache for row in report.rows if row.result.compile]
    actions.set_output("cache-hit", bool(cache) and all(c == "hit" for c in cache))
    actions.append_summary(markdown)
    for row in report.rows:
        v = row.verdict
        for brk in v.new_breaks:
            actions.error_annotation(
                f"{v.target}: new graph break: {brk.reason}",
                file=_repo_path(base_dir, brk.file),
                line=brk.line,
                title="gatekeeper: graph break",
            )
        export = row.result.export
        if v.verdict == "regressed" and export is not None and not export.exportable:
            actions.error_annotation(  # at the line torch.export refused
                f"{v.target}: {export.says()}",
                file=_repo_path(base_dir, export.file),
                line=export.line,
                title="gatekeeper: not exportable",
            )
        if v.verdict in ("regressed", "parity-failed", "error"):
            actions.error_annotation(
                f"{v.target}: {v.verdict}: " + "; ".join(v.reasons),
                title=f"gatekeeper: {v.verdict}",
            )


def announce_warm(statuses: list[str]) -> None:
    """The ``cache-hit`` output of a warm: every target's bundle was restored."""
    actions.set_output("cache-hit", bool(statuses) and all(s == "hit" for s in statuses))
