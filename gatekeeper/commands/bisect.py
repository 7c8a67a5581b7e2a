"""``gatekeeper bisect``: the first commit between good and bad where a target's metric
changed, each commit measured paired with good."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ..bisect import engine, history
from ..bisect import report as bisect_report
from ..bisect.metrics import Metric, names, relative, threshold_setting
from ..config import find_config
from ..errors import ConfigError, UsageError
from ..project import expand, load_config
from ..store import Store
from ..targets import select
from .common import Context, output_dir

HELP = "find the commit between --good and --bad where a target's metric changed"


def register(sub, parents) -> None:
    p = sub.add_parser("bisect", help=HELP, description=HELP, parents=parents)
    p.add_argument("--good", metavar="REF", required=True, help="a commit before the change")
    p.add_argument("--bad", metavar="REF", required=True, help="a commit after the change")
    p.add_argument(
        "--metric",
        choices=names(),
        default="latency",
        help="what changed (default: latency)",
    )
    p.add_argument(
        "--min-effect",
        metavar="PCT",
        type=float,
        help="the smallest change that counts, in percent (a metric judged by amounts: "
        "in its unit; default: the gate's threshold for the metric; parity and graph "
        "breaks: any change)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default="gatekeeper-bisect",
        help="where report.md, report.json, each measurement's results and the bundles "
        "bisect compiles go; the commits' worktrees live here while it runs "
        "(default: gatekeeper-bisect)",
    )
    p.add_argument(
        "--base-ref",
        metavar="REF",
        help="the branch whose stored baselines narrow the range (default: "
        "$GITHUB_BASE_REF, else main)",
    )


def _min_effect(metric: Metric, pct: float | None) -> float | None:
    if pct is None:
        return None
    if threshold_setting(metric) is None:
        raise UsageError(f"--min-effect does not apply to --metric {metric}: any change counts")
    if not relative(metric):
        if pct <= 0:
            raise UsageError(f"--min-effect {pct:g}: expected an amount above 0")
        return pct  # an amount in the metric's unit
    if not 0 < pct < (100 if metric == "latency" else float("inf")):
        upper = " and below 100" if metric == "latency" else ""
        raise UsageError(f"--min-effect {pct:g}: expected a percentage above 0{upper}")
    return pct / 100


# in every --out bisect writes: a folder holding it is bisect's own, to clean and reuse
MARKER = ".gatekeeper-bisect"


def owned_out(given: str, store: Store) -> Path:
    """``--out``, made bisect's own: it must be missing, empty, or a bisect's earlier
    output (its marker file), and hold no local store; a usage error before any work
    otherwise (bisect removes its worktrees folder and writes bundles in there)."""
    path = Path(given).absolute()
    if path.is_dir() and not (path / MARKER).is_file() and any(path.iterdir()):
        raise UsageError(
            f"--out {given}: not empty and not an earlier bisect's output: give a new "
            "or empty folder"
        )
    root = getattr(store.backend, "root", None)
    if isinstance(root, Path) and (
        root.resolve() == path.resolve() or path.resolve() in root.resolve().parents
    ):
        raise UsageError(f"--out {given}: holds the store {root}: give another folder")
    out = output_dir(path, "--out")
    (out / MARKER).write_text("gatekeeper bisect writes here; it removes what it made\n")
    return out


def _targets_at(root: Path, commit: history.Commit, rel: str, flag: str) -> list:
    """The targets of the config at ``commit`` (read without checking it out)."""
    with history.file_at(root, commit.sha, rel) as path:
        if path is None:
            raise UsageError(f"{flag} {commit.short} has no {rel}")
        try:
            return expand(load_config(path))
        except ConfigError as e:
            text = str(e).replace(str(path.absolute()), rel).replace(str(path), rel)
            raise ConfigError(f"{flag} {commit.short}: {text}") from None


def run(ctx: Context) -> int:
    a = ctx.args
    if a.shard:
        raise UsageError("bisect takes no --shard: give the targets with --target")
    min_effect = _min_effect(a.metric, a.min_effect)
    config = Path(find_config(a.config)).absolute()
    root = history.repo_root(config.parent)
    try:
        rel = str(config.resolve().relative_to(root.resolve()))
    except ValueError:
        raise UsageError(f"the config {config} is not in the repository {root}") from None
    history.check_clean(root)
    rng = history.load_range(root, a.good, a.bad)
    chosen = [t.id for t in select(_targets_at(root, rng.bad, rel, "--bad"), a.target)]
    at_good = {t.id for t in _targets_at(root, rng.good, rel, "--good")}
    if missing := [t for t in chosen if t not in at_good]:
        raise UsageError(f"target {missing[0]} does not exist at --good {rng.good.short}")
    ctx.signing_key()  # a signature required without a key: exit 2 before any work
    store = ctx.store
    out = owned_out(a.out, store)
    from .common import default_base_ref

    done = engine.run(
        root=root,
        rng=rng,
        config_path=rel,
        targets=chosen,
        metric=a.metric,
        threshold=min_effect,
        store=store,
        out=out,
        base_ref=a.base_ref or default_base_ref(),
        config_flag=f" --config {shlex.quote(rel)}" if a.config else "",
        verbose=a.verbose,
    )
    text, doc = bisect_report.write(done, out / "report.md", min_effect=min_effect)
    if a.json:
        ctx.emit(doc)
    else:
        print(text)
    found = sum(tb.found for tb in done)
    sys.stderr.write(
        f"gatekeeper: bisect: {found} of {len(done)} target(s) with a culprit; "
        f"report: {out / 'report.md'}\n"
    )
    return doc["exit_code"]
