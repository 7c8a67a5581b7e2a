"""The report: a GateReport rendered for people (markdown: the PR comment and the job
summary) and for tools (JSON); written beside the results. Nothing here measures or
decides."""

from __future__ import annotations

import json as _json
from pathlib import Path

from .. import safefs
from ..errors import GatekeeperError
from ..gate import GateReport
from .json import report_json
from .markdown import render_markdown
from .rows import summary_line

__all__ = ["render_markdown", "report_json", "summary_line", "write_report"]


def write_report(report: GateReport, path: Path) -> tuple[str, dict]:
    """Write ``path`` (markdown) and the JSON report beside it; return both."""
    markdown = render_markdown(report)
    doc = report_json(report)
    try:  # new files renamed over the names: a link planted there is never written through
        path.parent.mkdir(parents=True, exist_ok=True)
        safefs.write_new(path, markdown)
        safefs.write_new(path.with_suffix(".json"), _json.dumps(doc, indent=2))
    except (OSError, ValueError) as e:
        raise GatekeeperError(
            f"cannot write the report {path}: {getattr(e, 'strerror', None) or e}"
        ) from None
    return markdown, doc
