"""How a test hears what a model's factory saw from inside its box.

The box leaves a worker nowhere to write but its own folders, which end with its run:
a factory that reports to its test writes lines to a FIFO the test made (writing to a
FIFO changes no file, so a read-only mount takes it), and a thread of the test reads
them. The FIFO lives in a folder any user may enter (a test that runs gatekeeper as
another user)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path


class Outbox:
    """A FIFO (:attr:`path`) read by a thread until :meth:`close`: every line written."""

    def __init__(self) -> None:
        folder = Path(tempfile.mkdtemp(prefix="gk-outbox-"))
        folder.chmod(0o755)
        self.path = folder / "outbox"
        os.mkfifo(self.path, 0o666)
        self.path.chmod(0o666)
        self._got: list[bytes] = []
        self._stop = False
        self._waiting = threading.Event()  # the reader waits for a writer
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            self._waiting.set()
            with open(self.path, "rb") as f:  # waits for a writer; EOF when all closed
                self._waiting.clear()
                self._got.append(f.read())

    def take(self) -> list[str]:
        """The lines written so far (every writer gone: the processes that wrote have
        ended), and none of them again."""
        self._waiting.wait(timeout=30)
        got, self._got = self._got, []
        return b"".join(got).decode(errors="replace").splitlines()

    def close(self) -> list[str]:
        """Stop reading; every line written so far."""
        self._stop = True
        try:  # wakes the reader if it waits for a writer
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waits
            pass
        self._thread.join(timeout=30)
        os.unlink(self.path)
        os.rmdir(self.path.parent)
        return b"".join(self._got).decode(errors="replace").splitlines()

    def docs(self) -> list:
        """:meth:`close`, each line a JSON document."""
        return [json.loads(line) for line in self.close() if line.strip()]
