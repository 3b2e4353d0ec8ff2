"""One learner step's metrics dict -> the Prometheus metrics monitoring/ defines."""

from __future__ import annotations

from monitoring.metrics import metric

_GAUGES = {
    "policy_version": "learner_policy_version",
    "loss": "learner_loss",
    "pg_loss": "learner_pg_loss",
    "kl": "learner_kl",
    "entropy": "learner_entropy",
    "clip_fraction": "learner_clip_fraction",
    "approx_kl": "learner_approx_kl",
    "behav_masked_fraction": "learner_behaviour_masked_fraction",
    "behav_abs_log_diff": "learner_behaviour_logprob_gap",
    "optimizer_steps": "learner_optimizer_steps_per_batch",
    "grad_norm": "learner_grad_norm",
    "advantage_mean": "learner_advantage_mean",
    "advantage_std": "learner_advantage_std",
    "tokens_per_s": "learner_tokens_per_second",
}
_EDGE_GAUGES = {  # present only when EDGE distillation is on
    "edge_kl": "learner_edge_kl",
    "edge_token_fraction": "learner_edge_token_fraction",
    "edge_gated_fraction": "learner_edge_gated_fraction",
    "edge_gain_mean": "learner_edge_gain",
}
_DROPPED = {
    "groups_dropped_incomplete": "timeout",
    "groups_dropped_abandoned": "abandoned",
    "groups_dropped_stale": "stale",
    "groups_dropped_lost": "lost",
}


def export_step_metrics(metrics: dict) -> None:
    metric("learner_steps_total").inc()
    metric("learner_groups_trained_total").inc(metrics["groups_trained"])
    for key, name in _GAUGES.items():
        metric(name).set(metrics[key])
    for key, name in _EDGE_GAUGES.items():
        if key in metrics:
            metric(name).set(metrics[key])
    metric("learner_advantage_abs").labels(part="episode").set(metrics["episode_advantage_abs_mean"])
    metric("learner_advantage_abs").labels(part="step").set(metrics["step_advantage_abs_mean"])
    for key, reason in _DROPPED.items():
        metric("learner_groups_dropped").labels(reason=reason).set(metrics[key])
    for staleness, rows in metrics["staleness_histogram"].items():
        for _ in range(rows):
            metric("learner_step_staleness").observe(staleness)
    for size, groups in metrics["anchor_group_sizes"].items():
        for _ in range(groups):
            metric("learner_anchor_group_size").observe(size)
