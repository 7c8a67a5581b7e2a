"""Tests of gatekeeper.bundle: packing, verifying, extracting and installing bundles.

No torch: every cache dir is synthetic, and every hostile archive is crafted here with
tarfile + zstandard, with a manifest that is right about everything but the one thing
under test, so each refusal is the reason named and not an earlier check.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import uuid
from pathlib import Path

import pytest
import zstandard

from gatekeeper import bundle
from gatekeeper.bundle import ArchiveEntry, FileEntry, Manifest
from gatekeeper.errors import BundleError
from gatekeeper.kinds import precompile

TARGET = "mlp/b8/default"
KEY = {
    "env_key": "torch2.6.0+cpu-py3.11-cpu-x86_64-avx2-t2-3f9c1a",
    "code_hash": "0123456789abcdef",
    "env": {"torch": "2.6.0"},
    "spec": {"mode": "default"},
}
KEY_A = b"key-A-0123456789"
KEY_B = b"key-B-9876543210"

CACHE_FILES = {
    "fxgraph/ab/abcdef/entry": b"fx graph entry" * 100,
    "aotautograd/cd/entry": b"\x00\x01\x02aot" * 50,
    "cpp/kernel.so": b"\x7fELF" + bytes(range(256)) * 40,
    "triton/0/abc/kernel.cubin": b"cubin" * 1000,
    "empty.txt": b"",
    "top.py": b"print('hello')\n",
}
MEGACACHE_BYTES = b"mega-cache-blob" * 300


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_cache(root: Path) -> Path:
    cache = root / "inductor-cache"
    for rel, data in CACHE_FILES.items():
        p = cache / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (cache / "locks").mkdir()
    (cache / "locks" / "abc.lock").write_text("held")
    return cache


def make_megacache(root: Path) -> Path:
    p = root / "megacache.bin"
    p.write_bytes(MEGACACHE_BYTES)
    return p


def do_pack(
    cache: Path,
    mega: Path | None,
    dest: Path,
    signing_key: bytes | None = None,
    target: str = TARGET,
):
    dest.mkdir(parents=True, exist_ok=True)
    return bundle.pack(
        cache,
        mega,
        dest,
        target=target,
        key=KEY,
        compile_info={"seconds": 1.5, "graphs": 1, "graph_breaks": 0},
        creator={"commit": "deadbeef", "ref": "main"},
        version="0.1.0",
        signing_key=signing_key,
    )


@pytest.fixture
def packed(tmp_path):
    cache = make_cache(tmp_path / "src")
    mega = make_megacache(tmp_path / "src")
    archive, manifest = do_pack(cache, mega, tmp_path / "out")
    return archive, manifest


# -- crafting archives -------------------------------------------------------------------
def write_tar_zst(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = zstandard.ZstdCompressor().compress(buf.getvalue())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return raw


def reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def manifest_for(
    archive: Path, files: dict[str, bytes], target: str = TARGET, signing_key: bytes | None = None
) -> Manifest:
    """A manifest that is right about ``archive`` and lists exactly ``files``."""
    data = archive.read_bytes()
    m = Manifest(
        target=target,
        env_key=KEY["env_key"],
        code_hash=KEY["code_hash"],
        key=KEY,
        files={n: FileEntry(sha256=sha(b), size=len(b)) for n, b in files.items()},
        archive=ArchiveEntry(name=archive.name, sha256=sha(data), size=len(data)),
        compile={},
        creator={},
        created_at=bundle.now_iso(),
        gatekeeper_version="0.1.0",
    )
    if signing_key:
        m = m.model_copy(update={"signature": bundle._sign(m.signed_bytes(), signing_key)})
    return m


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and msg.strip() == msg and msg
    return msg


# -- round trip ---------------------------------------------------------------------------
def test_round_trip_every_file_byte_identical(tmp_path, packed):
    archive, manifest = packed
    m = bundle.verify_manifest(manifest.to_bytes(), target=TARGET, signing_key=None)
    assert m == manifest
    staging = tmp_path / "staging"
    bundle.extract(archive, m, staging)
    expected = {"cache/" + k: v for k, v in CACHE_FILES.items()}
    expected["megacache.bin"] = MEGACACHE_BYTES
    assert tree(staging) == expected

    dest = tmp_path / "deploy-cache"
    written = bundle.install_cache(staging, dest)
    assert written == len(CACHE_FILES)
    assert tree(dest) == CACHE_FILES
    assert not (dest / "locks").exists()
    assert not (dest / "megacache.bin").exists()  # the blob is loaded, not installed
    assert os.stat(dest / "cpp/kernel.so").st_mode & 0o111  # shared objects stay loadable


def test_manifest_lists_every_member_and_not_locks(packed):
    archive, manifest = packed
    expected = {"cache/" + k for k in CACHE_FILES} | {"megacache.bin"}
    assert set(manifest.files) == expected
    for rel, data in CACHE_FILES.items():
        entry = manifest.files["cache/" + rel]
        assert (entry.sha256, entry.size) == (sha(data), len(data))
    assert manifest.files["megacache.bin"].sha256 == sha(MEGACACHE_BYTES)
    with (
        zstandard.ZstdDecompressor().stream_reader(archive.open("rb")) as zr,
        tarfile.open(fileobj=zr, mode="r|") as tar,
    ):
        names = [i.name for i in tar]
    assert set(names) == expected
    assert not any("locks" in n for n in names)


def test_manifest_records_key_target_and_creator(packed):
    _, m = packed
    assert (m.target, m.env_key, m.code_hash) == (TARGET, KEY["env_key"], KEY["code_hash"])
    assert m.key == KEY
    assert m.creator["commit"] == "deadbeef"
    assert m.compile["graph_breaks"] == 0
    assert m.signature is None
    assert m.format == bundle.FORMAT
    # to_bytes is JSON that parses back to the same manifest
    assert Manifest.model_validate_json(m.to_bytes()) == m


def test_archive_name_is_its_own_hash(packed):
    archive, manifest = packed
    digest = sha(archive.read_bytes())
    assert archive.name == f"bundle-{digest[:16]}.tar.zst"
    assert manifest.archive.name == archive.name
    assert manifest.archive.sha256 == digest
    assert manifest.archive.size == archive.stat().st_size
    assert not list(archive.parent.glob("*.part"))


def test_packing_twice_gives_identical_archives(tmp_path):
    cache = make_cache(tmp_path / "src")
    mega = make_megacache(tmp_path / "src")
    a1, m1 = do_pack(cache, mega, tmp_path / "one")
    # touch every file: time must not leak into the archive
    for p in cache.rglob("*"):
        os.utime(p, (1_000_000_000, 1_000_000_000))
    a2, m2 = do_pack(cache, mega, tmp_path / "two")
    assert a1.read_bytes() == a2.read_bytes()
    assert a1.name == a2.name
    assert m1.files == m2.files and m1.archive == m2.archive
    with (
        zstandard.ZstdDecompressor().stream_reader(a1.open("rb")) as zr,
        tarfile.open(fileobj=zr, mode="r|") as tar,
    ):
        assert {i.mtime for i in tar} == {0}


def test_pack_without_megacache(tmp_path):
    cache = make_cache(tmp_path / "src")
    archive, manifest = do_pack(cache, None, tmp_path / "out")
    assert "megacache.bin" not in manifest.files
    bundle.extract(archive, manifest, tmp_path / "staging")
    assert tree(tmp_path / "staging") == {"cache/" + k: v for k, v in CACHE_FILES.items()}


def test_symlinks_in_the_cache_dir_are_not_packed(tmp_path):
    cache = make_cache(tmp_path / "src")
    secret = tmp_path / "secret"
    secret.write_text("do not ship")
    (cache / "link").symlink_to(secret)
    _, manifest = do_pack(cache, None, tmp_path / "out")
    assert "cache/link" not in manifest.files


# -- corruption ---------------------------------------------------------------------------
def test_flipped_byte_refused_before_anything_is_extracted(tmp_path, packed):
    archive, manifest = packed
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(BundleError) as ei:
        bundle.extract(archive, manifest, staging)
    msg = assert_one_line(ei.value)
    assert TARGET in msg
    assert "archive sha256 does not match" in msg
    assert not staging.exists()


def test_wrong_file_hash_in_manifest_refused_naming_the_file(tmp_path):
    cache = make_cache(tmp_path / "src")
    archive, manifest = do_pack(cache, None, tmp_path / "out")
    # tamper with one file and re-pack: a self-consistent archive...
    # (of the same size: a member of another size is refused before it is read)
    size = (cache / "cpp/kernel.so").stat().st_size
    (cache / "cpp/kernel.so").write_bytes(b"\x7fELF evil payload".ljust(size, b"\0"))
    evil_archive, _ = do_pack(cache, None, tmp_path / "evil")
    # ...given the original manifest (file hashes) with the new archive's hash
    forged = manifest.model_copy(
        update={
            "archive": ArchiveEntry(
                name=evil_archive.name,
                sha256=sha(evil_archive.read_bytes()),
                size=evil_archive.stat().st_size,
            )
        }
    )
    staging = tmp_path / "staging"
    with pytest.raises(BundleError) as ei:
        bundle.extract(evil_archive, forged, staging)
    msg = assert_one_line(ei.value)
    assert TARGET in msg
    assert "cache/cpp/kernel.so" in msg and "sha256" in msg
    assert not staging.exists()


def test_member_missing_from_archive_refused(tmp_path):
    archive = tmp_path / "arch" / "bundle.tar.zst"
    write_tar_zst(archive, [reg("cache/a", b"a")])
    m = manifest_for(archive, {"cache/a": b"a", "cache/b": b"b"})
    with pytest.raises(BundleError, match="cache/b is missing"):
        bundle.extract(archive, m, tmp_path / "staging")
    assert not (tmp_path / "staging").exists()


def test_member_twice_refused(tmp_path):
    archive = tmp_path / "arch" / "bundle.tar.zst"
    write_tar_zst(archive, [reg("cache/a", b"a"), reg("cache/a", b"a")])
    m = manifest_for(archive, {"cache/a": b"a"})
    with pytest.raises(BundleError, match="twice"):
        bundle.extract(archive, m, tmp_path / "staging")
    assert not (tmp_path / "staging").exists()


@pytest.mark.parametrize("cut", ["half", "tail", "header"])
def test_truncated_archive_is_unreadable_not_a_traceback(tmp_path, packed, cut):
    archive, manifest = packed
    data = archive.read_bytes()
    n = {"half": len(data) // 2, "tail": len(data) - 7, "header": 9}[cut]
    short = tmp_path / "short.tar.zst"
    short.write_bytes(data[:n])
    # the manifest agrees with the truncated bytes: only the content can fail
    m = manifest.model_copy(
        update={"archive": ArchiveEntry(name=short.name, sha256=sha(data[:n]), size=n)}
    )
    staging = tmp_path / "staging"
    with pytest.raises(BundleError) as ei:
        bundle.extract(short, m, staging)
    msg = assert_one_line(ei.value)
    assert TARGET in msg
    assert "unreadable archive" in msg
    assert not staging.exists()


def test_not_zstd_at_all_is_unreadable(tmp_path, packed):
    _, manifest = packed
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"this is not a zstd frame" * 20)
    m = manifest.model_copy(
        update={
            "archive": ArchiveEntry(
                name=junk.name, sha256=sha(junk.read_bytes()), size=junk.stat().st_size
            )
        }
    )
    with pytest.raises(BundleError, match="unreadable archive"):
        bundle.extract(junk, m, tmp_path / "staging")
    assert not (tmp_path / "staging").exists()


def test_missing_archive_file_is_a_bundle_error(tmp_path, packed):
    archive, manifest = packed
    archive.unlink()
    with pytest.raises(BundleError, match="unreadable archive"):
        bundle.extract(archive, manifest, tmp_path / "staging")


# -- hostile archives ---------------------------------------------------------------------
GOOD = b"a perfectly good first member"
TMP_EVIL = f"/tmp/gatekeeper-test-evil-{uuid.uuid4().hex}"


def hostile_cases(tmp_path: Path):
    abs_target = tmp_path / "abs_evil"
    return {
        "dotdot": ([reg("../evil", b"pwned")], {"../evil": b"pwned"}, "unsafe path"),
        "nested-dotdot": (
            [reg("cache/../../evil", b"pwned")],
            {"cache/../../evil": b"pwned"},
            "unsafe path",
        ),
        "absolute": ([reg(str(abs_target), b"pwned")], {str(abs_target): b"pwned"}, "unsafe path"),
        "absolute-tmp": ([reg(TMP_EVIL, b"pwned")], {TMP_EVIL: b"pwned"}, "unsafe path"),
        "symlink": ([special("cache/sym", tarfile.SYMTYPE, "/etc/passwd")], {}, "link"),
        "symlink-relative": ([special("cache/sym", tarfile.SYMTYPE, "../../..")], {}, "link"),
        "hardlink": ([special("cache/hard", tarfile.LNKTYPE, "cache/good")], {}, "link"),
        "chardev": ([special("cache/null", tarfile.CHRTYPE)], {}, "special file"),
        "blockdev": ([special("cache/sda", tarfile.BLKTYPE)], {}, "special file"),
        "fifo": ([special("cache/fifo", tarfile.FIFOTYPE)], {}, "special file"),
        "unlisted": (
            [reg("cache/extra.so", b"\x7fELF sneaky")],
            {},
            "'cache/extra.so' is not in the manifest",
        ),
        "backslash": (
            [reg("cache\\..\\..\\evil", b"pwned")],
            {"cache\\..\\..\\evil": b"pwned"},
            "unsafe path",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "dotdot",
        "nested-dotdot",
        "absolute",
        "absolute-tmp",
        "symlink",
        "symlink-relative",
        "hardlink",
        "chardev",
        "blockdev",
        "fifo",
        "unlisted",
        "backslash",
    ],
)
def test_hostile_archive_refused(tmp_path, case):
    members, listed, reason = hostile_cases(tmp_path)[case]
    archive = tmp_path / "arch" / "bundle-hostile.tar.zst"
    # a good member first, so something was extracted before the bad one is met
    write_tar_zst(archive, [reg("cache/good", GOOD), *members])
    manifest = manifest_for(archive, {"cache/good": GOOD, **listed})
    work = tmp_path / "work" / "a"
    staging = work / "staging"
    staging.mkdir(parents=True)
    before = set(tmp_path.rglob("*"))
    try:
        with pytest.raises(BundleError) as ei:
            bundle.extract(archive, manifest, staging)
        assert not Path(TMP_EVIL).exists()
    finally:
        Path(TMP_EVIL).unlink(missing_ok=True)  # only ever written by a broken extract
    msg = assert_one_line(ei.value)
    assert TARGET in msg
    assert f"bundle refused: {reason}" in msg
    assert not staging.exists()
    assert list(work.iterdir()) == []
    after = set(tmp_path.rglob("*"))
    assert after <= before  # nothing new anywhere (staging itself is gone)
    assert not (tmp_path / "abs_evil").exists()


def test_directory_members_are_fine(tmp_path):
    archive = tmp_path / "arch" / "bundle.tar.zst"
    d = tarfile.TarInfo("cache/sub")
    d.type = tarfile.DIRTYPE
    d.mode = 0o755
    write_tar_zst(archive, [(d, None), reg("cache/sub/f", b"f")])
    bundle.extract(archive, manifest_for(archive, {"cache/sub/f": b"f"}), tmp_path / "st")
    assert tree(tmp_path / "st") == {"cache/sub/f": b"f"}


# -- signing ------------------------------------------------------------------------------
@pytest.fixture
def signed(tmp_path):
    cache = make_cache(tmp_path / "src-signed")
    return do_pack(
        cache, make_megacache(tmp_path / "src-signed"), tmp_path / "signed", signing_key=KEY_A
    )


@pytest.fixture
def unsigned(packed):
    return packed


def test_signed_with_a_verifies_with_a(signed):
    archive, manifest = signed
    assert manifest.signature and manifest.signature.startswith("hmac-sha256:")
    m = bundle.verify_manifest(manifest.to_bytes(), target=TARGET, signing_key=KEY_A)
    assert m.signature == manifest.signature


def test_signed_with_a_refused_with_b(signed):
    _, manifest = signed
    with pytest.raises(BundleError) as ei:
        bundle.verify_manifest(manifest.to_bytes(), target=TARGET, signing_key=KEY_B)
    msg = assert_one_line(ei.value)
    assert TARGET in msg and "signature does not verify" in msg


def test_unsigned_refused_when_a_key_is_set(unsigned):
    _, manifest = unsigned
    with pytest.raises(BundleError) as ei:
        bundle.verify_manifest(manifest.to_bytes(), target=TARGET, signing_key=KEY_A)
    msg = assert_one_line(ei.value)
    assert TARGET in msg and "unsigned" in msg


@pytest.mark.parametrize(
    "edit", ["env_key", "code_hash", "file_sha", "archive_sha", "creator", "key", "add_file"]
)
def test_edited_signed_manifest_refused(signed, edit):
    _, manifest = signed
    doc = json.loads(manifest.to_bytes())
    if edit == "env_key":
        doc["env_key"] = "torch2.6.0+cpu-py3.11-cpu-x86_64-avx512-t2-000000"
    elif edit == "code_hash":
        doc["code_hash"] = "f" * 16
    elif edit == "file_sha":
        doc["files"]["cache/cpp/kernel.so"]["sha256"] = "0" * 64
    elif edit == "archive_sha":
        doc["archive"]["sha256"] = "0" * 64
    elif edit == "creator":
        doc["creator"]["commit"] = "cafebabe"
    elif edit == "key":
        doc["key"]["env"]["torch"] = "2.7.0"
    elif edit == "add_file":
        doc["files"]["cache/extra.so"] = {"sha256": "0" * 64, "size": 1}
    with pytest.raises(BundleError, match="signature does not verify"):
        bundle.verify_manifest(json.dumps(doc).encode(), target=TARGET, signing_key=KEY_A)


def test_no_key_accepts_signed_and_unsigned(signed, unsigned):
    for _, manifest in (signed, unsigned):
        m = bundle.verify_manifest(manifest.to_bytes(), target=TARGET, signing_key=None)
        assert m == manifest


def test_signed_bundle_round_trip(tmp_path, signed):
    archive, manifest = signed
    m = bundle.verify_manifest(manifest.to_bytes(), target=TARGET, signing_key=KEY_A)
    bundle.extract(archive, m, tmp_path / "staging")
    assert (tmp_path / "staging" / "megacache.bin").read_bytes() == MEGACACHE_BYTES


# -- manifest checks ----------------------------------------------------------------------
def test_manifest_for_another_target_refused(packed):
    _, manifest = packed
    with pytest.raises(BundleError) as ei:
        bundle.verify_manifest(manifest.to_bytes(), target="cnn/b8/default", signing_key=None)
    msg = assert_one_line(ei.value)
    assert "cnn/b8/default" in msg and TARGET in msg


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"target": "mlp/b8/default"}'])
def test_malformed_manifest_refused(data):
    with pytest.raises(BundleError) as ei:
        bundle.verify_manifest(data, target=TARGET, signing_key=None)
    msg = assert_one_line(ei.value)
    assert TARGET in msg and "malformed" in msg


def test_unknown_manifest_field_refused(packed):
    _, manifest = packed
    doc = json.loads(manifest.to_bytes())
    doc["extra"] = 1
    with pytest.raises(BundleError, match="malformed"):
        bundle.verify_manifest(json.dumps(doc).encode(), target=TARGET, signing_key=None)


def test_future_format_refused(packed):
    _, manifest = packed
    doc = json.loads(manifest.to_bytes())
    doc["format"] = bundle.FORMAT + 1
    with pytest.raises(BundleError, match="format"):
        bundle.verify_manifest(json.dumps(doc).encode(), target=TARGET, signing_key=None)


@pytest.mark.parametrize(
    "name", ["../bundle.tar.zst", "sub/bundle.tar.zst", "/abs/bundle.tar.zst", "."]
)
def test_archive_name_with_a_path_refused(packed, name):
    _, manifest = packed
    doc = json.loads(manifest.to_bytes())
    doc["archive"]["name"] = name
    with pytest.raises(BundleError, match="bad archive name"):
        bundle.verify_manifest(json.dumps(doc).encode(), target=TARGET, signing_key=None)


@pytest.mark.parametrize("name", ["", ".."])
def test_archive_name_that_is_not_a_file_name_refused(packed, name):
    _, manifest = packed
    doc = json.loads(manifest.to_bytes())
    doc["archive"]["name"] = name
    with pytest.raises(BundleError, match="bad archive name"):
        bundle.verify_manifest(json.dumps(doc).encode(), target=TARGET, signing_key=None)


# -- install_cache ------------------------------------------------------------------------
def staged(tmp_path: Path, files: dict[str, bytes]) -> Path:
    staging = tmp_path / "staging"
    for rel, data in files.items():
        p = staging / "cache" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (staging / "megacache.bin").write_bytes(b"blob")
    return staging


def test_install_into_existing_cache(tmp_path):
    staging = staged(
        tmp_path, {"same/a": b"same", "diff/b": b"new content", "fresh/c.so": b"\x7fELF"}
    )
    dest = tmp_path / "cache"
    (dest / "same").mkdir(parents=True)
    (dest / "diff").mkdir()
    (dest / "other").mkdir()
    (dest / "same" / "a").write_bytes(b"same")
    (dest / "diff" / "b").write_bytes(b"old content")
    (dest / "other" / "keep").write_bytes(b"someone else's entry")
    (dest / "diff" / "neighbour").write_bytes(b"neighbour")
    old = 1_000_000_000
    for p in dest.rglob("*"):
        os.utime(p, (old, old))
    ino = {rel: os.stat(dest / rel).st_ino for rel in ("same/a", "diff/b", "other/keep")}

    with open(dest / "diff" / "b", "rb") as reader:  # a process reading the old entry
        written = bundle.install_cache(staging, dest)
        assert reader.read() == b"old content"  # replaced by rename, not rewritten in place

    assert written == 2  # diff/b and fresh/c.so; same/a is skipped
    assert tree(dest) == {
        "same/a": b"same",
        "diff/b": b"new content",
        "fresh/c.so": b"\x7fELF",
        "other/keep": b"someone else's entry",
        "diff/neighbour": b"neighbour",
    }
    # the identical file is untouched
    st = os.stat(dest / "same" / "a")
    assert st.st_ino == ino["same/a"] and st.st_mtime == old
    # the differing file is a new inode (atomic replace)
    assert os.stat(dest / "diff" / "b").st_ino != ino["diff/b"]
    # other files are undisturbed
    st = os.stat(dest / "other" / "keep")
    assert st.st_ino == ino["other/keep"] and st.st_mtime == old
    assert os.stat(dest / "diff" / "neighbour").st_mtime == old
    # no temporary files left behind, megacache not installed
    assert not [p for p in dest.rglob(".gk-*")]
    assert not (dest / "megacache.bin").exists()
    assert os.stat(dest / "fresh" / "c.so").st_mode & 0o111


def test_install_twice_writes_nothing_the_second_time(tmp_path):
    staging = staged(tmp_path, {"a": b"a", "d/b": b"b"})
    dest = tmp_path / "cache"
    assert bundle.install_cache(staging, dest) == 2
    assert bundle.install_cache(staging, dest) == 0
    assert tree(dest) == {"a": b"a", "d/b": b"b"}


def test_install_same_size_different_content_is_replaced(tmp_path):
    staging = staged(tmp_path, {"a": b"1234"})
    dest = tmp_path / "cache"
    dest.mkdir()
    (dest / "a").write_bytes(b"abcd")
    assert bundle.install_cache(staging, dest) == 1
    assert (dest / "a").read_bytes() == b"1234"


# -- precompile packages --------------------------------------------------------------------
def pack_with_package(tmp_path: Path, info: dict, name: str = "pkg") -> tuple[Path, Manifest]:
    """A bundle whose compile recorded a precompile package: the recording's copy of the
    cache dir gained a dynamo entry and an AOT entry, and changed nothing else."""
    cache = make_cache(tmp_path / name / "src")
    copy = tmp_path / name / "copy"
    for rel, data in CACHE_FILES.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes(data)
    (copy / "locks").mkdir()
    (copy / "locks" / "new.lock").write_text("held")
    (copy / "dynamo" / "k1").mkdir(parents=True)
    (copy / "dynamo" / "k1" / "entry").write_bytes(b"package")
    (copy / "aotautograd" / "new").mkdir(parents=True)
    (copy / "aotautograd" / "new" / "entry").write_bytes(b"aot of the package")
    gained = bundle.changed_files(cache, copy)
    assert sorted(gained) == ["aotautograd/new/entry", "dynamo/k1/entry"]
    dest = tmp_path / name / "out"
    dest.mkdir(parents=True)
    return bundle.pack(
        cache,
        None,
        dest,
        target=TARGET,
        key=KEY,
        compile_info={"seconds": 1.0, "precompile": info},
        creator={},
        version="0.1.0",
        signing_key=None,
        members={"precompile/" + rel: path for rel, path in gained.items()},
    )


def test_a_package_is_installed_only_when_asked(tmp_path):
    archive, manifest = pack_with_package(tmp_path, {"status": "recorded", "verified": None})
    assert precompile.entries(manifest) == {"dynamo/k1"}
    staging = tmp_path / "staging"
    bundle.extract(archive, manifest, staging)
    plain, served = tmp_path / "plain", tmp_path / "served"
    bundle.install_cache(staging, plain)
    assert not (plain / "dynamo").exists() and (plain / "fxgraph/ab/abcdef/entry").is_file()
    bundle.install_cache(staging, served)
    bundle.install_tree(staging / "precompile", served)
    assert (served / "dynamo/k1/entry").read_bytes() == b"package"
    assert tree(served) == {
        **tree(plain),
        "dynamo/k1/entry": b"package",
        "aotautograd/new/entry": b"aot of the package",
    }


def test_only_a_verified_package_of_the_exact_bundle_is_served(tmp_path):
    from gatekeeper.kinds import Warming
    from gatekeeper.warm import WarmResult

    def decide(
        info: dict, *, hit: bool = True, want: str = "verified", served: set | None = None
    ) -> tuple[bool, WarmResult]:
        archive, manifest = pack_with_package(tmp_path, info, name=uuid.uuid4().hex)
        staging, cache = tmp_path / uuid.uuid4().hex, tmp_path / uuid.uuid4().hex
        bundle.extract(archive, manifest, staging)
        r = WarmResult(TARGET, "hit")
        claimed = served if served is not None else set()
        precompile.PRECOMPILE.warm(Warming(r, manifest, hit, staging, cache, want, claimed))
        return (cache / "dynamo/k1/entry").is_file(), r

    ok = {"status": "recorded", "verified": True, "check": {"dynamo": "skipped"}}
    assert decide(ok)[0] and decide(ok)[1].precompile == "served"
    serve, r = decide({"status": "recorded", "verified": None})
    assert not serve and r.precompile == "unverified"
    serve, r = decide(
        {
            "status": "recorded",
            "verified": False,
            "check": {"reason": "the package's outputs differ vs eager"},
        }
    )
    assert not serve and r.precompile == "rejected" and "differ" in r.precompile_reason
    serve, r = decide(ok, hit=False)  # a partial match is another version's code
    assert not serve and "another version" in r.precompile_reason
    serve, r = decide(ok, served={"dynamo/k1"})  # one place in the cache dir, one package
    assert not serve and r.precompile == "shadowed"
    assert decide({"status": "recorded", "verified": None}, want="any")[0]  # check's look
    assert not decide(ok, want="never")[0]  # check's measurement


def test_an_old_bundle_without_a_package_still_reads(packed):
    _, manifest = packed
    assert precompile.PRECOMPILE.info(manifest) == {} and precompile.entries(manifest) == set()
    assert not precompile.PRECOMPILE.present(manifest)


def test_resigning_a_manifest_keeps_it_verifiable(packed):
    _, manifest = packed
    signed = bundle.sign(manifest, KEY_A)
    noted = bundle.sign(signed.model_copy(update={"compile": {**signed.compile, "x": 1}}), KEY_A)
    assert bundle.verify_manifest(noted.to_bytes(), target=TARGET, signing_key=KEY_A) == noted
    forged = signed.model_copy(update={"compile": {**signed.compile, "x": 1}})  # not re-signed
    with pytest.raises(BundleError, match="signature does not verify"):
        bundle.verify_manifest(forged.to_bytes(), target=TARGET, signing_key=KEY_A)


def test_packages_load_only_when_every_found_target_is_served_from_its_own():
    """All or nothing: the precompile flag costs a target without a package its
    AOTAutograd hits (measured on a tiny BERT beside a GPT-2: 5.7 s instead of 3.8 s),
    the ISA flag is in the FX graph key, and torch hands a shadowed target (another
    mode of the same model) the served target's package."""
    from gatekeeper.warm import PackageState, WarmResult, service_env

    hold_packages = precompile.hold

    def with_package(name: str, status: str, state: str) -> WarmResult:
        return WarmResult(name, status, packages={"precompile": PackageState(state)})

    def served(name: str) -> WarmResult:
        return with_package(name, "hit", "served")

    both = {"TORCH_CACHING_PRECOMPILE": "1", "TORCHINDUCTOR_VEC_ISA_OK": "1"}
    assert service_env([served("a"), served("b")]) == both
    # a miss compiles cold, but with loading on torch would load any package it finds
    # for it (one an earlier deploy left): tests/test_warm_packages.py
    assert service_env([served("a"), WarmResult("d", "miss")]) == {}
    assert service_env([WarmResult("c", "hit"), WarmResult("d", "miss")]) == {}
    for other in (
        with_package("b", "hit", "rejected"),  # a package torch fails
        WarmResult("c", "partial"),  # a training step: no package
        with_package("s", "hit", "shadowed"),
    ):  # another mode
        results = [served("a"), other]
        assert service_env(results) == {}
        hold_packages(results)
        assert results[0].precompile == "installed"
        assert other.target in results[0].precompile_reason
    alone = [served("a")]
    hold_packages(alone)
    assert alone[0].precompile == "served" and alone[0].precompile_reason is None


