"""The training setting an analysis starts from: one grid cell of a registry sweep, per seed.

The sweep names the method whose training produces the analysed state (``dppo-topk-kl`` for
``token-analysis``), the model stand-in, the precision setting (the behaviour/trainer mismatch) and
the budget profile. The analysis trains that trial in process for a few steps, seed by seed, so it
never depends on a sweep having run first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.errors import ConfigError
from pdmask.registry.backends import SIM


@dataclass(frozen=True)
class TrainingSetting:
    """The analysed trial (``template``, seed aside) and the analysis threshold ``delta``."""

    template: dict[str, Any]  # Trial.model_dump(mode="json") of the cell's first seed
    delta: float

    def trial(self, seed: int):
        from pdmask.registry import Trial

        return Trial.model_validate({**self.template, "seed": seed})

    def identity(self) -> dict[str, Any]:
        """What the config hash covers: the trial without its seed and cosmetic sweep name."""
        out = {k: v for k, v in self.template.items() if k not in ("seed", "sweep")}
        out["analysis_delta"] = self.delta
        return out

    def tags(self) -> dict[str, str]:
        t = self.trial(0)
        tags = {k: v for k, v in t.tags().items() if k not in ("pdm.trial_hash", "pdm.seed")}
        tags["pdm.delta"] = repr(float(self.delta))
        tags["pdm.train_method"] = tags.pop("pdm.method")
        return tags


def resolve_setting(cfg: TokenAnalysisConfig) -> TrainingSetting:
    """Expand ``cfg.sweep`` on the embedded backend; it must describe one training setting."""
    from pdmask.registry import load_registry

    trials = load_registry().expand(cfg.sweep, backend=SIM.name, profile=cfg.profile)
    cells = {
        tuple(sorted((k, repr(v)) for k, v in t.identity().items() if k != "seed")) for t in trials
    }
    if len(cells) != 1:
        raise ConfigError(
            f"sweep {cfg.sweep!r} has {len(cells)} grid cells; the token analysis needs exactly one "
            "training setting (method, model, precision, delta)"
        )
    template = trials[0]
    delta = cfg.delta if cfg.delta is not None else template.delta
    if delta is None:
        raise ConfigError(
            f"sweep {cfg.sweep!r}: method {template.method!r} has no delta; pass --delta"
        )
    return TrainingSetting(template=template.model_dump(mode="json"), delta=float(delta))
