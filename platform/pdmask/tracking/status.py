"""done / failed / running / todo per trial, read from the store without writing to it."""

from __future__ import annotations

from pdmask.registry import Trial
from pdmask.tracking.runs import runs_by_hash, summarize_status
from pdmask.tracking.store import open_client, resolve_tracking_uri, sqlite_path


class TrialStatusIndex:
    def __init__(self, by_hash: dict[str, list]):
        self.by_hash = by_hash
        # Runs of the same configuration under another trial hash trained another recipe code.
        self.config_hashes = {
            r.data.tags.get("pdm.config_hash") for runs in by_hash.values() for r in runs
        }

    @classmethod
    def open(cls, uri: str | None, sweep: str, create: bool = False) -> TrialStatusIndex:
        """Read the sweep's runs. With ``create=False`` a store that does not exist yet is not
        created (a dry run writes nothing): every trial is then `todo`."""
        uri = resolve_tracking_uri(uri)
        if uri.startswith("sqlite:") and not create and not sqlite_path(uri).exists():
            return cls({})
        client = open_client(uri)
        exp = client.get_experiment_by_name(sweep)
        return cls({} if exp is None else runs_by_hash(client, exp.experiment_id))

    def status_of(self, trial: Trial) -> str:
        status = summarize_status(self.by_hash.get(trial.trial_hash, []))
        if status == "todo" and trial.config_hash in self.config_hashes:
            return "todo (recipe changed)"
        return status

    def finished_hashes(self) -> set[str]:
        return {h for h, runs in self.by_hash.items() if summarize_status(runs) == "done"}
