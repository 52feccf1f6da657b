"""Forecasts computed by worker processes beside the run (``PredictivePolicy(forecast_workers=N)``, issue 14's
simulator speed) give the same run as computed in the run's own process, to the last digit."""

from __future__ import annotations

import dataclasses
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import autoscaler.sim.run as run_module
from autoscaler.sim.engine import simulate
from autoscaler.sim.predictive import PredictivePolicy
from autoscaler.sim.registry import make_policy
from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import load_scenario


def _setup(days: float, fleet: int = 1) -> tuple[Any, list[Any], float, int]:
    scenario, base = load_scenario(Path(run_module.__file__).parent / "scenarios" / "default.yaml")
    services, start, steps = build_services(scenario, base)
    steps = min(steps, int(days * 86_400 / scenario.step_seconds))
    if fleet > 1:  # copies of the service, demand shifted 5 hours apart, in one cluster with room for them
        services = [
            dataclasses.replace(
                s, policy=dataclasses.replace(s.policy, name=f"{s.policy.name}-{k}"),
                rates=np.roll(np.asarray(s.rates, dtype=np.float64), -k * 1200),
            )
            for k in range(fleet)
            for s in services
        ]
        pools = [p.model_copy(update={"nodes": p.nodes * fleet}) for p in scenario.node_pools]
        scenario = scenario.model_copy(update={"node_pools": pools})
    return scenario, services, start, steps


def _run(
    days: float, workers: int, fleet: int = 1, name: str = "predictive", model_params: dict[str, Any] | None = None
) -> tuple[Any, ...]:
    scenario, services, start, steps = _setup(days, fleet)
    forecasting = scenario.forecasting.to_config()
    if model_params is not None:
        forecasting = dataclasses.replace(forecasting, model_params=model_params)
    policy = make_policy(
        name,
        forecasting=forecasting,
        node_boot_s=300.0,
        metrics_delay_s=scenario.metrics_delay_seconds,
        forecast_workers=workers,
    )
    run = simulate(
        policy, services, scenario.node_pools, start, scenario.step_seconds, steps, scenario.metrics_delay_seconds
    )
    assert isinstance(policy, PredictivePolicy) and policy._pipeline is None  # the workers were stopped
    timelines = [(t.ready.tolist(), t.spec.tolist()) for t in run.timelines]
    return (
        run.requests_in_slo_steps, run.gpu_seconds, run.scale_actions, dict(run.reasons), policy.errors,
        policy.pinball, policy.fit_failures, timelines,
    )


def test_one_worker_gives_the_same_run_to_the_last_digit() -> None:
    # 1.2 days: no forecast for the first half hour, the baseline's naive fall-back on the first day, hourly refits
    in_process = _run(1.2, workers=0)
    assert in_process[4], "no forecast was ever scored: the test would compare nothing"
    assert _run(1.2, workers=1) == in_process


def test_mean_reversion_computed_by_a_worker_gives_the_same_run() -> None:
    """``phase_naive``'s mean reversion (on by default since stop 52) keeps fitted slopes and sorted residual sets
    across updates; a worker computes them the same way (its fitted models are not shipped back, only the forecasts).
    1.2 days: the slopes need 30 origins per phase (5 hours) after the hour of deviations, so the last ~17 hours
    revert."""
    params = {"reversion_periods": 6}
    in_process = _run(1.2, workers=0, model_params=params)
    plain = _run(1.2, workers=0, model_params={"reversion_periods": None})
    assert in_process[4] != plain[4], "reversion changed no forecast: the test would compare the plain path"
    assert _run(1.2, workers=1, model_params=params) == in_process


def test_a_fleet_over_two_workers_gives_the_same_run() -> None:
    in_process = _run(0.3, workers=0, fleet=3)
    assert _run(0.3, workers=2, fleet=3) == in_process


def test_no_worker_is_left_running() -> None:
    before = set(multiprocessing.active_children())
    _run(0.1, workers=2, fleet=2)
    assert set(multiprocessing.active_children()) <= before


def test_a_worker_that_fails_fails_the_run_and_names_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: PredictivePolicy, *args: Any) -> Any:
        raise MemoryError("no room for the history")

    monkeypatch.setattr(PredictivePolicy, "_refit_step", broken)
    with pytest.raises(RuntimeError, match="forecast worker 0 failed: MemoryError: no room for the history"):
        _run(0.1, workers=1)


def test_a_worker_that_saw_other_demand_than_the_run_is_caught() -> None:
    """The workers compute from the demand the engine says the observations carry (``begin``); if the run's
    observations differed, the forecasts would silently be another run's: the history each was computed on is
    checked against the run's."""
    scenario, services, start, steps = _setup(0.1)
    policy = make_policy(
        "predictive", forecasting=scenario.forecasting.to_config(), metrics_delay_s=scenario.metrics_delay_seconds,
        forecast_workers=1,
    )
    assert isinstance(policy, PredictivePolicy)
    original = policy.begin

    def begin_with_other_demand(seen_rates: Any, start: float, steps: int) -> None:
        original([np.asarray(r) * 1.5 for r in seen_rates], start, steps)

    policy.begin = begin_with_other_demand  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="forecast worker diverged"):
        simulate(policy, services, scenario.node_pools, start, scenario.step_seconds, steps,
                 scenario.metrics_delay_seconds)
    policy.end()


def test_bad_worker_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="forecast_workers"):
        PredictivePolicy(forecast_workers=-1)


def test_the_mixed_training_scenario_reports_the_same_with_a_worker() -> None:
    """The packaged inference + training scenario (capacity arbitration reads the forecasts' median, the burst
    pool, the rebalancer): every policy's figures as ``autoscaler simulate`` reports them, with and without."""
    from autoscaler.sim.run import run_scenario

    scenario, base = load_scenario(Path(run_module.__file__).parent / "scenarios" / "mixed-training.yaml")
    scenario = scenario.model_copy(update={"duration_seconds": 0.4 * 86_400})

    def figures(workers: int) -> dict[str, tuple[Any, ...]]:
        result = run_scenario(scenario, base, ["predictive", "kube-preemption"], forecast_workers=workers)
        return {
            name: (r.requests_in_slo_steps, r.gpu_seconds, r.scale_actions, dict(r.reasons), r.burst_gpu_seconds,
                   r.training_gpu_seconds, r.preemptions)
            for name, r in result.runs.items()
        }

    assert figures(1) == figures(0)
