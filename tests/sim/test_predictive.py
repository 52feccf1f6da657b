"""The simulator's ``predictive`` policy on demand that jumps at window edges, and the causal bound beside it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from autoscaler.sim.bounds import cheapest_at, tuned_observed_policy, window_margin_bound
from autoscaler.sim.engine import simulate
from autoscaler.sim.predictive import ForecastingConfig
from autoscaler.sim.registry import make_policy
from autoscaler.sim.run import build_services, run_scenario
from autoscaler.sim.scenario import load_scenario

WINDOW_S = 600.0
DELAY_S = 30.0


def windowed_demand(days: float = 2.0, seed: int = 5) -> list[float]:
    """Per-minute request rate whose level is redrawn every 10 minutes (ServeGen's shape), 2 % noise."""
    rng = np.random.default_rng(seed)
    windows = int(days * 86_400 / WINDOW_S)
    levels = rng.choice([30.0, 45.0, 70.0], size=windows)
    per_minute = np.repeat(levels, int(WINDOW_S / 60))
    return list(per_minute * (1.0 + rng.normal(0.0, 0.02, per_minute.size)))


FORECASTING = {
    "model": "phase_naive",
    "refitSeconds": 3600,
    "updateSeconds": 60,
    "historySeconds": 86_400,
    "minHistorySeconds": 7_200,
}


@pytest.fixture
def edge_scenario(make_scenario: Callable[..., Path]) -> Path:
    path = make_scenario(windowed_demand(), metricsDelaySeconds=DELAY_S, forecasting=FORECASTING)
    return path


def _with_forecast(path: Path) -> Path:
    import yaml

    data = yaml.safe_load(path.read_text())
    spec = data["services"][0]["spec"]
    spec["coldStartSeconds"] = 90
    spec["forecast"] = {"mode": "active", "quantile": 0.99}
    spec["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 60}}
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_forecast_floor_covers_the_window_edges_that_reactive_scaling_misses(edge_scenario: Path) -> None:
    scenario, base = load_scenario(_with_forecast(edge_scenario))
    result = run_scenario(scenario, base, ("oracle", "predictive", "reactive"))
    figures = result.report["policies"]
    predictive, reactive = figures["predictive"], figures["reactive"]
    # Reactive scaling learns of a jump 30 s late and waits 90 s for pods: it misses the start of every up-jump.
    assert reactive["slo_attainment"] < 0.95
    # The first two hours have no forecast (minHistorySeconds); after that, misses are rare.
    assert predictive["slo_attainment"] > 0.985
    assert predictive["slo_attainment"] > reactive["slo_attainment"] + 0.05
    assert predictive["decisions_by_reason"].get("forecast_floor", 0) > 0
    # The forecaster found the 10-minute edges in the history it observed.
    policy = result.runs["predictive"].policy_object
    assert policy.per_service[0].estimator.period_bins_ == 10


def test_history_is_stamped_with_when_the_demand_happened(edge_scenario: Path) -> None:
    # The tick sees demand 30 s late. Stamped with the tick's time instead, the learnt edges are 30 s late and the
    # replicas for a jump arrive after it.
    scenario, base = load_scenario(_with_forecast(edge_scenario))
    services, start, steps = build_services(scenario, base)
    config = ForecastingConfig(
        model="phase_naive", refit_s=3600, update_s=60, history_s=86_400, min_history_s=7_200
    )

    def attainment(assumed_delay_s: float) -> float:
        policy = make_policy("predictive", forecasting=config, metrics_delay_s=assumed_delay_s)
        run = simulate(policy, services, scenario.node_pools, start, scenario.step_seconds, steps, DELAY_S)
        return run.requests_in_slo_steps / run.requests

    assert attainment(DELAY_S) > attainment(0.0) + 0.003


def test_causal_bound_trades_margin_for_slo(edge_scenario: Path) -> None:
    scenario, base = load_scenario(_with_forecast(edge_scenario))
    services, start, _ = build_services(scenario, base)
    points = window_margin_bound(services[0], start, scenario.step_seconds, DELAY_S, WINDOW_S, (1.0, 1.5, 2.5))
    slo = [p.slo_attainment for p in points]
    cost = [p.gpu_hours_vs_oracle for p in points]
    assert slo == sorted(slo) and cost == sorted(cost)
    # No margin: every up-jump is missed until the window is seen; a margin above the largest jump (70/30) misses
    # none, and costs more than the oracle, which knew each jump.
    assert slo[0] < 0.95
    assert slo[-1] == pytest.approx(1.0)
    assert cost[-1] > 1.0
    assert cheapest_at(points, 0.999) == points[-1]
    assert cheapest_at(points, 1.01) is None


def test_causal_bound_is_the_oracle_on_constant_demand(make_scenario: Callable[..., Path]) -> None:
    scenario, base = load_scenario(make_scenario([40.0] * 600, metricsDelaySeconds=DELAY_S))
    services, start, _ = build_services(scenario, base)
    (point,) = window_margin_bound(services[0], start, scenario.step_seconds, DELAY_S, WINDOW_S, (1.0,))
    assert point.slo_attainment == 1.0
    assert point.gpu_hours_vs_oracle == pytest.approx(1.0)


def test_forecast_rate_per_replica_overrides_the_reactive_target() -> None:
    import dataclasses

    from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy
    from autoscaler.core.predictive import rate_per_replica
    from autoscaler.sim.policies import SimService

    def _rate_per_replica(service: SimService) -> float | None:
        # what the simulator hands the tick: the policy, and the replica's known throughput (TickInput.throughputs)
        return rate_per_replica(service.policy, service.throughput)

    base = ServicePolicy(namespace="ml", name="chat", metric=MetricKind.REQUEST_RATE, target=3.2)
    service = SimService(base, np.zeros(4), throughput=3.5, base_latency_s=2.0, slo_s=4.0, quantile=0.95)
    assert _rate_per_replica(service) == 3.2
    with_rate = dataclasses.replace(base, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99, rate_per_replica=2.5))
    assert _rate_per_replica(dataclasses.replace(service, policy=with_rate)) == 2.5
    on_utilisation = dataclasses.replace(base, metric=MetricKind.GPU_UTILIZATION, target=70.0)
    assert _rate_per_replica(dataclasses.replace(service, policy=on_utilisation)) == pytest.approx(3.5 * 0.7)


def test_tuned_observed_policy_reaches_the_target_and_a_wider_search_never_costs_more(edge_scenario: Path) -> None:
    scenario, base = load_scenario(_with_forecast(edge_scenario))
    services, start, _ = build_services(scenario, base)
    args = (services[0], start, scenario.step_seconds, DELAY_S, WINDOW_S)
    narrow = tuned_observed_policy(*args, 0.99, inside_margins=(1.1,), edge_intercepts=(0.9,),
                                   edge_reversion=(0.0,), edge_volatility=(0.0,))
    wide = tuned_observed_policy(*args, 0.99, inside_margins=(1.0, 1.1), edge_intercepts=(0.3, 0.6, 0.9))
    assert narrow is not None and wide is not None
    assert narrow.slo_attainment >= 0.99 and wide.slo_attainment >= 0.99
    assert wide.gpu_hours_vs_oracle <= narrow.gpu_hours_vs_oracle
    # Knowing only observed demand, covering every jump costs more than the oracle, which knew each one.
    assert wide.gpu_hours_vs_oracle > 1.0
    assert tuned_observed_policy(*args, 1.01) is None
