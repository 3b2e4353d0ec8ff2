"""Run configuration: one YAML file per run, one pydantic model per component.

Every field has a default (the reference code's, kingofspace0wzz/slea-rl and verl-agent) and a
one-line description, so `configs/*.yaml` only spells out what a run changes. Unknown keys are
errors, because a typo in an RL config silently training with a default is the most expensive
bug there is.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the offending key."""


# The keys each preset fixes: what defines its algorithm. Everything else stays tunable.
# - slea: the paper's method: the library, retrieval at every step (omega, the advantage mode and the
#   library's knobs stay free: they are SLEA's hyperparameters, not a different algorithm).
# - grpo: GRPO as verl-agent runs it (`algorithm.adv_estimator=grpo`): no library, episode-level
#   advantage only (omega 0), group mean *and* std normalisation (`norm_adv_by_std_in_grpo=True`).
# - task_retrieval: the ablation of the paper: the library, retrieved once at step 0.
# - custom: nothing fixed (ablations such as step advantages without a library).
PRESETS: dict[str, dict[str, Any]] = {
    "slea": {"library.enabled": True, "actors.retrieval_mode": "step"},
    "grpo": {
        "library.enabled": False,
        "actors.retrieval_mode": "none",
        "learner.omega": 0.0,
        "learner.advantage_mode": "mean_std_norm",
    },
    "task_retrieval": {"library.enabled": True, "actors.retrieval_mode": "task"},
    "custom": {},
}
EDGE_KEYS: dict[str, Any] = {"actors.ab_groups": True}  # what `run.edge` fixes on top of the preset
EDGE_DEFAULT_DISTILL_COEF = 0.1  # learner.edge_distill_coef under `run.edge` unless the config gives one


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    id: str = Field("local", description="Run id; names the Redis stream slea:<id>:steps and the run directory.")
    id_env: str | None = Field(
        None,
        description="Environment variable whose value is the run id (the cluster's SLEA_RUN_ID, the pods' slea.io/run label): read by the process that loads the config, with no shell between to expand it or not; once read, run.id holds it and this is null.",
    )
    dir: str = Field("runs", description="Parent folder of run directories.")
    seed: int = Field(0, description="Seed for task sampling, generation and training.")
    preset: Literal["slea", "grpo", "task_retrieval", "custom"] = Field(
        "slea",
        description="Algorithm preset (PRESETS): step retrieval + step advantages, GRPO as verl-agent runs it, retrieval once per task, or custom (every key as written).",
    )
    edge: bool = Field(
        False,
        description="EDGE on top of the preset: A/B groups and gain-gated distillation of the with-experience behaviour into the experience-free policy (learner.edge_distill_coef, 0.1 unless set).",
    )
    max_failures: int = Field(
        3,
        ge=0,
        description="Restarts of a dead learner or library writer, both together, within run.failure_window_s before the run stops (actor workers restart without limit).",
    )
    failure_window_s: float = Field(
        3600.0,
        gt=0,
        description="Window of run.max_failures: an hour, so a crash loop stops the run in minutes while a week-long run survives rare faults (a preempted node, an OOM kill); the SleaComponentRestarts alert uses the same hour.",
    )
    hang_timeout_s: float | None = Field(
        1800.0,
        gt=0,
        description="A learner or library writer whose consumer group is given no stream entry for this long while entries wait for it is hung (alive, no progress): the driver restarts it as if it had died, within run.max_failures. Half an hour: longer than a learner step plus a checkpoint of the largest model the configs train (null: never).",
    )
    max_seconds: float | None = Field(
        None,
        gt=0,
        description="Stop training after this many seconds, counted from the actors' start: the learner finishes its step and checkpoints, as at learner.max_steps (null: no time limit).",
    )

    @model_validator(mode="before")
    @classmethod
    def _id_from_the_environment(cls, data: Any) -> Any:
        """KubeRay pastes a RayJob's entrypoint into the submitter pod's `bash -ce`, which expands
        `${SLEA_RUN_ID}` in the submitter's environment (where it is unset) before the head ever
        sees it; the variable's name crosses every shell unchanged, and the driver reads it here."""
        if isinstance(data, dict) and (name := data.get("id_env")):
            value = os.environ.get(name, "")
            if not value:
                raise ValueError(
                    f"run.id_env names the environment variable {name}, which is not set or empty in this "
                    "process (the cluster sets it on the Ray head from the pods' slea.io/run label); "
                    "set it, or give run.id instead"
                )
            data = {**data, "id": value, "id_env": None}
        return data

    @field_validator("id")
    @classmethod
    def _id_is_a_key(cls, value: str) -> str:
        if not value or any(ch in value for ch in " :/\\\n\t"):
            raise ValueError("must be non-empty with no spaces, ':' or slashes (it is part of Redis keys and paths)")
        return value


