"""Review 40 of the simulator's accounting: the latency model (``sim/latency.py``), the report's figures and costs
(``sim/report.py``), the training and capacity settings (``sim/training.py``) and the reference policies
(``sim/bounds.py``).

Defects found (reproduced by an ``xfail(strict=True)`` test below, whose docstring says WRONG / RIGHT):

1. WRONG: ``bounds._slo_attainment`` counts a step as within the SLO whenever the policy provisions at least the
   oracle's replicas (``ready >= need``), but ``need`` is clamped at ``maxReplicas``: a step whose demand not even
   ``maxReplicas`` replicas can serve within the SLO (``replicas_needed`` then returns ``maxReplicas``, "the caller
   decides what a miss means") counts as met, so ``window_margin_bound`` and ``tuned_observed_policy`` report an SLO
   share no run can reach, contradicting ``BoundPoint.slo_attainment`` ("share of requests in steps whose latency
   quantile meets the SLO") and the simulator, which scores the same step a miss. RIGHT: a step counts only when its
   replicas meet the SLO as the simulator judges it (``latency_and_share``).

The plain tests pin right behaviour checked in this review that no other test pins: the latency model's edges
(no replica, no demand, demand at capacity), ``replicas_needed`` agreeing with the simulator's per-step verdict,
the per-step and per-request SLO definitions, the total cost formula the README documents, and the training and
burst-pool settings the simulator hands the controller.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.sim.bounds import tuned_observed_policy, window_margin_bound
from autoscaler.sim.engine import PolicyRun
from autoscaler.sim.latency import latency_and_share, replicas_needed, share_within
from autoscaler.sim.policies import SimService
from autoscaler.sim.report import figures, format_table

STEP_S = 60.0
WINDOW_S = 600.0


def _capped_service(rates: list[float], max_replicas: int = 2) -> SimService:
    policy = ServicePolicy(
        namespace="ml",
        name="chat",
        metric=MetricKind.REQUEST_RATE,
        target=3.0,
        min_replicas=1,
        max_replicas=max_replicas,
    )
    return SimService(
        policy, np.asarray(rates, dtype=np.float64), throughput=10.0, base_latency_s=1.0, slo_s=2.0, quantile=0.95
    )


def test_bound_does_not_count_a_step_beyond_max_replicas_as_within_the_slo() -> None:
    """Fixed (was a strict xfail). WRONG: a step at 100 req/s, which two replicas of 10 req/s (``maxReplicas``)
    cannot serve, counted within the SLO because the policy had ``need`` (= ``maxReplicas``) replicas. RIGHT: the
    simulator scores that step a miss, so must the bound: its requests are outside the SLO."""
    rates = [5.0] * 30 + [100.0] * 10 + [5.0] * 30
    service = _capped_service(rates)
    assert service.need(100.0) == 2
    assert latency_and_share(2, 100.0, 10.0, 1.0, 0.95, 2.0)[0] == math.inf
    (point,) = window_margin_bound(service, 0.0, STEP_S, 0.0, WINDOW_S, (10.0,))
    reachable = sum(r for r in rates if r < 100.0) / sum(rates)
    assert point.slo_attainment == pytest.approx(reachable)
    assert tuned_observed_policy(service, 0.0, STEP_S, 0.0, WINDOW_S, target_slo=0.999) is None


def test_bound_still_reaches_full_attainment_when_every_step_can_be_served() -> None:
    service = _capped_service([5.0] * 30 + [15.0] * 10 + [5.0] * 30, max_replicas=10)
    (point,) = window_margin_bound(service, 0.0, STEP_S, 0.0, WINDOW_S, (4.0,))
    assert point.slo_attainment == 1.0


def test_latency_model_edges_no_replica_no_demand_and_demand_at_capacity() -> None:
    # no demand: no request waits, whatever the replicas (a service scaled to zero meets its SLO)
    assert latency_and_share(0, 0.0, 10.0, 1.0, 0.95, 2.0) == (1.0, 1.0)
    # demand with no replica ready (pods still starting count for nothing): infinite latency, no request served
    assert latency_and_share(0, 5.0, 10.0, 1.0, 0.95, 2.0) == (math.inf, 0.0)
    # demand exactly at capacity: the M/M/c queue is unstable
    assert latency_and_share(3, 30.0, 10.0, 1.0, 0.95, 2.0) == (math.inf, 0.0)
    assert share_within(3, 30.0, 10.0, 1.0, 2.0) == 0.0
    # just under capacity: finite, above the SLO, and some requests still within it
    latency, share = latency_and_share(3, 29.9, 10.0, 1.0, 0.95, 2.0)
    assert 2.0 < latency < math.inf and 0.0 < share < 0.95


def test_replicas_needed_agrees_with_the_simulators_verdict_on_the_step() -> None:
    """The oracle provisions ``replicas_needed``; the engine judges the step with ``latency_and_share``. The two
    compute the same inequality differently (slack vs latency); they must agree, or the oracle misses its SLO."""
    rng = random.Random(40)
    for _ in range(3000):
        throughput = rng.choice([1.0, 2.5, 3.2, rng.uniform(0.1, 20.0)])
        base = rng.choice([0.1, 1.0, rng.uniform(0.0, 3.0)])
        slo = base + rng.choice([0.01, 0.5, 3.0, rng.uniform(0.0, 5.0)])
        quantile = rng.choice([0.5, 0.9, 0.95, 0.99])
        rate = rng.uniform(0.0, 200.0)
        c = replicas_needed(rate, throughput, base, slo, quantile, 0, 100_000)
        assert latency_and_share(c, rate, throughput, base, quantile, slo)[0] <= slo
        if c > 0:
            assert latency_and_share(c - 1, rate, throughput, base, quantile, slo)[0] > slo


def _run(**values: float) -> PolicyRun:
    run = PolicyRun("p")
    for key, value in values.items():
        setattr(run, key, value)
    return run


def test_total_cost_is_burst_money_plus_lost_training_plus_requests_outside_the_slo() -> None:
    """README: burst money + lost training GPU-hours x trainingGpuHourValue + requests outside the SLO / 1,000 x
    sloMissPer1kRequests, where *outside the SLO* is the complement of *requests within SLO* (requests in steps whose
    latency quantile missed), not of the per-request tail estimate."""
    run = _run(
        requests=100_000.0,
        requests_in_slo_steps=98_000.0,
        requests_within_latency=99_500.0,
        burst_cost=12.5,
        lost_training_gpu_seconds=3 * 3600.0,
        gpu_seconds=7200.0,
        minutes=60,
        minutes_within_slo=57,
    )
    report = figures(run, oracle_gpu_hours=1.0, costs=(2.0, 1.5))
    assert report["total_cost"] == pytest.approx(12.5 + 3 * 2.0 + 2_000 / 1000 * 1.5)
    assert report["slo_attainment"] == pytest.approx(0.98)
    assert report["requests_within_latency"] == pytest.approx(0.995)
    assert report["slo_minutes_attainment"] == pytest.approx(57 / 60)
    assert report["gpu_hours_vs_oracle"] == pytest.approx(2.0)


def test_a_run_without_requests_or_oracle_is_reported_without_dividing_by_zero() -> None:
    report = figures(_run(), oracle_gpu_hours=0.0)
    assert report["slo_attainment"] == 1.0 and report["slo_minutes_attainment"] == 1.0
    assert report["gpu_hours_vs_oracle"] is None and report["total_cost"] == 0.0
    assert report["training_gpu_hours"] is None and report["training_jobs_finished"] is None
    table = format_table({"policies": {"p": {**report, "forecast_mae": None, "forecast_pinball": None}}})
    assert "stranded" not in table and "GPU-hours / oracle" in table


def test_capacity_config_hands_the_controller_the_burst_pools_as_the_scenario_bills_them() -> None:
    """The controller's burst arithmetic must price and bound the pools the engine bills: only burst pools, at their
    price per GPU-hour, never below the nodes always present nor above ``maxNodes``; no training block means the
    controller's default 600 s minimum runtime."""
    from autoscaler.sim.scenario import parse_scenario
    from autoscaler.sim.training import capacity_config
    from tests.sim.conftest import scenario_dict

    data = scenario_dict("trace.csv")
    data["nodePools"][1].update({"nodes": 1, "maxNodes": 3, "pricePerGpuHour": 4.5})
    (pool,) = capacity_config(parse_scenario(data)).pools
    assert (pool.name, pool.gpus_per_node, pool.price_per_gpu_hour, pool.boot_s) == ("burst", 8, 4.5, 120.0)
    assert (pool.nodes, pool.min_nodes, pool.max_nodes) == (1, 1, 3)
    assert capacity_config(parse_scenario(data)).training.min_runtime_s == 600.0
