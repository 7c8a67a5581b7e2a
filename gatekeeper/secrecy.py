"""The secrets of the gatekeeper process (the signing key, the store's credentials, the
job's tokens), kept where the model code its workers run cannot read them.

A worker's own environment never holds a secret (:func:`gatekeeper.boundary.client.cache_env`
drops every variable :func:`is_secret` names). Its ancestors do: gatekeeper itself, and
whatever started it. On Linux, before any worker starts, :func:`seal` makes this process
a dead end for model code:

* **the environment block is overwritten.** ``/proc/<pid>/environ`` shows the block the
  process was started with (``env_start``..``env_end`` of ``/proc/self/stat``), whatever
  ``os.environ`` holds now. Every variable the worker is denied (``is_secret``) has its
  value overwritten there with ``*``, in place, and so has any variable whose value holds
  a credential's; the variables still needed are set again (a copy on the heap), so
  ``os.environ`` and C's ``getenv`` read what they read before.
* **the process is not dumpable** (``prctl(PR_SET_DUMPABLE, 0)``): a process of the same
  user cannot open its ``/proc/<pid>/environ``, ``mem``, ``maps`` or file descriptors,
  nor ptrace it. Root can, with ``CAP_SYS_PTRACE``, ``CAP_SYS_ADMIN`` or ``CAP_PERFMON``:
  a worker never has them (:mod:`gatekeeper.boundary.confine`).
* **the gatekeeper program** (:func:`gatekeeper.cli.entry`: the console script, ``python
  -m gatekeeper``, the action) also takes the credentials out of ``os.environ``, so no
  child inherits them by default: the signing key, GitHub tokens and AWS keys stay in
  this module (:func:`secret`, :func:`aws_credentials`), the runner's other tokens are
  dropped. A program that calls gatekeeper's API keeps its ``os.environ`` as it is.

Elsewhere (macOS, Windows) :func:`seal` does nothing: the worker's environment is
scrubbed, and that is all (docs/hardening.md says what that leaves open).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("gatekeeper.secrecy")

PR_SET_DUMPABLE = 4

# what the parent itself reads, from here once the program took them out of os.environ
HELD = (
    "GATEKEEPER_SIGNING_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)
# a value this short is no credential of its own (and would match half the environment)
MIN_SECRET_LEN = 8

# What the worker never sees. It imports and runs the user's model code and whatever
# that imports, while the parent may hold the store's write credentials, the signing
# key and the job's tokens; the worker needs none of them (the parent fetches and
# publishes). Dropped by prefix, by name, and by a secret-sounding word in the name.
SECRET_PREFIXES = (
    "GATEKEEPER_",  # the signing key, and any future secret of ours
    "AWS_",  # the store's credentials and their files (torch and inductor read none)
    "GOOGLE_",
    "GCLOUD_",
    "CLOUDSDK_",
    "AZURE_",
    "ARM_",
    "ACTIONS_",  # the runner's runtime and OIDC request tokens and URLs
    "GITHUB_",  # the token, and GITHUB_ENV / GITHUB_PATH: files that steer later steps
    "GIT_CONFIG_",  # an auth header passed to git through the environment
    "VAULT_",
    "INPUT_",  # a JavaScript or Docker action's inputs: `signing-key`, `github-token`
)
# never given to a worker, whatever the config's pass_env says: gatekeeper's own (the
# signing key), the store's credentials, the runner's tokens and its file commands
# (GITHUB_ENV, RUNNER_TEMP: files that steer the job's later steps)
NEVER_PASSED = ("GATEKEEPER_", "AWS_", "GITHUB_", "GH_", "RUNNER_", "ACTIONS_", "INPUT_")
SECRET_NAMES = frozenset({"GH_TOKEN", "GH_ENTERPRISE_TOKEN", "SSH_AUTH_SOCK", "KUBECONFIG"})
_SECRET_WORD = re.compile(
    r"(^|[_-])(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|API[_-]?KEY|ACCESS[_-]KEY|"
    r"PRIVATE[_-]KEY|SIGNING[_-]KEY|AUTH)([_-]|$)",
    re.IGNORECASE,
)


# a name that may hold a credential, whatever its spelling (PGPASSWORD, MYSQL_PWD,
# DATABASE_URL, DEPLOY_KEY, SSH_KEY): never passed to a worker because a config names
# it, only because the workflow does (PASS_SECRETS)
MAY_BE_CREDENTIAL = re.compile(
    r"PASS|PWD|SECRET|TOKEN|CRED|AUTH|COOKIE|SESSION|PRIVATE|(KEY|URL|URI|DSN)S?(_|$)"
)
# a value that holds a password: a URL's (scheme://user:password@host) or a DSN's
# (password=...)
_PASSWORD_IN_VALUE = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@|\b(password|passwd|pwd)\s*=\s*[^\s;&]",
    re.IGNORECASE,
)
# the workflow's word (outside a pull request's config): the names that may pass even
# though they may hold a credential, when pass_env names them too
PASS_SECRETS = "GATEKEEPER_PASS_SECRETS"


def let_through() -> frozenset[str]:
    """The names ``GATEKEEPER_PASS_SECRETS`` lets through (comma- or space-separated)."""
    raw = os.environ.get(PASS_SECRETS, "")
    return frozenset(n for n in re.split(r"[\s,]+", raw.strip()) if n)


def may_be_credential(name: str) -> bool:
    """Whether the name ``name`` may hold a credential, in any spelling."""
    return MAY_BE_CREDENTIAL.search(name.upper()) is not None


def holds_password(value: str) -> bool:
    """Whether ``value`` holds a password: a URL with one, a DSN's ``password=``."""
    return _PASSWORD_IN_VALUE.search(value) is not None