class RedisConfig(_Section):
    url: str | None = Field(None, description="redis:// or rediss:// URL; null starts a private embedded redis-server.")
    username: str | None = Field(
        None, description="Redis ACL user (null = the default user); the cluster's is limited to slea:<run.id>:* keys."
    )
    password_env: str | None = Field(
        "SLEA_REDIS_PASSWORD", description="Environment variable holding the password (never put it in YAML)."
    )
    password_file: str | None = Field(None, description="File holding the password, e.g. a mounted Kubernetes Secret.")
    tls_ca_file: str | None = Field(None, description="CA bundle for rediss:// connections.")
    tls_verify: bool = Field(True, description="Verify the server certificate on rediss:// connections.")
    embedded_appendonly: bool = Field(
        True, description="Embedded server persists with AOF so a restart loses nothing acknowledged."
    )
    batch_size: int = Field(64, ge=1, le=10_000, description="Records per pipelined XADD batch.")
    read_count: int = Field(256, ge=1, le=100_000, description="Entries per XREADGROUP call.")
    block_ms: int = Field(1000, ge=0, description="How long a consumer read blocks waiting for new entries.")
    claim_idle_ms: int = Field(
        60_000, ge=1, description="Pending entries idle this long are claimed from dead consumers."
    )
    max_deliveries: int = Field(
        5, ge=1, description="After this many deliveries an entry moves to the dead-letter stream."
    )
    max_lag: int = Field(20_000, ge=1, description="Learner lag (entries) above which actors throttle.")
    reconnect_max_s: float = Field(30.0, gt=0, description="Give up reconnecting after this long without Redis.")
    retention_s: int | None = Field(
        7 * 24 * 3600,
        gt=0,
        description="In a configured (shared) Redis, a run's keys expire this long after its driver last ran (finished, "
        "stopped, failed or SIGKILLed: a live driver refreshes the expiry); resuming it within that time keeps them. "
        "null keeps them forever. The embedded Redis lives in the run directory and is not affected.",
    )
    socket_timeout_s: float = Field(
        10.0, gt=0, description="Socket timeout for Redis commands (blocking reads add block_ms)."
    )


class ModelConfig(_Section):
    name: str = Field(
        "smollm2-135m-instruct",
        description="HF id, local directory, GGUF file, or 'smollm2-135m-instruct' (shipped package).",
    )
    max_prompt_tokens: int = Field(
        2048, ge=16, description="Prompts longer than this are truncated from the history side."
    )
    max_new_tokens: int = Field(128, ge=1, description="Response budget per step.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")


class EnvsConfig(_Section):
    name: str = Field("alfworld", description="Environment name from the registry (or one of `plugins`).")
    params: dict[str, Any] = Field(default_factory=dict, description="Env-specific parameters, e.g. difficulty: easy.")
    max_steps: int | None = Field(
        None, ge=1, description="Step budget per episode; null uses the env's default (ALFWorld 50)."
    )
    budgets: list[int] = Field(
        default_factory=list, description="Budget-mixed training: sample each group's step budget from these."
    )
    eval_panel: str = Field("default", description="Evaluation panel name; training never samples its tasks.")
    panel_size: int = Field(
        50,
        ge=1,
        description="Tasks in the evaluation panel (held out from training, with eval.panel_size's if larger).",
    )
    plugins: dict[str, str] = Field(
        default_factory=dict,
        description="Extra envs: name -> 'module:Class' or 'path/to/adapter.py:Class' (a TextEnv subclass).",
    )

    @field_validator("plugins")
    @classmethod
    def _plugins_are_specs(cls, plugins: dict[str, str]) -> dict[str, str]:
        """Each value is a spec; a file is made absolute here, where the config is loaded, so Ray
        workers started in another directory (and a resumed run) import the same file."""
        resolved = {}
        for name, spec in plugins.items():
            try:
                source, class_name, is_file = parse_plugin_spec(spec)
            except ValueError as error:
                raise ValueError(f"plugin {name}={spec}: {error}") from None
            resolved[name] = f"{Path(source).expanduser().resolve()}:{class_name}" if is_file else spec
        return resolved


