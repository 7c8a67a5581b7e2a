"""The worker: the child process, and the only place torch compiles and measures.

The parent (everything outside this package) never imports torch to compile or time a
model: it sends a request (:data:`~gatekeeper.boundary.protocol.Request`, one model per
action) through :func:`~gatekeeper.boundary.client.run_worker`, which starts ``python -m
gatekeeper.worker`` in a fresh process with an isolated inductor cache dir, so a cold
compile is really cold and torch's counters describe one target. Every module here
runs in the child; the parent's side of the boundary is :mod:`gatekeeper.boundary`.

* ``imports``  what every worker imports before its action, fresh or forked
* ``model``    build the user's model and its seeded inputs (and a base version's, paired)
* ``compiler`` torch.compile as configured, and the counters that say what it did
* ``kinds``    each artifact kind's worker half: how it builds, records, loads
* ``compile``  the ``compile``, ``probe`` and ``deps`` actions
* ``graphs``   graphs and graph breaks with their reasons and file:line
* ``parity``   does the compiled model compute what eager (and the baseline) did?
* ``memory``   peak memory of a call
* ``timing``   interleaved latency rounds
* ``measure``  all of the above for one target: the answer to ``check``
* ``verify``   a package loaded as a deploy loads it, and its outputs compared
"""

from typing import NoReturn


def end(code: int) -> NoReturn:
    """End this worker process with ``code`` as an interpreter ends, less its teardown:
    Python's non-daemon threads joined and its ``atexit`` functions run (inductor's
    compile pool shut down, logging flushed, temporary folders removed), the standard
    streams flushed, then ``os._exit``. What is skipped is the interpreter freeing every
    object of torch, Dynamo and inductor one by one: about 1.1 seconds of every worker's
    wall and CPU, spent after its answer is written and before the parent can go on
    (docs/benchmarks.md, "A worker's end")."""
    import atexit
    import os
    import sys
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code & 0xFF if isinstance(code, int) else 1)
