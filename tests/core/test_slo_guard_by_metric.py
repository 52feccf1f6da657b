"""The SLO guard grows with the latency's overshoot on every metric, a request rate included (stop 45).

The default request counter counts finished requests: in an overload it saturates at what the ready replicas serve,
as a busy GPU's utilisation saturates at 100 %, and the latency's overshoot is the only measure of what waits. A
version that added one ready replica per breach on a request rate was measured (7 of the trace matrix's 30 rows
instead of 4, with the simulator's arrival-rate metric) and reverted: against a finished-request rate it adds one
replica per cold start to a service twice over capacity.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.decide import decide_service
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
        # ready: 12.
        ("gpu, all ready", GPU, 6, 6, 8.0, 100.0, False, 12, Reason.SLO_BREACH),
        # Pods starting are capacity on its way: growth is from the 6 ready, not the 8 asked for.
        ("gpu, 2 starting", GPU, 8, 6, 8.0, 100.0, False, 12, Reason.SLO_BREACH),
        # The overshoot is capped at x2 per tick.
        ("gpu, capped", GPU, 6, 6, 40.0, 100.0, False, 12, Reason.SLO_BREACH),
        # A stale utilisation still lets a fresh breach add capacity, in proportion.
        ("gpu, metric stale", GPU, 6, 6, 8.0, 100.0, True, 12, Reason.SLO_BREACH),
        # Finished requests on target (2.5 a replica on 6, all they serve) while more wait: the metric holds, the
        # overshoot doubles the ready replicas.
        ("rate, saturated on target", RATE, 6, 6, 8.0, 2.5, False, 12, Reason.SLO_BREACH),
        ("rate, 2 starting", RATE, 8, 6, 8.0, 2.5, False, 12, Reason.SLO_BREACH),
        # A rate that asks for more than the overshoot does: the metric decides.
        ("rate, metric above", RATE, 6, 6, 5.0, 5.0, False, 12, Reason.METRIC_ABOVE_TARGET),
        ("rate, metric stale", RATE, 6, 6, 8.0, 2.5, True, 12, Reason.SLO_BREACH),
        # Latency just over the SLO: at least one more ready replica.
        ("rate, just over", RATE, 6, 6, 4.1, 2.5, False, 7, Reason.SLO_BREACH),
        # Latency within the SLO: the guard says nothing (the metric's answer, within the tolerance).
        ("rate, within SLO", RATE, 6, 6, 3.9, 2.5, False, 6, Reason.WITHIN_TOLERANCE),
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