def parse_plugin_spec(spec: str) -> tuple[str, str, bool]:
    """'module:Class' or 'path/to/adapter.py:Class' -> (module or file, class name, whether it is a file).

    A source ending in '.py' is a file; anything else is a module name. The class name is what
    follows the last ':', so a Windows drive letter stays in the path.
    """
    source, _, class_name = str(spec).rpartition(":")
    if not source or not class_name.isidentifier():
        raise ValueError("a plugin must be 'module:Class' or 'path/to/adapter.py:Class'")
    return source, class_name, source.endswith(".py")


class AutoscaleConfig(_Section):
    """The actor pool sizing itself while training goes on (driver/autoscale.py decides)."""

    min_workers: int = Field(1, ge=1, description="Fewest actor workers the autoscaler keeps.")
    max_workers: int = Field(8, ge=1, description="Most actor workers the autoscaler starts.")
    interval_s: float = Field(
        30.0, gt=0, description="Seconds between decisions; each looks at the interval before it."
    )
    step: int = Field(1, ge=1, description="Workers added or removed by one decision.")
    grow_wait_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Grow while the learner spends more than this share of its time waiting for groups.",
    )
    shrink_throttled_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Shrink while workers spend more than this share of their time held back by the staleness or lag bound.",
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> AutoscaleConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers={self.min_workers} is above max_workers={self.max_workers}")
        return self


class ActorsConfig(_Section):
    num_workers: int = Field(2, ge=0, description="Actor workers (Ray actors) in the pool.")
    envs_per_worker: int = Field(8, ge=1, description="Environments each worker plays concurrently.")
    engine: Literal["transformers", "vllm"] = Field("transformers", description="Generation engine.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Generation dtype; auto: bfloat16 where the worker's device computes it faster (CUDA; a CPU where bf16 matmuls measure 1.2x float32's, slea/precision.py), else float32.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Passed through to the vLLM engine (e.g. gpu_memory_utilization; on CPU kv_cache_memory_bytes, 1 GiB unless set).",
    )
    group_size: int = Field(8, ge=1, description="G: trajectories per task group.")
    history_length: int = Field(2, ge=0, description="Observation/action pairs of history in the prompt.")
    prompt_style: Literal["reasoning", "compact"] = Field(
        "reasoning",
        description="reasoning: verl-agent's think-then-act prompt; compact: one format example, action only (small models).",
    )
    prompt_layout: Literal["experiences_first", "prefix_stable"] = Field(
        "experiences_first",
        description="Where the experiences go: experiences_first, in the system message (the studies' layout); prefix_stable, after the task and history, before the observation, so that vLLM's prefix cache holds the rest of the prompt (actors/prompts.py).",
    )
    retrieval_mode: Literal["step", "task", "none"] = Field(
        "step", description="Retrieve every step, once per episode, or never."
    )
    retrieval_timeout_s: float = Field(
        0.5, gt=0, description="A retrieval slower than this is skipped and counted as a miss."
    )
    ab_groups: bool = Field(False, description="EDGE A/B groups: first half with experiences, second half without.")
    max_staleness: int = Field(
        4,
        ge=0,
        description="Start no group that the learner would train more than this many versions later (actors/staleness_admission.py), nor while the weights are this many versions behind the learner's.",
    )
    synchronous: bool = Field(
        False,
        description="Synchronous baseline: only learner.tasks_per_step groups per policy version, then wait for the next one.",
    )
    max_outbox_steps: int = Field(
        1024,
        ge=1,
        description="Steps a worker holds that Redis has not taken yet; at this many its episodes wait (backpressure; actors/outbox.py).",
    )
    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs per actor worker.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per actor worker.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources pinning workers to their pool."
    )
    autoscale: AutoscaleConfig | None = Field(
        None,
        description="Size the pool by the learner's waiting and the actors' throttling (null = fixed; slea scale).",
    )


