"""Baselines in the store: their key scheme, and the atomic moves that publish them.

    baselines/<target-id>/<env-key>/<ref>/latest.json                  (compare-and-swap)
    baselines/<target-id>/<env-key>/<ref>/history/<stamp>-<commit>.json (append-only)
    baselines/<target-id>/<env-key>/<ref>/outputs/<sha16>.pt           (reference outputs)

``latest`` only ever moves forward in measurement time: an older run that publishes late
goes into history but never replaces a newer baseline. What a baseline *says* (its
noise figures) is decided in :mod:`gatekeeper.gate.baseline`; this module only stores,
finds and parses. Every key of this scheme is built and parsed here, nowhere else.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote

from pydantic import ValidationError

from ..errors import GatekeeperError, ObjectTooLarge, PreconditionFailed, StoreError
from ..hashing import sha256_file
from ..results import Baseline
from .layout import Store

CAS_ATTEMPTS = 30
ROOT = "baselines/"
Kind = Literal["latest", "history", "outputs"]


def ref_slug(ref: str) -> str:
    """A branch name as one path segment: ``feature/x`` -> ``feature%2Fx``."""
    return quote(ref, safe="")


def _stamp(iso: str) -> str:
    return "".join(ch for ch in iso if ch.isdigit())[:17]


@dataclass(frozen=True)
class BaselineKey:
    """Where one target's baselines of one branch live, in one environment."""

    target_id: str  # model/shapes/variant
    env_key: str
    ref: str  # the branch, unescaped

    @property
    def prefix(self) -> str:
        return f"{ROOT}{self.target_id}/{self.env_key}/{ref_slug(self.ref)}"

    @property
    def latest(self) -> str:
        return f"{self.prefix}/latest.json"

    def history(self, measured_at: str, commit: str | None) -> str:
        return f"{self.prefix}/history/{_stamp(measured_at)}-{(commit or 'local')[:12]}.json"

    def outputs(self, sha256: str) -> str:
        return f"{self.prefix}/outputs/{sha256[:16]}.pt"


@dataclass(frozen=True)
class ParsedKey:
    baseline: BaselineKey
    kind: Kind
    name: str  # the file name


# the folders under a baseline that hold one file each: their kind and file suffix
_SUFFIX: dict[str, tuple[Kind, str]] = {
    "history": ("history", ".json"),
    "outputs": ("outputs", ".pt"),
}


def parse_key(key: str) -> ParsedKey | None:
    """``baselines/m/s/v/<env>/<ref>/latest.json`` and its history and outputs keys;
    None for anything else (a stray object, a temporary file)."""
    parts = key.split("/")
    if parts[0] != ROOT.rstrip("/"):
        return None
    if len(parts) == 7 and parts[6] == "latest.json":
        kind: Kind = "latest"
    elif len(parts) == 8 and parts[6] in _SUFFIX:
        kind, suffix = _SUFFIX[parts[6]]
        if not parts[7].endswith(suffix):
            return None
    else:
        return None
    return ParsedKey(
        BaselineKey("/".join(parts[1:4]), parts[4], unquote(parts[5])), kind, parts[-1]
    )


def parse_doc(data: bytes) -> Baseline | None:
    try:
        return Baseline.model_validate_json(data)
    except ValidationError:
        return None  # an unreadable baseline: treated as absent, replaced on publish


