"""Grafana dashboards as data: one short list of panels per dashboard, rendered to the JSON that
Grafana provisioning and the kube-prometheus-stack sidecar load (monitoring/grafana/*.json).

Why generate: hand-edited dashboard JSON is thousands of lines where a wrong metric name hides
easily. Here each panel is a title, its PromQL and a unit; every selector goes through `m()`,
which adds the run filter, and the panel description is the catalogue's help text, so the
dashboards explain themselves. A catalogue metric no curated panel shows yet gets a default
panel on the dashboard of its prefix, so a new metric is visible as soon as it is defined (and
the JSON is regenerated); curate it into a better panel later. tests/monitoring checks that the JSON on disk is what this module
renders, that every PromQL names only catalogue metrics, and that every catalogue metric is shown.

Series carry the labels Ray adds (WorkerId, NodeAddress, ...) when they come from Ray workers,
so every expression aggregates with `sum by`/`max by` the labels the panel is about.

Regenerate after editing: `python -m monitoring.dashboards`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from monitoring.catalogue import CATALOGUE, PREFIX

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
RATE = "[$__rate_interval]"


def m(name: str, **matchers: str) -> str:
    """A selector for catalogue metric `name` (a histogram's _bucket/_sum/_count allowed), filtered by run."""
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    if name not in CATALOGUE and base not in CATALOGUE:
        raise KeyError(f"dashboard uses '{name}', which monitoring/catalogue.py does not define")
    labels = ['run=~"$run"'] + [
        f'{key}=~"{value[1:]}"' if value.startswith("~") else f'{key}="{value}"' for key, value in matchers.items()
    ]  # "~a|b" means a regex match
    return f"{PREFIX}{name}{{{','.join(labels)}}}"


def quantiles(name: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.95)) -> list[tuple[str, str]]:
    """histogram_quantile targets of a catalogue histogram, optionally split by one label."""
    group = f"le, {by}" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    return [
        (f"histogram_quantile({q}, sum by ({group}) (rate({m(name + '_bucket')}{RATE})))", f"{legend}p{int(q * 100)}")
        for q in qs
    ]


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend format)
    unit: str = "short"  # Grafana unit id: short, s, percentunit, ops, Bps, ...
    kind: str = "timeseries"  # or "stat" for single current values
    width: int = 12  # of 24 grid columns
    description: str = ""  # for panels on metrics outside the catalogue (the catalogue's help otherwise)
    # When only some runs have data here, the reason (EDGE runs only, after a fault, ...): Grafana
    # shows it instead of "No data", and tests/monitoring/test_dashboard_panels.py lets the panel be
    # empty in its run. Every other panel must show data of a plain local run.
    conditional: str = ""
    axis_label: str = ""  # the y axis' label where the unit does not name it (steps, entries, ...)


@dataclass
class Dashboard:
    uid: str
    title: str
    panels: list[Panel] = field(default_factory=list)


def _rate_by(name: str, by: str, **matchers: str) -> str:
    return f"sum by ({by}) (rate({m(name, **matchers)}{RATE}))"


def share(part: str, whole: str) -> str:
    """part / whole, 0 where the part has no series: a labelled counter exists only once it counted,
    so a run without a single success would show no success rate at all, not 0%."""
    return f"({part} or 0 * {whole}) / {whole}"


# Why a panel may show no data in a healthy run (Panel.conditional).
EDGE_ONLY = "EDGE runs only (run.edge: true)"
AUTOSCALE_ONLY = "autoscaling runs only (actors.autoscale set)"
REDIS_EXPORTER_ONLY = "with prometheus-redis-exporter beside Redis only (the KubeRay deploy)"


def after_fault(what: str) -> str:
    return f"after a fault only: {what}"


