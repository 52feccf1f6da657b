"""What a fresh controller exports before anything happens: the counter children the alerts count exist at 0 (so that
increase() and rate() see their first event), the process start time the no-success alert falls back on, and help
texts that name every label value the alerts and runbooks speak of.
"""

from __future__ import annotations

import re
import time

from prometheus_client.parser import text_string_to_metric_families

from autoscaler.core import model
from autoscaler.core.reasons import Reason
from autoscaler.telemetry import ACTION_KIND_REASONS, TICK_RESULTS, Telemetry
from tests.observability.common import RUNBOOKS_DIR, alerts, load_rules

COUNTED = ("gpu_autoscaler_ticks_total", "gpu_autoscaler_decisions_total", "gpu_autoscaler_actions_total")
ACTION_KINDS = {
    cls.__name__
    for cls in (model.ScaleDeployment, model.EvictPod, model.SuspendWorkload, model.ResumeWorkload, model.ScaleNodePool)
}
SELECTOR = re.compile(r"\b(gpu_autoscaler_(?:ticks|decisions|actions)_total)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def samples(telemetry: Telemetry) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(telemetry.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        have = labels.get(name, "")
        full = re.fullmatch(value, have) is not None
        if (op == "=" and have != value) or (op == "!=" and have == value):
            return False
        if (op == "=~" and not full) or (op == "!~" and full):
            return False
    return True


def test_counters_the_alerts_count_exist_at_zero_from_the_start() -> None:
    """Every selector of ticks/decisions/actions in an alert matches a child a fresh controller exports at 0."""
    fresh = samples(Telemetry(identity="a"))
    selectors = [
        (name, MATCHER.findall(body)) for rule in alerts().values() for name, body in SELECTOR.findall(rule["expr"])
    ]
    assert {name for name, _ in selectors} == set(COUNTED)
    for name, matchers in selectors:
        zeros = [labels for labels, value in fresh.get(name, []) if value == 0 and matches(labels, matchers)]
        assert zeros, f"{name}{{{matchers}}}: no child at 0 before the first event"


def test_the_first_failure_of_any_action_kind_counts() -> None:
    """GPUAutoscalerActionsFailing sums by kind: each kind has its failed children at 0, with the reasons it is
    planned with, so that the child a failure increments already had a 0 sample."""
    fresh = samples(Telemetry())["gpu_autoscaler_actions_total"]
    failed = {(labels["kind"], labels["reason"]) for labels, value in fresh if labels["result"] == "failed"}
    assert failed == set(ACTION_KIND_REASONS)
    assert {kind for kind, _ in failed} == ACTION_KINDS
    blocked = {
        labels["reason"] for labels, _ in fresh if labels["kind"] == "EvictPod" and labels["result"] == "blocked"
    }
    assert blocked == {"preempt_for_inference", "rebalance"}  # GPUAutoscalerEvictionsBlocked, by reason
    assert all(labels["dry_run"] == "false" and value == 0 for labels, value in fresh)  # only writes fail or block
    assert len(fresh) <= 40, "pre-created children stay few"
    assert {reason for _, reason in ACTION_KIND_REASONS} <= {r.value for r in Reason}


def test_ticks_by_every_result_exist_at_zero() -> None:
    fresh = samples(Telemetry())["gpu_autoscaler_ticks_total"]
    assert {labels["result"]: value for labels, value in fresh} == dict.fromkeys(TICK_RESULTS, 0.0)


def test_process_start_time_is_exported_and_used_by_the_no_success_alert() -> None:
    before = time.time()
    telemetry = Telemetry()
    after = time.time()
    [(labels, value)] = samples(telemetry)["gpu_autoscaler_process_start_time_seconds"]
    assert labels == {} and before <= value <= after
    assert "gpu_autoscaler_process_start_time_seconds" in alerts()["GPUAutoscalerNoSuccessfulTick"]["expr"]
    assert "process_start_time_seconds" in (RUNBOOKS_DIR / "GPUAutoscalerNoSuccessfulTick.md").read_text()


def test_forecast_fallback_reasons_are_documented_and_forecast_missing_is_not_alerted() -> None:
    """The controller exports forecast_missing (no usable forecast yet, or no ratePerReplica): the metric's help and
    the runbook say so, and the alert leaves it out."""
    telemetry = Telemetry()
    [help_text] = [
        f.documentation for f in telemetry.registry.collect() if f.name == "gpu_autoscaler_forecast_fallback"
    ]
    runbook = (RUNBOOKS_DIR / "GPUAutoscalerForecastFallback.md").read_text()
    for reason in ("forecast_stale", "forecast_unreliable", "forecast_missing"):
        assert reason in help_text and reason in runbook, reason
    expr = alerts()["GPUAutoscalerForecastFallback"]["expr"]
    assert 'reason!="forecast_missing"' in expr


def test_forecast_recording_rules_normalise_labels_and_keep_the_leader_only() -> None:
    records = {r["record"]: r["expr"] for g in load_rules()["groups"] for r in g["rules"] if "record" in r}
    for metric in (
        "gpu_autoscaler_forecast_pinball_ratio",
        "gpu_autoscaler_forecast_fallback",
        "gpu_autoscaler_headroom_target_ratio",
        "gpu_autoscaler_forecast_excess_share",
    ):
        [(name, expr)] = [(n, e) for n, e in records.items() if f":{metric}:leader" in n]
        assert '"exported_namespace"' in expr and '"exported_service"' in expr, name
        assert "gpu_autoscaler_leader == 1" in expr, name
