"""Earned headroom (issue 14): a forecasting service runs at its spec's target only once its forecast covered the
demand, and a scale-down accounts for the cold start of coming back."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.decide import ReplicaFloor, decide_service
from autoscaler.core.headroom import HeadroomConfig, HeadroomState, earned_headroom
from autoscaler.core.model import (
    ControllerState,
    ForecastMode,
    ForecastPolicy,
    MetricKind,
    Observation,
    RateKind,
    RatePolicy,
    ScalingRules,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.predictive import ForecastInput, PredictiveSettings, forecast_floor
from autoscaler.core.reasons import Reason
from autoscaler.core.tick import (
    ForecastReadConfig,
    PublishedForecast,
    TickConfig,
    TickInput,
    decide_tick,
    read_forecasts,
)
from forecast.types import Forecast

P99 = ForecastPolicy(ForecastMode.ACTIVE, 0.99)
POLICY = ServicePolicy(
    namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=3.2,
    cold_start_s=90.0, forecast=P99,
)


@pytest.mark.parametrize(
    ("coverage", "scored", "usable", "state", "ratio"),
    [
        (None, 0, True, HeadroomState.LEARNING, 0.75),  # nothing scored yet
        (1.0, 29, True, HeadroomState.LEARNING, 0.75),  # perfect, but too little evidence
        (0.995, 100, True, HeadroomState.EARNED, 1.0),  # misses 0.5 % <= 2.5 x the allowed 1 %
        (0.975, 100, True, HeadroomState.EARNED, 1.0),  # exactly 2.5 x: still full trust
        (0.9625, 100, True, HeadroomState.PARTIAL, 0.875),  # 3.75 x: half way between 2.5 x and 5 x
        (0.95, 100, True, HeadroomState.DEGRADED, 0.75),  # 5 x the allowed misses: no trust
        (0.50, 100, True, HeadroomState.DEGRADED, 0.75),
        (0.999, 500, False, HeadroomState.UNTRUSTED, 0.75),  # stale or unreliable outranks a good coverage
        (math.nan, 100, True, HeadroomState.LEARNING, 0.75),
    ],
)
def test_headroom_is_earned_from_coverage_of_the_provisioned_quantile(
    coverage: float | None, scored: int, usable: bool, state: HeadroomState, ratio: float
) -> None:
    headroom = earned_headroom(POLICY, coverage=coverage, scored=scored, usable=usable, why_unusable="stale")
    assert headroom.state is state
    assert headroom.ratio == pytest.approx(ratio)
    assert headroom.detail  # every state says why


def test_the_miss_allowance_scales_with_the_quantile() -> None:
    p90 = dataclasses.replace(POLICY, forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.9))
    # 80 % coverage: 2 x P90's allowed 10 % misses -> earned; for P99 the same coverage is 20 x -> degraded
    assert earned_headroom(p90, coverage=0.80, scored=100, usable=True).state is HeadroomState.EARNED
    assert earned_headroom(POLICY, coverage=0.80, scored=100, usable=True).state is HeadroomState.DEGRADED


@pytest.mark.parametrize(
    ("quantile", "scored", "state"),
    [
        (0.99, 30, HeadroomState.LEARNING),  # 30 scores of a P99 expect 0.3 misses: no judgement yet
        (0.99, 99, HeadroomState.LEARNING),
        (0.99, 100, HeadroomState.EARNED),  # one allowed miss
        (0.999, 999, HeadroomState.LEARNING),
        (0.999, 1000, HeadroomState.EARNED),
        (0.9, 30, HeadroomState.EARNED),  # min_scored (30) is the larger: P90 allows 3 misses in 30
        (0.9, 29, HeadroomState.LEARNING),
    ],
)
def test_coverage_is_judged_only_on_scores_in_which_the_quantile_allows_a_miss(
    quantile: float, scored: int, state: HeadroomState
) -> None:
    """A P99 judged on 30 scores swung a new service between the full target and the untrusted one: a single miss in
    them is 3.3 x the allowed misses. The coverage is judged once the quantile allows one miss (1 / (1 - q) scores)."""
    policy = dataclasses.replace(POLICY, forecast=ForecastPolicy(ForecastMode.ACTIVE, quantile))
    assert earned_headroom(policy, coverage=1.0, scored=scored, usable=True).state is state


def test_ratio_one_turns_it_off_and_a_config_must_be_ordered() -> None:
    off = dataclasses.replace(POLICY, forecast=dataclasses.replace(P99, untrusted_target_ratio=1.0))
    assert earned_headroom(off, coverage=None, scored=0, usable=False).ratio == 1.0
    with pytest.raises(ValueError):
        HeadroomConfig(full_trust_miss_ratio=3.0, no_trust_miss_ratio=2.0)


def test_the_floor_keeps_the_full_target_only_the_reactive_path_is_cooled() -> None:
    # 24 req/s now, a forecast of 24 at P99: the floor asks 24 / 3.2 = 8, the untrusted reactive path 24 / 2.4 = 10
    learning = PublishedForecast(POLICY.key, ForecastInput(flat_forecast(24.0), 0.0), "flat", 0.99, scored=5,
                                 coverage=1.0, coverage_samples=5)
    plan, _ = decide_tick(tick_at(60.0, 24.0, 8, learning), ControllerState())
    view = plan.forecasts[POLICY.key]
    assert view.floor is not None and view.floor.usable and view.floor.replicas == 8
    assert view.floor.target_ratio == 0.75
    assert plan.decisions[0].desired_replicas == 10 and "vs 2.4 per replica" in plan.decisions[0].detail


# ---- in the tick -----------------------------------------------------------------------------------------------


def flat_forecast(level: float, start: float = 0.0) -> Forecast:
    values = [level] * 30
    return Forecast(start=start, step_s=60.0, quantiles={0.5: values, 0.99: values}, model="flat")


def tick_at(now: float, rate: float, replicas: int, published: PublishedForecast | None) -> TickInput:
    obs = Observation(now, {POLICY.key: ServiceObservation(POLICY.key, replicas, replicas, metric_total=rate)})
    return TickInput(now, obs, ClusterSnapshot(now), {POLICY.key: POLICY}, {POLICY.key: published} if published else {})


def test_a_new_service_runs_at_the_untrusted_target_then_earns_the_spec_target() -> None:
    # 24 req/s: 8 replicas at the spec's 3.2 per replica, 10 at the untrusted 2.4
    plan, _ = decide_tick(tick_at(0.0, 24.0, 8, None), ControllerState())
    assert plan.decisions[0].desired_replicas == 10
    view = plan.forecasts[POLICY.key]
    assert view.headroom is not None and view.headroom.state is HeadroomState.UNTRUSTED
    assert "no forecast fitted yet" in view.headroom.detail

    learning = PublishedForecast(POLICY.key, ForecastInput(flat_forecast(24.0), 0.0), "flat", 0.99, scored=5,
                                 coverage=1.0, coverage_samples=5)
    plan, _ = decide_tick(tick_at(60.0, 24.0, 8, learning), ControllerState())
    assert plan.decisions[0].desired_replicas == 10
    assert plan.forecasts[POLICY.key].headroom.state is HeadroomState.LEARNING  # type: ignore[union-attr]

    earned = dataclasses.replace(learning, scored=200, coverage=0.995, coverage_samples=200)
    plan, _ = decide_tick(tick_at(60.0, 24.0, 8, earned), ControllerState())
    assert plan.decisions[0].desired_replicas == 8
    assert plan.forecasts[POLICY.key].headroom.state is HeadroomState.EARNED  # type: ignore[union-attr]


def test_shadow_mode_and_no_headroom_config_change_nothing() -> None:
    shadow = dataclasses.replace(POLICY, forecast=ForecastPolicy(ForecastMode.SHADOW, 0.99))
    tick = dataclasses.replace(tick_at(0.0, 24.0, 8, None), policies={POLICY.key: shadow})
    plan, _ = decide_tick(tick, ControllerState())
    assert plan.decisions[0].desired_replicas == 8
    assert plan.forecasts[POLICY.key].headroom is None
    off = TickConfig(ForecastReadConfig(headroom=None))
    plan, _ = decide_tick(tick_at(0.0, 24.0, 8, None), ControllerState(), off)
    assert plan.decisions[0].desired_replicas == 8


# ---- scale-down that accounts for the cold start -----------------------------------------------------------------

SETTINGS = PredictiveSettings(rate_per_replica=2.5, quantile=0.99, refit_period_s=3600.0)
RATE_POLICY = dataclasses.replace(POLICY, target=2.5, forecast=P99)


def dip_forecast() -> Forecast:
    """50 req/s for the first minute (from now), 10 req/s from 60 s on: at now + a 90 s lead the demand is low, but
    a replica removed now could not be back before the high minute ends."""
    values = [50.0] + [10.0] * 29
    return Forecast(start=0.0, step_s=60.0, quantiles={0.5: values, 0.99: values}, model="dip")


def test_the_hold_keeps_a_replica_wanted_back_within_the_cold_start() -> None:
    floor = forecast_floor(RATE_POLICY, ForecastInput(dip_forecast(), 0.0), SETTINGS, now=0.0, lead_s=90.0)
    assert floor is not None and floor.usable
    # at now + lead (90 s) the forecast is 10 req/s -> 4 replicas; before that 50 -> 20: hold 20
    assert (floor.replicas, floor.hold) == (4, 20)
    no_window = dataclasses.replace(
        RATE_POLICY, scale_down=dataclasses.replace(RATE_POLICY.scale_down, stabilisation_s=0.0)
    )
    obs = ServiceObservation(POLICY.key, 20, 20, metric_total=10.0)
    decision, _ = decide_service(no_window, obs, ServiceState(), 0.0, floor)
    assert (decision.desired_replicas, decision.reason) == (20, Reason.FORECAST_HOLD)
    # without the cold-start rule the dip is followed down and back up
    blind = dataclasses.replace(SETTINGS, cold_start_aware=False)
    floor = forecast_floor(RATE_POLICY, ForecastInput(dip_forecast(), 0.0), blind, now=0.0, lead_s=90.0)
    decision, _ = decide_service(no_window, obs, ServiceState(), 0.0, floor)
    assert decision.desired_replicas == 4


def test_a_small_forecast_driven_scale_down_is_within_tolerance() -> None:
    no_window = dataclasses.replace(
        RATE_POLICY, scale_down=dataclasses.replace(RATE_POLICY.scale_down, stabilisation_s=0.0)
    )
    forecast = Forecast(start=0.0, step_s=60.0, quantiles={0.5: [47.0] * 30, 0.99: [47.0] * 30}, model="flat")
    floor = forecast_floor(no_window, ForecastInput(forecast, 0.0), SETTINGS, now=0.0, lead_s=90.0)
    assert floor is not None and floor.replicas == 19
    obs = ServiceObservation(POLICY.key, 20, 20, metric_total=40.0)  # reactive wants 16, the forecast 19
    decision, _ = decide_service(no_window, obs, ServiceState(), 0.0, floor)
    assert (decision.desired_replicas, decision.reason) == (20, Reason.WITHIN_TOLERANCE)  # 19 >= 20 x 0.9
    obs = ServiceObservation(POLICY.key, 22, 22, metric_total=40.0)
    decision, _ = decide_service(no_window, obs, ServiceState(), 0.0, floor)
    assert decision.desired_replicas == 19  # 19 < 22 x 0.9: a real drop


def test_without_a_usable_forecast_the_scale_down_window_is_at_least_the_lead() -> None:
    no_window = dataclasses.replace(
        RATE_POLICY, scale_down=dataclasses.replace(RATE_POLICY.scale_down, stabilisation_s=0.0)
    )
    stale = ForecastInput(dip_forecast(), fitted_at=-20_000.0)
    state = ServiceState()
    replicas = []
    for now, rate in ((0.0, 50.0), (15.0, 10.0), (60.0, 10.0), (90.0, 10.0), (120.0, 10.0)):
        floor = forecast_floor(no_window, stale, SETTINGS, now=now, lead_s=90.0)
        assert floor is not None and not floor.usable and floor.down_window_s == 90.0
        obs = ServiceObservation(POLICY.key, 20, 20, metric_total=rate)
        decision, state = decide_service(no_window, obs, state, now, floor)
        replicas.append(decision.desired_replicas)
    # 50 req/s at t=0 wants 20; the drop to 10 (4 replicas) waits until t=0 leaves the 90 s window (upstream's
    # window is (now - window, now]: at t=90 the t=0 recommendation is out); with the spec's 0 s it would go at t=15
    assert replicas == [20, 20, 20, 4, 4]


def test_without_trust_a_scale_down_waits_as_long_as_an_hpa_and_earned_trust_gives_the_spec_window_back() -> None:
    # The spec's window is 60 s; untrusted, a scale-down waits the HPA's 300 s; earned, the spec's 60 s again.
    spec = dataclasses.replace(POLICY, scale_down=dataclasses.replace(POLICY.scale_down, stabilisation_s=60.0))
    untrusted = earned_headroom(spec, coverage=None, scored=0, usable=False, why_unusable="no forecast")
    assert untrusted.down_window_s == 300.0
    half = earned_headroom(spec, coverage=0.9625, scored=100, usable=True)
    assert half.down_window_s == pytest.approx(180.0)  # trust 0.5: half way
    assert earned_headroom(spec, coverage=0.99, scored=100, usable=True).down_window_s == 0.0

    def replicas_over_time(published: PublishedForecast | None) -> list[int]:
        state, seen = ControllerState(), []
        replicas = 10
        for now, rate in ((0.0, 24.0), (15.0, 6.0), (120.0, 6.0), (285.0, 6.0), (300.0, 6.0), (315.0, 6.0)):
            tick = dataclasses.replace(tick_at(now, rate, replicas, published), policies={POLICY.key: spec})
            plan, state = decide_tick(tick, state)
            replicas = plan.decisions[0].desired_replicas
            seen.append(replicas)
        return seen

    # no forecast: 24 req/s at the untrusted 2.4 wants 10; the drop to 6 req/s (3 replicas) waits out 300 s
    assert replicas_over_time(None) == [10, 10, 10, 10, 3, 3]
    # an earned forecast of 6 req/s: the spec's 60 s window applies (3 at 6 / 3.2 -> 2, floor 2, min 1)
    earned = PublishedForecast(POLICY.key, ForecastInput(flat_forecast(6.0), 0.0), "flat", 0.99, scored=200,
                               coverage=0.995, coverage_samples=200)
    seen = replicas_over_time(earned)
    assert seen[:3] == [10, 10, 2]  # the first tick's replicas are its initial recommendation; 60 s later, down


# ---- the contended hold: a GPU given back while lower-priority GPU work waits -----------------------------------


def edge_forecast() -> Forecast:
    """32 req/s in the first minute, 16 req/s from then on, 56 req/s again from minute 20 (the next edge) to the
    forecast's end at minute 30."""
    values = [32.0] + [16.0] * 19 + [56.0] * 10
    return Forecast(start=0.0, step_s=60.0, quantiles={0.5: values, 0.99: values}, model="edge")


