"""The MLflow side of a VeRL job: the run the sweep expects, its tags, and FAILED on failure.

verl's ``Tracking`` (in the TaskRunner process) logs into MLflow: experiment =
``trainer.project_name``, run name = ``trainer.experiment_name``. How a sweep finds its run
(design.md's contract) is set up by the job's environment (``overrides.job_env``):

- attach: the sweep pre-creates the run with its ``pdm.*`` tags and passes ``MLFLOW_RUN_ID``;
  verl logs into it. The pre-created run holds tags and pdmask's own params only (names
  without a ``/``; verl's are ``/``-separated paths into its config): a param verl logs with a
  different value makes MLflow fail, and verl then silently continues without MLflow;
- tags at creation: ``MLFLOW_RUN_CONTEXT`` (JSON) becomes tags when verl creates the run.

In the job, pdmask's trainer then checks that verl's MLflow backend really started, adds what only
the job knows (verl version, loss, mu source, rollout precision), logs the resolved config as an
artifact, and marks the run FAILED, with the reason, when the job raises (verl would mark a crashed
run FINISHED). verl's adapter drops a step's metrics after three failed ``log_metrics`` calls and
trains on, and its TaskRunner ends the run FINISHED whatever was logged: pdmask's guard around the
adapter (:class:`SkipLoggedSteps`) writes the step itself, with the same tries, and ends the job
with ``IncompleteRun`` naming the step when the store refused them all (its checkpoint is saved
before its metrics are written, so the retry resumes from the step before and logs it again:
``resume.py``). When training ends, the job also refuses to end successfully unless the run holds
its last step's training metrics (:func:`require_training_metrics`). A retried job logs into the
same run and resumes from its last checkpoint, so verl logs the steps after that checkpoint again:
the guard drops every value of a step the run already holds for that metric, so a history never
has a step twice.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from omegaconf import OmegaConf

from pdmask.backends.verl.checks import config_value
from pdmask.console import redact
from pdmask.errors import IncompleteRun, TrackingError
from pdmask.registry.backends import VERL
from pdmask.tracking.store import DESCRIPTION_TAG
from pdmask.watchdog import WATCHDOG_TAG

FAILURE_TAG = "pdm.failure_reason"
CONFIG_ARTIFACT = "verl_config.yaml"


def job_tags(config) -> dict[str, str]:
    """Facts only the running job knows, as run tags."""
    import verl

    quantization = config_value(config, "actor_rollout_ref.rollout.quantization")
    kv_cache = config_value(config, "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype")
    return {
        "pdm.backend": VERL.name,
        "pdm.verl.version": verl.__version__,
        "pdm.verl.loss_mode": str(
            config_value(config, "actor_rollout_ref.actor.policy_loss.loss_mode")
        ),
        "pdm.verl.mu_source": str(
            config_value(config, "actor_rollout_ref.actor.policy_loss.pdm_mu_source", "rollout")
        ),
        "pdm.verl.rollout_quantization": str(quantization or "none"),
        "pdm.verl.kv_cache_dtype": str(kv_cache or "auto"),
        **_trainer_tags(config),
        **logprob_tags(config),
    }


def _trainer_tags(config) -> dict[str, str]:
    """The actor's engine and training numerics: on Megatron, FP8 where its transformer config
    says so (Transformer Engine's recipe), else its dtype."""
    actor = "actor_rollout_ref.actor"
    if config_value(config, f"{actor}.strategy") != "megatron":
        dtype = config_value(config, f"{actor}.fsdp_config.dtype", "bfloat16")
        return {"pdm.verl.training_engine": "fsdp", "pdm.verl.trainer_dtype": str(dtype)}
    overrides = f"{actor}.megatron.override_transformer_config"
    fp8 = config_value(config, f"{overrides}.fp8")
    dtype = config_value(config, f"{actor}.megatron.dtype", "bfloat16")
    if fp8:
        dtype = f"fp8-{fp8}-{config_value(config, f'{overrides}.fp8_recipe', 'delayed')}"
    return {"pdm.verl.training_engine": "megatron", "pdm.verl.trainer_dtype": str(dtype)}


def logprob_tags(config) -> dict[str, str]:
    """What the behaviour log-probs mean in this run: which distribution mu is, at which K."""
    rollout = "actor_rollout_ref.rollout"
    mu_source = config_value(config, "actor_rollout_ref.actor.policy_loss.pdm_mu_source", "rollout")
    return {
        # vLLM's `processed_logprobs`: log_softmax of the logits after temperature (and after
        # top-p/top-k, which the start-up checks refuse), i.e. the trainer's log_softmax(z / T).
        "pdm.verl.logprobs_mode": str(config_value(config, f"{rollout}.logprobs_mode")),
        "pdm.verl.temperature": str(config_value(config, f"{rollout}.temperature")),
        "pdm.verl.top_p": str(config_value(config, f"{rollout}.top_p")),
        "pdm.verl.top_k": str(config_value(config, f"{rollout}.top_k")),
        "pdm.verl.topk": str(config_value(config, "actor_rollout_ref.actor.policy_loss.pdm_topk")),
        "pdm.verl.mu": (
            "vLLM decode-time top-K (processed log-probs) + the sampled token"
            if mu_source == "rollout"
            else "the trainer's old-policy forward: pi_old's top-K + the sampled token"
        ),
        "pdm.verl.device": str(config_value(config, "trainer.device")),
    }


def uses_mlflow(config) -> bool:
    backends = config_value(config, "trainer.logger", []) or []
    return "mlflow" in ([backends] if isinstance(backends, str) else list(backends))


def start_of_training(config, tracking) -> None:
    """Right after verl created its ``Tracking``, before it logs anything: check MLflow is live,
    tag, log the config, guard against re-logged steps."""
    if not uses_mlflow(config):
        return
    if "mlflow" not in getattr(tracking, "logger", {}):
        conflicts = param_conflicts(config)
        raise TrackingError(
            "verl's MLflow backend did not start; refusing to train unrecorded. "
            + (
                f"The run already holds other values of the params {', '.join(conflicts)}"
                " (MLflow refuses to change a param)"
                if conflicts
                else "See verl's warnings above"
            )
        )
    import mlflow

    mlflow.set_tags(job_tags(config))
    _label_precision_by_engine(config)
    mlflow.log_dict(OmegaConf.to_container(config, resolve=True), CONFIG_ARTIFACT)
    adapter = tracking.logger["mlflow"]
    if not isinstance(adapter, SkipLoggedSteps):
        run_id = mlflow.active_run().info.run_id
        tracking.logger["mlflow"] = SkipLoggedSteps(adapter, logged_steps(run_id))


def _label_precision_by_engine(config) -> None:
    """The run's ``pdm.precision_label`` as the engine that trains it makes it true: the
    submitter tagged the backend's label; on verl's Megatron engine a setting may train in FP8
    (``catalog.PrecisionSpec.label_on``)."""
    import mlflow

    from pdmask.registry.catalog import PRECISIONS

    engine = _trainer_tags(config)["pdm.verl.training_engine"]
    tags = mlflow.get_run(mlflow.active_run().info.run_id).data.tags
    spec = PRECISIONS.get(tags.get("pdm.precision", ""))
    if spec is None:
        return
    label, submitted = spec.label_on(VERL.name, engine), tags.get("pdm.precision_label")
    if submitted and label != submitted:  # the description names it too (Trial.description)
        note = tags.get(DESCRIPTION_TAG, "")
        mlflow.set_tag(DESCRIPTION_TAG, note.replace(f"({submitted})", f"({label})"))
    mlflow.set_tag("pdm.precision_label", label)


def param_conflicts(config, limit: int = 8) -> list[str]:
    """The params verl logs for ``config`` that the job's pre-created run holds with another
    value, as ``key: run's -> job's`` (empty outside such a job or when the store is unreadable)."""
    job = _job_run()
    if job is None:
        return []
    from verl.utils.tracking import _compute_mlflow_params_from_objects  # what verl logs

    client, run_id = job
    try:
        held = client.get_run(run_id).data.params
    except Exception:
        return []
    ours = _compute_mlflow_params_from_objects(OmegaConf.to_container(config, resolve=True))
    differ = [
        f"{key}: {held[key]!r} -> {str(value)!r}"
        for key, value in ours.items()
        if key in held and held[key] != str(value)
    ]
    return differ[:limit]


def logged_steps(run_id: str) -> dict[str, int]:
    """The last step of every metric the run already holds (empty for a first attempt)."""
    import mlflow

    client = mlflow.MlflowClient()
    return {key: _last_step(client, run_id, key) for key in client.get_run(run_id).data.metrics}


def _last_step(client, run_id: str, key: str) -> int:
    """The last step of one metric of the run (-1: none)."""
    return max((m.step for m in client.get_metric_history(run_id, key)), default=-1)


class SkipLoggedSteps:
    """verl's MLflow adapter, minus the values of steps the run already holds for that metric,
    and failing where verl's would drop a step.

    Per metric, not per step: a retry that crashed between a step's training and validation
    metrics still gets the validation ones logged. The write is verl's (its sanitised keys, its
    number of tries, MLflow's own retries inside each), but a step the store refused every time
    raises ``IncompleteRun`` instead of passing silently: the run would miss that step for good."""

    def __init__(self, adapter, logged: dict[str, int]):
        self.adapter = adapter
        self.logged = logged

    def log(self, data, step):
        from pdmask.tracking import sanitize_metric  # the key verl's adapter writes

        metrics = {sanitize_metric(k): v for k, v in data.items()}
        if step is not None and self.logged:
            metrics = {k: v for k, v in metrics.items() if step > self.logged.get(k, -1)}
        if metrics:
            _write_metrics(metrics, step)

    def __getattr__(self, name):  # finish() and anything else verl calls
        return getattr(self.adapter, name)


def _write_metrics(metrics: dict, step) -> None:
    """``mlflow.log_metrics`` with verl's tries; ``IncompleteRun`` naming the step when the
    store refused every one."""
    import mlflow
    from verl.utils.tracking import MLFLOW_MAX_ATTEMPTS

    errors = []
    for _ in range(MLFLOW_MAX_ATTEMPTS):
        try:
            mlflow.log_metrics(metrics=metrics, step=step)
            return
        except Exception as err:  # what verl's adapter catches (and then drops the step)
            # MLflow's error names the request's URL: no credential of it goes into the reason
            errors.append(redact(" ".join(str(err).split()))[:300] or type(err).__name__)
    run = mlflow.active_run()
    raise IncompleteRun(
        f"the tracking store refused step {step}'s metrics ({len(metrics)} values) for run "
        f"{run.info.run_id if run else 'unknown'} {len(errors)} times (last: {errors[-1]}); "
        "ending the attempt rather than training on without them: its retry resumes from the "
        "checkpoint before the step and logs it again"
    )


STEP_METRIC = "training/global_step"  # verl logs it with every training step


def _job_run():
    """(client, run id) of the job's pre-created run, or None outside such a job."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return None
    import mlflow

    return mlflow.MlflowClient(os.environ.get("MLFLOW_TRACKING_URI")), run_id


def last_logged_step() -> int | None:
    """The last training step the job's run holds (0: none yet); None when unknown (no run, or
    the store cannot be read: verl's own resume choice then stands)."""
    job = _job_run()
    if job is None:
        return None
    client, run_id = job
    try:
        return max(_last_step(client, run_id, STEP_METRIC), 0)
    except Exception:
        return None


def _run_of_this_job():
    """(client, run id) of the run verl logs into: the pre-created one, else the active one."""
    job = _job_run()
    if job is not None:
        return job
    import mlflow

    run = mlflow.active_run()
    return (mlflow.MlflowClient(), run.info.run_id) if run is not None else None


def require_training_metrics(config, last_step: int) -> None:
    """``TrackingError`` unless the job's run holds the training metrics of ``last_step``, the
    last step verl trained (nothing for a job that logs to no MLflow)."""
    if not uses_mlflow(config):
        return
    if last_step < 1:
        raise TrackingError("training ended before its first step: the run holds no training")
    job = _run_of_this_job()
    if job is None:
        raise TrackingError(
            f"training ended at step {last_step}, but the job has no MLflow run to hold it"
        )
    client, run_id = job
    try:
        held = _last_step(client, run_id, STEP_METRIC)
    except Exception as err:
        raise TrackingError(
            f"training ended at step {last_step}, but its run {run_id} cannot be read to confirm "
            f"its metrics are there: {err}"
        ) from err
    if held < last_step:
        raise TrackingError(
            f"training ended at step {last_step}, but run {run_id} holds no training metrics "
            + ("at all" if held < 0 else f"after step {held}")
            + f" ({STEP_METRIC}): verl's MLflow adapter drops a step's metrics after three failed "
            "log_metrics calls and trains on (its warnings are in the job's log); the curves "
            "would end early without a trace"
        )


def tag_run(tags: dict[str, str]) -> None:
    """Tags on the job's pre-created run (nothing outside such a job)."""
    job = _job_run()
    if job is not None:
        client, run_id = job
        for key, value in tags.items():
            client.set_tag(run_id, key, value)


def mark_failed(reason: str, extra_tags: dict[str, str] | None = None) -> None:
    """FAILED with the reason: the active run, else the pre-created ``MLFLOW_RUN_ID``, else nothing."""
    import mlflow

    # MLflow's tag value limit; the end of a traceback is the informative part
    tags = {FAILURE_TAG: reason, **(extra_tags or {})}
    tags = {key: value[-5000:] for key, value in tags.items()}
    run = mlflow.active_run()
    if run is not None:
        mlflow.set_tags(tags)
        mlflow.end_run(status="FAILED")
        return
    job = _job_run()
    if job is not None:
        tag_run(tags)
        client, run_id = job
        client.set_terminated(run_id, status="FAILED")


@contextmanager
def failure_marked(cause: Callable[[], str | None] | None = None) -> Iterator[None]:
    """Re-raises whatever happens inside, after marking the job's run FAILED.

    ``cause`` (the job watchdog's ``cause``) is asked first: when it names one (a vLLM engine
    found dead), that is recorded as the watchdog's reason, which the sweep puts first in the
    attempt's failure. verl's own error after an engine death depends on where its loop was
    (a rollout, a weight sync, the replay buffer): the root cause must not."""
    try:
        yield
    except BaseException as exc:
        found = cause() if cause is not None else None
        extra = {WATCHDOG_TAG: f"{found} (found when the trainer failed)"} if found else None
        try:
            mark_failed("".join(traceback.format_exception(exc)), extra_tags=extra)
        except Exception:  # never hide the job's own error behind a tracking error
            traceback.print_exc()
        raise
