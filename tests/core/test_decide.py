"""decide(): guard-rails and multi-tick stabilisation scenarios."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.core.decide import ReplicaFloor, decide, decide_service
from autoscaler.core.model import (
    ControllerState,
    MetricKind,
    Mode,
    Observation,
    PodMetrics,
    ScaleDeployment,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.reasons import Reason

POLICY = ServicePolicy(namespace="ml", name="chat", min_replicas=1, max_replicas=20, target=70.0)


def gpu_obs(replicas: int, util: float, **kw: object) -> ServiceObservation:
    fields: dict[str, object] = {
        "key": "ml/chat",
        "spec_replicas": replicas,
        "ready_replicas": replicas,
        "pods": PodMetrics(replicas, util * replicas),
    }
    fields.update(kw)
    return ServiceObservation(**fields)  # type: ignore[arg-type]


def run_ticks(policy: ServicePolicy, utils: list[float], start_replicas: int, step: float = 15.0) -> list[int]:
    """Apply each tick's decision as if the Deployment followed instantly; returns replicas after each tick."""
    state = ServiceState()
    replicas = start_replicas
    seen = []
    for tick, util in enumerate(utils):
        decision, state = decide_service(policy, gpu_obs(replicas, util), state, tick * step)
        replicas = decision.desired_replicas
        seen.append(replicas)
    return seen


