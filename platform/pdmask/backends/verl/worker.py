"""verl's actor worker with pdmask's loss installed and the logits hook switched on.

Differences from ``ActorRolloutRefWorker`` (``vanilla`` and every other verl loss compute exactly
as upstream; pdmask only adds the policy's entropy to their metrics):

- ``init_model`` replaces the actor's ``ppo_loss`` by ``pdm_ppo_loss`` (same actor config), which
  runs verl's own losses through ``ppo_loss`` unchanged;
- ``update_actor`` sets ``distillation_use_topk`` on the batch so verl's FSDP engine calls the
  loss function on the logits (the flag's name is verl's; no distillation happens), checks the
  step's top-K ids against the model's vocabulary once (``layout.check_batch_ids``), and keeps
  ``actor/entropy`` of the step's first mini-batch (``metrics.keep_first_update``);
- ``compute_log_prob`` during the old-policy pass (``pdm_mu_source=recompute``) also asks for the
  hook and turns its per-slot outputs into the ``pdm_mu_topk_*`` fields, which verl's transfer
  queue bridge stores with the batch.
"""

from __future__ import annotations

from functools import partial

from verl.single_controller.base.decorator import (
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker

from pdmask.backends.verl import compat, cpu_platform
from pdmask.backends.verl.layout import TOPK_IDS, TOPK_LOGPROBS, check_batch_ids, stack_old_slots
from pdmask.backends.verl.loss import LossSettings, pdm_ppo_loss
from pdmask.backends.verl.metrics import keep_first_update
from pdmask.backends.verl.processor import OLD_PHASE, PHASE_KEY, phase
from pdmask.errors import ConfigError

compat.require(["worker", "engine"])

HOOK_FLAG = "distillation_use_topk"


class PDMActorRolloutRefWorker(ActorRolloutRefWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        if cpu_platform.selected():  # before verl's own, whose backend string fails on CPU
            cpu_platform.init_process_group()
            cpu_platform.register_engine()
        super().init_model()
        self.pdm_settings, self.pdm_hook = None, False
        if self.actor is None:
            return
        actor_config = self.loss_fn.keywords["config"]
        self.pdm_settings = LossSettings.from_actor_config(actor_config)
        if self.distillation_enabled:  # distillation owns the logits hook
            if self.pdm_settings is not None:
                raise ConfigError(
                    "distillation.enabled: pdmask's losses cannot run with verl's distillation"
                )
            return
        if self.pdm_settings is None and not self._hook_allowed():
            return  # verl's own loss as configured: no actor/entropy rather than a refusal
        self.loss_fn = partial(pdm_ppo_loss, config=actor_config)
        self.actor.set_loss_fn(self.loss_fn)
        self.pdm_hook = True

    def _hook_allowed(self) -> bool:
        """Whether verl's engine can call the logits hook in this job: not under static padding
        (it refuses the hook) nor fused kernels (no logits). The start-up checks require both
        for pdmask's losses; a job of verl's own loss may set them."""
        return not self.config.actor.get("pad_to_length", False) and not self.config.model.get(
            "use_fused_kernels", False
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data):
        if phase(data) is not None:
            # In the old-policy phase the loss is zero: a leaked marker would silently stop training.
            raise RuntimeError(
                f"{PHASE_KEY} reached update_actor; the trainer must clear it after the old pass"
            )
        if not self.pdm_hook:
            return super().update_actor(data)
        check_batch_ids(data, self.actor.model_config.hf_config.vocab_size)
        tu.assign_non_tensor_data(data, HOOK_FLAG, True)
        output = super().update_actor(data)
        if output is not None:  # the ranks that hold the metrics
            keep_first_update(tu.get(output, "metrics"))
        return output

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data):
        if phase(data) != OLD_PHASE or self.pdm_settings is None:
            return super().compute_log_prob(data)
        # Without compute_loss the engine has no function to call and would crash on the hook flag.
        tu.assign_non_tensor_data(data, "compute_loss", True)
        tu.assign_non_tensor_data(data, HOOK_FLAG, True)
        output = super().compute_log_prob(data)
        if output is not None:
            ids, lps = stack_old_slots(output, self.pdm_settings.topk)
            output[TOPK_IDS] = ids
            output[TOPK_LOGPROBS] = lps
        return output
