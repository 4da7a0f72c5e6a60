"""How to run a sweep: the typed options a script, a notebook or the CLI hands the sweep runners.

    from pdmask import SweepOptions, run_sweep
    run_sweep("smoke", SweepOptions(profile="smoke", figures=False))

Every field is optional: the defaults run the sweep as its file says, on an embedded Ray and the
sqlite MLflow store of the state folder. `pdm sweep` maps its flags one to one onto these fields.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict, Field


class SweepOptions(BaseModel):
    """Choices made per invocation; the sweep file holds everything that defines the trials."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    overrides: tuple[str, ...] = Field(
        (),
        description="The command line's `key=value` overrides of the sweep "
        "(`registry/cli_overrides.py`): settings (`profile=full`), seeds (`seed=[0,1,2,3]`), "
        "axis filters (`precision=bf16`).",
    )
    backend: str | None = Field(
        None, description="Training backend for every trial; None = the sweep's own."
    )
    profile: str | None = Field(
        None, description="Embedded-backend budget profile; None = the sweep's own."
    )
    cluster: str | None = Field(
        None,
        description="Cluster profile the resources and GPU-hours are planned for; None = the "
        "sweep's own.",
    )
    tracking_uri: str | None = Field(
        None,
        description="MLflow store; None = $MLFLOW_TRACKING_URI, else the sqlite store in the "
        "state folder.",
    )
    address: str | None = Field(
        None,
        description="Ray cluster to use (VeRL trials: its job API, http://HEAD:8265); None = "
        "$RAY_ADDRESS where the runner reads it, else an embedded local Ray.",
    )
    max_trials: int | None = Field(
        None,
        ge=1,
        description="Confirms a grid of up to this many trials, above the default cap (or the "
        "sweep's max_trials); None = the cap applies.",
    )
    max_concurrent: int | None = Field(
        None, ge=1, description="Cap on trials running at once; None = the sweep's own."
    )
    insecure: bool = Field(
        False,
        description="Submit to a cluster whose job API answers without authentication (refused "
        "otherwise: an open job API runs anyone's code).",
    )
    skip_cluster_check: bool = Field(
        False,
        description="Submit to an --address without proving its nodes share storage: neither "
        "the refusal of unshareable settings (a sqlite store, no checkpoint root) nor the "
        "per-node check (`pdm cluster check`) runs. For a cluster whose nodes are all this machine.",
    )
    figures: bool = Field(
        True, description="Build the sweep's figures once every trial has finished."
    )

    def command(self, sweep: str) -> str:
        """The ``pdm sweep`` command line that runs ``sweep`` with these options (what to run
        again to resume), passwords in a tracking URI replaced."""
        from pdmask.tracking.store import redact

        words = ["pdm", "sweep", sweep, *self.overrides]
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value == field.default or name == "overrides":
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else f"--no-{name.replace('_', '-')}")
            else:
                words += [flag, redact(str(value)) if name == "tracking_uri" else str(value)]
        return shlex.join(words)
