"""What every command shares: the common flags, config, store and targets resolved once
from them, the flag groups several verbs take, and output that is either a human table
or exactly one JSON document on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tabulate import tabulate

from .. import units
from ..check.paired import Mode, ModeName
from ..config import Config
from ..errors import ConfigError, UsageError
from ..gate import GateReport
from ..project import expand, load_config
from ..store import Store, open_store
from ..targets import Target, select


def common_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("common options")
    g.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: gatekeeper.toml, else [tool.gatekeeper] in pyproject.toml)",
    )
    g.add_argument(
        "--store",
        metavar="URI",
        help="store: a directory or s3://bucket/prefix (default: from config)",
    )
    g.add_argument(
        "--target",
        metavar="GLOB",
        action="append",
        help="only targets whose id matches (repeatable)",
    )
    g.add_argument("--shard", metavar="I/N", help="only the i-th of n slices of the targets")
    g.add_argument("--read-only", action="store_true", help="never write to the store")
    g.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    g.add_argument("-v", "--verbose", action="store_true", help="more logs on stderr")
    g.add_argument(
        "--unconfined",
        action="store_true",
        help="where the worker's box cannot be made, run model code without it instead "
        "of refusing (the runner owner's choice, as GATEKEEPER_UNCONFINED=1; every "
        "report then says unconfined: docs/hardening.md#getting-a-box)",
    )
    return p


def add_measure_flags(p: argparse.ArgumentParser) -> None:
    """``check`` and ``run``."""
    p.add_argument(
        "--out",
        metavar="DIR",
        default=".",
        help="where results.json (and reference outputs) go (default: .)",
    )
    p.add_argument(
        "--cold", action="store_true", help="measure a cold compile: do not restore bundles first"
    )
    p.add_argument(
        "--mode",
        choices=("auto", "paired", "stored"),
        default="auto",
        help="paired: measure the base commit's model beside this one, round by "
        "round, in one process (drift cancels); stored: against the "
        "baseline's recorded runs; auto (default): paired whenever the base "
        "commit is in this checkout",
    )
    p.add_argument(
        "--paired", metavar="BASE_REF", help="the same as --mode paired --base-ref BASE_REF"
    )
    p.add_argument(
        "--base-ref",
        metavar="REF",
        help="branch whose baseline (and, paired, whose commit) to compare with "
        "(default: $GITHUB_BASE_REF, else main)",
    )


def add_gate_flags(p: argparse.ArgumentParser) -> None:
    """``gate``, ``merge`` and ``run``."""
    p.add_argument(
        "--report",
        metavar="PATH",
        help="where the markdown report goes (default: report.md beside the results)",
    )
    p.add_argument(
        "--require-baseline", action="store_true", help="a target without a baseline fails (exit 1)"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="show every target's profile diff in the report (by default only "
        "targets whose timing got worse); Chrome traces are always written "
        "to traces/ beside results.json",
    )
    p.add_argument(
        "--accept",
        metavar="GLOB",
        action="append",
        default=[],
        help="targets whose regression this change makes on purpose: regressed "
        "becomes accepted (exit 0); never a parity failure (repeatable; a "
        "pull request's label gatekeeper:accept accepts every target, "
        "gatekeeper:accept:GLOB those matching)",
    )


def default_base_ref() -> str:
    """The branch a pull request is gated against (its base), else ``main``: what
    ``--base-ref`` means when not given."""
    return os.environ.get("GITHUB_BASE_REF") or "main"


ACCEPT_LABEL = "gatekeeper:accept"


def accept_globs(args: argparse.Namespace) -> list[str]:
    """``--accept`` globs, plus those of the pull request's gatekeeper:accept labels."""
    globs = list(getattr(args, "accept", None) or [])
    from ..github.event import pr_context_from_env

    try:
        pr = pr_context_from_env()
    except Exception:  # an unreadable event accepts nothing
        pr = None
    for label in pr.labels if pr is not None else ():
        if label == ACCEPT_LABEL:
            globs.append("*")
        elif label.startswith(ACCEPT_LABEL + ":") and label[len(ACCEPT_LABEL) + 1 :]:
            globs.append(label[len(ACCEPT_LABEL) + 1 :])
    return globs


