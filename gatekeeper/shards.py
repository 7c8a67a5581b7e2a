"""Shards' results merged into one document (``gatekeeper merge``): each target once,
its reference outputs and traces copied beside the merged file, every path a shard
names kept inside its folder."""

from __future__ import annotations

import shutil
from pathlib import Path

from .errors import GatekeeperError, UsageError
from .hashing import sha256_file
from .inside import contained
from .results import (
    Results,
    TargetResult,
    load_results,
    reference_name,
    trace_name,
)
from .targets import parse_shard

# the largest Chrome trace merge copies (traces carry no hash to check them against)
MAX_TRACE_BYTES = 256 << 20


def merge_results(paths: list[Path], out_dir: Path) -> Results:
    """Shard results concatenated into one document; each target may appear once.
    Reference outputs and traces are copied next to the merged file so it stays
    self-contained. Shards come from pull requests' jobs: every file a shard names must
    lie inside its folder (:func:`contained`), its copy's name is rebuilt from the
    target id, and reference outputs must match the sha256 and size their shard
    records."""
    docs = [(p, load_results(p)) for p in paths]
    seen: dict[str, Path] = {}
    targets = []
    check_shards([d.shard for _, d in docs])
    bases = {d.base_ref for _, d in docs}
    if len(bases) > 1:
        raise UsageError(f"shards were gated against different base refs: {sorted(bases)}")
    for path, doc in docs:
        folder = path.parent
        for i, t in enumerate(doc.targets):
            if t.target in seen:
                raise UsageError(f"target {t.target} is in both {seen[t.target]} and {folder}")
            seen[t.target] = folder
            targets.append(_carry_files(t, path, f"targets[{i}]", out_dir))
    first = docs[0][1]
    return first.model_copy(
        update={
            "targets": sorted(targets, key=lambda t: t.target),
            "created_at": max(d.created_at for _, d in docs),
            "removed": sorted({t for _, d in docs for t in d.removed}),
            # one shard's model code unconfined: the merged run's was
            "unconfined": sorted({w for _, d in docs for w in d.unconfined or []}) or None,
        }
    )


def _carry_files(t: TargetResult, path: Path, where: str, out_dir: Path) -> TargetResult:
    """``t`` with its reference outputs and traces copied from the shard ``path``'s
    folder into ``out_dir`` under names rebuilt from its target id."""
    folder = path.parent
    t = t.model_copy(deep=True)
    if t.reference is not None:
        src = contained(folder, t.reference.file, f"{path}: {where}.reference.file")
        name = reference_name(t.target)
        contained(out_dir, name, f"{path}: {where}.target")  # one file name, whatever the id
        if src.is_file():
            _copy(src, out_dir / name, t.reference.size, f"{path}: {where}.reference.file")
            dest = out_dir / name
            if sha256_file(dest) != t.reference.sha256:
                dest.unlink()
                raise GatekeeperError(
                    f"{path}: {where}.reference.file {t.reference.file}: its sha256 "
                    "does not match the results"
                )
        t.reference.file = name
    profiles = [("profile", t.profile, False)]
    if t.paired is not None:
        profiles.append(("paired.profile", t.paired.profile, True))
    for field, profile, base in profiles:
        if profile is None or not profile.trace:
            continue
        what = f"{path}: {where}.{field}.trace"
        src = contained(folder, profile.trace, what)
        name = trace_name(t.target, base=base)
        contained(out_dir, name, f"{path}: {where}.target")
        if src.is_file():
            _copy(src, out_dir / name, MAX_TRACE_BYTES, what)
        profile.trace = name
    return t


def _copy(src: Path, dest: Path, max_bytes: int, what: str) -> None:
    """Copy a regular file of at most ``max_bytes`` (a no-op onto itself)."""
    if dest.exists() and src.resolve() == dest.resolve():
        return
    size = src.stat().st_size
    if size > max_bytes:
        raise GatekeeperError(f"{what}: {src} is {size} bytes, more than its {max_bytes}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


def check_shards(shards: list[str | None]) -> None:
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
