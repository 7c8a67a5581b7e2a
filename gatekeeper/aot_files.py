"""Where ``gatekeeper warm`` installs an ``+aot`` target's AOTInductor package (under
``gatekeeper/aot/<target>/`` in the inductor cache dir, beside what warm recorded of it
and the bundle's signed manifest), and how a deploy checks that package before loading
it: the bytes it hashes are a private copy's, the copy it then loads
(:func:`gatekeeper.runtime.load_aot`). No torch here."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from .errors import GatekeeperError

AOT_HOME = Path("gatekeeper", "aot")  # inside the inductor cache dir
PACKAGE = "model.pt2"
AOT_MEMBER = f"aot/{PACKAGE}"  # the package in an aot bundle's archive
INFO = "package.json"  # what warm installed: target, code hash, sha256, the check's verdict
MANIFEST = "manifest.json"  # the bundle's signed manifest, as warm verified it
# what the aot kind's worker adds to a package, in the archive's extra files: for weights
# bound at load, which constant is which tensor of the model, and the constants that are
# no tensor of the model (stored, small); the custom ops of Python its program calls,
# each with the module that defines it
WEIGHTS_RECORD = "extra/gatekeeper/weights.json"
STORED_CONSTANTS = "extra/gatekeeper/constants.pt"
PYTHON_OPS = "extra/gatekeeper/python_ops.json"


def package_member(path: str | os.PathLike[str], name: str) -> bytes | None:
    """A file of a ``.pt2`` archive (``name`` under its one top folder), or None."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        found = [n for n in z.namelist() if n.split("/", 1)[-1] == name]
        return z.read(found[0]) if found else None


class AotUnavailable(GatekeeperError):
    """No verified AOTInductor package is installed for the target: the service compiles
    (``torch.compile``) as it would without one."""


def inductor_cache_dir() -> Path:
    """The inductor cache dir of this process, as inductor computes it (without
    importing inductor): ``$TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>``."""
    explicit = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): inductor's fallback
        user = "unknown"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tempfile.gettempdir(), f"torchinductor_{user}")


def package_dir(cache: Path, target_id: str) -> Path:
    """Where ``warm`` installs a target's package inside a cache dir."""
    return cache / AOT_HOME / target_id.replace("/", "__")


def private_copy(src: Path) -> tuple[Path, str, int]:
    """``src`` (never through a symlink) copied into a new 0700 folder of this
    process's in its temp dir (never inside the package's folder, which others may
    write), the sha256 of exactly the bytes copied, and a descriptor of the copy
    (what is loaded: :func:`loadable`)."""
    folder = Path(tempfile.mkdtemp(prefix="gk-aot-"))
    dest, h = folder / PACKAGE, hashlib.sha256()
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        kept = os.open(dest, flags, 0o600)
        with os.fdopen(fd, "rb") as f, os.fdopen(os.dup(kept), "wb") as out:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return dest, h.hexdigest(), kept


def loadable(copy: Path, fd: int, sha256: str) -> str:
    """What to hand torch's loader of a verified private copy: the open descriptor's
    own path (``/proc/self/fd/N``: the very file hashed, whatever the name holds now),
    or, where there is none, the copy's path once its bytes hash as verified again."""
    own = f"/proc/self/fd/{fd}"
    if os.path.exists(own):
        return own
    h = hashlib.sha256()
    with os.fdopen(os.dup(fd), "rb") as f:
        f.seek(0)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha256:
        raise AotUnavailable(f"{copy}: changed after it was verified: not loaded")
    return str(copy)


def check_package(wanted: str, where: Path, info: dict) -> tuple[Path, int]:
    """Loading a package runs its shared library: it must be the file ``warm`` verified.
    Its sha256 must be the one ``warm`` recorded; where this process has the signing
    key (or a signature is required), the bundle's signed manifest ``warm`` kept beside
    it must verify and record that same sha256, so an edited ``package.json`` is no way
    around it. The bytes hashed are a private copy's, the one loaded (returned, with a
    descriptor of it: :func:`loadable`). Raises :class:`AotUnavailable` otherwise."""
    from . import bundle
    from .errors import BundleError, ConfigError

    recorded = info.get("sha256")
    if not isinstance(recorded, str) or not re.fullmatch(r"[0-9a-f]{64}", recorded):
        raise AotUnavailable(f"{wanted}: {where / INFO} records no sha256 for its package")
    try:
        key = bundle.signing_key()
    except ConfigError as e:
        raise AotUnavailable(f"{wanted}: {e}") from None
    if key is not None:
        try:
            data = (where / MANIFEST).read_bytes()
            target = json.loads(data).get("target")
            manifest = bundle.verify_manifest(data, target=str(target), signing_key=key)
        except (OSError, ValueError, AttributeError, BundleError) as e:
            raise AotUnavailable(
                f"{wanted}: no signed manifest verifies the package in {where} ({e}); "
                "run gatekeeper warm again"
            ) from None
        entry = manifest.files.get(AOT_MEMBER)
        if entry is None or entry.sha256 != recorded or manifest.code_hash != info.get("code_hash"):
            raise AotUnavailable(f"{wanted}: {where / INFO} is not what its signed manifest says")
    try:
        copy, actual, fd = private_copy(where / PACKAGE)
    except OSError as e:  # missing, or a symlink (O_NOFOLLOW)
        raise AotUnavailable(f"{wanted}: {where / PACKAGE} unreadable: {e.strerror}") from None
    if actual != recorded:
        os.close(fd)
        shutil.rmtree(copy.parent, ignore_errors=True)
        raise AotUnavailable(
            f"{wanted}: {where / PACKAGE} is not the package warm verified (sha256 "
            f"{actual[:12]}, recorded {recorded[:12]}): not loaded"
        )
    return copy, fd
