"""The errors gatekeeper expects, and the exit code each one means.

Every expected failure is raised as a :class:`GatekeeperError`; ``cli.main`` is the one
place that turns them into a one-line message on stderr and an exit code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a regression or a parity failure: the gate said no
EXIT_ERROR = 2  # usage, config or tool error


def first_line(e: BaseException, limit: int = 400) -> str:
    """``Type: first line of the message``: an exception from torch or the user's code
    as one line."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    return line[:limit]


class GatekeeperError(Exception):
    """An expected failure, shown to the user as one line."""

    exit_code = EXIT_ERROR

    def __str__(self) -> str:  # always one line
        return " ".join(str(self.args[0] if self.args else self.__class__.__name__).split())


class UsageError(GatekeeperError):
    """Bad command-line usage."""


class ConfigError(GatekeeperError):
    """The config file is missing, malformed or names something that does not work."""


class StoreError(GatekeeperError):
    """The store failed: unreachable, denied, misconfigured."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (network, endpoint, missing bucket or credentials)."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the object exists (If-None-Match) or moved (If-Match)."""


class ObjectTooLarge(StoreError):
    """An object is larger than anything of its kind may be: refused before it is read
    whole (a manifest, a baseline, reference outputs larger than their record)."""


class AccessDenied(StoreError):
    """The store refused the request for lack of permission (HTTP 403)."""


class BundleError(GatekeeperError):
    """A bundle is malformed, unsafe, or does not verify: it is never loaded."""


class WorkerError(GatekeeperError):
    """A compile or measure subprocess failed."""


class BoxUnavailable(GatekeeperError):
    """The worker's box cannot be made here (gatekeeper.boundary.box): no model code
    runs, unless the runner's owner chose to run it unconfined."""


class WontFit(GatekeeperError):
    """A target will not fit in the memory given: refused before any compile, naming
    the estimate and the ways out (gatekeeper.worker.plan)."""
