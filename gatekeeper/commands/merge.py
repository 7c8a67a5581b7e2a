"""``gatekeeper merge``: one verdict and one report from the results of many shards."""
from __future__ import annotations

import shutil
from pathlib import Path

from ..check import write_results
from ..errors import UsageError
from ..provenance import base_ref
from ..results import Results, load_results
from ..targets import parse_shard
from ..verdict import judge
from .common import Context
from .gate import add_gate_flags, write_report

HELP = "merge shard results.json files, then gate and report them as one run"


def register(sub, parents) -> None:
    p = sub.add_parser("merge", help=HELP, description=HELP, parents=parents)
    p.add_argument("results", nargs="+", metavar="RESULTS",
                   help="results.json files (or folders holding one) of each shard")
    p.add_argument("--out", metavar="DIR", default=".",
                   help="where the merged results.json and report go (default: .)")
    p.add_argument("--base-ref", metavar="REF")
    add_gate_flags(p)


def merge_results(paths: list[Path], out_dir: Path) -> Results:
    """Concatenate shard results; each target may appear once. Reference outputs are
    copied next to the merged file so it stays self-contained."""
    docs = [(p.parent, load_results(p)) for p in paths]
    seen: dict[str, Path] = {}
    targets = []
    for folder, doc in docs:
        for t in doc.targets:
            if t.target in seen:
                raise UsageError(f"target {t.target} is in both {seen[t.target]} and {folder}")
            seen[t.target] = folder
            if t.reference is not None:
                src, dest = folder / t.reference.file, out_dir / t.reference.file
                if src.is_file() and src.resolve() != dest.resolve():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dest)
            targets.append(t)
    _check_shards([d.shard for _, d in docs])
    first = docs[0][1]
    bases = {d.base_ref for _, d in docs}
    if len(bases) > 1:
        raise UsageError(f"shards were gated against different base refs: {sorted(bases)}")
    return first.model_copy(update={"targets": sorted(targets, key=lambda t: t.target),
                                    "created_at": max(d.created_at for _, d in docs)})


def _check_shards(shards: list[str | None]) -> None:
    """Shard results must be the whole set: 1/n .. n/n, each once."""
    given = [s for s in shards if s]
    if not given:
        return
    if len(given) != len(shards):
        raise UsageError("merge takes either all sharded results or none")
    parsed = [parse_shard(s) for s in given]
    counts = {n for _, n in parsed}
    if len(counts) != 1:
        raise UsageError(f"shards of different splits: {', '.join(sorted(given))}")
    (n,) = counts
    if missing := sorted(set(range(1, n + 1)) - {i for i, _ in parsed}):
        raise UsageError(f"missing shard(s) {', '.join(f'{i}/{n}' for i in missing)}")
    if len(set(given)) != len(given):
        raise UsageError("the same shard was given twice")


def run(ctx: Context) -> int:
    paths = [Path(p) / "results.json" if Path(p).is_dir() else Path(p)
             for p in ctx.args.results]
    out = Path(ctx.args.out)
    merged = merge_results(paths, out)
    path = write_results(merged, out)
    report = judge(merged, ctx.config, ctx.store,
                   base_ref=ctx.args.base_ref or merged.base_ref or base_ref(),
                   require_baseline=ctx.args.require_baseline)
    return write_report(ctx, report, Path(ctx.args.report or out / "report.md"), path)