OVERVIEW = Dashboard(
    "slea-overview",
    "SLEA-RL / Run overview",
    [
        Panel(
            "Success rate by task type",
            [
                (
                    share(
                        _rate_by("actor_episodes_total", "task_type", outcome="success"),
                        _rate_by("actor_episodes_total", "task_type"),
                    ),
                    "{{task_type}}",
                )
            ],
            unit="percentunit",
        ),
        Panel(
            "Episode length (steps)",
            quantiles("actor_episode_steps", "env")
            + [
                (
                    f"sum by (env) (rate({m('actor_episode_steps_sum')}{RATE})) / sum by (env) (rate({m('actor_episode_steps_count')}{RATE}))",
                    "{{env}} mean",
                )
            ],
            axis_label="steps",
        ),
        Panel(
            "Policy version of the actors",
            [
                (f"min({m('actor_policy_version')})", "slowest actor"),
                (f"max({m('actor_policy_version')})", "newest actor"),
            ],
            kind="stat",
        ),
        Panel(
            "Stream lag by consumer group",
            [(f"max by (group) ({m('stream_lag')})", "{{group}}")],
            axis_label="entries not yet read",
        ),
        Panel("Throughput: env steps/s", [(f"sum({_rate_by('actor_env_steps_total', 'env')})", "steps/s")], unit="ops"),
        Panel(
            "Throughput: generated tokens/s",
            [(f"sum(rate({m('actor_generated_tokens_total')}{RATE}))", "tokens/s")],
            unit="ops",
        ),
        Panel(
            "Component restarts (last hour)",
            [(f"sum by (component) (increase({m('run_component_restarts_total')}[1h]))", "{{component}}")],
            axis_label="restarts",
            conditional=after_fault("a component restarted"),
        ),
    ],
)

ACTORS = Dashboard(
    "slea-actors",
    "SLEA-RL / Actors",
    [
        Panel("Env steps/s by env", [(_rate_by("actor_env_steps_total", "env"), "{{env}}")], unit="ops"),
        Panel(
            "Generated tokens/s by worker",
            [(_rate_by("actor_generated_tokens_total", "worker"), "worker {{worker}}")],
            unit="ops",
        ),
        Panel("Episodes/s by outcome", [(_rate_by("actor_episodes_total", "outcome"), "{{outcome}}")], unit="ops"),
        Panel(
            "Engine time by phase and worker",
            [(_rate_by("actor_engine_seconds_total", "worker, phase"), "worker {{worker}} {{phase}}")],
            axis_label="engine seconds per second",
            description="Prefill (reading prompts) and decode (writing responses), summed over the requests in "
            "flight: above 1 while requests share a batch.",
        ),
        Panel(
            "Prefix-cache hit rate by worker",
            [
                (
                    share(
                        _rate_by("actor_cached_prompt_tokens_total", "worker"),
                        _rate_by("actor_prompt_tokens_total", "worker"),
                    ),
                    "worker {{worker}}",
                )
            ],
            unit="percentunit",
            description="Share of prompt tokens whose KV vLLM's prefix cache already held (not prefilled again); "
            "0 with the transformers engine, which has no prefix cache. actors.prompt_layout: prefix_stable keeps more "
            "of each prompt's front stable (on CPU's 128-token blocks it measured 49% -> 51%).",
        ),
        Panel(
            "Invalid actions per env step",
            [
                (
                    share(_rate_by("actor_invalid_actions_total", "env"), _rate_by("actor_env_steps_total", "env")),
                    "{{env}}",
                )
            ],
            unit="percentunit",
        ),
        Panel("Retrieval latency (actor side)", quantiles("actor_retrieval_seconds", qs=(0.5, 0.95, 0.99)), unit="s"),
        Panel(
            "Retrievals/s by outcome (actor side)",
            [(_rate_by("actor_retrieval_requests_total", "outcome"), "{{outcome}}")],
            unit="ops",
        ),
        Panel(
            "Version lag by worker",
            [(f"max by (worker) ({m('actor_version_lag')})", "worker {{worker}}")],
            axis_label="versions behind the learner",
        ),
        Panel(
            "Policy version by worker",
            [(f"max by (worker) ({m('actor_policy_version')})", "worker {{worker}}")],
            axis_label="policy version",
        ),
        Panel(
            "Throttled fraction by reason",
            [(_rate_by("actor_throttled_seconds_total", "reason"), "{{reason}}")],
            unit="percentunit",
            conditional="while actors hold new groups back only (the learner behind, stale weights, a full Redis)",
        ),
        Panel(
            "Weight updates/min by worker",
            [(f"60 * {_rate_by('actor_weight_updates_total', 'worker')}", "worker {{worker}}")],
            axis_label="updates per minute",
        ),
        Panel(
            "Steps lost (last hour)",
            [
                (
                    f"sum by (worker, reason) (increase({m('actor_steps_lost_total')}[1h]))",
                    "worker {{worker}} {{reason}}",
                )
            ],
            axis_label="steps",
            conditional=after_fault("Redis refused steps or was away too long"),
        ),
        Panel(
            "Actor workers: desired and alive",
            [
                (f"max({m('actor_pool_desired_workers')})", "desired"),
                (f"max({m('actor_pool_alive_workers')})", "alive"),
            ],
            axis_label="workers",
        ),
        Panel(
            "Autoscale decisions/h by kind",
            [(f"3600 * {_rate_by('actor_pool_autoscale_decisions_total', 'kind')}", "{{kind}}")],
            axis_label="decisions per hour",
            conditional=AUTOSCALE_ONLY,
        ),
    ],
)