def _waiting_pod(priority: int, gpus: int = 8) -> PodInfo:
    return PodInfo("ml", f"trainer-{priority}", None, gpus, priority, "Pending", False, "Job", "trainer")


def _chat(node: str, count: int, first: int, ready_at: float = 0.0) -> tuple[PodInfo, ...]:
    return tuple(PodInfo("ml", f"chat-{first + i}", node, 1, 1000, "Running", True, "Deployment", "chat",
                         ready_at=ready_at) for i in range(count))


# 20 chat replicas on three 8-GPU nodes: n1 and n2 full, n3 with 4 (4 GPUs free). A scale-down deletes in the
# ReplicaSet's order: the most crowded nodes' replicas first (n1's and n2's), the latest ready among them (n1's): the
# 8th replica gone empties n1 for an 8-GPU trainer, a scale-down of 7 or fewer hands it nothing; once it runs there,
# 4 + the replicas given back - 8 GPUs are free for the 18 replicas the next edge needs: not enough
SPREAD = _chat("n1", 8, 0, ready_at=100.0) + _chat("n2", 8, 8) + _chat("n3", 4, 16)
# n1: 5 replicas beside a 3-GPU job (no hole possible), n2: 8, n3: 7 and 1 free: n2's replicas go first (the most
# crowded node) and the 8th empties it; n3's would free a hole after 7, but go only once n2 is empty
SMALL_JOB = PodInfo("ml", "small-job", "n1", 3, 100, "Running", True, "Job", "small")
TIGHT = (*_chat("n1", 5, 0), SMALL_JOB, *_chat("n2", 8, 5), *_chat("n3", 7, 13))


