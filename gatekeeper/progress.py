"""Progress on stderr for long per-target work: a ticking line on a terminal, plain
start and end lines in CI logs. stdout stays free for results (and ``--json``)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO


class Progress:
    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.total = total
        self.n = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    @contextmanager
    def step(self, label: str, doing: str) -> Iterator[_Step]:
        self.n += 1
        head = f"[{self.n}/{self.total}] {label}"
        step = _Step()
        start = time.monotonic()
        stop = threading.Event()
        ticker = None
        if self.tty:

            def tick() -> None:
                while not stop.wait(1.0):
                    self._write(f"\r{head}: {doing} {time.monotonic() - start:4.0f} s\x1b[K")

            self._write(f"{head}: {doing}")
            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
        else:
            self._write(f"{head}: {doing}\n")
        try:
            yield step
        finally:
            stop.set()
            if ticker:
                ticker.join()
            took = time.monotonic() - start
            end = f"{head}: {step.result or 'failed'} ({took:.1f} s)"
            self._write(f"\r{end}\x1b[K\n" if self.tty else end + "\n")


class _Step:
    result: str | None = None

    def done(self, result: str) -> None:
        self.result = result
