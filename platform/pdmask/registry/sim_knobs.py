"""Knobs of the embedded backend that a sweep may set per cell, as ``sim.<knob>`` axes.

A ``sim`` trial is mostly fixed by its model's stand-in, its precision setting and the sweep's
budget profile. These few knobs are experiment-design choices a sweep varies on the embedded
backend: a control cell (``sim.lr: 0``, ``sim.train_layers: output``) or a task regime
(``sim.task: llm-like``). A cell that sets
one is a cell of the embedded backend: other backends leave it out of their expansion.

The knobs a cell sets enter the trial's identity (``Trial.sim``, canonical values, only the set
ones) and its tags (``pdm.sim.<knob>``), so a control run is never mistaken for a trained one.
``SimTrialConfig`` (the backend's config) inherits this model: it is the knobs' only declaration.
Torch-free, as the whole registry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdmask.errors import known_names

TaskName = Literal["synonyms", "llm-like"]  # = pdmask.backends.sim.task.TASKS (a test checks)
AXIS_PREFIX = "sim."


class SimKnobs(BaseModel):
    """The embedded backend's sweep-reachable knobs (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: TaskName = Field(
        "synonyms",
        description="Task regime (pdmask.backends.sim.task.TASKS): synonyms (102 tokens per "
        "digit; the base models' top-20 view holds about half the mass) or llm-like (two forms "
        "per digit and 4,071 rare filler tokens: over 99 %, with a long thin tail, like an "
        "LLM's). Both answer in 1 to 4 attempts (4 to 16 tokens, long-tailed). Each regime has "
        "its own base models.",
    )
    lr: float | None = Field(
        None,
        ge=0,
        description="AdamW learning rate of the RL phase; None = the profile's. 0 is the mismatch "
        "control: the policy never changes, so the trainer/behaviour gap it logs is the "
        "precision mismatch alone (no backward pass or optimizer step is taken).",
    )
    train_layers: Literal["all", "output"] = Field(
        "all",
        description="Parameters the RL phase trains: all, or output (the lm head alone, every "
        "layer below it frozen). output is the control where Ddot's premise holds: a token's own "
        "update moves its logits along e_k - pi (times |h|^2), with no network kernel between.",
    )


KNOBS = tuple(SimKnobs.model_fields)  # the knobs' names, as a sweep spells them after `sim.`


def resolve_knobs(values: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Validated, canonical knobs (only those given) and (knob, message) for each problem."""
    try:
        knobs = SimKnobs.model_validate(values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            knob = str(e["loc"][0]) if e["loc"] else "sim"
            if e["type"] == "extra_forbidden":
                problems.append((knob, f"unknown knob sim.{knob}; {known_names(knob, KNOBS)}"))
            else:
                problems.append((knob, e["msg"]))
        return {}, problems
    return knobs.model_dump(mode="json", include=set(values)), []


def knobs_label(knobs: dict[str, Any]) -> str:
    """What a cell's knobs make of its trials, in words for tables and run descriptions ('' for
    none): the lr = 0 control says so, so it is never read as a trained row."""
    return ", ".join(
        "lr = 0 mismatch control" if knob == "lr" and value == 0 else f"{knob} = {value}"
        for knob, value in sorted(knobs.items())
    )


def knob_tag(value: Any) -> str:
    """A knob's value as the ``pdm.sim.<knob>`` tag holds it (floats as ``repr``: 0 -> 0.0)."""
    return repr(float(value)) if isinstance(value, int | float) else str(value)
