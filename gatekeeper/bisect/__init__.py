"""``gatekeeper bisect``: from a change of a metric between two commits to the commit
that made it, with the gate's statistics.

* ``history``  the range (bad's first-parent line back to good), commits, worktrees
* ``search``   which commit to measure next, and what the measurements found (pure)
* ``metrics``  what one measurement says of the metric: like good, changed, undecided
* ``stored``   narrowing the range by the branch's stored baselines
* ``measure``  one commit, checked out, built and measured paired with the base commit
* ``engine``   a whole bisect, target by target, and the culprit against its parent
* ``report``   report.md and the JSON document
"""