@dataclass
class Context:
    args: argparse.Namespace
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def config(self) -> Config:
        return load_config(self.args.config)

    @cached_property
    def store(self) -> Store:
        """``--store`` works without a config file; the config's store otherwise."""
        if self.args.store:  # works without a config file
            cfg = self.config if self.args.config else _optional_config()
            return open_store(
                self.args.store,
                read_only=self.args.read_only or bool(cfg and cfg.read_only),
                endpoint_url=cfg.endpoint_url if cfg else None,
                base_dir=None,
            )
        cfg = self.config
        return open_store(
            cfg.store,
            read_only=self.args.read_only or cfg.read_only,
            endpoint_url=cfg.endpoint_url,
            base_dir=cfg.base_dir,
        )

    def signing_key(self) -> bytes | None:
        """``GATEKEEPER_SIGNING_KEY``, checked before any work: when a signature is
        required (``require_signature``, or the action's ``require-signature``), a
        missing or empty key is an error (exit 2) rather than an unchecked load."""
        from ..bundle import signing_key

        if self.args.store and not self.args.config:
            cfg = _optional_config()  # `--store` alone works without a config file
        else:
            cfg = self.config
        return signing_key(bool(cfg and cfg.require_signature))

    @cached_property
    def targets(self) -> list[Target]:
        return select(expand(self.config), self.args.target, self.args.shard)

    @property
    def base_ref(self) -> str:
        return self.args.paired or self.args.base_ref or default_base_ref()

    def mode(self) -> Mode:
        """The measuring mode ``--mode`` / ``--paired`` ask for, resolved here."""
        from ..check.paired import choose_mode

        requested: ModeName = "paired" if self.args.paired else self.args.mode
        return choose_mode(requested, self.base_ref, self.config.base_dir)

    def emit(
        self,
        doc: dict,
        rows: list[dict] | None = None,
        headers: dict[str, str] | None = None,
        footer: str = "",
    ) -> None:
        """``--json``: the document; else a table of ``rows`` with ``headers``."""
        if self.args.json:
            json.dump(doc, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
            return
        if rows is not None and headers is not None:
            table = [[_cell(r.get(k)) for k in headers] for r in rows]
            print(tabulate(table, headers=list(headers.values()), disable_numparse=True))
        if footer:
            print(footer)

    def finish_gate(self, report: GateReport, report_path: Path, results_path: Path) -> int:
        """Write report.md and report.json, print the report (or its JSON), tell GitHub
        (outputs, summary, annotations); the exit code of the verdict."""
        from ..github.announce import announce
        from ..report import summary_line, write_report

        report.profile_all = bool(getattr(self.args, "profile", False))
        markdown, doc = write_report(report, report_path)
        if self.args.json:
            self.emit(doc | {"report": str(report_path)})
        else:
            print(markdown)
        sys.stderr.write(summary_line(report) + "\n")
        announce(
            report,
            markdown=markdown,
            report_path=report_path,
            results_path=results_path,
            base_dir=self.config.base_dir,
        )
        return report.exit_code


def output_dir(path: str | Path, flag: str, *, create: bool = True) -> Path:
    """A folder a command writes into (``--out``, ``--cache-dir``), created now (with
    ``create``; else only checked): one that cannot be is a usage error naming the flag,
    before any work is done."""
    path = Path(path)
    if not create:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag} {path}: not a directory")
        there = next(p for p in (path, *path.absolute().parents) if p.exists())
        if not there.is_dir():
            raise UsageError(f"{flag} {path}: {there} is not a directory")
        if not os.access(there, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: {there} is not writable")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"{flag} {path}: cannot create this directory: {e.strerror or e}"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: this directory is not writable")
    return path


def output_file(path: str | Path, flag: str) -> Path:
    """A file a command writes (``--report``): its folder is created now, and a path
    that cannot be a file is a usage error naming the flag."""
    path = Path(path)
    if path.is_dir() or not path.name:
        raise UsageError(f"{flag} {path}: is a directory, not a file")
    output_dir(path.parent, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: this file is not writable")
    return path


def input_file(path: str | Path, flag: str, what: str) -> Path:
    """A file a command reads (``--results``, ``--report``): there, and a file."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, not a {what} (give the file in it)")
    if not path.is_file():
        raise UsageError(f"{flag} {path}: {what} not found")
    return path


def _optional_config() -> Config | None:
    try:
        return load_config(None)
    except ConfigError:
        return None


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def human_bytes(n: int | None) -> str | None:
    """A size for a table or a JSON field (binary units, :func:`gatekeeper.units.size`);
    None stays None, so the table shows "-" and the JSON null."""
    return None if n is None else units.size(n)