class LearnerConfig(_Section):
    tasks_per_step: int = Field(16, ge=1, description="Ready task groups per training step.")
    gamma: float = Field(0.95, ge=0, le=1, description="Discount of step returns.")
    omega: float = Field(1.0, ge=0, description="Weight of the step-level (anchor) advantage.")
    advantage_mode: Literal["mean_norm", "mean_std_norm"] = Field("mean_norm", description="Group normalisation.")
    episode_stats: Literal["per_step", "per_trajectory"] = Field(
        "per_step", description="Episode advantage statistics over step rows or trajectories."
    )
    anchor: Literal["exact", "cluster"] = Field(
        "exact", description="Anchor states: exact observation text or library cluster key."
    )
    invalid_penalty: float = Field(0.1, ge=0, description="Penalty on the step whose action was invalid.")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Forward/backward compute under autocast (weights, gradients, optimizer state stay float32; LM head and log-softmax in float32); auto: bfloat16 where it is faster (slea/precision.py).",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in optimizer steps.")
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1.")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (asymmetric, DAPO-style).")
    kl_coef: float = Field(
        0.01, ge=0, description="KL penalty to the frozen reference policy (low-variance estimator)."
    )
    reference_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Weights of the frozen KL reference (held only when kl_coef > 0); auto: the compute dtype, so a bf16 learner holds a bf16 reference (half the memory; its matmuls run in bf16 under autocast either way).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Keep only each decoder layer's input and recompute the layer in backward: far less activation memory for about a third more compute (learner/memory.py counts both ways).",
    )
    entropy_coef: float = Field(0.001, ge=0, description="Entropy bonus.")
    edge_distill_coef: float = Field(
        0.0,
        ge=0,
        description="EDGE: weight of the reverse KL from the experience-free (B-half) policy to itself prompted with the experiences (0 = off; needs actors.ab_groups).",
    )
    edge_gain_threshold: float = Field(
        0.0,
        description="EDGE: distil a group only when its A half beat its B half by more than this (success rate or mean return).",
    )
    edge_gain_metric: Literal["success", "return"] = Field(
        "success", description="EDGE: the gain compares A/B success rates or mean episode returns."
    )
    max_staleness: int = Field(4, ge=0, description="Steps more than this many versions old are dropped.")
    behav_weight_cap: float = Field(
        5.0, gt=0, description="Decoupled PPO: cap of the behaviour-to-proximal importance weight."
    )
    mini_batches: int = Field(
        4, ge=1, description="PPO mini-batches per learner batch: one optimizer step each (rows dealt at random)."
    )
    ppo_epochs: int = Field(
        1, ge=1, description="Passes over a learner batch's mini-batches (optimizer steps = mini_batches x ppo_epochs)."
    )
    micro_batch_tokens: int = Field(
        4096, ge=16, description="Token budget per micro-batch (gradient accumulation across them)."
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip.")
    zero_stage: Literal[0, 1, 2, 3] = Field(0, description="DeepSpeed ZeRO stage.")
    group_timeout_s: float = Field(600.0, gt=0, description="Groups not complete after this long are dropped.")
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every N learner steps (and on shutdown).")
    max_steps: int = Field(100, ge=1, description="Learner steps in the run.")
    num_ranks: int = Field(
        1, ge=1, description="Learner processes (data-parallel DeepSpeed ranks); rank 0 reads the stream."
    )
    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs for each learner rank (on CPU also its torch threads).")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs for each learner rank.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources pinning each learner rank."
    )
    weight_transport: Literal["object_store", "collective"] = Field(
        "object_store",
        description="New weights reach vLLM engines via the Ray object store, or broadcast on a gloo/NCCL group per engine (transformers engines always use the object store).",
    )
    weight_push_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Collective transport: longest wait for an engine to join or take a version before it is dropped.",
    )


