"""Review 46b: forecasts that learn from the finished requests (``simulation.forecastLearnsFrom``) and the trace
matrix's HPA frontier (``--hpa-frontier``, ``hpa_at_slo``), stop 46.

Findings as tests (strict xfails until fixed) and pins of the edges checked and found right.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import autoscaler.sim.run as run_module
import autoscaler.sim.scenario as scenario_module
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.sim.engine import _observe, simulate
from autoscaler.sim.policies import SimService
from autoscaler.sim.registry import make_policy
from benchmarks import traces_matrix
from benchmarks.traces_matrix import format_rows, hpa_at_slo, judge
from tests.sim.test_forecast_learns_from import overloaded

POLICY = ServicePolicy("inference", "chat", metric=MetricKind.REQUEST_RATE, target=3.0)


def _service(counts_finished: bool = True) -> SimService:
    return SimService(POLICY, np.zeros(4), throughput=3.5, base_latency_s=1.0, slo_s=4.0, quantile=0.95,
                      rate_counts_finished=counts_finished, forecast_learns_finished=True)  # fmt: skip


# ---- findings: what the forecasts learn ------------------------------------------------------------------------


def test_the_history_learns_what_the_replicas_ready_at_the_sample_served() -> None:
    """Fixed (was a strict xfail). The controller's history is a range query of its counter: at time t it reads
    what the pods ready at t finished, whether or not they are still there (their series stay in Prometheus). The
    simulator records the delayed step once, at the tick that sees it, and the step was served by ``seen_ready``
    replicas.

    WRONG: 8 replicas ready at the sample served 28 of 30 req/s; 2 are gone by the tick (a scale-down decided on older
    metrics, an eviction): the history learns 21 req/s (6 x 3.5), a demand no counter ever read, and keeps it.
    RIGHT: 28 req/s, min(arrivals, replicas ready at the sample x throughput) -- the step's own service. (The
    instantaneous metric ``metric_total`` may keep counting only the pods still here: that is a separate reading.)"""
    obs = _observe(_service(), MetricKind.REQUEST_RATE, 6, 6, 0, 30.0, 100.0, 5.0, 15.0, seen_ready=8)
    assert obs.request_rate == pytest.approx(28.0)


@pytest.mark.parametrize(
    ("case", "ready", "seen_ready", "rate", "learnt"),
    [
        ("more ready now than at the sample: the 6 ready then", 8, 6, 30.0, 21.0),
        ("the same replicas: what they served", 6, 6, 30.0, 21.0),
        ("under capacity: every request", 6, 8, 10.0, 10.0),
        ("none ready at the sample: nothing finished", 4, 0, 30.0, 0.0),
    ],
)
def test_pin_the_history_is_what_the_sampled_step_served(
    case: str, ready: int, seen_ready: int, rate: float, learnt: float
) -> None:
    obs = _observe(_service(), MetricKind.REQUEST_RATE, 8, ready, 8 - ready, rate, 100.0, 5.0, 15.0,
                   seen_ready=seen_ready)  # fmt: skip
    assert obs.request_rate == pytest.approx(learnt), case


def _short_overloaded_run(policy_name: str, learns_finished: bool) -> Any:
    """Six hours overloaded at the peaks (``test_forecast_learns_from.overloaded``)."""
    scenario, services, start, steps = overloaded(learns_finished, 6.0)
    policy = make_policy(policy_name, node_boot_s=300.0, metrics_delay_s=scenario.metrics_delay_seconds,
                         forecasting=scenario.forecasting.to_config())  # fmt: skip
    return simulate(
        policy, services, scenario.node_pools, start, scenario.step_seconds, steps, scenario.metrics_delay_seconds
    )


@pytest.mark.parametrize("policy_name", ["reactive", "hpa"])
def test_pin_only_the_forecasts_read_what_they_learn_from(policy_name: str) -> None:
    """``ServiceObservation.request_rate`` is read by the predictive policy's forecasts only: the reactive policy
    (the controller's core, its SLO guard included) and the HPA run the same whatever the forecasts learn from."""
    arrivals, finished = (_short_overloaded_run(policy_name, learns) for learns in (False, True))
    assert arrivals.requests_in_slo_steps < arrivals.requests  # the premise: overloaded at times
    assert (arrivals.gpu_seconds, arrivals.requests_in_slo_steps, arrivals.scale_actions) == (
        finished.gpu_seconds, finished.requests_in_slo_steps, finished.scale_actions,
    )  # fmt: skip


@pytest.mark.parametrize(("learns", "started"), [((False, False), True), ((False, True), False), ((True, True), False)])
def test_pin_services_mixing_arrivals_and_finished_start_no_forecasting_worker(
    learns: tuple[bool, bool], started: bool
) -> None:
    """A worker computes from the arrivals known before the run: one service learning from the finished requests
    (which depend on the run's replicas) keeps every service in the run's process -- nothing to diverge from."""
    from autoscaler.sim.predictive import PredictivePolicy

    services = [
        dataclasses.replace(_service(), policy=dataclasses.replace(POLICY, name=f"s{k}"), forecast_learns_finished=f)
        for k, f in enumerate(learns)
    ]
    policy = PredictivePolicy(forecast_workers=2)
    policy.reset(services, 15.0)
    try:
        policy.begin([np.zeros(4) for _ in services], 0.0, 4)
        assert (policy._pipeline is not None) is started
    finally:
        policy.end()


# ---- pins: the HPA frontier ------------------------------------------------------------------------------------


def test_pin_equal_gpu_hours_prefer_the_higher_target() -> None:
    frontier = [
        {"target": 60.0, "slo_attainment": 0.999, "gpu_hours": 100.0},
        {"target": 80.0, "slo_attainment": 0.998, "gpu_hours": 100.0},
    ]
    assert hpa_at_slo(frontier, 0.998)["target"] == 80.0  # type: ignore[index]


def test_pin_a_nan_share_never_reaches_the_slo() -> None:
    frontier = [
        {"target": 80.0, "slo_attainment": math.nan, "gpu_hours": 50.0},
        {"target": 60.0, "slo_attainment": 0.999, "gpu_hours": 100.0},
    ]
    assert hpa_at_slo(frontier, 0.99)["target"] == 60.0  # type: ignore[index]
    assert hpa_at_slo(frontier[:1], 0.5) is None


def test_pin_the_default_target_matched_judges_as_gpu_vs_hpa() -> None:
    """When the HPA at its default target is the cheapest reaching the SLO, both GPU comparisons agree."""
    hpa = {"slo_attainment": 0.99, "gpu_hours": 110.0}
    for pred_gpu in (100.0, 120.0):
        row = {
            "cold_start": 90.0,
            "policies": {"predictive": {"slo_attainment": 0.99, "gpu_hours": pred_gpu}, "hpa": hpa},
            "hpa_frontier": [{"target": 70.0, **hpa}, {"target": 60.0, "slo_attainment": 0.995, "gpu_hours": 130.0}],
        }
        verdict = judge(row, servegen=False)
        assert verdict["hpa_at_slo"]["target"] == 70.0
        assert verdict["gpu_vs_hpa_at_slo"] is verdict["gpu_vs_hpa"]


def test_pin_run_row_runs_each_extra_target_alone_and_not_the_default_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job tuple's last element is the frontier's targets; the default target (70 %) listed again is not run a
    second time; every other target is the HPA alone at that target; the frontier is sorted by target."""
    runs: list[tuple[tuple[str, ...], float | None]] = []

    def fake_run(data: dict[str, Any], base: Path, policies: tuple[str, ...], **kw: Any) -> Any:
        target = data.get("baselines", {}).get("hpaTargetUtilization")
        runs.append((tuple(policies), target))
        figures = {"slo_attainment": 0.99, "gpu_hours": 100.0 - (target or 70.0) / 10, "gpu_hours_vs_oracle": 1.0,
                   "scale_actions": 1, "scale_downs": 0, "scale_downs_undone": 0, "burst_gpu_hours": 0.0,
                   "decisions_by_reason": {}}  # fmt: skip
        report = {"policies": {p: dict(figures) for p in policies},
                  "scenario": {"services": [{"mean_rate": 1.0, "peak_rate": 2.0}]}}  # fmt: skip
        return SimpleNamespace(report=report, steps=4, step_s=15.0)

    monkeypatch.setattr(scenario_module, "parse_scenario", lambda data: data)
    monkeypatch.setattr(run_module, "run_scenario", fake_run)
    base = traces_matrix.default_scenario()
    job = ("t", "/nonexistent/t.csv", 1.0, 86_400.0, 90.0, None, base, traces_matrix.POLICIES, (80.0, 70.0, 50.0))
    row = traces_matrix.run_row(job)
    assert runs == [(traces_matrix.POLICIES, None), (("hpa",), 80.0), (("hpa",), 50.0)]
    assert [p["target"] for p in row["hpa_frontier"]] == [50.0, 70.0, 80.0]
    assert row["hpa_frontier"][1]["gpu_hours"] == row["policies"]["hpa"]["gpu_hours"]


def test_pin_format_rows_keeps_the_columns_when_only_some_rows_have_a_frontier() -> None:
    def row(frontier: bool) -> dict[str, Any]:
        figures = {"slo_attainment": 0.99, "gpu_hours": 100.0, "gpu_hours_vs_oracle": 1.1, "scale_actions": 3}
        r: dict[str, Any] = {
            "trace": "t", "cold_start": 90.0, "simulated_hours": 24.0, "seconds": 1.0, "headroom_shares": {},
            "policies": {"predictive": figures, "hpa": figures, "oracle": figures},
        }  # fmt: skip
        if frontier:
            r["hpa_frontier"] = [{"target": 70.0, "slo_attainment": 0.99, "gpu_hours": 100.0}]
        r["verdict"] = judge(r, servegen=False)
        return r

    lines = format_rows([row(True), row(False)], markdown=True).splitlines()
    assert len({line.count("|") for line in lines}) == 1
    assert lines[2].split("|")[-4:-1] == [" 1.000 (70 %) ", " ok ", " 1 "]
    assert lines[3].split("|")[-4:-1] == [" - ", " - ", " 1 "]
