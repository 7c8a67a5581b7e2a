"""How a worker process starts, for both doors into one (:mod:`gatekeeper.boundary.client`,
one process; :mod:`gatekeeper.boundary.ranks`, a distributed target's ranks): its
environment (an allow-list) and its confined command line. No torch here.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from .. import safefs
from ..scratch import held
from ..secrecy import (
    NEVER_PASSED,
    PASS_SECRETS,
    holds_password,
    is_credential,
    let_through,
    may_be_credential,
)
from . import box
from .headers import folder as headers_folder
from .protocol import Build

log = logging.getLogger("gatekeeper.worker")
# What the worker's environment keeps of the parent's (docs/hardening.md, "The worker's
# environment"): what Python, torch, inductor, Triton, CUDA/ROCm, NCCL and gloo, the
# C++ compiler and the BLAS/OpenMP runtimes read. Anything else comes only through
# ``pass_env`` in the config. A credential is never passed, whatever list names it.
ALLOWED_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
        "TMPDIR", "TEMP", "TMP", "NO_COLOR", "COLUMNS",
        "PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "PYTHONIOENCODING", "PYTHONUTF8",
        "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH",
        "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH", "LIBRARY_PATH",
        "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "MAX_JOBS",
        "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
    }
)  # fmt: skip
ALLOWED_PREFIXES = (
    "LC_", "TORCH", "PYTORCH_", "TRITON_", "INDUCTOR_", "KINETO_",
    "CUDA_", "CUDNN_", "CUBLAS", "NCCL_", "NVIDIA_", "NVTE_", "CUPTI_",
    "ROCM_", "HIP_", "HSA_", "MIOPEN_", "GLOO_",
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "DNNL_", "ONEDNN_",
)  # fmt: skip


def allowed(name: str, pass_env: Iterable[str] = ()) -> bool:
    """Whether the parent's variable ``name`` reaches the worker: on the allow-list, or
    named by ``pass_env`` (a name, or a ``PREFIX*`` glob); never one of
    :data:`gatekeeper.secrecy.NEVER_PASSED`, and never a name that may hold a credential
    (``PGPASSWORD``, ``DATABASE_URL``, ``DEPLOY_KEY``) unless ``pass_env`` names it and
    the workflow lets it through (``GATEKEEPER_PASS_SECRETS``)."""
    upper = name.upper()
    if upper.startswith(NEVER_PASSED):
        return False
    patterns = list(pass_env)
    if name in patterns and name in let_through():
        return True
    if is_credential(upper):
        return False
    if upper in ALLOWED_NAMES or upper.startswith(ALLOWED_PREFIXES):
        return True
    if may_be_credential(upper):
        return False
    return name in patterns or any(
        fnmatch.fnmatchcase(name, p) for p in patterns if p.endswith("*")
    )


def worker_environ(environ: Mapping[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """What of ``environ`` a worker is given (:func:`allowed`), less a value that holds
    a password (a URL's, a DSN's) unless the workflow lets its name through: dropped,
    with a warning."""
    names, through = list(pass_env), let_through()
    found = {k: v for k, v in environ.items() if allowed(k, names)}
    for name in [k for k, v in found.items() if k not in through and holds_password(v)]:
        del found[name]
        if name not in _warned:
            _warned.add(name)
            log.warning(
                "%s is not given to workers: its value holds a password (%s=%s lets it through)",
                name,
                PASS_SECRETS,
                name,
            )
    return found


_warned: set[str] = set()


def cache_env(
    cache_dir: Path, extra: dict[str, str] | None = None, pass_env: Iterable[str] = ()
) -> dict[str, str]:
    """The environment of a compile: this cache dir only, FX graph and AOT caches on;
    ``extra``: what a deploy's service sets besides (see :func:`gatekeeper.warm.service_env`);
    ``pass_env``: the config's additions to the allow-list (:func:`allowed`)."""
    env = worker_environ(os.environ, pass_env) | (extra or {})
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    # Triton's kernels then land inside the inductor cache dir (<cache>/triton/<device>)
    env.pop("TRITON_CACHE_DIR", None)
    # and the rest of Triton's home (its driver stubs under ~/.triton/cache) in it too: in
    # the box the user's home is read-only (a GPU compile failed on '/root/.triton')
    env["TRITON_HOME"] = str(cache_dir)
    # no current directory on sys.path: a gatekeeper/ folder there must not shadow us
    env["PYTHONSAFEPATH"] = "1"
    # the profiler (CPU peak memory) must not print its start/stop lines into our logs
    env.setdefault("KINETO_LOG_LEVEL", "6")
    return env


