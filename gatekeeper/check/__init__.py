"""``check``: measure each target in a worker (a fresh process), warm from the store when
it can; paired mode measures the base commit's model beside it, as the base commit's
own config defines it (:func:`gatekeeper.check.paired.base_config`).

* ``run``       every target of a run, in the mode chosen (:func:`run.check_all`)
* ``target``    one target's check, in its stages: warm, baseline, measure, verify,
                assemble (:func:`target.check_target`)
* ``verify``    the one verifier of a bundle's packages, before ``warm`` may serve them
* ``paired``    which mode decides a run's timing, and paired mode's base version
"""
