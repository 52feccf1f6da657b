"""Build the Grafana dashboard of the GPU autoscaler (dashboards/gpu-autoscaler.json) with grafana-foundation-sdk.

    python dashboards/build.py            # write dashboards/gpu-autoscaler.json
    python dashboards/build.py --check    # exit 1 when the committed JSON differs from a fresh build

The SDK must be exactly 0.0.21 (the ``test`` extra pins it): a plain ``pip install grafana-foundation-sdk`` resolves
to a build for Grafana 10.1 (the versions carry epochs), whose API and JSON differ.

Per-service and inference-pod panels read the recording rules of deploy/rules/gpu-autoscaler.rules.yml (leader-only,
label-normalised series): install the PrometheusRule with the dashboard.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

# The SDK warns, when its modules are imported, that it prefers its v2 schema. The classic JSON model is kept on
# purpose: Grafana 10 and 11 import it and file provisioning reads it, while v2 needs Grafana 12's new API.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Prefer using dashboardv2", DeprecationWarning)
    from grafana_foundation_sdk.builders import common as common_builders
    from grafana_foundation_sdk.builders.dashboard import (
        Dashboard,
        DashboardLink,
        DatasourceVariable,
        QueryVariable,
        Row,
        ThresholdsConfig,
    )
    from grafana_foundation_sdk.builders.prometheus import Dataquery
    from grafana_foundation_sdk.builders.stat import Panel as Stat
    from grafana_foundation_sdk.builders.statetimeline import Panel as StateTimeline
    from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models.dashboard import (
        DashboardCursorSync,
        DashboardLinkType,
        DataSourceRef,
        DynamicConfigValue,
        Threshold,
        ThresholdsMode,
        ValueMap,
        ValueMappingResult,
        VariableRefresh,
        VariableSort,
    )

SDK_VERSION = "0.0.21"
OUTPUT = Path(__file__).resolve().parent / "gpu-autoscaler.json"
UID = "gpu-autoscaler"
RUNBOOKS_URL = "https://github.com/example/gpu-autoscaler/blob/main/deploy/runbooks/README.md"

# Forecast accountability per service, from the leader-only, label-normalised recording rules of
# deploy/rules/gpu-autoscaler.rules.yml (group gpu-autoscaler.forecast): the raw gauges carry the service's labels as
# exported_namespace/exported_service under deploy/base's ServiceMonitor, and a former leader keeps exporting them.
FORECAST_ERROR_SERIES = "namespace_service:gpu_autoscaler_forecast_pinball_ratio:leader"  # error / seasonal naive
FORECAST_FALLBACK_SERIES = "namespace_service_reason:gpu_autoscaler_forecast_fallback:leader"  # 1 = reactive only
HEADROOM_SERIES = "namespace_service:gpu_autoscaler_headroom_target_ratio:leader"  # share of the spec's target
# share of the forecast quantile's excess over the median the floor provisions (calibrated excess)
EXCESS_SHARE_SERIES = "namespace_service:gpu_autoscaler_forecast_excess_share:leader"
# The newest successful tick of each installation (followers' zeros and replaced leaders handled by the rule).
LAST_SUCCESS = "namespace_job:gpu_autoscaler_last_successful_tick_timestamp_seconds:max"

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'job=~"$job"'
SVC = 'namespace=~"$namespace", service=~"$service"'
SERVICES = "namespace_service:gpu_autoscaler_current_replicas:leader"  # managed services, from the recording rules
# The burst spend alert threshold, recorded once in deploy/rules/gpu-autoscaler.rules.yml (GPUAutoscalerBurstSpendHigh
# reads the same series): the spend panel draws it instead of repeating the number here.
SPEND_THRESHOLD = "cluster:gpu_autoscaler_burst_spend_per_hour:alert_threshold"
CAPACITY_REASONS = (
    "preempt_for_inference|resume_training|burst_scale_up|burst_scale_down|burst_node_not_registered|burst_node_not_ready"
)

Builder = Timeseries | Stat | StateTimeline


def query(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False) -> Dataquery:
    q = Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DS)
    return q.instant() if instant else q.range()


def thresholds(*steps: tuple[float | None, str]) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps([Threshold(value=v, color=c) for v, c in steps])


def timeseries(
    title: str,
    unit: str,
    queries: Iterable[Dataquery],
    description: str,
    width: int,
    height: int = 8,
    stacked: bool = False,
    step: bool = False,
) -> Timeseries:
    panel = (
        Timeseries()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(height)
        .fill_opacity(20 if stacked else 0)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if step:
        panel = panel.line_interpolation(common.LineInterpolation.STEP_AFTER)
    for q in queries:
        panel = panel.with_target(q)
    return panel


def stat(title: str, unit: str, q: Dataquery, description: str, width: int = 6) -> Stat:
    # The SDK leaves reduceOptions.calcs empty; name the reducer so the panel shows the latest value everywhere.
    return (
        Stat()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(4)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .with_target(q)
    )


def controller_row() -> tuple[Row, list[Builder]]:
    leader_only = "on (job, instance) group_left () (gpu_autoscaler_leader == 1)"
    panels: list[Builder] = [
        stat(
            "Leaders",
            "none",
            query(f"sum by (namespace, job) (gpu_autoscaler_leader{{{JOB}}})", "{{namespace}}", instant=True),
            "Replicas that hold the leader Lease and act, per installation (namespace): a dry-run installation "
            "beside the acting one has a Lease of its own. Exactly 1 each is healthy (alerts: GPUAutoscalerNoLeader, "
            "GPUAutoscalerMultipleLeaders).",
        ).thresholds(thresholds((None, "red"), (1, "green"), (2, "red"))),
        stat(
            "Mode",
            "none",
            query(f"max by (namespace, job) (gpu_autoscaler_dry_run{{{JOB}}})", "{{namespace}}", instant=True),
            "Per installation (namespace): dry-run (recommend-only) controllers compute and report every plan but "
            "write nothing.",
        ).mappings(
            [
                ValueMap(
                    {
                        "0": ValueMappingResult(text="acting", color="green"),
                        "1": ValueMappingResult(text="dry-run", color="blue"),
                    }
                )
            ]
        ),
        stat(
            "Since last successful tick",
            "s",
            query(f"time() - min({LAST_SUCCESS}{{{JOB}}})", "age", instant=True),
            "Age of the newest tick that read everything it needed, for the installation that has waited longest "
            "(alert GPUAutoscalerNoSuccessfulTick at 10 min). Empty: no successful tick in the last hour.",
        )
        .thresholds(thresholds((None, "green"), (60, "orange"), (600, "red")))
        .no_value("none in 1 h"),
        stat(
            "Invalid policies",
            "none",
            query(
                f"max(gpu_autoscaler_invalid_policies{{{JOB}}} * {leader_only})",
                "invalid",
                instant=True,
            ),
            "GPUScalingPolicy objects the leader rejects; their services are not autoscaled.",
        ).thresholds(thresholds((None, "green"), (1, "orange"))),
        timeseries(
            "Ticks by result",
            "ops",
            [query(f"sum by (result) (rate(gpu_autoscaler_ticks_total{{{JOB}}}[$__rate_interval]))", "{{result}}")],
            "ok: read everything and decided; hold: a read failed, nothing applied; error: the tick raised; "
            "standby: a follower's tick.",
            width=6,
            stacked=True,
        ),
        timeseries(
            "Tick duration",
            "s",
            [
                query(
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(gpu_autoscaler_tick_duration_seconds_bucket{{{JOB}}}[$__rate_interval])))",
                    f"p{round(q * 100)}",
                    ref,
                )
                for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
            ],
            "Wall time of one tick (observe, read, decide, act). Ticks run every 15 s by default; alert "
            "GPUAutoscalerTickSlow at p99 > 10 s.",
            width=6,
        ),
        timeseries(
            "Leader by replica",
            "none",
            [query(f"max by (identity) (gpu_autoscaler_leader{{{JOB}}})", "{{identity}}")],
            "1 while a replica holds the Lease. A hand-over shows as one line dropping and another rising.",
            width=6,
            step=True,
        )
        .min(0)
        .max(1),
        timeseries(
            "Errors by component",
            "ops",
            [
                query(
                    f"sum by (component) (rate(gpu_autoscaler_errors_total{{{JOB}}}[$__rate_interval])) > 0",
                    "{{component}}",
                )
            ],
            "Reads (metrics_read, cluster_read, policy_read) make ticks hold; writes (cluster_write, node_pool) "
            "fail actions; the others run beside the tick. Empty when nothing fails.",
            width=6,
        ).no_value("no errors"),
    ]
    return Row("Controller"), panels


def decisions_row() -> tuple[Row, list[Builder]]:
    panels: list[Builder] = [
        timeseries(
            "Decisions by reason",
            "ops",
            [
                query(
                    f"sum by (reason) (rate(gpu_autoscaler_decisions_total{{{JOB}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            "One decision per service per tick, whether or not it changes anything; the reasons are the machine "
            "names of autoscaler/core/reasons.py (also in Events and logs).",
            width=12,
            stacked=True,
        ),
        timeseries(
            "Actions by kind, reason and result",
            "ops",
            [
                query(
                    "sum by (kind, reason, dry_run, result) "
                    f"(rate(gpu_autoscaler_actions_total{{{JOB}}}[$__rate_interval])) > 0",
                    "{{kind}} {{reason}}: {{result}} (dry run {{dry_run}})",
                )
            ],
            "applied; failed (retried next tick); blocked (a PodDisruptionBudget refused an eviction); held (not "
            "applied on stale data or during the takeover grace); skipped (the object changed since the tick read it: "
            "not written, the next tick decides); dry_run; not_leader. Kinds and results that did not happen are "
            "left out (the controller exports the ones the alerts count at 0 from its start).",
            width=12,
            stacked=True,
        ).no_value("no actions"),
    ]
    return Row("Decisions and actions"), panels


def services_row() -> tuple[Row, list[Builder]]:
    current = f"namespace_service:gpu_autoscaler_current_replicas:leader{{{SVC}}}"
    desired = f"namespace_service:gpu_autoscaler_desired_replicas:leader{{{SVC}}}"
    stale = f"namespace_service_reason:gpu_autoscaler_stale_services:leader{{{SVC}}}"
    panels: list[Builder] = [
        timeseries(
            "Replicas: current and desired",
            "short",
            [
                query(current, "{{namespace}}/{{service}} current", "A"),
                query(desired, "{{namespace}}/{{service}} desired", "B"),
            ],
            "Replicas on the scale subresource and the replicas the latest plan wants (equal when holding).",
            width=12,
            step=True,
        ),
        timeseries(
            "Desired minus current",
            "short",
            [query(f"{desired} - {current}", "{{namespace}}/{{service}}")],
            "Above 0: a scale-up not applied yet (in flight, failing, or recommend-only); below 0: a scale-down.",
            width=12,
            step=True,
        ),
        stat(
            "Stale services now",
            "none",
            query(f"count(max by (namespace, service) ({stale}))", "stale", instant=True),
            "Services whose metrics are missing or stale: the controller holds their replicas.",
        )
        .thresholds(thresholds((None, "green"), (1, "orange")))
        .no_value("0"),
        StateTimeline()
        .title("Stale services by reason")
        .description(
            "When each service's metrics were stale, and why (alert GPUAutoscalerServiceMetricsStale after 10 min)."
        )
        .datasource(DS)
        .unit("none")
        .span(18)
        .height(4)
        .with_target(query(stale, "{{namespace}}/{{service}} {{reason}}")),
    ]
    return Row("Services"), panels


def gpu_row() -> tuple[Row, list[Builder]]:
    util_steps = thresholds((None, "blue"), (30, "green"), (90, "red"))
    lines = common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
    panels: list[Builder] = [
        timeseries(
            "GPU utilization per node",
            "percent",
            [query("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}}")],
            "Mean DCGM_FI_DEV_GPU_UTIL of each node's GPUs; dashed lines at 30 % and 90 %.",
            width=12,
        )
        .min(0)
        .max(100)
        .thresholds(util_steps)
        .thresholds_style(lines),
        timeseries(
            "GPU memory used per node",
            "percentunit",
            [
                query(
                    "sum by (Hostname) (DCGM_FI_DEV_FB_USED) / "
                    "(sum by (Hostname) (DCGM_FI_DEV_FB_USED) + sum by (Hostname) (DCGM_FI_DEV_FB_FREE))",
                    "{{Hostname}}",
                )
            ],
            "Framebuffer used / (used + free) over each node's GPUs.",
            width=12,
        )
        .min(0)
        .max(1),
        timeseries(
            "GPU utilization per inference pod",
            "percent",
            [query(f"namespace_service_pod:dcgm_gpu_util:avg{{{SVC}}}", "{{namespace}}/{{pod}}")],
            "Pods of the Deployments that have a GPUScalingPolicy (alerts at > 90 % for 15 min, < 30 % for 1 h, "
            "per service).",
            width=8,
        )
        .min(0)
        .max(100)
        .thresholds(util_steps)
        .thresholds_style(lines),
        timeseries(
            "GPU memory used per inference pod",
            "bytes",
            [query(f"namespace_service_pod:dcgm_fb_used_bytes:sum{{{SVC}}}", "{{namespace}}/{{pod}}")],
            "Framebuffer used by each inference pod, summed over its GPUs.",
            width=8,
        ).min(0),
        timeseries(
            "Graphics engine active per inference pod",
            "percentunit",
            [query(f"namespace_service_pod:dcgm_gr_engine_active:avg{{{SVC}}}", "{{namespace}}/{{pod}}")],
            "DCGM profiling: share of time the graphics engine was busy; unlike GPU utilization it does not read "
            "100 % for a single small request.",
            width=8,
        )
        .min(0)
        .max(1),
    ]
    return Row("GPUs"), panels


def forecast_row() -> tuple[Row, list[Builder]]:
    panels: list[Builder] = [
        timeseries(
            "Forecast decisions",
            "ops",
            [
                query(
                    "sum by (reason) "
                    f'(rate(gpu_autoscaler_decisions_total{{{JOB}, reason=~"forecast_.*"}}[$__rate_interval]))',
                    "{{reason}}",
                )
            ],
            "Decisions the forecast made: the floor raised the replicas (forecast_floor) or held a scale-down "
            "(forecast_hold). An unusable forecast adds no line here (the decision carries a reactive reason): see "
            "\"Services on reactive fall-back\".",
            width=8,
            stacked=True,
        ),
        timeseries(
            "Forecast error by service (pinball / seasonal naive)",
            "none",
            [query(f"{FORECAST_ERROR_SERIES}{{{SVC}}}", "{{namespace}}/{{service}}")],
            "gpu_autoscaler_forecast_pinball_ratio (the leader's): recent pinball loss at the provisioned quantile "
            "divided by the seasonal-naive baseline's; above 1 the forecast is not trusted and the service scales "
            "reactively.",
            width=8,
        ),
        timeseries(
            "Services on reactive fall-back",
            "none",
            [query(f"sum by (reason) ({FORECAST_FALLBACK_SERIES}{{{SVC}}})", "{{reason}}")],
            "gpu_autoscaler_forecast_fallback (the leader's): forecasting services scaled reactively only, by reason: "
            "forecast_stale, forecast_unreliable (alert GPUAutoscalerForecastFallback after 30 min), forecast_missing "
            "(no usable forecast yet, or a metric other than the request rate without ratePerReplica: not alerted).",
            width=8,
            stacked=True,
        ),
        timeseries(
            "Earned headroom by service (share of the target)",
            "percentunit",
            [query(f"{HEADROOM_SERIES}{{{SVC}}}", "{{namespace}}/{{service}}")],
            "gpu_autoscaler_headroom_target_ratio (the leader's): the share of its spec's target an active "
            "forecasting service runs at. 1 once its forecast's quantile covered the demand; untrustedTargetRatio "
            "(0.75) while it learns or when the forecast degrades (more replicas, not fewer).",
            width=12,
        ),
        timeseries(
            "Forecast floor: share of its quantile's excess provisioned",
            "percentunit",
            [query(f"{EXCESS_SHARE_SERIES}{{{SVC}}}", "{{namespace}}/{{service}}")],
            "gpu_autoscaler_forecast_excess_share (the leader's): the floor provisions the median plus this share of "
            "the quantile's excess over it -- what the last accountability window's scores needed to cover the "
            "quantile (calibrated excess). 1: the quantile as fitted (it under-covered, too few scores, or off).",
            width=12,
        ),
        timeseries(
            "Forecast update job",
            "ops",
            [
                query(
                    f"sum by (result) (rate(gpu_autoscaler_forecast_updates_total{{{JOB}}}[$__rate_interval]))",
                    "{{result}}",
                )
            ],
            "Per-series outcomes of the job that re-conditions the latest fits on new history between refits.",
            width=12,
            stacked=True,
        ),
    ]
    return Row("Forecast"), panels


def capacity_row() -> tuple[Row, list[Builder]]:
    """Capacity arbitration (capacity.enabled): shortfalls, preemptions and resumes, lost training, burst nodes and
    spend. The controller-wide gauges come from the leader-only recording rules; per-hour rates are over 30 minutes,
    the window of GPUAutoscalerTrainingThrash."""
    per_hour = "[30m])) * 3600"
    dashed = DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})
    panels: list[Builder] = [
        timeseries(
            "Capacity shortfall",
            "short",
            [
                query(
                    f"max by (namespace, job) (namespace_job:gpu_autoscaler_capacity_shortfall_gpus:leader{{{JOB}}})",
                    "{{namespace}}/{{job}}",
                )
            ],
            "GPUs inference wanted at the latest tick that neither free GPUs nor booting burst nodes had, before "
            "that tick's preemptions and burst scale-ups. Above 0 for 15 min (acting installations): alert "
            "GPUAutoscalerCapacityShortfall. A dry-run installation shows what it would ask for.",
            width=8,
            step=True,
        )
        .min(0)
        .thresholds(thresholds((None, "green"), (1, "red"))),
        timeseries(
            "Preemptions, resumes and burst scaling (applied, per hour)",
            "short",
            [
                query(
                    "sum by (kind, reason) (rate(gpu_autoscaler_actions_total"
                    f'{{{JOB}, result="applied", reason=~"{CAPACITY_REASONS}"}}{per_hour}',
                    "{{reason}} ({{kind}})",
                )
            ],
            "Applied capacity actions per hour, over 30 min: preempt_for_inference (SuspendWorkload per gang, "
            "EvictPod per pod), resume_training (ResumeWorkload), burst_scale_up / burst_scale_down (ScaleNodePool, "
            "one action per pool resize), burst_node_not_registered / burst_node_not_ready (ScaleNodePool: a burst "
            "node that never registered, or never became ready, given back).",
            width=8,
        ).min(0),
        timeseries(
            "Training gangs stopped per hour, by how",
            "short",
            [
                query(
                    f"sum by (how) (rate(gpu_autoscaler_training_gangs_stopped_total{{{JOB}}}{per_hour}",
                    "{{how}}",
                )
            ],
            "Gangs the controller stopped per hour, over 30 min: suspend (through the workload's spec) or evict "
            "(every pod). Sustained above 6/h, or above 3/h with as many resumes: alert GPUAutoscalerTrainingThrash.",
            width=8,
            stacked=True,
        ).min(0),
        timeseries(
            "Training GPU-hours lost per hour",
            "short",
            [query(f"sum(rate(gpu_autoscaler_training_gpu_hours_lost_total{{{JOB}}}{per_hour}", "GPU-hours lost")],
            "Training work the controller's preemptions threw away, GPU-hours per hour over 30 min: GPUs x time "
            "since each stopped gang's last checkpoint (else its start).",
            width=8,
        ).min(0),
        timeseries(
            "Burst nodes by pool",
            "short",
            [query(f"sum by (pool) (namespace_job_pool:gpu_autoscaler_burst_nodes:leader{{{JOB}}})", "{{pool}}")],
            "Nodes of each burst pool at the leader's latest tick, booting ones included.",
            width=8,
            stacked=True,
            step=True,
        ).min(0),
        timeseries(
            "Burst spend per hour",
            "short",
            [
                query(
                    f"max by (namespace, job) (namespace_job:gpu_autoscaler_burst_spend_per_hour:leader{{{JOB}}})",
                    "{{namespace}}/{{job}}",
                    "A",
                ),
                query(f"max({SPEND_THRESHOLD})", "alert threshold", "B"),
            ],
            "What the burst pools' nodes cost per hour, in the pools' currency (price_per_gpu_hour). Dashed: the "
            f"alert threshold ({SPEND_THRESHOLD}); above it for 2 h: alert GPUAutoscalerBurstSpendHigh.",
            width=8,
            step=True,
        )
        .min(0)
        .override_by_query("B", [dashed]),
    ]
    return Row("Capacity arbitration"), panels


def rebalance_row() -> tuple[Row, list[Builder]]:
    """The rebalancer (rebalance.enabled): GPUs stranded by fragmentation, moves by result, passes by result. Only
    the leader runs passes; a former leader keeps its last gauge values, so the gauges are joined on the leader."""
    per_hour = "[30m])) * 3600"
    leader = "* on (job, instance) group_left () (gpu_autoscaler_leader == 1)"
    panels: list[Builder] = [
        timeseries(
            "GPUs stranded by fragmentation",
            "short",
            [
                query(f"max by (namespace, job) (gpu_autoscaler_stranded_gpus{{{JOB}}} {leader})", "stranded", "A"),
                query(
                    f"max by (namespace, job) (gpu_autoscaler_rebalance_moves_last_hour{{{JOB}}} {leader})",
                    "pods moved over the last hour",
                    "B",
                ),
            ],
            "Free GPUs on ready nodes where none of the waiting GPU pods fits (pending, or training this controller "
            "suspended), at the leader's latest rebalance pass; and the pods it evicted over the last hour (bounded "
            "by rebalance.max_moves_per_hour).",
            width=8,
            step=True,
        ).min(0),
        timeseries(
            "Rebalance moves per hour, by result",
            "short",
            [
                query(
                    "sum by (result) (rate(gpu_autoscaler_actions_total"
                    f'{{{JOB}, kind="EvictPod", reason="rebalance"}}{per_hour}',
                    "{{result}}",
                )
            ],
            "Pods the rebalancer evicted (applied), would evict (dry_run), or could not (blocked by a "
            "PodDisruptionBudget, held by the guard, failed), per hour over 30 min. Blocked for long: alert "
            "GPUAutoscalerEvictionsBlocked.",
            width=8,
            stacked=True,
        ).min(0),
        timeseries(
            "Rebalance passes per hour, by result",
            "short",
            [query(f"sum by (result) (rate(gpu_autoscaler_rebalance_passes_total{{{JOB}}}{per_hour}", "{{result}}")],
            "ok: planned (moves applied or none needed); held: the latest tick did not read everything, or the "
            "cluster could not be read, so nothing moved; error: the pass failed (see errors_total{component="
            '"rebalance"}).',
            width=8,
            stacked=True,
        ).min(0),
    ]
    return Row("Rebalancing"), panels


def query_variable(name: str, label: str, values: str) -> QueryVariable:
    # "All" is sent as .* so that every panel can use =~"$name" whatever is selected.
    return (
        QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(values)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def build() -> dict[str, Any]:
    """The dashboard as a JSON-ready dict (panel ids are assigned here, in layout order)."""
    dashboard = (
        Dashboard("GPU Autoscaler")
        .uid(UID)
        .description(
            "The GPU autoscaler controller, its decisions and actions, its services and their GPUs, and its capacity "
            "arbitration (training preempted, burst nodes)."
        )
        .tags(["gpu", "autoscaler", "kubernetes"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .link(DashboardLink("Runbooks").type(DashboardLinkType.LINK).url(RUNBOOKS_URL).target_blank(True))
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(query_variable("job", "Controller job", "label_values(gpu_autoscaler_ticks_total, job)"))
        .with_variable(query_variable("namespace", "Namespace", f"label_values({SERVICES}, namespace)"))
        .with_variable(
            query_variable("service", "Service", f'label_values({SERVICES}{{namespace=~"$namespace"}}, service)')
        )
    )
    next_id = 1
    # New rows go last: panel ids follow the layout, and links to existing panels (viewPanel=<id>) must keep working.
    rows = (
        controller_row(), decisions_row(), services_row(), gpu_row(), forecast_row(), capacity_row(), rebalance_row()
    )
    for row, panels in rows:
        dashboard = dashboard.with_row(row.id(next_id))
        next_id += 1
        for panel in panels:
            dashboard = dashboard.with_panel(panel.id(next_id))
            next_id += 1
    result: dict[str, Any] = json.loads(json.dumps(dashboard.build(), cls=JSONEncoder))
    return result


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def check_sdk_version() -> None:
    installed = metadata.version("grafana-foundation-sdk")
    if installed.removeprefix("v") != SDK_VERSION:  # the 0.0.x wheels report their version as "v0.0.21"
        raise SystemExit(
            f"grafana-foundation-sdk {installed} is installed, this generator needs {SDK_VERSION}: "
            f"pip install 'grafana-foundation-sdk=={SDK_VERSION}'"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is out of date")
    args = parser.parse_args(argv)
    check_sdk_version()
    wanted = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != wanted:
            print(f"{OUTPUT} is out of date: run python dashboards/build.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(wanted)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