def passable(name: str) -> str:
    """``name``, when a config's ``pass_env`` may name it; else ValueError: never what
    gatekeeper withholds (:data:`NEVER_PASSED`), and never a name that may hold a
    credential unless the workflow lets it through (:data:`PASS_SECRETS`)."""
    if name.upper().startswith(NEVER_PASSED):
        raise ValueError(f"{name!r} is never passed to a worker (docs/hardening.md)")
    if may_be_credential(name) and name not in let_through():
        raise ValueError(
            f"{name!r} may name a credential: a config never passes one to a worker; the "
            f"workflow may let it through with {PASS_SECRETS}={name} (docs/hardening.md)"
        )
    return name


def secret_word(name: str) -> bool:
    """Whether ``name`` says it holds a credential (``HF_TOKEN``, ``MY_SIGNING_KEY``)."""
    return _SECRET_WORD.search(name) is not None


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less every variable :func:`is_secret` names."""
    return {k: v for k, v in environ.items() if not is_secret(k)}


def is_secret(name: str) -> bool:
    """Whether the variable ``name`` stays out of the worker's environment."""
    upper = name.upper()
    return upper.startswith(SECRET_PREFIXES) or upper in SECRET_NAMES or secret_word(upper)


_vault: dict[str, str] = {}
_sealed = False


def secret(name: str) -> str | None:
    """The variable ``name`` as this process was given it: from ``os.environ``, else from
    what :func:`seal` took out of it."""
    value = os.environ.get(name)
    return value if value is not None else _vault.get(name)


def aws_credentials() -> dict[str, str]:
    """The AWS keys :func:`seal` took out of the environment, as ``boto3.session.Session``
    takes them; empty where the environment still has them (boto3 reads them there)."""
    if "AWS_ACCESS_KEY_ID" in os.environ or "AWS_ACCESS_KEY_ID" not in _vault:
        return {}
    creds = {
        "aws_access_key_id": _vault["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": _vault["AWS_SECRET_ACCESS_KEY"],
    }
    token = _vault.get("AWS_SESSION_TOKEN") or _vault.get("AWS_SECURITY_TOKEN")
    if token:
        creds["aws_session_token"] = token
    return creds


def is_credential(name: str) -> bool:
    """A variable whose value is a credential (a key, a token, a password), not a setting
    such as ``AWS_REGION`` or ``GITHUB_EVENT_PATH``."""
    upper = name.upper()
    return (
        upper in HELD
        or upper in SECRET_NAMES
        or upper.startswith(("ACTIONS_", "VAULT_"))
        or secret_word(upper)
    )


def _dropped(name: str) -> bool:
    """Whether the program takes ``name`` out of ``os.environ``: every credential but the
    AWS variables botocore reads itself (container and web-identity settings)."""
    if name in HELD:
        return True
    if name in let_through() and not name.upper().startswith(NEVER_PASSED):
        return False  # the workflow lets it through to workers that name it
    return is_credential(name) and not name.upper().startswith("AWS_")


def seal(*, drop: bool = False) -> None:
    """Keep this process's secrets from the workers it starts (see the module doc);
    ``drop``: also take the credentials out of ``os.environ`` (the gatekeeper program).
    Safe to call again: later variables are sealed too."""
    global _sealed
    names = {n for n in os.environ if is_secret(n)}
    values = {os.environ[n] for n in names if is_credential(n)} | set(_vault.values())
    if drop:
        # AWS keys without their other half stay where boto3 finds them, and says so
        partial = ("AWS_ACCESS_KEY_ID" in os.environ) != ("AWS_SECRET_ACCESS_KEY" in os.environ)
        for name in sorted(names):
            if _dropped(name) and not (partial and name.startswith("AWS_")):
                value = os.environ.pop(name)
                if name in HELD:
                    _vault[name] = value
    if sys.platform != "linux":
        return
    scrubbed = _scrub_block({v for v in values if len(v) >= MIN_SECRET_LEN})
    for name in scrubbed & set(os.environ):  # a heap copy: what C's environ points to now
        os.environ[name] = os.environ[name]
    if not _sealed:
        _not_dumpable()
        _sealed = True


def _environ_block() -> tuple[int, int] | None:
    """(start, end) of the environment block ``/proc/self/environ`` shows."""
    try:
        stat = Path("/proc/self/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # after the command's name: field 3 on
        start, end = int(fields[50 - 3]), int(fields[51 - 3])
    except (OSError, IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def _scrub_block(values: set[str]) -> set[str]:
    """Overwrite, in place, the value of every entry of the environment block that the
    worker is denied (whether ``os.environ`` still has it or not) or that holds one of
    ``values`` or another such entry's credential; returns the names overwritten."""
    where = _environ_block()
    if where is None:
        log.debug("no environment block to scrub")
        return set()
    start, end = where
    entries = [e.partition(b"=") for e in ctypes.string_at(start, end - start).split(b"\0")]
    needles = {v.encode(errors="surrogateescape") for v in values} | {
        value
        for name, _, value in entries
        if len(value) >= MIN_SECRET_LEN and is_credential(name.decode(errors="replace"))
    }
    scrubbed, offset = set(), 0
    for name, sep, value in entries:
        text = name.decode(errors="surrogateescape")
        if sep and value.strip(b"*") and (is_secret(text) or any(n in value for n in needles)):
            ctypes.memmove(start + offset + len(name) + 1, b"*" * len(value), len(value))
            scrubbed.add(text)
        offset += len(name) + len(sep) + len(value) + 1
    return scrubbed


def _not_dumpable() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_DUMPABLE) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.warning("cannot make this process non-dumpable: %s", e)
