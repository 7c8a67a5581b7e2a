"""The command line: parse, dispatch to one module per verb, and turn every expected
failure into one line on stderr and its exit code (0 pass, 1 failed gate, 2 error)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from . import __version__, secrecy
from .boundary import box
from .commands import (
    baseline,
    bisect,
    check,
    comment,
    common,
    dashboard,
    gate,
    key,
    merge,
    run,
    store,
    warm,
)
from .commands import compile as compile_
from .errors import EXIT_ERROR, GatekeeperError

COMMANDS = {
    "compile": compile_,
    "warm": warm,
    "key": key,
    "check": check,
    "baseline": baseline,
    "gate": gate,
    "run": run,
    "comment": comment,
    "merge": merge,
    "store": store,
    "dashboard": dashboard,
    "bisect": bisect,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other error
        sys.stderr.write(f"gatekeeper: error: {message} (see '{self.prog} --help')\n")
        sys.exit(EXIT_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gatekeeper",
        description="Make torch.compile safe and fast to "
        "ship: precompiled, verified bundles; warm starts; a PR gate.",
    )
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )
    parents = [common.common_flags()]
    for module in COMMANDS.values():
        module.register(sub, parents)
    return parser


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gatekeeper: %(levelname)s: %(message)s"))
    root = logging.getLogger("gatekeeper")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    root.propagate = False


class _Stdout:
    """``sys.stdout`` while a command runs. When the reader goes away (``| head``: EPIPE),
    the rest of the output goes to /dev/null and the command carries on: it still writes
    its files and exits with its own code. Exit codes here carry the verdict (1 is
    "regressed"), so neither Python's usual 1 nor a shell's 141 for SIGPIPE would do:
    ``gatekeeper gate | head`` must still fail on a regression and pass on a pass."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.reader_gone = False

    def _gone(self) -> None:
        self.reader_gone = True
        try:  # what is still buffered, and Python's flush at exit, go nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (tests' capture)
            pass

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    stdout = sys.stdout
    sys.stdout = guard = _Stdout(stdout)
    try:
        return _main(argv)
    finally:  # also after --help or a usage error (SystemExit)
        guard.flush()
        sys.stdout = stdout


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(getattr(args, "verbose", False))
    if getattr(args, "unconfined", False):  # the runner owner's, never a config's
        box.choose_unconfined()
    ctx = common.Context(args)
    try:
        return COMMANDS[args.command].run(ctx)
    except GatekeeperError as e:
        sys.stderr.write(f"gatekeeper: error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("gatekeeper: interrupted\n")
        return 130
    except Exception as e:  # a bug of ours: still exit 2, never 1 (which means "regressed")
        if args.verbose:
            traceback.print_exc()
        sys.stderr.write(
            f"gatekeeper: internal error: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]} (run with -v for the traceback)\n"
        )
        return EXIT_ERROR


def _stop_on_sigterm() -> None:
    """SIGTERM (a cancelled job) stops the program as Ctrl-C does: every ``finally``
    runs, so workers' boxes are ended and reaped and temporary folders removed."""
    import signal
    import threading

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def entry(argv: list[str] | None = None, *, exit: bool = True) -> int:
    """The ``gatekeeper`` program (the console script, ``python -m gatekeeper``, the
    action's step): :func:`main` in a process whose secrets are sealed away from the
    model code its workers run (:func:`gatekeeper.secrecy.seal`, credentials taken out
    of ``os.environ``). ``exit``: leave with the exit code, else return it."""
    secrecy.seal(drop=True)
    _stop_on_sigterm()
    try:
        code = main(argv)
    except SystemExit as e:  # --help, --version, a usage error
        if isinstance(e.code, str):
            sys.stderr.write(f"{e.code}\n")
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_ERROR)
    if exit:
        sys.exit(code)
    return code


if __name__ == "__main__":
    entry()
