"""A grid's trials handed to Ray Tune one at a time, as the session's gate admits them.

Tune starts every trial of a ``grid_search`` as soon as a slot is free. A searcher is asked
instead, whenever Tune has room for one more trial: this one answers with the next trial of the
gate's launch order that the gate admits (every setting's canary first, the others of a setting
once its canary reached its first training step and a validation), with nothing for now while
the admissible ones wait, and with the end once every trial was handed out or belongs to a
stopped setting (``canary.SettingGate``). The trials Tune retries after a crash stay Tune's.
"""

from __future__ import annotations

from ray.tune.search import Searcher

from pdmask.orchestration.canary import SettingGate


class GatedGrid(Searcher):
    def __init__(self, gate: SettingGate):
        super().__init__()
        self.gate = gate
        self.queue = list(gate.order)
        self.trial_of: dict[str, str] = {}  # Tune trial id -> trial hash

    def __getstate__(self):
        # Tune pickles its search algorithm with the run config; the gate holds the driver's
        # MLflow client and console, and only the driver's searcher hands out trials.
        return {"queue": [], "trial_of": {}}

    def __setstate__(self, state):
        self.__dict__.update(state, gate=None)

    def suggest(self, trial_id: str) -> dict | str | None:
        self.gate.refresh()
        self.queue = [t for t in self.queue if not self.gate.is_stopped(t)]
        if not self.queue:
            return Searcher.FINISHED
        trial = next((t for t in self.queue if self.gate.admissible(t)), None)
        if trial is None:
            return None  # Tune asks again at its next step
        self.queue.remove(trial)
        self.gate.start(trial)
        self.trial_of[trial_id] = trial.trial_hash
        return {"trial": trial.model_dump(mode="json")}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        """Finished, or failed beyond its retries: it will not run again in this invocation."""
        if trial_id in self.trial_of:
            self.gate.end(self.trial_of[trial_id])
