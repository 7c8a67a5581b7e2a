"""Whose rules judge a change, and what the change alters of them and of its targets.

A pull request is gated against the base as it was: the base's rules judge it, so a
change cannot loosen its own gate (its rules apply once it is merged):

* paired: the base commit's own config's rules for the target, which ``check`` records
  on each result (``base_target.rules``, with the base's definition of the target);
* stored: the rules stored with the baseline (its result's ``rules``: every result
  records the rules of the config it was measured with);
* else, the change's own rules: for a target new in this change, and, with a note, for
  a baseline published before rules were stored with it.

What the change alters is listed: each rule (old -> new) and each field of the target's
definition (:func:`gatekeeper.project.definition`), on one line each. Pure
functions over results documents; no torch, no store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..config import GateConfig
from ..results import Baseline, BaseTarget, TargetResult

Source = Literal["base commit", "baseline", "this change"]
MAX_VALUE_CHARS = 80  # one value in a change's line
# the definition fields that build the inputs: other inputs give other outputs
INPUT_FIELDS = ("inputs", "inputs_factory", "seed", "shape_set")


def show(value: Any) -> str:
    """A config value as one short piece of text: strings as they are, numbers as
    written, tables and lists as compact JSON, ``unset`` for an absent field."""
    if value is None:
        text = "unset"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


@dataclass(frozen=True)
class Change:
    """One field the change alters: its dotted name, the base's value and the change's."""

    field: str
    base: Any
    pr: Any

    def __str__(self) -> str:
        return f"{self.field} {show(self.base)} → {show(self.pr)}"

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "base": self.base, "pr": self.pr}


def changes(base: Mapping[str, Any], pr: Mapping[str, Any], prefix: str = "") -> list[Change]:
    """The fields whose values differ, in the base's order then the new ones; tables
    on both sides are compared field by field (``options.max_fusion_size``)."""
    out: list[Change] = []
    for name in [*base, *(k for k in pr if k not in base)]:
        old, new = base.get(name), pr.get(name)
        if isinstance(old, dict) and isinstance(new, dict):
            out += changes(old, new, f"{prefix}{name}.")
        elif old != new:
            out.append(Change(prefix + name, old, new))
    return out


def rule_changes(base: GateConfig, pr: GateConfig) -> list[Change]:
    return changes(base.model_dump(mode="json"), pr.model_dump(mode="json"))


@dataclass(frozen=True)
class Governing:
    """The rules that judge one target, where they come from, and a note when that
    needs saying."""

    rules: GateConfig
    source: Source
    note: str | None = None


def governing(
    own: GateConfig,
    base: BaseTarget | None,
    baseline: Baseline | None,
    *,
    paired: bool = False,
) -> Governing:
    """The rules that judge a target: ``own`` is the change's rules for it, ``base``
    what a paired check recorded of the base commit's target, ``paired`` whether its
    result was measured paired."""
    if base is not None:  # paired: the base commit's config decides
        if base.rules is not None:
            return Governing(base.rules, "base commit")
        return Governing(own, "this change")  # the base has no such target
    if paired:
        return Governing(
            own,
            "this change",
            "the results do not record the base commit's rules (measured by an older "
            "gatekeeper): this change's rules judge it",
        )
    if baseline is None:
        return Governing(own, "this change")
    if baseline.result.rules is not None:
        return Governing(baseline.result.rules, "baseline")
    return Governing(
        own,
        "this change",
        f"the baseline of {baseline.ref} records no gate rules (published before they "
        "were stored with it): this change's rules judge it",
    )


def definition_changes(result: TargetResult, baseline: Baseline | None) -> list[Change]:
    """The fields of the target's definition that the change alters, against the base
    commit's definition (paired) or the baseline's (stored); none when either side
    does not record one."""
    base = result.base_target
    old = (
        base.definition
        if base is not None
        else (baseline.result.definition if baseline is not None else None)
    )
    if old is None or result.definition is None:
        return []
    return changes(old, result.definition)


def notes(
    result: TargetResult, gov: Governing, ruled: list[Change], altered: list[Change]
) -> list[str]:
    """What the report says of the target's rules (``ruled``: the rules the change
    alters) and its definition (``altered``: the fields it changes)."""
    out = [gov.note] if gov.note else []
    if result.base_target is not None and not result.base_target.defined:
        return [*out, "new in this change: the base commit's config does not define it"]
    if altered:
        out.append("this change redefines the target: " + "; ".join(map(str, altered)))
    if ruled:
        out.append(
            f"gated by the {gov.source}'s rules, which this change alters (its own apply "
            "once merged): " + "; ".join(map(str, ruled))
        )
    if result.paired is not None and not result.paired.same_inputs:
        out.append("outputs not compared with the base commit's: its config builds other inputs")
    elif result.paired is None and any(c.field.split(".")[0] in INPUT_FIELDS for c in altered):
        out.append("outputs not compared with the baseline's: the inputs changed since")
    return out
