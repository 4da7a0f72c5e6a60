"""The training backends a trial can name: what each one is, as the registry must know it.

A backend has two halves. This one is data, read while sweeps are expanded, checked and planned
(no torch, no verl): its name, what it can hand a recipe, where it takes mu from, whether the
embedded knobs apply, how its trials are launched and what one of them occupies. The other half
is its runtime, the ``pdmask.backends.interface.Backend`` it names by import path, loaded only in
the processes that need it (the Ray worker that trains, the driver that submits jobs).

Adding a backend is one runtime module plus one ``BackendSpec`` here (or ``register_backend`` at
import time, for a backend that lives outside pdmask).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Launch(Enum):
    """How a sweep's trials of a backend reach compute."""

    TUNE = "tune"  # each trial trains in a Ray Tune worker of an embedded or attached Ray
    RAY_JOBS = "ray-jobs"  # each trial is a Ray Job submitted to a cluster's head


# What a sweep sets for every trial besides its grid, and what each means to a backend that reads
# it: ``profile`` a budget preset (``registry.sweeps.SIM_PROFILES``), ``steps`` the RL steps.
TRIAL_SETTINGS = ("profile", "steps")


class Occupies(Enum):
    """What one trial holds while it runs (the plan's resources column)."""

    ONE_CPU = "1 CPU"  # one Ray worker's CPU
    CLUSTER_GPUS = "cluster GPUs"  # the GPUs its model needs on the sweep's cluster profile


@dataclass(frozen=True)
class BackendSpec:
    name: str
    """What sweeps, trials and ``--backend`` call it (part of every trial's identity)."""
    summary: str
    """One line for ``--help`` and listings."""
    runtime: str
    """``module:attribute`` of its ``Backend`` object, imported on first use."""
    supplies: frozenset[str]
    """The recipe inputs it can hand a recipe (``Recipe.needs``)."""
    mu_sources: tuple[str, ...]
    """Where it can take mu's top-K from (the ``mu_source`` axis)."""
    launch: Launch
    occupies: Occupies
    takes_sim_knobs: bool = False
    """Whether ``sim.<knob>`` axes apply; cells that set one are left out for other backends."""
    trains_stand_ins: bool = False
    """Whether it trains small stand-ins of the models trials name (figure panels say so)."""
    withholds: dict[str, str] = field(default_factory=dict, hash=False)
    """Why it cannot supply an input it lacks (the plan's refusal of a recipe says it)."""
    settings: frozenset[str] = frozenset({"profile"})
    """The sweep's trial settings its trials train with (``TRIAL_SETTINGS``). A sweep that sets
    one it lacks is refused at plan time, naming the field; one it lacks stays out of its
    trials' identity (their hash), so it cannot tell two trials apart that train the same."""


SIM = BackendSpec(
    name="sim",
    summary="the embedded CPU trainer: real GRPO on a small transformer, any machine",
    runtime="pdmask.backends.sim.backend:BACKEND",
    supplies=frozenset(
        {
            "behaviour_topk",
            "behaviour_full",
            "entropy",
            "support_log_probs",
            "second_order",
            "output_kernel",
        }
    ),
    # Its behaviour copy is the rollout engine itself: there is no separate old-policy forward.
    mu_sources=("rollout",),
    launch=Launch.TUNE,
    occupies=Occupies.ONE_CPU,
    takes_sim_knobs=True,
    trains_stand_ins=True,
    settings=frozenset({"profile", "steps"}),  # steps: the profile's unless the sweep sets them
)
VERL = BackendSpec(
    name="verl",
    summary="VeRL training jobs (vLLM rollouts) submitted as Ray Jobs to a cluster",
    runtime="pdmask.backends.verl.backend:BACKEND",
    supplies=frozenset({"behaviour_topk", "entropy", "support_log_probs", "second_order"}),
    mu_sources=("rollout", "recompute"),
    launch=Launch.RAY_JOBS,
    occupies=Occupies.CLUSTER_GPUS,
    settings=frozenset({"steps"}),  # no budget profiles: its jobs' setup is the cluster's
    withholds={
        "behaviour_full": "vLLM returns the behaviour's top-K log-probs, not its distribution",
        "output_kernel": "verl's engine hands the policy-loss hook logits, not the lm head's "
        "input and weight",
    },
)

BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (SIM, VERL)}
DEFAULT_BACKEND = SIM.name


def register_backend(spec: BackendSpec) -> None:
    """Make ``spec`` known to this process (a backend that lives outside pdmask). Trials carry
    their backend's runtime path to the workers that train them, so only the driver must call
    this, before it loads the registry."""
    known = BACKENDS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"a different backend is already registered as {spec.name!r}")
    BACKENDS[spec.name] = spec


def unregister_backend(name: str) -> None:
    if name in (SIM.name, VERL.name):
        raise ValueError(f"backend {name!r} is built in")
    BACKENDS.pop(name, None)


def backend_spec(name: str) -> BackendSpec:
    """The spec of backend ``name``; a ``KeyError`` naming the known ones otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}") from None