def _checkouts(places: Iterable[Path]) -> list[Path]:
    """The git checkouts holding ``places``, and their git dirs (a worktree's ``.git``
    file names its own, and that one its common dir), found without running git."""
    found: list[Path] = []
    for place in places:
        for top in [place, *place.parents]:
            dot = top / ".git"
            if not dot.exists():
                continue
            found.append(top)
            git_dir = dot
            if dot.is_file():
                text = dot.read_text(errors="replace").strip()
                if text.startswith("gitdir:"):
                    git_dir = (top / text[7:].strip()).resolve()
                    found.append(git_dir)
            common = git_dir / "commondir"
            if common.is_file():
                found.append((git_dir / common.read_text().strip()).resolve())
            break
    return found


def _runner_dirs(environ: Mapping[str, str]) -> list[Path]:
    """The Actions runner's folders (its temp dir with the file commands that steer
    later steps, its tool cache, the workspace) and the files GITHUB_ENV and its like
    name (each file bound read-only by itself, wherever it lies)."""
    names = ("RUNNER_TEMP", "RUNNER_TOOL_CACHE", "RUNNER_WORKSPACE", "GITHUB_WORKSPACE")
    files = ("GITHUB_ENV", "GITHUB_PATH", "GITHUB_OUTPUT", "GITHUB_STATE", "GITHUB_STEP_SUMMARY")
    return [Path(environ[n]) for n in (*names, *files) if environ.get(n)]


def read_only_dirs(config_dirs: Iterable[Path] = (), headers: bool = True) -> list[str]:
    """What no worker may write, even inside a folder it writes in: this Python's
    installation, every folder on the parent's import path, gatekeeper's package (code
    the parent, holding the signing key, imports later, and the action's later steps
    run), every ``PATH`` folder (a program the parent or a later step runs), the git
    checkouts of the configs (a paired check's base commit's too) and of the current
    directory with their ``.git`` (the hooks and config git runs), the runner's
    folders, and (``headers``) the shared precompiled headers (C++ that every later
    compile includes: :mod:`gatekeeper.boundary.headers`)."""
    here = Path(__file__).resolve().parents[1]
    entries = [sys.prefix, sys.base_prefix, sys.exec_prefix, str(here), *sys.path]
    entries += [p for p in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(p)]
    paths = [Path(e) for e in entries if e]
    if headers and (shared := headers_folder()) is not None:
        paths.append(shared)
    paths += _checkouts([Path.cwd(), *config_dirs])
    paths += _runner_dirs(os.environ)
    found = set()
    for path in paths:
        try:
            real = path.resolve()
        except OSError:
            continue
        if real.exists() and real != Path(real.anchor):
            found.add(str(real))
    return sorted(found)


def writable_dirs(writable: Iterable[Path]) -> list[str]:
    """The folders a worker writes in: its own (``writable``), nothing of the parent's
    (its temp dir is read-only in the box, and ``/dev/shm`` the box's own)."""
    found = {str(Path(p).resolve()) for p in writable}
    return sorted(p for p in found if Path(p).is_dir())


# a GPU's device nodes (NVIDIA's, ROCm's, DRM's): bound into the box's /dev only where
# the target runs on one
GPU_NODES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri", "/dev/kfd")


def devices_for(device: str) -> list[str]:
    """The device nodes a worker of ``device`` needs in its box's ``/dev``."""
    if device == "cpu":
        return []
    import glob

    return sorted({p for pattern in GPU_NODES for p in glob.glob(pattern)})


