"""The gate: is this pull request's measurement worse than its base branch's baseline?

* ``verdicts``  the verdicts (a ``Literal``), in order of severity
* ``stats``     pure statistics (scipy.stats, imported lazily)
* ``drift``     noise within a run and drift between runs, in one place
* ``rules``     one target's result against its baseline -> a verdict and its reasons
* ``judge``     load the baselines from the store and gate every target -> a GateReport
* ``baseline``  publish results as a branch's baseline (with their noise figures)

No torch anywhere here; only ``judge`` and ``baseline`` touch the store.
"""

from .rules import GateReport, GateRow, TargetVerdict
from .verdicts import ORDER, Verdict

__all__ = ["ORDER", "GateReport", "GateRow", "TargetVerdict", "Verdict"]