def test_only_a_float32_inference_target_records_a_package(tmp_path):
    """A training step and an autocast variant get no package, each with its reason (a
    package recorded under autocast loaded but missed its guards on every call)."""
    from gatekeeper.boundary.protocol import Response
    from gatekeeper.project import expand, load_config

    (tmp_path / "gatekeeper.toml").write_text(
        '[tool.gatekeeper]\n[[tool.gatekeeper.models]]\nname = "m"\nfactory = "x:y"\n'
        'inputs = [{ shape = [2, 3] }]\ntasks = ["infer", "train"]\n'
        'precisions = ["fp32", "bf16"]\n'
    )
    config = load_config(tmp_path / "gatekeeper.toml")
    recorded = {"status": "recorded", "entries": ["dynamo/k"], "unguarded": []}
    resp = Response(ok=True, packages={"precompile": recorded})
    package = precompile.PRECOMPILE
    assert all(package.wanted(t, config) for t in expand(config))
    why = {t.id: package.pack(t, resp, tmp_path, tmp_path)[0] for t in expand(config)}
    assert why["m/fixed/default"]["status"] == "recorded"
    assert "autocast" in why["m/fixed/default+bf16"]["reason"]
    assert "training step" in why["m/fixed/default+train"]["reason"]
    assert "training step" in why["m/fixed/default+train+bf16"]["reason"]