@pytest.mark.parametrize(
    ("case", "placed", "pods", "workloads", "hold_s", "desired", "window_s", "spare_nodes"),
    [
        # demand falls to 16 req/s (5 replicas at 3.2) at now + lead; nothing waits: follow it down as far as the
        # cold start allows (the first minute still needs 32 / 3.2 = 10; the hold reads two lead times, 180 s:
        # a replica the floor would add back within a cold start is kept, stop 47)
        ("nothing waits", SPREAD, (), (), 1800.0, 10, 180, 0),
        # a lower-priority trainer waits for GPUs: the next edge (minute 20, 56 req/s) wants 18 back; the hold
        # reaches the forecast's end (1,800 s), not now + lead + 1,800 s; a scale-down of 7 opens no hole: 13
        ("lower-priority pod pending", SPREAD, (_waiting_pod(100),), (), 1800.0, 13, 1800, 0),
        ("lower-priority workload queued (Kueue)", SPREAD, (),
         (WorkloadInfo("Job", "ml", "t", "job/ml/t", True, 100, (8,), queued=True),), 1800.0, 13, 1800, 0),
        ("lower-priority workload suspended by us", SPREAD, (),
         (WorkloadInfo("Job", "ml", "t", "job/ml/t", True, 100, (8,), suspended_by_us_at=-60.0),), 1800.0, 13, 1800, 0),
        # paused by somebody on purpose: it waits for them, not for capacity
        ("lower-priority workload paused by hand", SPREAD, (),
         (WorkloadInfo("Job", "ml", "t", "job/ml/t", True, 100, (8,)),), 1800.0, 10, 180, 0),
        # up to 7 replicas (n2's) can go without opening a hole: down to 20 - 7 = 13
        ("a small scale-down hands the trainer nothing", TIGHT, (_waiting_pod(100),), (), 1800.0, 13, 1800, 0),
        # an empty spare node: the trainer in the hole still leaves room for the edge's replicas, nothing to hold
        ("the comeback fits elsewhere", SPREAD, (_waiting_pod(100),), (), 1800.0, 10, 180, 1),
        # a higher-priority pod waiting takes the GPUs before anything of ours would: no reason to hold
        ("only higher-priority work waits", SPREAD, (_waiting_pod(5000),), (), 1800.0, 10, 180, 0),
        # a pending pod without GPUs is not waiting for ours, nor one no node could hold (16 GPUs, 8-GPU nodes)
        ("a CPU pod pending", SPREAD, (_waiting_pod(100, gpus=0),), (), 1800.0, 10, 180, 0),
        ("a pod no node can hold", SPREAD, (_waiting_pod(100, gpus=16),), (), 1800.0, 10, 180, 0),
        # the replicas hold no node the trainer could use (all on nodes of another GPU type)
        ("the trainer needs another GPU type", SPREAD,
         (dataclasses.replace(_waiting_pod(100), gpu_product="H100"),), (), 1800.0, 10, 180, 0),
        # 600 s past the lead (690 s) ends before the edge: it needs no more than the cold start's 10
        ("hold shorter than the gap", SPREAD, (_waiting_pod(100),), (), 600.0, 10, 180, 0),
        ("hold off", SPREAD, (_waiting_pod(100),), (), 0.0, 10, 180, 0),
    ],
)
def test_contended_hold(case: str, placed: tuple, pods: tuple, workloads: tuple,  # type: ignore[type-arg]
                        hold_s: float, desired: int, window_s: int, spare_nodes: int) -> None:
    policy = dataclasses.replace(POLICY, scale_down=dataclasses.replace(POLICY.scale_down, stabilisation_s=0.0),
                                 priority=1000)
    earned = PublishedForecast(policy.key, ForecastInput(edge_forecast(), 0.0), "edge", 0.99, scored=200,
                               coverage=0.995, coverage_samples=200)
    tick = tick_at(0.0, 16.0, 20, earned)
    names = ("n1", "n2", "n3", *(f"spare{i}" for i in range(spare_nodes)))
    nodes = tuple(NodeInfo(n, 8, "A100", None, True) for n in names)
    snapshot = ClusterSnapshot(0.0, pods=placed + pods, workloads=workloads, nodes=nodes)
    tick = dataclasses.replace(tick, policies={policy.key: policy}, snapshot=snapshot)
    config = TickConfig(ForecastReadConfig(contended_hold_s=hold_s))
    plan, _ = decide_tick(tick, ControllerState(), config)
    decision = plan.decisions[0]
    assert decision.desired_replicas == desired, (case, decision.detail)
    assert decision.reason is Reason.FORECAST_HOLD, case
    assert f"again within {window_s}s" in decision.detail, (case, decision.detail)