LIBRARY = Dashboard(
    "slea-library",
    "SLEA-RL / Experience library",
    [
        Panel(
            "Experiences by zone and level",
            [(f"max by (zone, level) ({m('library_experiences')})", "{{zone}}/{{level}}")],
            axis_label="experiences",
        ),
        Panel("Library version", [(f"max({m('library_version')})", "version")], kind="stat"),
        Panel(
            "Admission events/s",
            [(_rate_by("library_admission_events_total", "zone, event"), "{{zone}} {{event}}")],
            unit="ops",
        ),
        Panel(
            "Rejections/s by reason",
            [(_rate_by("library_rejections_total", "zone, reason"), "{{zone}} {{reason}}")],
            unit="ops",
        ),
        Panel(
            "Episodes processed/s by outcome",
            [(_rate_by("library_episodes_total", "outcome"), "{{outcome}}")],
            unit="ops",
        ),
        Panel(
            "Extractions/s and failures/s",
            [
                (_rate_by("library_extraction_calls_total", "backend, prompt"), "{{backend}} prompt {{prompt}}"),
                (_rate_by("library_extraction_failures_total", "backend, reason"), "{{backend}} failed: {{reason}}"),
            ],
            unit="ops",
        ),
        Panel("Extraction time", quantiles("library_extraction_seconds", "backend"), unit="s"),
        Panel(
            "Clusters by task type",
            [(f"max by (task_type) ({m('library_clusters')})", "{{task_type}}")],
            axis_label="clusters",
        ),
        Panel(
            "Cluster evictions/s",
            [(_rate_by("library_cluster_evictions_total", "task_type"), "{{task_type}}")],
            unit="ops",
            conditional="at the cluster bound only (library.max_clusters per task type)",
        ),
        Panel(
            "Retrieval hit rate (items from the observation's cluster)",
            [
                (
                    share(
                        f"sum(rate({m('library_retrievals_total', source='~cluster|mixed')}{RATE}))",
                        f"sum(rate({m('library_retrievals_total')}{RATE}))",
                    ),
                    "hit rate",
                )
            ],
            unit="percentunit",
        ),
        Panel(
            "Retrievals/s by source",
            [(_rate_by("library_retrievals_total", "mode, source"), "{{mode}} {{source}}")],
            unit="ops",
        ),
        Panel("Retrieval latency (library side)", quantiles("library_retrieval_seconds", "kind"), unit="s"),
    ],
)

