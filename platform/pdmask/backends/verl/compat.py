"""The exact verl release this plugin is written against, and the verl hooks it relies on.

The plugin reaches into verl 0.9.1 at a handful of places, several of them private (a logits
processor hook meant for distillation, module globals of the vLLM server). A different verl could
move any of them and the job would then fail in an obscure way, hours in and on GPUs. So every
module of the plugin calls :func:`require` at import time for the hooks it uses, and the error
names each missing hook.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
from collections.abc import Iterable

from pdmask.errors import BackendUnavailable

VERL_VERSION = "0.9.1"

# Hooks per plugin module, as "module:attribute.path" or "module:Callable(param, ...)" (the
# parameters must exist in the callable's signature). Imported and checked by ``require``.
HOOKS: dict[str, tuple[str, ...]] = {
    "plugin": (
        "verl.trainer.ppo.core_algos:register_policy_loss",
        "verl.trainer.ppo.core_algos:POLICY_LOSS_REGISTRY",
        "verl.trainer.ppo.core_algos:agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size, "
        "batch_num_tokens, global_batch_size, loss_scale_factor)",
    ),
    "loss": (
        "verl.workers.utils.losses:ppo_loss(config, model_output, data, dp_group)",
        "verl.workers.utils.padding:no_padding_2_padding(tensor, data)",
        "verl.utils.metric:Metric",
        "verl.utils.metric:AggregationType.SUM",
        "verl.utils.ulysses:slice_input_tensor(x, dim)",
        "verl.utils.ulysses:get_ulysses_sequence_parallel_world_size",
        "verl.utils.tensordict_utils:get_non_tensor_data(data, key, default)",
    ),
    "engine": (
        "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.prepare_model_outputs("
        "output, output_args, micro_batch, logits_processor_func)",
    ),
    "worker": (
        "verl.workers.engine_workers:ActorRolloutRefWorker.init_model",
        "verl.workers.engine_workers:ActorRolloutRefWorker.update_actor(data)",
        "verl.workers.engine_workers:ActorRolloutRefWorker.compute_log_prob(data)",
        "verl.workers.engine_workers:TrainingWorker.set_loss_fn(loss_fn)",
        "verl.single_controller.base.decorator:register",
        "verl.single_controller.base.decorator:make_nd_compute_dataproto_dispatch_fn(mesh_name)",
        "verl.utils.tensordict_utils:assign_non_tensor_data(tensor_dict, key, val)",
    ),
    "trainer": (
        "verl.trainer.ppo.v1.trainer_base:register_trainer(name)",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._setup",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._init_resource_pool_mgr",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._compute_old_log_prob(batch, metrics)",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer.fit(agent_loop_manager)",
        "verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync.on_train_begin",
        "verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync.on_step_end",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer.on_validate_end",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer.init",
        "verl.trainer.ppo.v1.trainer_base:PPOTrainer._load_checkpoint",
        # the params verl logs, compared with the run's when its MLflow start-up failed
        "verl.utils.tracking:_compute_mlflow_params_from_objects(params)",
        "verl.workers.rollout.llm_server:LLMServerManager.get_replicas",
        "verl.trainer.ppo.utils:Role.ActorRollout",
    ),
    "agent_loop": (
        "verl.experimental.agent_loop.agent_loop:register(agent_name)",
        "verl.experimental.agent_loop.agent_loop:AgentLoopOutput.as_dict",
        "verl.experimental.agent_loop.single_turn_agent_loop:SingleTurnAgentLoop.run",
    ),
    "replica": ("verl.workers.rollout.replica:RolloutReplicaRegistry.register(name, loader)",),
}

# The vLLM server module cannot be imported without vllm (absent on CPU machines), so its hooks
# are also checked from the source text: module-level names and methods of classes.
VLLM_SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
VLLM_SERVER_NAMES = (
    "SamplingParams",
    "extract_prompt_logprobs",
    "vLLMHttpServer.generate",
    "vLLMHttpServer.launch_server",
    "vLLMHttpServer.collective_rpc",
    "vLLMHttpServer._get_worker_extension_cls",
    "vLLMReplica.__init__",
)


def check_version() -> None:
    """Fail unless the installed verl is exactly the release the hooks were checked against."""
    try:
        import verl
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise BackendUnavailable(
            "the VeRL backend needs the 'verl' extra: pip install 'pdmask[verl]'"
        ) from exc
    if verl.__version__ != VERL_VERSION:
        raise BackendUnavailable(
            f"pdmask's VeRL plugin is pinned to verl=={VERL_VERSION}, found {verl.__version__}; "
            f"install it with pip install 'verl=={VERL_VERSION}'"
        )


def _missing(spec: str) -> str | None:
    """None if the hook exists, else why not."""
    module_name, _, target = spec.partition(":")
    path, _, params = target.partition("(")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        return f"{spec}: module {module_name} does not import ({exc})"
    for part in path.split("."):
        if not hasattr(obj, part):
            return f"{spec}: {path} not found in {module_name}"
        obj = getattr(obj, part)
    wanted = [p.strip() for p in params.rstrip(")").split(",") if p.strip()]
    if wanted:
        have = inspect.signature(obj).parameters
        absent = [p for p in wanted if p not in have]
        if absent:
            return f"{spec}: parameter(s) {', '.join(absent)} gone from {path}"
    return None


def require(groups: Iterable[str]) -> None:
    """Check the hooks of the given ``HOOKS`` groups; one error naming every missing hook."""
    check_version()
    problems = [p for g in groups for spec in HOOKS[g] if (p := _missing(spec))]
    if problems:
        raise BackendUnavailable(
            f"verl {VERL_VERSION} hooks used by pdmask are missing:\n  - " + "\n  - ".join(problems)
        )


def vllm_server_missing_names() -> list[str]:
    """Names of ``VLLM_SERVER_NAMES`` absent from the vLLM server module's source (no import)."""
    # find_spec would import the parent package, which itself needs vllm: locate the file by hand.
    root = importlib.util.find_spec("verl")
    path = os.path.join(os.path.dirname(root.origin), *VLLM_SERVER_MODULE.split(".")[1:]) + ".py"
    if not os.path.exists(path):
        return [f"{VLLM_SERVER_MODULE} (module not found)"]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            defined.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.ClassDef):
            defined.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    defined.add(f"{node.name}.{item.name}")
    return [f"{VLLM_SERVER_MODULE}:{n}" for n in VLLM_SERVER_NAMES if n not in defined]


def check_all() -> None:
    """Every hook the plugin uses anywhere (the vLLM server's only from its source)."""
    require(HOOKS)
    missing = vllm_server_missing_names()
    if missing:
        raise BackendUnavailable(
            "verl hooks used by pdmask are missing:\n  - " + "\n  - ".join(missing)
        )