def _started_replicas(cold_start_s: float, count: int = 5) -> tuple[PodInfo, ...]:
    return tuple(
        PodInfo("ml", f"chat-{k}", "n1", 1, 0, "Running", True, "Deployment", "chat", created_at=0.0,
                ready_at=cold_start_s)
        for k in range(count)
    )  # fmt: skip


def test_the_lead_follows_the_snapshot_read_even_when_derived_facts_are_kept_between_ticks() -> None:
    """``read_forecasts`` keeps what it derives from the snapshot's pods and nodes (cold starts, free GPUs) while the
    simulator hands over the same tuples; a re-timed snapshot reuses them, a changed one must not."""
    nodes = (NodeInfo("n1", 8, None, None, True),)
    published = PublishedForecast(POLICY.key, ForecastInput(flat_forecast(10.0), fitted_at=0.0), "flat", 0.99)
    slow = ClusterSnapshot(0.0, pods=_started_replicas(120.0), nodes=nodes)
    leads = []
    for snapshot in (slow, dataclasses.replace(slow, time=15.0), ClusterSnapshot(30.0, pods=_started_replicas(40.0),
                                                                                   nodes=nodes), slow):
        tick = TickInput(snapshot.time, tick_at(snapshot.time, 10.0, 5, None).observation, snapshot,
                         {POLICY.key: POLICY}, {POLICY.key: published})
        leads.append(read_forecasts(tick, ForecastReadConfig())[POLICY.key].lead_s)
    assert leads == [120.0, 120.0, 40.0, 120.0]  # observed p95 cold starts; the configured 90 s would be wrong