STREAM = Dashboard(
    "slea-stream",
    "SLEA-RL / Step stream",
    [
        Panel("Produced records/s", [(_rate_by("stream_records_produced_total", "stream"), "{{stream}}")], unit="ops"),
        Panel("Produced bytes/s", [(_rate_by("stream_bytes_produced_total", "stream"), "{{stream}}")], unit="Bps"),
        Panel(
            "Consumed and acked/s by group",
            [
                (_rate_by("stream_records_consumed_total", "group"), "{{group}} consumed"),
                (_rate_by("stream_records_acked_total", "group"), "{{group}} acked"),
            ],
            unit="ops",
        ),
        Panel(
            "Lag by group (not yet delivered)",
            [(f"max by (group) ({m('stream_lag')})", "{{group}}")],
            axis_label="entries",
        ),
        Panel(
            "Pending by group (delivered, not acked)",
            [(f"max by (group) ({m('stream_pending')})", "{{group}}")],
            axis_label="entries",
        ),
        Panel("Stream length", [(f"max by (stream) ({m('stream_length')})", "{{stream}}")], axis_label="entries"),
        Panel(
            "Dead-lettered (last hour)",
            [(f"sum by (group, reason) (increase({m('stream_dead_lettered_total')}[1h]))", "{{group}} {{reason}}")],
            axis_label="entries",
            conditional=after_fault("entries that kept failing or did not decode"),
        ),
        Panel(
            "Claimed from idle consumers/s",
            [(_rate_by("stream_records_claimed_total", "group"), "{{group}}")],
            unit="ops",
            conditional=after_fault("a consumer stopped holding entries (a restart)"),
        ),
        Panel(
            "Reconnects (last hour)",
            [(f"sum by (role) (increase({m('stream_reconnects_total')}[1h]))", "{{role}}")],
            axis_label="reconnects",
            conditional=after_fault("Redis went away"),
        ),
        Panel("Trimmed entries/s", [(_rate_by("stream_trimmed_total", "stream"), "{{stream}}")], unit="ops"),
        # Redis itself, from prometheus-redis-exporter: not per run (one Redis holds every run's keys)
        Panel(
            "Redis memory used of maxmemory",
            [
                (
                    "max by (instance) (redis_memory_used_bytes) / max by (instance) (redis_memory_max_bytes > 0)",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
            description="redis_memory_used_bytes / redis_memory_max_bytes (prometheus-redis-exporter). "
            "At 1 Redis refuses writes (maxmemory-policy noeviction) and producers stop with a backpressure error.",
            conditional=REDIS_EXPORTER_ONLY,
        ),
    ],
)

LEARNER = Dashboard("slea-learner", "SLEA-RL / Learner", [])

DASHBOARDS = [OVERVIEW, ACTORS, LEARNER, LIBRARY, STREAM]
HOME = {"stream_": STREAM, "actor_": ACTORS, "learner_": LEARNER, "library_": LIBRARY}  # by name prefix


def _shown(dashboards: list[Dashboard]) -> set[str]:
    names = re.findall(
        rf"\b{PREFIX}([a-zA-Z0-9_]+)",
        " ".join(expr for d in dashboards for panel in d.panels for expr, _legend in panel.targets),
    )
    return {re.sub(r"_(bucket|sum|count)$", "", name) if name not in CATALOGUE else name for name in names}


# Catalogue metrics shown by default panels that only some runs fill, with why.
DEFAULT_CONDITIONS = {
    "learner_edge_kl": EDGE_ONLY,
    "learner_edge_token_fraction": EDGE_ONLY,
    "learner_edge_gated_fraction": EDGE_ONLY,
    "learner_edge_gain": EDGE_ONLY,
    "stream_backpressure_total": after_fault("Redis at maxmemory refused steps"),
}


def default_panel(name: str) -> Panel:
    """A plain panel for a catalogue metric no curated panel shows yet, so a metric is on a
    dashboard the moment it is defined: counters as rates, gauges as values, histograms as p50/p95."""
    spec = CATALOGUE[name]
    by = ", ".join(spec.labels)
    legend = " ".join(f"{{{{{label}}}}}" for label in spec.labels) or name
    title = name.replace("_", " ").capitalize()
    conditional = DEFAULT_CONDITIONS.get(name, "")
    if spec.kind == "counter":
        expr = f"sum by ({by}) (rate({m(name)}{RATE}))" if by else f"sum(rate({m(name)}{RATE}))"
        return Panel(f"{title.removesuffix(' total')} /s", [(expr, legend)], unit="ops", conditional=conditional)
    if spec.kind == "gauge":
        unit = "percentunit" if name.endswith("_fraction") else "short"
        axis = "per second" if name.endswith("_per_second") else ""
        expr = f"max by ({by}) ({m(name)})" if by else f"max({m(name)})"
        return Panel(title, [(expr, legend)], unit=unit, axis_label=axis, conditional=conditional)
    return Panel(title, quantiles(name, spec.labels[0] if spec.labels else ""), conditional=conditional)


def completed() -> list[Dashboard]:
    """The curated dashboards plus a default panel for every catalogue metric none of them shows,
    on the dashboard of its name's prefix (the overview for any other)."""
    dashboards = [Dashboard(d.uid, d.title, list(d.panels)) for d in DASHBOARDS]
    by_uid = {d.uid: d for d in dashboards}
    shown = _shown(dashboards)
    for name in CATALOGUE:
        if name not in shown:
            home = next((d for prefix, d in HOME.items() if name.startswith(prefix)), OVERVIEW)
            by_uid[home.uid].panels.append(default_panel(name))
    return dashboards


def _help_of(exprs: list[str]) -> str:
    """Panel description: the catalogue help of every metric the panel reads."""
    names = dict.fromkeys(re.findall(rf"\b{PREFIX}([a-zA-Z0-9_]+)", " ".join(exprs)))
    specs = [CATALOGUE.get(name) or CATALOGUE[re.sub(r"_(bucket|sum|count)$", "", name)] for name in names]
    return " ".join(f"{PREFIX}{spec.name}: {spec.help}" for spec in dict.fromkeys(specs))


def _variables() -> list[dict]:
    datasource = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    }
    run = {
        "name": "run",
        "label": "Run",
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": f"label_values({PREFIX}stream_records_produced_total, run)", "refId": "run"},
        "definition": f"label_values({PREFIX}stream_records_produced_total, run)",
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "refresh": 2,
        "sort": 1,
        "current": {"text": "All", "value": "$__all"},
        "hide": 0,
    }
    return [datasource, run]


def render(dashboard: Dashboard) -> dict:
    """The Grafana dashboard JSON model (schemaVersion 39: Grafana 10/11)."""
    panels, x, y = [], 0, 0
    for number, panel in enumerate(dashboard.panels, start=1):
        height = 5 if panel.kind == "stat" else 8
        if x + panel.width > 24:
            x, y = 0, y + 8
        exprs = [expr for expr, _legend in panel.targets]
        description = panel.description or _help_of(exprs)
        defaults: dict = {"unit": panel.unit}
        if panel.conditional:
            description += f" Conditional: {panel.conditional}."
            defaults["noValue"] = panel.conditional
        if panel.axis_label:
            defaults["custom"] = {"axisLabel": panel.axis_label}
        panels.append(
            {
                "id": number,
                "type": panel.kind,
                "title": panel.title,
                "description": description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
                "fieldConfig": {"defaults": defaults, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
                if panel.kind == "timeseries"
                else {},
                "targets": [
                    {
                        "refId": chr(ord("A") + index),
                        "expr": expr,
                        "legendFormat": legend,
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    }
                    for index, (expr, legend) in enumerate(panel.targets)
                ],
            }
        )
        x += panel.width
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "tags": ["slea-rl"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "timezone": "browser",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": _variables()},
        "links": [{"title": "SLEA-RL", "type": "dashboards", "tags": ["slea-rl"], "asDropdown": True}],
        "panels": panels,
    }


def rendered_files() -> dict[Path, str]:
    """Path -> file text of every dashboard, as written to monitoring/grafana/."""
    return {GRAFANA_DIR / f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in completed()}


def main() -> None:
    for path, text in rendered_files().items():
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
