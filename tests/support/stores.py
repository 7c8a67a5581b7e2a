"""Stores for tests that run on both backends: a local directory and S3 on moto's
server (the ``stores`` fixture, one new client per call, as a new runner's), and real
bundles of small synthetic inductor cache dirs to publish into them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gatekeeper import bundle
from gatekeeper.store import BundleLocation, Store
from gatekeeper.store.base import Backend
from gatekeeper.store.local import LocalBackend
from gatekeeper.store.s3 import S3Backend

TARGET = "tiny/b4/default"
ENV = "torch2.13.0+cpu-py3.11-cpu-x86_64-avx512-t2-a1b1b8"


class StoreFactory:
    """Opens Stores on one backend root; every call is a new client, as a new runner's."""

    def __init__(self, kind: str, root: Path | str) -> None:
        self.kind = kind
        self.root = root
        self._opened: list[Backend] = []

    def backend(self) -> Backend:
        b: Backend = LocalBackend(self.root) if self.kind == "local" else S3Backend(str(self.root))
        self._opened.append(b)
        return b

    def __call__(self, *, read_only: bool = False) -> Store:
        return Store(self.backend(), read_only=read_only)

    def denying(self, deny: Any) -> Store:  # test_fleet.DenyWrites
        if self.kind == "local":
            return Store(deny.local(Path(self.root)))
        backend = S3Backend(str(self.root))
        self._opened.append(backend)
        return Store(deny.s3(backend))

    def close(self) -> None:
        for b in self._opened:
            b.close()


@pytest.fixture(params=["local", "s3"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    if request.param == "local":
        factory = StoreFactory("local", tmp_path / "store")
    else:
        factory = StoreFactory("s3", request.getfixturevalue("s3_bucket_uri"))
    yield factory
    factory.close()


@pytest.fixture
def store(stores: StoreFactory) -> Store:
    return stores()


def keys(store: Store, prefix: str = "") -> set[str]:
    return {i.key for i in store.list(prefix)}


def overwrite(store: Store, key: str, change: Callable[[bytes], bytes]) -> None:
    got = store.backend.get(key)
    assert got is not None, key
    store.backend.put(key, change(got[0]))


def flip_byte(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(out) // 2] ^= 0x01
    return bytes(out)


# -- bundles and results ---------------------------------------------------------------


def make_bundle(
    tmp: Path,
    seed: int | str,
    *,
    target: str = TARGET,
    env_key: str = ENV,
    code_hash: str = "c0de0000c0de0000",
) -> tuple[BundleLocation, Path, bytes]:
    """A real bundle of a small synthetic inductor cache dir; distinct content per seed."""
    work = tmp / f"bundle-{seed}-{code_hash}-{env_key[-6:]}"
    cache = work / "cache"
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "locks").mkdir()
    (cache / "locks" / "x.lock").write_text("ignored")
    (cache / "fxgraph" / "ab" / "entry").write_bytes(f"graph {seed}".encode() * 64)
    (cache / "kernel.cpp").write_text(f"// kernel for {seed}\n" * 32)
    megacache = work / "megacache.bin"
    megacache.write_bytes(os.urandom(512))
    archive, manifest = bundle.pack(
        cache,
        megacache,
        work,
        target=target,
        key={"env_key": env_key, "code_hash": code_hash},
        compile_info={"seconds": 1.5, "counters": {"fxgraph_cache_miss": 1}},
        creator={"commit": f"{seed}", "ref": "main"},
        version="test",
        signing_key=None,
    )
    return BundleLocation(target, env_key, code_hash), archive, manifest.to_bytes()


def publish(store: Store, tmp: Path, seed: int | str, **kw: Any) -> BundleLocation:
    loc, archive, manifest = make_bundle(tmp, seed, **kw)
    assert store.publish_bundle(loc, archive, archive.name, manifest) == "published"
    return loc