# With untrustedTargetRatio 1 (earned headroom off) the state was EARNED whatever the forecast -- none fitted,
# stale, unreliable -- so `autoscaler plan`, status.lastForecast.headroomState and the state gauge called a stale or
# absent forecast earned. The ratio (1.0) and the spec's scale-down window stay; the state says what the forecast is.
def test_headroom_off_keeps_the_full_target_but_reports_the_forecasts_true_state() -> None:
    from autoscaler.core.headroom import HeadroomState, earned_headroom
    from autoscaler.core.model import ForecastMode, ForecastPolicy, MetricKind, ServicePolicy

    off = ServicePolicy(
        "ml", "chat", metric=MetricKind.REQUEST_RATE, target=3.2,
        forecast=ForecastPolicy(ForecastMode.ACTIVE, 0.99, untrusted_target_ratio=1.0),
    )
    cases = {
        HeadroomState.UNTRUSTED: earned_headroom(off, coverage=None, scored=0, usable=False, why_unusable="stale"),
        HeadroomState.LEARNING: earned_headroom(off, coverage=None, scored=0, usable=True),
        HeadroomState.DEGRADED: earned_headroom(off, coverage=0.5, scored=500, usable=True),
        HeadroomState.EARNED: earned_headroom(off, coverage=0.999, scored=500, usable=True),
    }
    for state, headroom in cases.items():
        assert headroom.state is state, headroom
        assert (headroom.ratio, headroom.down_window_s) == (1.0, 0.0), headroom
        assert "untrustedTargetRatio 1" in headroom.detail


