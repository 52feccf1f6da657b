"""A real Prometheus for the dashboard and rule tests: synthetic history of the controller's and dcgm-exporter's
metrics is backfilled with promtool, then Prometheus starts on a free 127.0.0.1 port with the project's rule file.

Debian's Prometheus is 2.42: OpenMetrics timestamps are seconds, each series ascends, each family's lines stay
together, no blank line, ``# EOF`` at the end. Retention is measured from the newest block, hence ``100y``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.prometheus.promserver import PrometheusServer, backfill

__all__ = ["Prometheus", "backfill"]

HISTORY_S = 30 * 60
STEP_S = 15
JOB = {"job": "gpu-autoscaler", "namespace": "gpu-autoscaler"}
LEADER = {**JOB, "instance": "10.0.0.1:8080"}
FOLLOWER = {**JOB, "instance": "10.0.0.2:8080"}
# Pods of the two managed services, one training pod, and a GPU without a pod.
CHAT_PODS = ("chat-7d9f8b6c5d-x2x4z", "chat-7d9f8b6c5d-q8w2n")
EMBED_POD = "embed-6c5d4b8f7-bcdfg"
TRAINING_POD = "llama-ft-8x7z2"


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    value: Callable[[float], float]  # seconds since the start of the history -> value


def counter(per_s: float) -> Callable[[float], float]:
    return lambda t: round(per_s * t, 6)


def const(v: float) -> Callable[[float], float]:
    return lambda t: v


def history(start: float) -> list[Series]:
    """A healthy-looking cluster with a few things wrong (see ``EXPECTED_ACTIVE_ALERTS``)."""
    s: list[Series] = [
        Series("up", LEADER, const(1)),
        Series("up", FOLLOWER, const(1)),
        Series("gpu_autoscaler_leader", {**LEADER, "identity": "pod-a"}, const(1)),
        Series("gpu_autoscaler_leader", {**FOLLOWER, "identity": "pod-b"}, const(0)),
        Series("gpu_autoscaler_dry_run", LEADER, const(0)),
        Series("gpu_autoscaler_dry_run", FOLLOWER, const(0)),
        Series("gpu_autoscaler_last_successful_tick_timestamp_seconds", LEADER, lambda t: start + t),
        Series("gpu_autoscaler_last_successful_tick_timestamp_seconds", FOLLOWER, const(0)),
        Series("gpu_autoscaler_invalid_policies", LEADER, const(1)),
        Series("gpu_autoscaler_invalid_policies", FOLLOWER, const(0)),
        Series("gpu_autoscaler_ticks_total", {**LEADER, "result": "ok"}, counter(1 / 15)),
        Series("gpu_autoscaler_ticks_total", {**LEADER, "result": "hold"}, const(0)),
        Series("gpu_autoscaler_ticks_total", {**FOLLOWER, "result": "standby"}, counter(1 / 15)),
        Series("gpu_autoscaler_tick_duration_seconds_sum", LEADER, counter(0.2 / 15)),
        Series("gpu_autoscaler_tick_duration_seconds_count", LEADER, counter(1 / 15)),
        Series("gpu_autoscaler_errors_total", {**LEADER, "component": "metrics_read"}, counter(0.01)),
        Series("gpu_autoscaler_errors_total", {**LEADER, "component": "refit"}, const(0)),
        # chat: honorLabels style; embed: the operator renamed its labels (exported_*)
        Series("gpu_autoscaler_current_replicas", {**LEADER, "service": "chat", "namespace": "ml"}, const(2)),
        Series("gpu_autoscaler_desired_replicas", {**LEADER, "service": "chat", "namespace": "ml"}, const(3)),
        Series(
            "gpu_autoscaler_current_replicas",
            {**LEADER, "service": "gpu-autoscaler", "exported_namespace": "ml", "exported_service": "embed"},
            const(4),
        ),
        Series(
            "gpu_autoscaler_desired_replicas",
            {**LEADER, "service": "gpu-autoscaler", "exported_namespace": "ml", "exported_service": "embed"},
            const(4),
        ),
        Series(
            "gpu_autoscaler_stale_services",
            {
                **LEADER,
                "service": "gpu-autoscaler",
                "exported_namespace": "ml",
                "exported_service": "embed",
                "reason": "no_data",
            },
            const(1),
        ),
        # the follower's leftover snapshot from when it led: must be ignored
        Series("gpu_autoscaler_current_replicas", {**FOLLOWER, "service": "chat", "namespace": "ml"}, const(9)),
        Series(
            "kube_node_status_capacity", {"node": "node1", "resource": "nvidia_com_gpu", "unit": "integer"}, const(8)
        ),
        Series(
            "kube_node_status_capacity", {"node": "node2", "resource": "nvidia_com_gpu", "unit": "integer"}, const(8)
        ),
        Series(
            "kube_node_status_capacity", {"node": "node3", "resource": "nvidia_com_gpu", "unit": "integer"}, const(8)
        ),
    ]
    # Forecast accountability as the controller exports it (telemetry.py): chat's forecast is trusted, embed's is not.
    s.append(Series("gpu_autoscaler_forecast_pinball_ratio", {**LEADER, "service": "chat", "namespace": "ml"},
                    const(0.62)))
    s.append(Series("gpu_autoscaler_forecast_pinball_ratio", {**LEADER, "service": "embed", "namespace": "ml"},
                    const(1.4)))
    s.append(Series("gpu_autoscaler_forecast_fallback",
                    {**LEADER, "service": "embed", "namespace": "ml", "reason": "forecast_unreliable"}, const(1)))
    # Earned headroom (issue 14): chat earned its target, embed (unreliable forecast) runs at 0.75 of it.
    s.append(Series("gpu_autoscaler_headroom_target_ratio", {**LEADER, "service": "chat", "namespace": "ml"},
                    const(1.0)))
    s.append(Series("gpu_autoscaler_headroom_target_ratio", {**LEADER, "service": "embed", "namespace": "ml"},
                    const(0.75)))
    # Calibrated excess (stop 42): chat's floor provisions 60 % of its P99's excess over the median
    s.append(Series("gpu_autoscaler_forecast_excess_share", {**LEADER, "service": "chat", "namespace": "ml"},
                    const(0.6)))
    s.append(Series("gpu_autoscaler_forecast_updates_total", {**LEADER, "result": "ok"}, counter(2 / 60)))
    # Capacity arbitration: the leader is 2 GPUs short (GPUAutoscalerCapacityShortfall pending), has 2 burst nodes
    # (56/h, under the 100/h alert threshold) and stops 2 gangs an hour (no thrash); the follower's leftovers from
    # when it led (6 short, 300/h, 5 nodes) must be ignored.
    s += [
        Series("gpu_autoscaler_capacity_shortfall_gpus", LEADER, const(2)),
        Series("gpu_autoscaler_capacity_shortfall_gpus", FOLLOWER, const(6)),
        Series("gpu_autoscaler_burst_spend_per_hour", LEADER, const(56)),
        Series("gpu_autoscaler_burst_spend_per_hour", FOLLOWER, const(300)),
        Series("gpu_autoscaler_burst_nodes", {**LEADER, "pool": "cloud-a100"}, const(2)),
        Series("gpu_autoscaler_burst_nodes", {**LEADER, "pool": "cloud-h100"}, const(0)),
        Series("gpu_autoscaler_burst_nodes", {**FOLLOWER, "pool": "cloud-a100"}, const(5)),
        Series("gpu_autoscaler_training_gangs_stopped_total", {**LEADER, "how": "suspend"}, counter(2 / 3600)),
        Series("gpu_autoscaler_training_gangs_stopped_total", {**LEADER, "how": "evict"}, const(0)),
        Series("gpu_autoscaler_training_gangs_stopped_total", {**FOLLOWER, "how": "suspend"}, const(4)),
        Series("gpu_autoscaler_training_gpu_hours_lost_total", LEADER, counter(3 / 3600)),
        # Rebalancing: the leader sees 5 stranded GPUs and moved 2 pods this hour; the follower's leftovers differ.
        Series("gpu_autoscaler_stranded_gpus", LEADER, const(5)),
        Series("gpu_autoscaler_stranded_gpus", FOLLOWER, const(40)),
        Series("gpu_autoscaler_rebalance_moves_last_hour", LEADER, const(2)),
        Series("gpu_autoscaler_rebalance_moves_last_hour", FOLLOWER, const(7)),
        Series("gpu_autoscaler_rebalance_passes_total", {**LEADER, "result": "ok"}, counter(1 / 300)),
        Series("gpu_autoscaler_rebalance_passes_total", {**LEADER, "result": "held"}, const(0)),
    ]
    for le, share in (("0.1", 0.2), ("0.25", 0.9), ("1", 1.0), ("10", 1.0), ("+Inf", 1.0)):
        s.append(Series("gpu_autoscaler_tick_duration_seconds_bucket", {**LEADER, "le": le}, counter(share / 15)))
    # 2 services, 4 ticks a minute (8 decisions a minute): chat is clamped at maxReplicas on 3 ticks in 4
    # (GPUAutoscalerServiceAtMaxReplicas pending at 0.75 services per tick).
    for reason, per_s in (
        ("within_tolerance", 0.5 / 15),
        ("at_max_replicas", 0.75 / 15),
        ("forecast_floor", 0.75 / 15),
    ):
        s.append(Series("gpu_autoscaler_decisions_total", {**LEADER, "reason": reason}, counter(per_s)))
    s.append(Series("gpu_autoscaler_decisions_total", {**LEADER, "reason": "slo_breach"}, const(0)))
    for kind, reason, result, per_s in (
        ("ScaleDeployment", "metric_above_target", "applied", 0.005),
        ("ScaleDeployment", "metric_above_target", "failed", 0.0),
        ("EvictPod", "preempt_for_inference", "blocked", 0.0),
        ("SuspendWorkload", "preempt_for_inference", "applied", 2 / 3600),
        ("ResumeWorkload", "resume_training", "applied", 1 / 3600),
        ("ScaleNodePool", "burst_scale_up", "applied", 1 / 3600),
        ("ScaleNodePool", "burst_scale_down", "applied", 0.0),
        ("EvictPod", "rebalance", "applied", 2 / 3600),
    ):
        labels = {**LEADER, "kind": kind, "reason": reason, "dry_run": "false", "result": result}
        s.append(Series("gpu_autoscaler_actions_total", labels, counter(per_s) if per_s else const(0)))
    gpus = [
        ("node1", 0, CHAT_PODS[0], 95.0, 60000.0),
        ("node1", 1, CHAT_PODS[1], 95.0, 60000.0),
        ("node2", 0, EMBED_POD, 20.0, 8000.0),
        ("node2", 1, TRAINING_POD, 99.0, 70000.0),
        ("node2", 2, "", 0.0, 0.0),
    ]
    for host, gpu, pod, util, used in gpus:
        labels = {
            "gpu": str(gpu),
            "UUID": f"GPU-{host}-{gpu}",
            "modelName": "NVIDIA A100-SXM4-80GB",
            "Hostname": host,
            "job": "dcgm-exporter",
            "instance": f"{host}:9400",
        }
        if pod:
            labels |= {"namespace": "ml", "pod": pod, "container": "main"}
        s += [
            Series("DCGM_FI_DEV_GPU_UTIL", labels, const(util)),
            Series("DCGM_FI_DEV_FB_USED", labels, const(used)),
            Series("DCGM_FI_DEV_FB_FREE", labels, const(81920.0 - used)),
            Series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, const(util / 100)),
        ]
    return s


# What the rules make of this history once evaluated (pending: every alert has a `for` of minutes), as
# (alert, labels other than alertname and severity).
CONTROLLER = (("job", "gpu-autoscaler"), ("namespace", "gpu-autoscaler"))
EXPECTED_ACTIVE_ALERTS = {
    ("GPUAutoscalerInvalidPolicies", CONTROLLER),
    ("GPUAutoscalerForecastFallback", (("namespace", "ml"), ("reason", "forecast_unreliable"), ("service", "embed"))),
    ("GPUAutoscalerServiceMetricsStale", (("namespace", "ml"), ("reason", "no_data"), ("service", "embed"))),
    ("GPUAutoscalerServiceAtMaxReplicas", CONTROLLER),
    ("GPUInferenceUtilizationHigh", (("namespace", "ml"), ("service", "chat"))),
    ("GPUInferenceUtilizationLow", (("namespace", "ml"), ("service", "embed"))),
    ("DCGMExporterNodeMissing", (("node", "node3"),)),
    ("GPUAutoscalerCapacityShortfall", CONTROLLER),
}


def write_openmetrics(path: Path, series: Iterable[Series], start: float, end: float) -> None:
    by_family: dict[str, list[Series]] = {}
    for one in series:
        by_family.setdefault(one.name, []).append(one)
    times = [start + k * STEP_S for k in range(int((end - start) // STEP_S) + 1)]
    with path.open("w") as out:
        for name, members in by_family.items():
            # "unknown" accepts any sample name (counters would need the family name without _total)
            out.write(f"# HELP {name} synthetic\n# TYPE {name} unknown\n")
            for one in members:
                labels = ",".join(f'{k}="{v}"' for k, v in one.labels.items())
                out.writelines(f"{name}{{{labels}}} {one.value(t - start)} {int(t)}\n" for t in times)
        out.write("# EOF\n")


class Prometheus(PrometheusServer):
    """The shared test Prometheus (``tests/prometheus/promserver.py``) with the project's rule file, evaluated every
    second so that tests need not wait long, and JSON query helpers. No scrape jobs: the data is backfilled."""

    def __init__(self, binary: str, workdir: Path, rule_file: Path) -> None:
        config = f"global: {{scrape_interval: 15s, evaluation_interval: 1s}}\nrule_files: ['{rule_file}']\n"
        super().__init__(binary, workdir / "data", config)
        self.workdir, self.rule_file = workdir, rule_file

    def get(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, decoded JSON body); a 4xx answer is returned, not raised."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def query(self, expr: str) -> tuple[int, dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)

    def wait_for(self, expr: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body = self.query(expr)
            if status == 200 and body["data"]["result"]:
                return
            time.sleep(0.2)
        raise AssertionError(f"no result for {expr} after {timeout}s")
