"""The process boundary, parent side: how the parent asks a worker for work and reads
its answer. No torch is imported at module level here; the parent imports
:mod:`gatekeeper.worker` (the torch child) through nothing but this package.

* ``protocol``     the typed requests and responses both sides speak
* ``client``       run a request in a fresh worker process: :func:`client.run_worker`
* ``spawn``        a worker's environment (an allow-list) and its confined command line
* ``confine``      the box a worker starts in (a stdlib-only script, run by file path)
* ``ranks``        a distributed target: start its ranks, wait, stop them
* ``elastic``      the ranks' launcher, torch's elastic agent (``python -m``, torch inside)
* ``merge``        the ranks' answers made into one
* ``breadcrumbs``  the step a worker was in, for the parent to read when it died
"""
