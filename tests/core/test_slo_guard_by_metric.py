"""The SLO guard grows with the latency's overshoot only on a metric that saturates (stop 45).

A busy GPU reads 100 % however many requests wait: the utilisation cannot see the missing capacity, and the latency's
overshoot is the guard's only measure of it. A request rate counts the demand itself, so the metric's recommendation
already asks for what the demand needs; a breach there means those replicas are not all ready yet, and the guard
asks for one ready replica more (doubling the ready replicas at twice the SLO cost up to 12 % more GPU-hours on the
trace matrix for at most a few hundredths of a point of requests within SLO on most rows).
"""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.decide import DEMAND_METRICS, decide_service
from autoscaler.core.model import MetricKind, PodMetrics, ServiceObservation, ServicePolicy, ServiceState
from autoscaler.core.reasons import Reason

GPU = ServicePolicy(namespace="ml", name="chat", min_replicas=1, max_replicas=40, target=70.0, latency_slo_s=4.0)
RATE = dataclasses.replace(GPU, metric=MetricKind.REQUEST_RATE, target=2.5)
QUEUE = dataclasses.replace(GPU, metric=MetricKind.QUEUE_DEPTH, target=2.0)


def observe(
    policy: ServicePolicy, spec: int, ready: int, latency_s: float, *, per_replica: float, stale: bool = False
) -> ServiceObservation:
    """``spec`` replicas of which ``ready`` are ready; each ready one reports ``per_replica`` of the policy's metric
    (the request rate and queue depth as the service-wide total over the created pods)."""
    reasons = (f"{policy.metric.value}: sample 900 s old",) if stale else ()
    if policy.metric in (MetricKind.GPU_UTILIZATION, MetricKind.ENGINE_ACTIVE):
        pods = None if stale else PodMetrics(ready, per_replica * ready, unready=spec - ready)
        return ServiceObservation("ml/chat", spec, ready, pods=pods, latency_s=latency_s, stale_reasons=reasons)
    total = None if stale else per_replica * spec
    return ServiceObservation("ml/chat", spec, ready, metric_total=total, latency_s=latency_s, stale_reasons=reasons)


@pytest.mark.parametrize(
    ("name", "policy", "spec", "ready", "latency_s", "per_replica", "stale", "desired", "reason"),
    [
        # A saturated GPU (100 % on each of 6) says 9 (ceil(6 x 100 / 70)); latency at twice the SLO doubles the 6
        # ready: 12, the overshoot being the only measure of what waits.
        ("gpu, all ready", GPU, 6, 6, 8.0, 100.0, False, 12, Reason.SLO_BREACH),
        # Pods starting are counted as capacity on its way for every metric: growth is from the 6 ready.
        ("gpu, 2 starting", GPU, 8, 6, 8.0, 100.0, False, 12, Reason.SLO_BREACH),
        # The overshoot is capped at x2 per tick.
        ("gpu, capped", GPU, 6, 6, 40.0, 100.0, False, 12, Reason.SLO_BREACH),
        # A stale utilisation still lets a fresh breach add capacity, in proportion.
        ("gpu, metric stale", GPU, 6, 6, 8.0, 100.0, True, 12, Reason.SLO_BREACH),
        # Request rate on target (2.5 a replica on 6): the metric holds; the breach asks for one more ready replica.
        ("rate, all ready, on target", RATE, 6, 6, 8.0, 2.5, False, 7, Reason.SLO_BREACH),
        # 2 of the 8 the metric asked for are still starting: they are the answer to the breach (upstream's
        # external-metric ratio over the 8 created pods is 1: within the tolerance). Not 12 (6 ready doubled).
        ("rate, 2 starting", RATE, 8, 6, 8.0, 2.5, False, 8, Reason.WITHIN_TOLERANCE),
        # One starting of 7: ready + 1 = 7 = the spec: held, nothing more.
        ("rate, 1 starting", RATE, 7, 6, 8.0, 2.5, False, 7, Reason.WITHIN_TOLERANCE),
        # The rate says more than ready + 1 (3.75 a replica on 6: 9): the metric decides, the guard adds nothing.
        ("rate, metric above", RATE, 6, 6, 8.0, 3.75, False, 9, Reason.METRIC_ABOVE_TARGET),
        # A stale rate and a fresh breach: one more ready replica (nothing removed, nothing doubled).
        ("rate, metric stale", RATE, 6, 6, 8.0, 2.5, True, 7, Reason.SLO_BREACH),
        ("rate, stale, 2 starting", RATE, 8, 6, 8.0, 2.5, True, 8, Reason.SLO_BREACH),
        # Latency within the SLO: the guard says nothing (the metric's answer, within the tolerance).
        ("rate, within SLO", RATE, 6, 6, 3.9, 2.5, False, 6, Reason.WITHIN_TOLERANCE),
        # A queue depth counts waiting requests, not the demand: it keeps the proportional growth.
        ("queue, all ready", QUEUE, 6, 6, 8.0, 2.0, False, 12, Reason.SLO_BREACH),
    ],
)
def test_slo_guard_by_metric(
    name: str,
    policy: ServicePolicy,
    spec: int,
    ready: int,
    latency_s: float,
    per_replica: float,
    stale: bool,
    desired: int,
    reason: Reason,
) -> None:
    obs = observe(policy, spec, ready, latency_s, per_replica=per_replica, stale=stale)
    decision, _ = decide_service(policy, obs, ServiceState(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (desired, reason), (name, decision.detail)
    if reason is Reason.SLO_BREACH:
        assert f"with {ready} ready" in decision.detail
        assert ("counts the demand" in decision.detail) == (policy.metric in DEMAND_METRICS), decision.detail


def test_only_the_request_rate_counts_the_demand() -> None:
    assert frozenset({MetricKind.REQUEST_RATE}) == DEMAND_METRICS


def test_a_breach_through_a_cold_start_adds_one_replica_per_ready_step() -> None:
    """Multi-tick: a request-rate service at 6 whose demand jumps to 8 replicas' worth while latency stays above the
    SLO for the whole cold start (4 ticks). The metric asks for 8 at once; the guard adds nothing while they start,
    and once all 8 are ready and latency still breaches (a target set above what a replica serves), one more per
    tick whose pods are ready -- never the 12 or 16 that doubling the ready replicas asked for."""
    state = ServiceState()
    spec, ready = 6, 6
    starting: list[int] = []  # tick at which each starting pod turns ready
    seen = []
    for tick in range(12):
        ready += sum(1 for t in starting if t == tick)
        starting = [t for t in starting if t > tick]
        obs = observe(RATE, spec, ready, 8.0, per_replica=20.0 / spec)  # 20 req/s over the created pods: 8 at 2.5
        decision, state = decide_service(RATE, obs, state, tick * 15.0)
        added = decision.desired_replicas - spec
        assert added >= 0
        starting += [tick + 4] * added
        spec = decision.desired_replicas
        seen.append((spec, ready))
    specs = [s for s, _ in seen]
    assert specs[0] == 8  # the metric, at once
    assert max(specs) <= 10, seen  # not 12 (6 ready doubled), not compounding
    # while pods start, nothing is added on top of them
    assert specs[1:4] == [8, 8, 8], seen
    # all 8 ready at tick 4 and latency still above the SLO: one more ready replica, then again once it is ready
    assert specs[4] == 9, seen
    assert specs[5:8] == [9, 9, 9], seen
    assert specs[8] == 10, seen