def publish(
    store: Store, key: BaselineKey, doc: Baseline, reference_file: Path | None = None
) -> str:
    """Store ``doc`` (and its reference outputs): outputs first, then history, then
    ``latest`` by compare-and-swap. Returns ``published``, ``older`` (history only: a
    newer baseline is in place) or ``skipped`` (read-only store)."""
    result = doc.result
    if reference_file is not None and result.reference is not None:
        digest = sha256_file(reference_file)
        if digest != result.reference.sha256:
            raise GatekeeperError(
                f"{result.target}: reference outputs {reference_file} do "
                "not match the sha256 in the results"
            )
        doc = doc.model_copy(update={"reference_key": key.outputs(digest)})
        try:
            if store.write(key.outputs(digest), reference_file, if_none_match=True) is None:
                return "skipped"
        except PreconditionFailed:
            pass  # the same outputs are stored already: the name is their hash
    data = doc.dump()
    try:
        if store.write(key.history(doc.created_at, doc.commit), data, if_none_match=True) is None:
            return "skipped"
    except PreconditionFailed:
        pass  # this very run was published before
    for attempt in range(CAS_ATTEMPTS):
        etag: str | None = None
        try:
            current = store.read(key.latest)
        except ObjectTooLarge:  # not a baseline: replaced like any unreadable one
            info = store.backend.head(key.latest)
            current, etag = None, info.etag if info else None
        if current is not None:
            etag = current[1]
            existing = parse_doc(current[0])
            if existing is not None and existing.created_at > doc.created_at:
                return "older"
        try:
            written = store.write(
                key.latest,
                data,
                if_none_match=etag is None,
                if_match=etag,
            )
            return "published" if written is not None else "skipped"
        except PreconditionFailed:
            time.sleep(random.uniform(0, 0.05 * 2 ** min(attempt, 5)))  # backoff + jitter
    raise StoreError(f"{key.latest}: kept changing over {CAS_ATTEMPTS} attempts; try again")


def history(store: Store, key: BaselineKey, newest: int) -> list[Baseline]:
    """The newest ``newest`` documents of this target, env and ref, oldest first."""
    infos = sorted(
        (
            i
            for i in store.list(f"{key.prefix}/history/")
            if (p := parse_key(i.key)) and p.kind == "history"
        ),
        key=lambda i: i.key,
    )[-newest:]
    out = []
    for info in infos:
        doc = read_doc(store, info.key)
        if doc is not None:
            out.append(doc)
    return out


def read_doc(store: Store, key: str) -> Baseline | None:
    """The baseline at ``key``; None when it is absent, too large or not a baseline."""
    try:
        got = store.read(key)
    except ObjectTooLarge:
        return None
    return parse_doc(got[0]) if got else None


def fetch(store: Store, key: BaselineKey) -> Baseline | None:
    """The latest baseline, or None when the store says there is none; a store that
    cannot be read, or a document that is not a baseline, raises StoreError."""
    got = store.read(key.latest)
    if got is None:
        return None
    doc = parse_doc(got[0])
    if doc is None:
        raise StoreError(
            f"{key.latest} in store {store.uri}: not a valid gatekeeper "
            "baseline (publish a new one with `gatekeeper baseline`)"
        )
    return doc


def fetch_reference(store: Store, baseline: Baseline, dest: Path) -> Path | None:
    """Download the baseline's reference outputs, verified against their sha256."""
    ref = baseline.result.reference
    if baseline.reference_key is None or ref is None:
        return None
    store.download(baseline.reference_key, dest, max_bytes=ref.size)
    if sha256_file(dest) != ref.sha256:
        dest.unlink(missing_ok=True)
        raise StoreError(f"{baseline.reference_key}: sha256 does not match the baseline")
    return dest


def targets_with_baseline(store: Store, env_keys: set[str], ref: str) -> set[str]:
    """Target ids that have a baseline of ``ref`` in any of ``env_keys``."""
    return {
        p.baseline.target_id
        for info in store.list(ROOT)
        if (p := parse_key(info.key))
        and p.kind == "latest"
        and p.baseline.ref == ref
        and p.baseline.env_key in env_keys
    }


def documents(store: Store) -> Iterator[tuple[str, Baseline | None]]:
    """Every latest and history document in the store (None: unreadable); one deleted
    since it was listed is skipped."""
    for info in store.list(ROOT):
        p = parse_key(info.key)
        if p is not None and p.kind in ("latest", "history"):
            try:
                got = store.read(info.key)
            except ObjectTooLarge:
                yield info.key, None  # unreadable, like a malformed one
                continue
            if got is not None:
                yield info.key, parse_doc(got[0])


def outputs(store: Store) -> Iterator:
    """Every stored reference-outputs object (ObjectInfo)."""
    for info in store.list(ROOT):
        p = parse_key(info.key)
        if p is not None and p.kind == "outputs":
            yield info
