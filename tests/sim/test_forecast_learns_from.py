"""What the simulated forecasts learn from (``simulation.forecastLearnsFrom``, stop 46).

In a cluster the forecaster's history is the controller's history query of its request counter, by default
``vllm:request_success_total``: finished requests, which in an overload read what the ready replicas served, not the
demand. The simulator's forecasts learnt from the arrivals (the demand), computed beside the run in worker processes.
``finished`` feeds them -- history and scores alike -- what the ready replicas finished, as the controller's history
reads it; such forecasts depend on the run's own replicas, so they are computed in the run's process.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import autoscaler.sim.run as run_module
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.sim.engine import _observe, simulate
from autoscaler.sim.policies import SimService
from autoscaler.sim.predictive import PredictivePolicy
from autoscaler.sim.registry import make_policy
from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import load_scenario

POLICY = ServicePolicy("inference", "chat", metric=MetricKind.REQUEST_RATE, target=3.0)


def _service(learns_finished: bool, counts_finished: bool = True) -> SimService:
    return SimService(POLICY, np.zeros(4), throughput=3.5, base_latency_s=1.0, slo_s=4.0, quantile=0.95,
                      rate_counts_finished=counts_finished, forecast_learns_finished=learns_finished)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "learns_finished", "counts_finished", "metric", "ready", "rate", "learnt"),
    [
        ("arrivals: the demand, overloaded or not", False, True, MetricKind.REQUEST_RATE, 6, 30.0, 30.0),
        ("finished, overloaded: what the 6 ready served", True, True, MetricKind.REQUEST_RATE, 6, 30.0, 21.0),
        ("finished, under capacity: every request", True, True, MetricKind.REQUEST_RATE, 6, 10.0, 10.0),
        ("finished, no ready replica: nothing", True, True, MetricKind.REQUEST_RATE, 0, 30.0, 0.0),
        # the history is the counter's whatever the scaling metric reads
        ("finished, a service scaling on GPU utilisation", True, True, MetricKind.GPU_UTILIZATION, 6, 30.0, 21.0),
        ("finished, while the metric reads the arrivals", True, False, MetricKind.REQUEST_RATE, 6, 30.0, 21.0),
    ],
)
def test_what_the_forecasts_learn(
    case: str, learns_finished: bool, counts_finished: bool, metric: MetricKind, ready: int, rate: float,
    learnt: float,
) -> None:  # fmt: skip
    obs = _observe(_service(learns_finished, counts_finished), metric, 8, ready, 8 - ready, rate, 100.0, 5.0, 15.0)
    assert obs.request_rate == pytest.approx(learnt), case


# the field parsed, its default and bad values: tests/sim/test_request_rate_counts.py (FIELDS)


def overloaded(learns_finished: bool, hours: float) -> tuple[Any, list[Any], float, int]:
    """``hours`` of the default scenario with the demand doubled and at most 8 replicas (overloaded at the peaks):
    the scenario, its services, start and steps."""
    scenario, base = load_scenario(Path(run_module.__file__).parent / "scenarios" / "default.yaml")
    services, start, steps = build_services(scenario, base)
    services = [
        dataclasses.replace(
            s, rates=np.asarray(s.rates, dtype=np.float64) * 2.0,
            policy=dataclasses.replace(s.policy, max_replicas=8), forecast_learns_finished=learns_finished,
        )
        for s in services
    ]  # fmt: skip
    return scenario, services, start, min(steps, int(hours * 3600 / scenario.step_seconds))


def _overloaded_run(learns_finished: bool, workers: int) -> tuple[PredictivePolicy, Any]:
    """Half a day overloaded at every peak (``overloaded``)."""
    scenario, services, start, steps = overloaded(learns_finished, 12.0)
    policy = make_policy(
        "predictive", forecasting=scenario.forecasting.to_config(), node_boot_s=300.0,
        metrics_delay_s=scenario.metrics_delay_seconds, forecast_workers=workers,
    )  # fmt: skip
    assert isinstance(policy, PredictivePolicy)
    started: list[bool] = []
    begin = policy.begin

    def begin_and_see(*args: Any) -> None:
        begin(*args)
        started.append(policy._pipeline is not None)

    policy.begin = begin_and_see  # type: ignore[method-assign]
    run = simulate(
        policy, services, scenario.node_pools, start, scenario.step_seconds, steps, scenario.metrics_delay_seconds
    )
    assert started == [workers > 0 and not learns_finished], "forecasting workers started"
    return policy, run


def test_finished_forecasts_learn_at_most_what_the_replicas_serve() -> None:
    """Capped at 8 replicas of 3.5 req/s, the finished history never exceeds 28 req/s, while the arrivals' does:
    the forecast learns the clipped peaks, as a controller reading its counter would."""
    learnt, _ = _overloaded_run(True, workers=0)
    demand, _ = _overloaded_run(False, workers=0)
    # (the history is a buffer grown by doubling: only its first history_len buckets were written)
    filled = [s.history[: s.history_len] for s in (learnt.per_service[0], demand.per_service[0])]
    finite = [h[~np.isnan(h)] for h in filled]
    assert finite[0].size and finite[1].size
    assert finite[0].max() <= 8 * 3.5 + 1e-9
    assert finite[1].max() > 8 * 3.5


def test_finished_forecasts_are_computed_in_the_run_even_with_workers() -> None:
    """The workers compute from the demand known before the run; the finished requests depend on the run's own
    replicas: a worker would diverge (and the run fail), so none is started -- the same run as without workers."""
    in_process, run0 = _overloaded_run(True, workers=0)
    with_workers, run1 = _overloaded_run(True, workers=1)
    assert in_process.errors and in_process.errors == with_workers.errors
    assert run0.gpu_seconds == run1.gpu_seconds and run0.requests_in_slo_steps == run1.requests_in_slo_steps
