"""The per-service decision on odd inputs (review findings of stop 28): a wall clock stepped back, metrics large
enough to overflow a replica count, and the scale event of a min/max clamp."""

from __future__ import annotations

from autoscaler.core.decide import decide, decide_service
from autoscaler.core.model import (
    ControllerState,
    MetricKind,
    Observation,
    PodMetrics,
    RateKind,
    RatePolicy,
    ScalingRules,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.reasons import Reason

POLICY = ServicePolicy(namespace="ml", name="chat", min_replicas=1, max_replicas=40, target=70.0)


def obs(replicas: int, util: float) -> ServiceObservation:
    return ServiceObservation("ml/chat", replicas, replicas, PodMetrics(replicas, util * replicas))


def test_a_clock_stepped_back_does_not_freeze_scale_ups_for_the_length_of_the_step() -> None:
    """Entries "in the future" sat in every window until the wall clock caught up (600 s here): a 0 s scale-up
    window stayed capped at the old recommendation and the old event counted against every rate period. They are
    taken as made now: one rate period counts the last scale-up, then scale-ups go on."""
    d1, state = decide_service(POLICY, obs(2, 200.0), ServiceState(), 1000.0)
    assert d1.desired_replicas == 6
    d2, state = decide_service(POLICY, obs(6, 200.0), state, 415.0)  # 15 s later; NTP stepped back 600 s
    assert d2.reason is not Reason.SCALE_UP_STABILISED, d2  # no cap at the old recommendation
    assert all(t <= 415.0 for t, _ in (*state.recommendations, *state.scale_events))
    d3, _ = decide_service(POLICY, obs(6, 200.0), state, 430.0)  # one 15 s period on
    assert d3.desired_replicas > 6, d3  # was frozen at 6 until the clock passed 1000 again


def _one(policy: ServicePolicy, observation: ServiceObservation) -> int:
    plan, _ = decide(Observation(0.0, {"ml/chat": observation}), ControllerState(), {"ml/chat": policy}, 0.0)
    return plan.decisions[0].desired_replicas


def test_a_huge_but_finite_metric_scales_to_the_limit_instead_of_losing_the_tick() -> None:
    # 1e308 / 0.5 is inf: math.ceil(inf) raised OverflowError out of decide(), for every service of the tick
    rate = ServicePolicy(namespace="ml", name="chat", metric=MetricKind.REQUEST_RATE, target=0.5, max_replicas=10)
    engine = ServicePolicy(namespace="ml", name="chat", metric=MetricKind.ENGINE_ACTIVE, target=0.5, max_replicas=10)
    assert _one(rate, ServiceObservation("ml/chat", 4, 4, metric_total=1e308)) == 8  # +100 % per 15 s, toward max
    assert _one(engine, ServiceObservation("ml/chat", 4, 4, pods=PodMetrics(4, 1e308))) == 8


def test_a_min_clamp_counts_against_the_next_periods_scale_up_rate() -> None:
    """Upstream stores the scale event of a min/max clamp too (``storeScaleEvent`` after every rescale)."""
    up = ScalingRules(stabilisation_s=0.0, policies=(RatePolicy(RateKind.PODS, 2, 60.0),))
    policy = ServicePolicy(namespace="ml", name="chat", min_replicas=5, max_replicas=50, target=70.0, scale_up=up)
    d1, state = decide_service(policy, obs(2, 70.0), ServiceState(), 0.0)
    assert d1.desired_replicas == 5 and state.scale_events == ((0.0, 3),)
    d2, _ = decide_service(policy, obs(5, 140.0), state, 15.0)
    assert d2.desired_replicas == 5, d2  # the period started at 2: 2 + 2 = 4 allowed, below the current 5


# One policy whose target is absurd for the arithmetic (5e-324 req/s per replica with an untrusted-target ratio of
# 0.5 underflows to 0.0) raised ZeroDivisionError out of ``decide``: the tick decided for no service at all, so one
# malformed policy stopped every other service from being scaled. Now that service holds and says why.
def test_one_service_whose_decision_fails_holds_and_the_others_are_decided() -> None:
    from autoscaler.core.model import MetricKind, Observation, ServiceObservation, ServicePolicy

    broken = ServicePolicy("ml", "tiny", max_replicas=10, metric=MetricKind.REQUEST_RATE, target=5e-324 * 0.5)
    busy = ServicePolicy("ml", "chat", max_replicas=10, metric=MetricKind.REQUEST_RATE, target=10.0)
    observation = Observation(
        1000.0,
        {
            broken.key: ServiceObservation(broken.key, 3, 3, metric_total=5.0, request_rate=5.0),
            busy.key: ServiceObservation(busy.key, 2, 2, metric_total=40.0, request_rate=40.0),
        },
    )
    from autoscaler.core.model import ControllerState

    before = ControllerState({broken.key: ServiceState(((900.0, 3),))})
    plan, state = decide(observation, before, {broken.key: broken, busy.key: busy}, 1000.0)
    by_key = {d.key: d for d in plan.decisions}
    assert by_key[busy.key].desired_replicas == 4 and by_key[busy.key].reason is Reason.METRIC_ABOVE_TARGET
    held = by_key[broken.key]
    assert (held.current_replicas, held.desired_replicas, held.reason) == (3, 3, Reason.DECISION_FAILED)
    assert "ZeroDivisionError" in held.detail
    assert [a.name for a in plan.actions] == ["chat"]
    assert state.services[broken.key] == before.services[broken.key]  # its history is kept as it was