class LibraryConfig(_Section):
    enabled: bool = Field(True, description="Run the experience library (false for plain GRPO).")
    k_strategies: int = Field(2, ge=0, le=32, description="Strategies injected per step.")
    k_warnings: int = Field(1, ge=0, le=32, description="Warnings injected per step.")
    max_tokens: int = Field(200, ge=1, le=4096, description="Token budget of injected experiences.")
    delta: float = Field(0.85, ge=-1, le=1, description="Cosine similarity to join an existing cluster.")
    group_instance_numbers: bool = Field(
        False, description="Treat 'countertop 1' and 'countertop 2' states as one structural key."
    )
    max_clusters: int = Field(
        20_000, ge=1, description="Clusters per task type; the least used is evicted beyond this."
    )
    strategy_capacity: dict[str, int] = Field(
        default_factory=lambda: {"principle": 100, "method": 100, "example": 100}, description="E+ capacity per level."
    )
    warning_capacity: dict[str, int] = Field(
        default_factory=lambda: {"mistake": 50, "pattern": 50, "diagnostic": 50}, description="E- capacity per level."
    )
    max_successes_per_window: int = Field(5, ge=0, description="Successes distilled per window.")
    max_failures_per_window: int = Field(5, ge=0, description="Failures distilled per window.")
    max_strategies_per_window: int = Field(10, ge=0, description="Strategies admitted per window.")
    max_warnings_per_window: int = Field(5, ge=0, description="Warnings admitted per window.")
    window_versions: int = Field(1, ge=1, description="Extraction window length in learner versions.")
    warmup_versions: int = Field(5, ge=0, description="No injection before this many versions ...")
    warmup_experiences: int = Field(10, ge=0, description="... or before the library holds this many experiences.")
    extractor: Literal["rules", "llm"] = Field(
        "rules", description="Distil episodes by deterministic rules or by an LLM."
    )
    extractor_endpoint: str | None = Field(
        None, description="OpenAI-compatible endpoint for the llm extractor; null uses the local model."
    )
    snapshot_every: int = Field(10, ge=1, description="Snapshot every N library versions (and on shutdown).")
    follow: Literal["run", "current"] = Field(
        "run",
        description="Library a retrieval app serves: run.id's, or (current) the newest run slea train started with a library on this Redis.",
    )
    replicas: int = Field(1, ge=1, description="Ray Serve replicas of the retrieval app.")
    max_replicas: int = Field(4, ge=1, description="Serve autoscaling upper bound.")
    http_port: int = Field(8000, ge=0, le=65535, description="Ray Serve HTTP port (0 = no HTTP).")
    http_host: str = Field(
        "127.0.0.1",
        description="Address Serve's HTTP proxy listens on; 0.0.0.0 opens it to other machines (the cluster config does).",
    )
    max_ongoing_requests: int = Field(
        8, ge=1, description="Requests one Serve replica works on at once; more wait in the caller's queue."
    )
    max_queued_requests: int = Field(
        32,
        ge=1,
        description="Requests each caller (HTTP proxy, actor handle) queues for the app; more get 503 'dropped due to backpressure'.",
    )
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources pinning the library.")
    window_seconds: float | None = Field(
        None, gt=0, description="Extraction window as wall time instead of learner versions (null = versions)."
    )
    dedup_threshold: float = Field(
        0.85, ge=-1, le=1, description="Cosine similarity at which a candidate merges into an item of its zone."
    )
    utility_rate: float = Field(
        0.2, gt=0, le=1, description="EDGE utility: weight of the newest outcome difference in the exponential average."
    )
    prune_min_exposures: int = Field(
        8,
        ge=1,
        description="A-half episodes an item must have been shown in, in A/B groups with matched B episodes (its utility's sample), before it can be pruned.",
    )
    prune_utility_at_or_below: float = Field(
        -0.25,
        ge=-1,
        le=1,
        description="EDGE pruning: an item whose utility is at or below this for prune_windows consecutive evaluated windows is pruned.",
    )
    prune_windows: int = Field(
        2,
        ge=1,
        description="EDGE pruning: consecutive windows with A/B evidence the utility must stay at or below the threshold.",
    )
    embedding_model: str | None = Field(
        None, description="sentence-transformers model folder; null uses the shipped all-MiniLM-L6-v2 package."
    )
    embedding_cache_size: int = Field(
        8192,
        ge=0,
        description="Observation embeddings kept in an LRU cache (text -> vector; model-fixed, version-independent).",
    )
    extractor_model: str | None = Field(
        None, description="Local model of the llm extractor (same forms as model.name); null uses model.name."
    )
    extractor_endpoint_model: str = Field(
        "default", description="'model' field sent to the OpenAI-compatible extractor endpoint."
    )
    extractor_max_new_tokens: int = Field(
        256, ge=16, le=4096, description="Generation budget of one extraction (Prompt B or C)."
    )
    snapshot_max_age_s: float = Field(
        60.0, gt=0, description="Snapshot at least this often while processed entries await their ack."
    )
    max_batch_observations: int = Field(
        256, ge=1, le=4096, description="Observations per retrieve_batch request (larger requests get 4xx)."
    )
    max_observation_chars: int = Field(
        16_384, ge=64, description="Characters per observation in a retrieval request (longer get 4xx)."
    )
    max_request_bytes: int = Field(
        4_000_000, ge=1024, description="HTTP request body limit of the retrieval app (larger get 413)."
    )
    target_ongoing_requests: float = Field(
        4.0, gt=0, description="Serve autoscaling: in-flight requests per replica to aim for."
    )

    @model_validator(mode="after")
    def _target_within_bound(self) -> LibraryConfig:
        if self.target_ongoing_requests > self.max_ongoing_requests:
            raise ValueError(
                f"target_ongoing_requests ({self.target_ongoing_requests}) must not exceed "
                f"max_ongoing_requests ({self.max_ongoing_requests}): replicas could never reach it"
            )
        return self