# ---- a scale-down window that grows is in force at once --------------------------------------------------------------


@pytest.mark.parametrize("behavior", [True, False])
def test_a_window_grown_by_lost_trust_counts_the_recommendations_made_under_the_shorter_one(behavior: bool) -> None:
    """At full trust the spec's 60 s window applies; the tick trust is lost the window is the HPA's 300 s. Before
    the fix the recommendations were pruned to the 60 s window, so the grown window saw one minute of history and
    the service scaled down at once, as if it still had its forecast's trust."""
    spec = dataclasses.replace(
        POLICY,
        behavior=behavior,
        scale_down=dataclasses.replace(POLICY.scale_down, stabilisation_s=60.0),
    )
    trusted = ReplicaFloor(0, Reason.FORECAST_FLOOR, "flat", hold_window_s=90.0)
    untrusted = ReplicaFloor(0, Reason.FORECAST_UNRELIABLE, "judged unreliable", usable=False, down_window_s=300.0)

    def run(lose_trust_at: float | None) -> list[int]:
        state, replicas, seen = ServiceState(), 10, []
        for now in (15.0 * k for k in range(12)):
            rate = 32.0 if now <= 60.0 else 9.6  # 10 replicas needed, then 3
            floor = untrusted if lose_trust_at is not None and now >= lose_trust_at else trusted
            obs = ServiceObservation(POLICY.key, replicas, replicas, metric_total=rate, request_rate=rate)
            decision, state = decide_service(spec, obs, state, now, floor)
            replicas = decision.desired_replicas
            seen.append(replicas)
        return seen

    kept = run(None)
    first_down = kept.index(3)  # with its trust kept, the 60 s window lets the 10 go
    assert kept[:first_down] == [10] * first_down and first_down >= 8
    # trust lost at that very tick: the 300 s window holds the 10 recommended at 60 s and before
    assert run(15.0 * first_down) == [10] * 12


