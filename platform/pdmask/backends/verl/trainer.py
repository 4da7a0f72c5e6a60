"""pdmask's verl trainer, ``trainer.v1.trainer_mode=pdm_sync``: verl's synchronous v1 trainer plus

- start-up checks of the settings pdmask's methods depend on, before any GPU is allocated;
- pdmask's actor worker (loss + logits hook) in place of verl's;
- the old-policy pass marker when mu is recomputed by the trainer (``pdm_mu_source=recompute``);
- MLflow: the backend must be live, job tags, the resolved config, FAILED on any failure; a step
  whose metrics the store refused ends the attempt (verl's MLflow adapter would drop it after
  three tries and train on: ``tracking.SkipLoggedSteps``), and a job whose run holds no training
  metrics for its last step ends failed, naming why;
- a line per validation in the trial's log, from verl's metrics (``progress.py``);
- ``actor/entropy``: verl's own where its old-log-prob pass ran, else pdmask's (``metrics.py``);
- the job's watchdog (``watchdog.py``): a dead vLLM engine or a stall ends the job within a bound;
- a retry resumes from the newest checkpoint whose steps are all logged (``resume.py``).
"""

from __future__ import annotations

import ray
from omegaconf import open_dict
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from pdmask.backends.verl import compat, progress, resume, tracking, watchdog
from pdmask.backends.verl.checks import TRAINER_NAME, check_job_config
from pdmask.backends.verl.loss_names import method_for_loss_mode
from pdmask.backends.verl.metrics import ENTROPY_METRIC
from pdmask.backends.verl.processor import OLD_PHASE, PHASE_KEY
from pdmask.backends.verl.worker import PDMActorRolloutRefWorker
from pdmask.watchdog import Bounds

compat.require(["trainer"])

# The roles verl maps to its ActorRolloutRefWorker (trainer_base._init_resource_pool_mgr).
_ACTOR_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef, Role.RefPolicy)


@register_trainer(TRAINER_NAME)
class PDMTrainerSync(PPOTrainerSync):
    def __init__(self, config):
        with tracking.failure_marked():
            check_job_config(config)
            # verl branches on the literal mode "sync" (replay buffer, refills, checkpoints); a new
            # name would silently select the asynchronous replay buffer. The class is already chosen.
            with open_dict(config):
                config.trainer.v1.trainer_mode = "sync"
            super().__init__(config)
            policy_loss = config.actor_rollout_ref.actor.policy_loss
            self.recompute_mu = (
                method_for_loss_mode(policy_loss.loss_mode) is not None
                and policy_loss.get("pdm_mu_source", "rollout") == "recompute"
            )

    _watchdog: watchdog.JobWatchdog | None = None

    def _failure_cause(self) -> str | None:
        """On a failure, what the watchdog finds wrong now (see ``tracking.failure_marked``)."""
        if self._watchdog is None:
            return None
        self._watchdog.stop()  # one account of the failure: this one
        return self._watchdog.cause()

    def init(self):
        with tracking.failure_marked(self._failure_cause):
            bounds = Bounds.from_env()
            if bounds is not None:  # before verl's set-up: the first weight sync happens in it
                self._watchdog = watchdog.JobWatchdog(
                    bounds, lambda: watchdog.server_handles(self), watchdog.end_job
                ).start()
            super().init()

    def fit(self, agent_loop_manager):
        with tracking.failure_marked(self._failure_cause):
            super().fit(agent_loop_manager)
            # verl returns after logging its last step and counting one more; before verl's
            # TaskRunner ends the run FINISHED, the run must hold that step's metrics.
            tracking.require_training_metrics(self.config, last_step=self.global_steps - 1)
        if self._watchdog is not None:
            self._watchdog.stop()

    def _load_checkpoint(self):
        trainer = self.config.trainer
        tracker = resume.set_aside_unreadable_tracker(trainer.default_local_dir)
        point = resume.ResumePoint(None)
        if trainer.resume_mode == "auto":  # only verl's own choice is refined
            point = resume.resume_point(trainer.default_local_dir, tracking.last_logged_step())
        set_aside = ([tracker] if tracker else []) + point.set_aside
        if set_aside:
            for line in set_aside:
                print(f"pdmask: {line}", flush=True)
            tracking.tag_run({"pdm.verl.checkpoint_set_aside": "; ".join(set_aside)})
        if point.unlogged:
            tracking.tag_run({"pdm.verl.unlogged_steps": ",".join(map(str, point.unlogged))})
        if not point.folder:
            return super()._load_checkpoint()
        folder = point.folder
        print(
            f"pdmask: resuming from {folder}: the newest whole checkpoint of logged steps",
            flush=True,
        )
        tracking.tag_run({"pdm.verl.resumed_from": folder})
        # verl's v1 trainer loads the checkpoint in init() and logs the config as MLflow params
        # later, in fit(): the config must be the first attempt's again by then, or the retry's
        # params differ from the run's and verl silently drops MLflow (start_of_training refuses).
        first_attempts = trainer.resume_mode, trainer.get("resume_from_path")
        with open_dict(self.config):
            trainer.resume_mode, trainer.resume_from_path = "resume_path", folder
        try:
            super()._load_checkpoint()
        finally:
            with open_dict(self.config):
                trainer.resume_mode, trainer.resume_from_path = first_attempts

    def _beat(self, what: str) -> None:
        if self._watchdog is not None:
            self._watchdog.beat(what)

    def on_step_end(self):
        super().on_step_end()  # verl's weight sync into vLLM: the step is done after it
        self._beat(f"step {self.global_steps}")

    def on_validate_end(self):
        super().on_validate_end()
        self._beat(f"the validation at step {self.global_steps}")

    # verl creates its Tracking in fit() and logs the validation before training before
    # on_train_begin: pdmask's MLflow set-up runs at whichever of the two hooks comes first.
    _tracking_started = False

    def _start_tracking(self):
        if not self._tracking_started:
            tracking.start_of_training(self.config, self.logger)
            progress.install(self.logger, self.total_training_steps)  # the trial log's lines
            self._tracking_started = True

    def on_validate_begin(self):
        super().on_validate_begin()
        self._start_tracking()

    def on_train_begin(self):
        super().on_train_begin()
        self._start_tracking()

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        worker = ray.remote(PDMActorRolloutRefWorker)
        for role in _ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = worker

    def _update_actor(self, batch, metrics):
        # verl's actor/entropy, from its old-log-prob pass over the whole batch (run when mu is
        # recomputed), is the exact one; pdmask's, from the first update's mini-batch, stands in
        # for it where verl computed none (bypass mode).
        verls = metrics.get(ENTROPY_METRIC)
        batch = super()._update_actor(batch, metrics)
        if verls is not None:
            metrics[ENTROPY_METRIC] = verls
        return batch

    def _compute_old_log_prob(self, batch, metrics):
        if not self.recompute_mu:
            return super()._compute_old_log_prob(batch, metrics)
        batch.extra_info[PHASE_KEY] = OLD_PHASE
        try:
            output = super()._compute_old_log_prob(batch, metrics)
        finally:
            # Must never reach update_actor: the old-phase loss is zero (the worker also refuses it).
            batch.extra_info.pop(PHASE_KEY, None)
        output.extra_info.pop(PHASE_KEY, None)
        return output