def worker_command(
    *args: str,
    writable: list[Path],
    scratch: Path,
    config_dirs: Iterable[Path] = (),
    module: str = "gatekeeper.worker",
    private_net: bool = False,
    writes_headers: bool = False,
    devices: Iterable[str] = (),
) -> list[str]:
    """``python -m gatekeeper.worker ARGS``; on Linux started in its box (``confine.py``:
    no capability or namespace to read its ancestors' memory, a filesystem where it
    writes only ``writable``, a ``/dev`` of its own with only ``devices`` besides the
    usual nodes, a PID namespace that dies with this process, the workflow's limits,
    ``scratch`` removed if this process dies first) before any code of the model or of
    its site-packages runs (:func:`gatekeeper.boundary.box.start` starts it). A
    distributed target's ``module`` is its launcher: the ranks it starts are its
    children, in the same box (``private_net``: with a network of their own)."""
    cmd = [sys.executable, "-m", module, *args]
    if sys.platform != "linux":
        return cmd
    confine = [sys.executable, "-I", "-S", str(Path(__file__).with_name("confine.py"))]
    confine += ["--parent", str(os.getpid())]
    for folder in dict.fromkeys([scratch, *held()]):  # removed by the box if we die first
        confine += ["--scratch", str(folder)]
    for path in read_only_dirs(config_dirs, headers=not writes_headers):
        confine += ["--read-only", path]
    for path in writable_dirs(writable):  # never ``scratch``: the run's folder is ours
        confine += ["--writable", path]
    for node in devices:
        confine += ["--device", node]
    if private_net:
        confine.append("--private-net")
    return [*confine, *box.confine_flags(), "--", *cmd]


def worker_folders(run: Path) -> tuple[Path, Path]:
    """A run's folder (the parent's: the request, the log) and, inside it, the worker's
    own (``box/``: its temp dir, its answer), the one it writes."""
    own = run / "box"
    own.mkdir(mode=0o700)
    return run, own


def headers_worker(
    where: Path, scratch: Path, parts: tuple[str, ...] = ("kernels",)
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of :mod:`gatekeeper.worker.headers` (no model
    code) building ``parts``, in its box: ``where`` and a folder of ``scratch`` its only
    writable ones."""
    _, own = worker_folders(scratch)
    cmd = worker_command(
        str(where),
        *parts,
        writable=[where, own],
        scratch=scratch,
        module="gatekeeper.worker.headers",
        writes_headers=True,
    )
    return cmd, cache_env(own / "cache") | {"TMPDIR": str(own)}


# what a worker's answer may weigh (a response with every shape set's timings and
# counters is a few hundred KiB); a log is read only from its end (safefs.read_tail)
ANSWER_CAP = 64 * 2**20


def answered(path: Path) -> bool:
    """Whether anything is at ``path`` (a worker's answer: read by :func:`read_answer`,
    which refuses what is not a plain file)."""
    return os.path.lexists(path)


def read_answer(path: Path, what: str, cap: int = ANSWER_CAP) -> str:
    """The text of an answer a worker or rank wrote, refused unread (WorkerError, one
    line) when it is over ``cap`` bytes, or not a plain file (a link, a FIFO: never
    followed, never waited on)."""
    from ..errors import WorkerError

    try:
        fd = safefs.open_regular(path)
    except safefs.NotPlain as e:
        raise WorkerError(f"{what}: {path.name} refused unread: {e.strerror}") from None
    except OSError as e:
        raise WorkerError(f"{what}: cannot read {path.name}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(cap + 1) if size <= cap else b""
    if size > cap or len(data) > cap:
        raise WorkerError(
            f"{what}: {path.name} refused unread: {size} bytes, more than the {cap} bytes "
            "an answer may have"
        )
    return data.decode(errors="replace")


def configs_of(request: Build) -> list[Path]:
    """The config folders ``request`` builds from: its own, and a paired base commit's."""
    found = [request.base_path]
    if base := getattr(request, "paired_base", None):
        found.append(Path(base.base_dir))
    return found


def outputs_of(request: object) -> list[Path]:
    """The folders ``request`` has its worker write in (its outputs' and packages')."""
    found = []
    for name in ("megacache_out", "reference_out", "trace_out"):
        if value := getattr(request, name, None):
            found.append(Path(value).parent)
    for ref in getattr(request, "packages", None) or []:
        found.append(Path(ref.path).parent)
    return found


def writable_for(cache_dir: Path, request: object) -> list[Path]:
    """The folders a worker's box may write (its cache and the request's outputs),
    made if missing."""
    writable = [cache_dir, *outputs_of(request)]
    for folder in writable:
        folder.mkdir(parents=True, exist_ok=True)
    return writable