def test_hpa_formula_scales_up_immediately_within_rate_limit() -> None:
    # 140 % of target on 2 replicas -> 4 replicas (HPA: ceil(2 * 140/70))
    decision, _ = decide_service(POLICY, gpu_obs(2, 98.0), ServiceState(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (3, Reason.METRIC_ABOVE_TARGET)
    decision, _ = decide_service(POLICY, gpu_obs(2, 100.0 * 1.0), ServiceState(), 0.0)
    assert decision.desired_replicas == 3  # ceil(2 * 100/70) = 3


def test_scale_up_is_rate_limited_per_period() -> None:
    # demand for 40 replicas from 2: max(2+4, 2*2)=6, then 12, then 20 (maxReplicas)
    replicas = run_ticks(POLICY, [100.0 * 20] * 1 + [100.0] * 0, 2)
    assert replicas == [6]
    policy = dataclasses.replace(POLICY, max_replicas=100)
    seen = []
    state = ServiceState()
    current = 2
    for tick in range(4):
        decision, state = decide_service(policy, gpu_obs(current, 100.0 * 40 / current * 0.7), state, tick * 15.0)
        current = decision.desired_replicas
        seen.append((current, decision.reason))
    assert [r for r, _ in seen] == [6, 12, 24, 40]
    assert seen[0][1] is Reason.SCALE_UP_RATE_LIMITED
    assert seen[-1][1] is Reason.METRIC_ABOVE_TARGET


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    # 10 replicas at target, then load drops to a third: the HPA holds for 300 s, then scales down at once.
    utils = [70.0] * 4 + [70.0 / 3] * 30
    replicas = run_ticks(POLICY, utils, 10)
    drop_tick = 4
    held = replicas[drop_tick : drop_tick + 19]
    assert all(r == 10 for r in held), held  # ticks 4..22 are within 300 s of the last recommendation of 10 (tick 3)
    first_down = next(i for i, r in enumerate(replicas) if r < 10)
    assert first_down * 15.0 - 3 * 15.0 >= 300.0  # the last "10" recommendation was at tick 3
    assert replicas[-1] == 4  # ceil(10 * (70/3) / 70)


def test_scale_down_stabilised_reason_and_detail() -> None:
    state = ServiceState(recommendations=((0.0, 10),))
    decision, _ = decide_service(POLICY, gpu_obs(10, 20.0), state, 60.0)
    assert decision.desired_replicas == 10
    assert decision.reason is Reason.SCALE_DOWN_STABILISED
    assert "stabilised at 10" in decision.detail


@pytest.mark.parametrize(
    ("obs", "why"),
    [
        (gpu_obs(5, 10.0, pods=None), "no samples"),
        (gpu_obs(5, 10.0, pods=PodMetrics(0, 0.0, missing=5)), "no ready pod"),
        (gpu_obs(5, 10.0, stale_reasons=("gpu_utilization: sample 900 s old",)), "900 s old"),
        (gpu_obs(5, 10.0, pods=PodMetrics(5, float("nan"))), "invalid"),
        (gpu_obs(5, 10.0, pods=PodMetrics(5, float("inf"))), "invalid"),
    ],
)
def test_stale_or_missing_metrics_hold_never_zero(obs: ServiceObservation, why: str) -> None:
    decision, state = decide_service(POLICY, obs, ServiceState(), 0.0)
    assert decision.desired_replicas == 5
    assert decision.reason is Reason.METRICS_STALE
    assert why in decision.detail
    assert state == ServiceState(((0.0, 5),))  # a stale tick leaves no recommendation but upstream's initial one


SLO_POLICY = dataclasses.replace(POLICY, latency_slo_s=1.0)
NO_LATENCY = ("latency: no series for ml/chat",)
ONE_POD_MISSING = ("gpu_utilization: 1 of 6 ready pods without a valid sample",)


@pytest.mark.parametrize(
    ("policy", "obs", "desired", "reason"),
    [
        # k of n pods reported, low: the HPA rule (missing = 100 %) still recommends 3; partial data removes nothing
        (
            POLICY,
            gpu_obs(6, 10.0, pods=PodMetrics(5, 50.0, missing=1), partial_reasons=ONE_POD_MISSING),
            6,
            Reason.METRICS_PARTIAL,
        ),
        # only 1 of 6 reported: the HPA itself would hold (direction flips); the reason says why
        (
            POLICY,
            gpu_obs(6, 10.0, pods=PodMetrics(1, 10.0, missing=5), partial_reasons=ONE_POD_MISSING),
            6,
            Reason.METRICS_PARTIAL,
        ),
        # busy on 5 of 6: a scale-up on the fresh part goes (missing = idle on a scale-up): ceil(6 * 500/420) = 8
        (
            POLICY,
            gpu_obs(6, 100.0, pods=PodMetrics(5, 500.0, missing=1), partial_reasons=ONE_POD_MISSING),
            8,
            Reason.METRIC_ABOVE_TARGET,
        ),
        # the guard's latency missing: a scale-up on a fresh scaling metric is not frozen (issue 17, defect 2)...
        (SLO_POLICY, gpu_obs(2, 100.0, partial_reasons=NO_LATENCY), 3, Reason.METRIC_ABOVE_TARGET),
        # ... but what it guards, a scale-down, is
        (SLO_POLICY, gpu_obs(6, 10.0, partial_reasons=NO_LATENCY), 6, Reason.METRICS_PARTIAL),
        (SLO_POLICY, gpu_obs(6, 70.0, partial_reasons=NO_LATENCY), 6, Reason.METRICS_PARTIAL),
        # a stale scaling metric still holds, partial or not
        (SLO_POLICY, gpu_obs(6, 100.0, pods=None, partial_reasons=NO_LATENCY), 6, Reason.METRICS_STALE),
    ],
)
def test_partial_data_forbids_only_a_scale_down(
    policy: ServicePolicy, obs: ServiceObservation, desired: int, reason: Reason
) -> None:
    decision, state = decide_service(policy, obs, ServiceState(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (desired, reason), decision.detail
    if desired <= obs.spec_replicas:  # a hold on partial data leaves no recommendation but upstream's initial one
        assert state == ServiceState(((0.0, obs.spec_replicas),))
    if reason is Reason.METRICS_PARTIAL:
        assert obs.partial_reasons[0] in decision.detail


def test_partial_then_complete_data_scales_down_on_the_complete_data_only() -> None:
    """Multi-tick: 4 ticks of a partial answer (5 of 6 pods, low), then complete data, low: no scale-down while the
    data is partial, and the partial ticks left nothing in the stabilisation window to hold the complete data up."""
    policy = dataclasses.replace(POLICY, scale_down=dataclasses.replace(POLICY.scale_down, stabilisation_s=60.0))
    state, replicas, seen = ServiceState(), 6, []
    for tick in range(12):
        if tick < 4:
            obs = gpu_obs(
                replicas,
                10.0,
                pods=PodMetrics(replicas - 1, 10.0 * (replicas - 1), missing=1),
                partial_reasons=ONE_POD_MISSING,
            )
        else:
            obs = gpu_obs(replicas, 10.0)
        decision, state = decide_service(policy, obs, state, tick * 15.0)
        replicas = decision.desired_replicas
        seen.append(replicas)
    # ticks 0-3 partial: 6. Tick 4 (t=60) is the first complete one; its own recommendation (1) is the window's only
    # entry, so the scale-down happens at once (the rate policy allows it). Ticks after stay at 1.
    assert seen[:4] == [6, 6, 6, 6]
    assert seen[4] < 6 and seen[-1] == 1


def test_stale_request_rate_total_holds() -> None:
    policy = dataclasses.replace(POLICY, metric=MetricKind.REQUEST_RATE, target=5.0)
    obs = ServiceObservation("ml/chat", 4, 4, metric_total=None, stale_reasons=("request_rate: empty result",))
    decision, _ = decide_service(policy, obs, ServiceState(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (4, Reason.METRICS_STALE)


def test_slo_guard_scales_up_when_metric_is_on_target() -> None:
    policy = dataclasses.replace(POLICY, latency_slo_s=1.0)
    decision, _ = decide_service(policy, gpu_obs(4, 70.0, latency_s=1.5), ServiceState(), 0.0)
    assert decision.reason is Reason.SLO_BREACH
    assert decision.desired_replicas == 6  # ceil(4 * 1.5)


def test_slo_guard_blocks_scale_down_and_works_on_stale_metric() -> None:
    policy = dataclasses.replace(POLICY, latency_slo_s=1.0)
    decision, _ = decide_service(policy, gpu_obs(4, 10.0, latency_s=1.2), ServiceState(), 0.0)
    assert decision.desired_replicas >= 5
    stale = gpu_obs(4, 10.0, pods=None, latency_s=3.0)
    decision, _ = decide_service(policy, stale, ServiceState(), 0.0)
    assert decision.reason is Reason.SLO_BREACH
    assert decision.desired_replicas == 8  # bounded by slo_guard_max_factor 2


def test_latency_below_slo_does_nothing() -> None:
    policy = dataclasses.replace(POLICY, latency_slo_s=1.0)
    decision, _ = decide_service(policy, gpu_obs(4, 70.0, latency_s=0.5), ServiceState(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (4, Reason.WITHIN_TOLERANCE)


def test_min_max_and_scaled_to_zero() -> None:
    assert decide_service(POLICY, gpu_obs(0, 0.0), ServiceState(), 0.0)[0].reason is Reason.SCALING_DISABLED
    assert decide_service(POLICY, gpu_obs(25, 70.0), ServiceState(), 0.0)[0].desired_replicas == 20
    policy = dataclasses.replace(POLICY, min_replicas=3)
    warm = ServiceState(((-1000.0, 3),))  # past the scale-down window
    decision, _ = decide_service(policy, gpu_obs(3, 5.0), warm, 0.0)
    assert (decision.desired_replicas, decision.reason) == (3, Reason.AT_MIN_REPLICAS)
    decision, _ = decide_service(POLICY, gpu_obs(18, 100.0), ServiceState(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (20, Reason.AT_MAX_REPLICAS)


def test_forecast_floor_raises_but_shadow_only_reports() -> None:
    floor = ReplicaFloor(9, Reason.FORECAST_FLOOR, "forecast 45 req/s at now+90s")
    decision, _ = decide_service(POLICY, gpu_obs(4, 70.0), ServiceState(), 0.0, floor)
    assert (decision.desired_replicas, decision.reason) == (8, Reason.SCALE_UP_RATE_LIMITED)
    decision, _ = decide_service(POLICY, gpu_obs(8, 70.0), ServiceState(), 0.0, floor)
    assert (decision.desired_replicas, decision.reason) == (9, Reason.FORECAST_FLOOR)
    shadow = dataclasses.replace(floor, shadow=True)
    decision, _ = decide_service(POLICY, gpu_obs(4, 70.0), ServiceState(), 0.0, shadow)
    assert decision.desired_replicas == 4 and "shadow forecast floor 9" in decision.detail


def test_decide_builds_actions_only_for_active_services() -> None:
    passive = ServicePolicy(namespace="ml", name="embed", target=70.0, mode=Mode.RECOMMEND_ONLY)
    observation = Observation(
        time=0.0,
        services={
            "ml/chat": gpu_obs(2, 140.0),
            "ml/embed": dataclasses.replace(gpu_obs(2, 140.0), key="ml/embed"),
        },
    )
    plan, state = decide(observation, ControllerState(), {"ml/chat": POLICY, "ml/embed": passive}, 0.0)
    assert [d.key for d in plan.decisions] == ["ml/chat", "ml/embed"]
    assert all(d.desired_replicas == 4 for d in plan.decisions)
    assert plan.actions == (ScaleDeployment("ml", "chat", 4, 2, Reason.METRIC_ABOVE_TARGET, plan.decisions[0].detail),)
    assert plan.decisions[1].recommend_only
    assert state.services["ml/embed"].scale_events == ()  # nothing applied, so no rate-limit debt
    assert state.services["ml/chat"].scale_events == ((0.0, 2),)


def test_missing_observation_is_a_hold_without_action() -> None:
    plan, _ = decide(Observation(0.0, {}), ControllerState(), {"ml/chat": POLICY}, 0.0)
    assert plan.actions == ()
    assert plan.decisions[0].reason is Reason.METRICS_STALE


def test_restart_with_a_warm_service_does_not_scale_down_inside_the_window() -> None:
    """Issue 16: 10 ticks on target at 6 replicas, then the controller restarts (its state is lost) and the load
    drops to 10 %: upstream's initial recommendation holds 6 for one whole scale-down window (300 s) after the
    restart, then the scale-down goes. Without the seed a restarted controller scaled 6 -> 1 at its first tick."""
    state, replicas, now = ServiceState(), 6, 0.0
    for _ in range(10):
        decision, state = decide_service(POLICY, gpu_obs(replicas, 70.0), state, now)
        replicas, now = decision.desired_replicas, now + 15.0
    assert replicas == 6
    restart = now
    state = ServiceState()  # a new process
    seen = []
    while now <= restart + 330:
        decision, state = decide_service(POLICY, gpu_obs(replicas, 10.0), state, now)
        replicas = decision.desired_replicas
        seen.append((now - restart, replicas))
        now += 15.0
    assert all(r == 6 for t, r in seen if t < 300), seen  # the seed leaves the window at exactly 300 s
    assert seen[-1][1] < 6, seen


@pytest.mark.parametrize(
    ("current", "util", "behavior", "expected"),
    [
        # no behavior block: at most max(2 x current, 4) per sync; with the defaulted block max(current + 4, 2 x)
        (1, 1000.0, False, 4),
        (2, 1000.0, False, 4),
        (3, 1000.0, False, 6),
        (1, 1000.0, True, 5),
        (2, 1000.0, True, 6),
        (3, 1000.0, True, 7),
    ],
)
def test_scale_up_cap_with_and_without_a_behavior_block(
    current: int, util: float, behavior: bool, expected: int
) -> None:
    policy = dataclasses.replace(POLICY, behavior=behavior)
    decision, _ = decide_service(policy, gpu_obs(current, util), ServiceState(), 0.0)
    assert decision.desired_replicas == expected, decision.detail


def test_without_a_behavior_block_the_window_maximum_wins_and_there_is_no_rate_limit() -> None:
    policy = dataclasses.replace(POLICY, behavior=False)
    history = ServiceState(((0.0, 9), (100.0, 4)))
    decision, _ = decide_service(policy, gpu_obs(10, 7.0), history, 250.0)  # wants 1; the window's max is 9
    assert (decision.desired_replicas, decision.reason) == (9, Reason.SCALE_DOWN_STABILISED)
    decision, _ = decide_service(policy, gpu_obs(10, 7.0), history, 350.0)  # (0, 9) left the window: 4
    assert decision.desired_replicas == 4
    decision, _ = decide_service(policy, gpu_obs(10, 7.0), ServiceState(((-400.0, 10),)), 0.0)
    assert decision.desired_replicas == 1  # 10 -> 1 in one sync: no scale-down rate policy without behavior


def test_whole_percent_is_exact_where_the_float_mean_is_not() -> None:
    """90.6, 88.3, 80.9 and 88.2 average 87 exactly, as a float 86.99999999999999; upstream's integer arithmetic
    gives 87, and 87 against a target of 87 holds."""
    from autoscaler.core import hpa

    pods = PodMetrics(4, 90.6 + 88.3 + 80.9 + 88.2)
    replicas, ratio = hpa.replicas_for_pod_metric(4, pods, 87.0, 0.0, 0.0, whole_percent=True)
    assert (replicas, ratio) == (4, 1.0)


def test_a_missing_pod_counts_as_its_target_above_100_percent() -> None:
    """Upstream's fallback for a missing utilisation sample on a scale-down is max(100 %, target)."""
    from autoscaler.core import hpa

    # 3 ready pods at 60 % of a 150 % target, 1 missing: (180 + 150) / 4 = 82.5 % -> ratio 0.55 -> ceil(2.2) = 3
    pods = PodMetrics(3, 180.0, missing=1)
    assert hpa.replicas_for_pod_metric(4, pods, 150.0, missing_value_on_scale_down=max(100.0, 150.0))[0] == 3
    # with a fixed 100 % instead it would be (180 + 100) / 4 = 70 % -> ratio 0.47 -> ceil(1.87) = 2
    assert hpa.replicas_for_pod_metric(4, pods, 150.0, missing_value_on_scale_down=100.0)[0] == 2
