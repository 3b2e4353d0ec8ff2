"""Every slea metric: name, type, help and labels in one table, so dashboards, alerts and both
metric backends (monitoring/metrics.py, monitoring/ray_metrics.py) read one definition.

Components never construct prometheus metrics themselves; they call `monitoring.metrics.metric(name)`.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "slea_"

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric as Prometheus will see it (the exported name is PREFIX + name)."""

    name: str  # without prefix; counters end in _total
    kind: str  # "counter" | "gauge" | "histogram"
    help: str  # one line shown in Prometheus and Grafana
    labels: tuple[str, ...] = ()  # label names, e.g. ("stream", "group")
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S  # histograms only


CATALOGUE: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in [
        # stream transport (slea.streams)
        MetricSpec("stream_records_produced_total", "counter", "StepRecords XADDed to the step stream.", ("stream",)),
        MetricSpec("stream_bytes_produced_total", "counter", "Payload bytes XADDed to the step stream.", ("stream",)),
        MetricSpec(
            "stream_records_consumed_total", "counter", "Entries delivered to a consumer group.", ("stream", "group")
        ),
        MetricSpec(
            "stream_records_acked_total", "counter", "Entries acknowledged by a consumer group.", ("stream", "group")
        ),
        MetricSpec(
            "stream_records_claimed_total", "counter", "Entries claimed from idle consumers.", ("stream", "group")
        ),
        MetricSpec(
            "stream_dead_lettered_total",
            "counter",
            "Entries moved to the dead-letter stream.",
            ("stream", "group", "reason"),
        ),
        MetricSpec("stream_reconnects_total", "counter", "Reconnections after Redis went away.", ("stream", "role")),
        MetricSpec(
            "stream_trimmed_total", "counter", "Entries trimmed after every group acknowledged them.", ("stream",)
        ),
        MetricSpec(
            "stream_backpressure_total",
            "counter",
            "XADD batches Redis refused at maxmemory (noeviction): a consumer is behind.",
            ("stream",),
        ),
        MetricSpec("stream_lag", "gauge", "Entries in the stream not yet delivered to a group.", ("stream", "group")),
        MetricSpec(
            "stream_pending", "gauge", "Entries delivered to a group but not acknowledged.", ("stream", "group")
        ),
        MetricSpec("stream_length", "gauge", "Entries held in the stream.", ("stream",)),
        # learner (learner/)
        MetricSpec(
            "learner_steps_total",
            "counter",
            "Learner steps (batches) trained; each takes learner_optimizer_steps_per_batch optimizer steps.",
        ),
        MetricSpec("learner_policy_version", "gauge", "Latest policy version the learner published."),
        MetricSpec("learner_loss", "gauge", "Total loss of the last step."),
        MetricSpec("learner_pg_loss", "gauge", "Policy-gradient (PPO-clip) part of the loss."),
        MetricSpec("learner_kl", "gauge", "KL to the reference policy (low-variance estimator)."),
        MetricSpec("learner_entropy", "gauge", "Mean token entropy of the responses trained on."),
        MetricSpec(
            "learner_clip_fraction",
            "gauge",
            "Share of response tokens whose ratio was clipped (mean over the batch's optimizer steps).",
        ),
        MetricSpec(
            "learner_approx_kl",
            "gauge",
            "k3 estimate of KL(proximal || current) over the batch's optimizer steps: how far PPO moved the policy.",
        ),
        MetricSpec(
            "learner_behaviour_masked_fraction",
            "gauge",
            "Share of response tokens masked because the behaviour-to-proximal weight exceeded learner.behav_weight_cap.",
        ),
        MetricSpec(
            "learner_behaviour_logprob_gap",
            "gauge",
            "Mean |log pi_proximal - log pi_behaviour| per response token: staleness plus the actor/learner numerics gap (bf16 actors, another engine).",
        ),
        MetricSpec(
            "learner_optimizer_steps_per_batch",
            "gauge",
            "Optimizer steps of the last learner batch (mini_batches x ppo_epochs).",
        ),
        MetricSpec("learner_grad_norm", "gauge", "Gradient norm before clipping."),
        MetricSpec("learner_advantage_mean", "gauge", "Mean advantage of the rows trained on."),
        MetricSpec("learner_advantage_std", "gauge", "Standard deviation of the advantages."),
        MetricSpec(
            "learner_advantage_abs",
            "gauge",
            "Mean |advantage| by part: episode (group) or step (anchor, times omega).",
            ("part",),
        ),
        MetricSpec("learner_tokens_per_second", "gauge", "Training throughput of the last step (all tokens)."),
        MetricSpec("learner_groups_trained_total", "counter", "Task groups trained on."),
        MetricSpec(
            "learner_groups_dropped",
            "gauge",
            "Groups dropped so far, by reason (timeout, abandoned, stale, lost: an admission slot no group held).",
            ("reason",),
        ),
        MetricSpec(
            "learner_edge_kl",
            "gauge",
            "EDGE: sampled reverse KL from the experience-free policy to itself shown the experiences, per distilled token.",
        ),
        MetricSpec(
            "learner_edge_token_fraction",
            "gauge",
            "EDGE: share of response tokens distilled (B half of gated-in groups).",
        ),
        MetricSpec(
            "learner_edge_gated_fraction",
            "gauge",
            "EDGE: share of groups distilled (experiences helped by more than the threshold).",
        ),
        MetricSpec(
            "learner_edge_gain", "gauge", "EDGE: mean gain of the A half (with experiences) over the B half, per group."
        ),
        MetricSpec(
            "learner_step_staleness",
            "histogram",
            "Policy versions between generation and training, per step row.",
            (),
            (0.5, 1.5, 2.5, 3.5, 4.5, 6.5, 8.5, 16.5),
        ),
        MetricSpec(
            "learner_anchor_group_size",
            "histogram",
            "Rows sharing one anchor state (1 = singleton, step advantage 0).",
            (),
            (1, 2, 3, 4, 6, 8, 16, 32, 64),
        ),
        MetricSpec("actor_env_steps_total", "counter", "Environment steps played.", ("env", "task_type")),
        MetricSpec("actor_generated_tokens_total", "counter", "Response tokens generated.", ("worker",)),
        MetricSpec("actor_prompt_tokens_total", "counter", "Prompt tokens generated from.", ("worker",)),
        MetricSpec(
            "actor_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens the engine's prefix cache already held (vLLM; the transformers engine has no cache: 0).",
            ("worker",),
        ),
        MetricSpec(
            "actor_engine_seconds_total",
            "counter",
            "Engine seconds by phase (prefill: reading the prompt, decode: writing the response), summed over requests.",
            ("worker", "phase"),
        ),
        MetricSpec(
            "actor_episodes_total",
            "counter",
            "Episodes finished, by outcome (success, failure, abandoned).",
            ("env", "task_type", "outcome"),
        ),
        MetricSpec(
            "actor_episode_steps",
            "histogram",
            "Steps per finished episode.",
            ("env",),
            (1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100),
        ),
        MetricSpec(
            "actor_invalid_actions_total", "counter", "Steps whose action was unparsable or inadmissible.", ("env",)
        ),
        MetricSpec("actor_retrieval_seconds", "histogram", "Latency of one batched retrieval call from an actor."),
        MetricSpec(
            "actor_retrieval_requests_total",
            "counter",
            "Observations an actor retrieved for, by outcome (hit, empty, timeout, error, unavailable).",
            ("outcome",),
        ),
        MetricSpec("actor_policy_version", "gauge", "Policy version an actor worker generates with.", ("worker",)),
        MetricSpec("actor_version_lag", "gauge", "Learner version minus the worker's policy version.", ("worker",)),
        MetricSpec(
            "actor_throttled_seconds_total",
            "counter",
            "Time a worker held back new groups, by reason.",
            ("worker", "reason"),
        ),
        MetricSpec(
            "actor_weight_updates_total", "counter", "Weight versions an actor worker switched to.", ("worker",)
        ),
        MetricSpec(
            "actor_steps_lost_total",
            "counter",
            "Steps played that never reached the stream: Redis refused or was away past redis.reconnect_max_s.",
            ("worker", "reason"),
        ),
        # actor pool size (driver/pool_control.py: the driver exports these)
        MetricSpec(
            "actor_pool_desired_workers", "gauge", "Actor workers the pool is asked to have (slea scale, autoscale)."
        ),
        MetricSpec(
            "actor_pool_alive_workers", "gauge", "Actor workers placed, up and answering (not waiting for a node)."
        ),
        MetricSpec(
            "actor_pool_autoscale_decisions_total",
            "counter",
            "Autoscale decisions about the actor pool, by kind (grow, shrink, hold).",
            ("kind",),
        ),
        # run supervision (driver/supervision.py, driver/train.py, driver/serve_health.py: the driver exports this)
        MetricSpec(
            "run_component_restarts_total",
            "counter",
            "Restarts by component: a dead or hung learner or library writer restarted by the driver (run.max_failures "
            "bounds them), an actor worker Ray restarted, a library Serve replica Serve replaced.",
            ("component",),
        ),
        # experience library (library/)
        MetricSpec("library_experiences", "gauge", "Experiences held per zone and level.", ("zone", "level")),
        MetricSpec(
            "library_admission_events_total",
            "counter",
            "Admission outcomes that happened: admitted, merged, rejected, evicted, pruned.",
            ("zone", "event"),
        ),
        MetricSpec(
            "library_rejections_total",
            "counter",
            "Candidates not admitted, by reason (below_minimum, rate_limit, over_token_budget).",
            ("zone", "reason"),
        ),
        MetricSpec(
            "library_episodes_total",
            "counter",
            "Finished episodes the library processed, by outcome (success, failure, abandoned, duplicate).",
            ("outcome",),
        ),
        MetricSpec(
            "library_extraction_calls_total",
            "counter",
            "Extractions run, by backend and prompt (success: B, failure: C).",
            ("backend", "prompt"),
        ),
        MetricSpec(
            "library_extraction_failures_total",
            "counter",
            "Extractions whose output was rejected or that raised, by reason.",
            ("backend", "reason"),
        ),
        MetricSpec(
            "library_extraction_seconds",
            "histogram",
            "Wall time of one extraction.",
            ("backend",),
            (0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        ),
        MetricSpec("library_clusters", "gauge", "Observation clusters held per task type.", ("task_type",)),
        MetricSpec(
            "library_cluster_evictions_total",
            "counter",
            "Least-used clusters evicted at the cluster bound.",
            ("task_type",),
        ),
        MetricSpec(
            "library_retrievals_total",
            "counter",
            "Observations retrieved for, by mode and by where the items came from (cluster, fallback, mixed, empty, warmup).",
            ("mode", "source"),
        ),
        MetricSpec(
            "library_retrieval_seconds",
            "histogram",
            "Latency of one retrieval call (single or batch) inside the library.",
            ("kind",),
        ),
        MetricSpec("library_version", "gauge", "Library version (bumped by every committed change)."),
    ]
}