class MonitoringConfig(_Section):
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="prometheus-client HTTP port outside Ray (null = none, 0 = any free port)."
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="Address the prometheus-client port listens on; 0.0.0.0 lets another machine's Prometheus scrape it.",
    )
    sinks: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        ["jsonl", "tensorboard"],
        description="Where each learner step's metrics go: jsonl (metrics.jsonl; required, since plots, slea compare and --resume read it), tensorboard, wandb (pip install 'slea-rl[wandb]').",
    )
    wandb_project: str = Field("slea-rl", description="W&B project; the W&B run is named after run.id.")
    wandb_entity: str | None = Field(None, description="W&B team or user (null = the logged-in user's default).")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None,
        description="W&B mode: offline writes <run dir>/wandb/ without network, for `wandb sync` later (null = $WANDB_MODE, else online).",
    )
    plots: bool = Field(True, description="Write PNG plots into the run directory as the run goes.")

    @field_validator("sinks")
    @classmethod
    def _jsonl_once(cls, sinks: list[str]) -> list[str]:
        if "jsonl" not in sinks:
            raise ValueError(
                "must include jsonl: metrics.jsonl is the run's record, read by its plots, slea compare and --resume"
            )
        if len(set(sinks)) != len(sinks):
            raise ValueError("names a sink twice")
        return sinks


class EvalConfig(_Section):
    every: int = Field(
        0,
        ge=0,
        description="Held-out panel evaluation every N learner steps, plus before the first and after the last (0 = never).",
    )
    before_training: bool = Field(
        True,
        description="Also evaluate the policy before the first update (false: runs of one comparison share one baseline evaluation of the base model).",
    )
    panel_size: int | None = Field(
        None,
        ge=1,
        description="Panel tasks played while training (null = envs.panel_size); training holds out the larger of the two.",
    )
    samples_per_task: int = Field(
        2, ge=1, description="Sampled episodes per panel task (plus one greedy unless greedy is false)."
    )
    greedy: bool = Field(True, description="Also play one greedy episode per panel task (the eval/greedy/... rows).")
    library: bool = Field(True, description="Also play with the run's live library, when the run has one.")
    policy_alone: bool = Field(
        True,
        description="With the library, also play the panel without it (the policy alone); false: only as deployed. The base policy (before the first update) is always played alone.",
    )
    engine: Literal["transformers", "vllm"] | None = Field(
        None,
        description="The evaluator's generation engine (null = actors.engine); vLLM caches the panel prompts' shared prefix.",
    )
    max_batch: int = Field(16, ge=1, description="Generations batched together by the evaluator's engine.")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPUs of the evaluator.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs of the evaluator.")