def test_a_rate_limited_scale_down_stops_when_trust_is_lost() -> None:
    """With a behavior block, one pod per 60 s: at full trust the service steps down from 10 after the 60 s window;
    when trust is lost mid-way the 300 s window (which covers the 10s recommended a few minutes ago) stops it."""
    rules = ScalingRules(stabilisation_s=60.0, policies=(RatePolicy(RateKind.PODS, 1, 60.0),))
    spec = dataclasses.replace(POLICY, scale_down=rules)
    trusted = ReplicaFloor(0, Reason.FORECAST_FLOOR, "flat", hold_window_s=90.0)
    untrusted = ReplicaFloor(0, Reason.FORECAST_UNRELIABLE, "judged unreliable", usable=False, down_window_s=300.0)

    def run(lose_trust_at: float | None) -> list[int]:
        state, replicas, seen = ServiceState(), 10, []
        for now in (15.0 * k for k in range(24)):  # to 345 s
            rate = 32.0 if now <= 60.0 else 9.6
            floor = untrusted if lose_trust_at is not None and now >= lose_trust_at else trusted
            obs = ServiceObservation(POLICY.key, replicas, replicas, metric_total=rate, request_rate=rate)
            decision, state = decide_service(spec, obs, state, now, floor)
            replicas = decision.desired_replicas
            seen.append(replicas)
        return seen

    assert run(None)[-8:] == [7, 7, 7, 7, 6, 6, 6, 6]  # one pod a minute: 9 at 120 s, 8 at 180 s, ...
    # trust lost at 225 s (8 replicas): no step until the 10s recommended at 0-60 s leave the 300 s window (360 s)
    assert run(225.0)[12:] == [8] * 12