class RayConfig(_Section):
    address: str | None = Field(None, description="Join this Ray cluster ('auto' on KubeRay); null starts a local one.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray (null = all).")


class SleaConfig(_Section):
    run: RunConfig = Field(default_factory=RunConfig, description="Run identity and algorithm preset.")
    redis: RedisConfig = Field(default_factory=RedisConfig, description="Step stream transport.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model and sampling.")
    envs: EnvsConfig = Field(default_factory=EnvsConfig, description="Environments and tasks.")
    actors: ActorsConfig = Field(default_factory=ActorsConfig, description="Actor pool.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner and its algorithm.")
    library: LibraryConfig = Field(default_factory=LibraryConfig, description="Experience library.")
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig, description="Metrics and run outputs.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation during training.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster.")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, tree: Any) -> Any:
        """Fill in the keys that `run.preset` (and `run.edge`) fix. Works on the tree as written, so
        a key the user gave is told apart from a default: a different value is an error naming both."""
        if not isinstance(tree, dict):
            return tree
        tree = {name: _as_written(section) for name, section in tree.items()}
        _refuse_model_dtype(tree.get("model"))
        run = tree.get("run") if isinstance(tree.get("run"), dict) else {}
        fixed = dict(PRESETS.get(run.get("preset", "slea"), {}))
        if run.get("edge"):
            fixed.update(EDGE_KEYS)
        for dotted, value in fixed.items():
            section_name, key = dotted.split(".")
            section = tree.setdefault(section_name, {})
            if not isinstance(section, dict):
                continue  # pydantic reports the malformed section itself
            if key in section and section[key] != value:
                cause = f"run.preset={run.get('preset', 'slea')}" if dotted not in EDGE_KEYS else "run.edge=true"
                raise ValueError(
                    f"{cause} fixes {dotted}={value!r}, but the config sets {dotted}={section[key]!r}; "
                    f"drop one of them (run.preset=custom fixes nothing)"
                )
            section[key] = value
        if run.get("edge"):
            tree.setdefault("learner", {}).setdefault("edge_distill_coef", EDGE_DEFAULT_DISTILL_COEF)
        return tree

    @model_validator(mode="after")
    def _edge_is_possible(self) -> SleaConfig:
        if self.run.edge:
            if not self.library.enabled or self.actors.retrieval_mode == "none":
                raise ValueError(
                    "run.edge needs the experience library (library.enabled and a retrieval_mode other than "
                    f"'none'); preset '{self.run.preset}' has none: use preset slea or task_retrieval"
                )
            if self.actors.group_size < 2:
                raise ValueError(
                    "run.edge needs actors.group_size >= 2: a group is split into a half with and a half "
                    "without experiences"
                )
        return self

    @model_validator(mode="after")
    def _collective_needs_separate_gpus(self) -> SleaConfig:
        """NCCL refuses two ranks of one group on one device, and a vLLM engine whose link fails
        never falls back to the object store: it would stay on version 0 for the whole run."""
        learner, actors = self.learner, self.actors
        if (
            learner.weight_transport == "collective"
            and actors.engine == "vllm"
            and 0 < learner.num_gpus < 1
            and 0 < actors.num_gpus < 1
        ):
            raise ValueError(
                f"learner.weight_transport=collective with learner.num_gpus={learner.num_gpus} and "
                f"actors.num_gpus={actors.num_gpus}: Ray may put the learner and a vLLM engine on one GPU, where "
                "NCCL refuses the weight group (two ranks on one device). Use learner.weight_transport: "
                "object_store to share a GPU, or whole GPUs (num_gpus >= 1) for the learner or the actors"
            )
        return self

    def held_out_panel_size(self) -> int:
        """Tasks of the `envs.eval_panel` panel that training never samples: every task any evaluation of
        this run plays. Panels of one name are prefixes of one sequence (actors/envs/tasks.py), so the
        larger of the two sizes covers both the in-training evaluator and `slea eval` on the run."""
        return max(self.envs.panel_size, self.eval.panel_size or 0)

    def stream_key(self) -> str:
        return f"slea:{self.run.id}:steps"

    def dead_letter_key(self) -> str:
        return f"slea:{self.run.id}:dead"


def _refuse_model_dtype(model: Any) -> None:
    """`model.dtype` set one dtype for generation *and* the learner's weights: as bfloat16 it stepped
    bf16 parameters with no float32 master copy (after 4 steps at lr 2e-5 only ~15% of them moved).
    The two now have their own keys, and the learner's weights are always float32."""
    if isinstance(model, dict) and "dtype" in model:
        raise ValueError(
            f"model.dtype={model['dtype']!r} is no longer a key: generation takes actors.dtype and training "
            "learner.compute_dtype (bf16 compute over float32 master weights; bf16 weights are never "
            "trained); set those instead (both default to auto: bfloat16 where the hardware has it)"
        )


def _as_written(section: Any) -> Any:
    """A section as the user gave it, as a fresh dict: a section model counts only the keys set on it."""
    if isinstance(section, BaseModel):
        return section.model_dump(exclude_unset=True)
    return dict(section) if isinstance(section, dict) else section


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "<root>"
    if error["type"] == "value_error" and not error["loc"]:  # a whole-config rule (presets, run.edge): its own words
        return str(error["ctx"]["error"])
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'{_did_you_mean(error['loc'])}"
    if error["type"] == "missing":
        return f"missing key '{key}'"
    return f"bad value for '{key}': {error['msg']} (got {error.get('input')!r})"


def _did_you_mean(loc: tuple) -> str:
    """ " (did you mean 'learner.gamma'?)" for an unknown key close to a real one of its section."""
    model: type[BaseModel] = SleaConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""  # inside a free-form dict (envs.params): nothing to suggest
        model = annotation
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean '{'.'.join([*map(str, loc[:-1]), close[0]])}'?)" if close else ""


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.c=value' -> (['a','b','c'], value); the value is parsed as YAML so 3, true, [1,2] work."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.path=value")
    path, raw = text.split("=", 1)
    keys = [key for key in path.strip().split(".") if key]
    if not keys:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{path}': value {raw!r} is not valid YAML ({exc.problem})") from None
    return keys, value


def apply_override(tree: dict[str, Any], keys: list[str], value: Any) -> None:
    node = tree
    for depth, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{'.'.join(keys)}': '{'.'.join(keys[: depth + 1])}' is not a section")
        node = child
    node[keys[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> SleaConfig:
    """Read a YAML run file (or defaults), apply `--set` overrides, validate; errors name the key."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(
                f"config file '{path}' is not valid YAML{where}: {getattr(exc, 'problem', exc)}"
            ) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file '{path}' must be a mapping of sections, got {type(loaded).__name__}")
        tree = loaded or {}
    for override in overrides:
        apply_override(tree, *parse_override(override))
    try:
        return SleaConfig.model_validate(tree)
    except ValidationError as exc:
        problems = [_describe(error) for error in exc.errors()]
        if len(problems) == 1:
            raise ConfigError(problems[0]) from None
        raise ConfigError(f"{len(problems)} problems: " + "; ".join(problems)) from None  # every one, in one line


def check_trainable(config: SleaConfig) -> None:
    """What `slea train` refuses that evaluation allows: the learner's importance ratios compare its
    log-probs of `logits / T` over the whole vocabulary with the behaviour log-probs the actors
    recorded, so the actors must sample exactly that distribution. And the run's outputs: a
    metrics sink whose package is missing fails here, before Redis and Ray start, not at step 1."""
    if config.model.temperature <= 0:
        raise ConfigError(
            f"model.temperature={config.model.temperature} is greedy decoding: training needs a sampled "
            "policy (temperature > 0); greedy stays available for evaluation (slea eval)"
        )
    if config.model.top_p < 1:
        raise ConfigError(
            f"model.top_p={config.model.top_p}: the learner scores the untruncated distribution at "
            "model.temperature, so nucleus-truncated samples would get wrong importance weights; "
            "train with top_p 1.0"
        )
    if "wandb" in config.monitoring.sinks and importlib.util.find_spec("wandb") is None:  # an optional extra
        raise ConfigError(
            "monitoring.sinks lists wandb, but the wandb package is not installed: "
            "pip install 'slea-rl[wandb]' (or remove wandb from monitoring.sinks)"
        )


def dump_config(config: SleaConfig) -> str:
    """The fully resolved config as YAML, written into every run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
