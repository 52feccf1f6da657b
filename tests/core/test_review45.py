"""Review 45: the request-rate SLO guard (9f372b9) and the waited-out forecast shortfall (ad1d152).

Findings first (each a failing test before its fix, or a strict xfail where it is left for a decision), then the
behaviour checked and found right, pinned.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo
from autoscaler.core.decide import decide_service
from autoscaler.core.model import (
    CapacityState,
    MetricKind,
    ScaleDecision,
    ScaleNodePool,
    ServiceObservation,
    ServicePolicy,
    ServiceState,
)
from autoscaler.core.reasons import Reason
from tests.core.test_arbitrate import NOW, POOL, full_cluster, gang_pods, job, node, replica
from tests.core.test_arbitrate_wait_out import RATE_CHAT, RISK_10, acted, flat, over_slo_handed

SEARCH = replace(RATE_CHAT, name="search", priority=500)
BURST_ONLY = CapacityConfig(pools=(POOL,), preempt=False)


def chat_decision(current: int, desired: int, reason: Reason = Reason.FORECAST_FLOOR) -> ScaleDecision:
    return ScaleDecision(RATE_CHAT.key, current, desired, reason, "")


def chosen(report, service: str):  # type: ignore[no-untyped-def]
    [option] = [o for o in report.options if o.chosen and o.service == service]
    return option


# ---- Finding 1: a forecast that does not vouch for the shortfall is the metric's demand --------------------------


@pytest.mark.parametrize("config", [RISK_10, BURST_ONLY], ids=["preempt", "burst"])
def test_a_shortfall_the_forecast_does_not_vouch_for_is_not_waited_out(config: CapacityConfig) -> None:
    """The forecast fits the 8 replicas from now + lead (420 s: cold start + a node's boot) on, but the metric asks
    for 9 now: ``_duration`` says "forecast" with the lead as the duration and does not vouch for it -- the replicas
    are the metric's demand, already here, which the commit meant to act on as before. Costed over the lead alone
    (1 GPU x 420 s), every such tick looked cheaper to wait, and the next tick again the same 420 s: waited out
    for as long as the metric asks, however long that is."""
    forecasts = {RATE_CHAT.key: (flat(8.0), 0.99, 420.0)}
    arb = ArbitrationInput(
        NOW, full_cluster(), {RATE_CHAT.key: RATE_CHAT}, [chat_decision(8, 9, Reason.METRIC_ABOVE_TARGET)], forecasts
    )
    actions, report, _ = arbitrate(arb, CapacityState(), config)
    assert [s.basis for s in report.shortfalls] == ["forecast"]
    assert acted(actions) == ([("suspend", "new-ckpt")] if config.preempt else [("burst", "burst", 1)])
    assert not any("waited out" in o.detail for o in report.options)


# ---- Finding 2: a waited-out service starves a lower-priority one ------------------------------------------------


def _two_services() -> ClusterSnapshot:
    """chat (priority 1000) full on n1, search (500) full on n4, two 8-GPU gangs on n2 and n3."""
    search = [
        PodInfo("inference", f"search-{i}", "n4", 1, 500, "Running", True, "Deployment", "search", created_at=NOW)
        for i in range(8)
    ]
    pods = [replica(i, "n1") for i in range(8)] + search
    pods += gang_pods("old-ckpt", ["n2"], checkpoint_age=1800.0) + gang_pods("new-ckpt", ["n3"], checkpoint_age=60.0)
    nodes = (node("n1"), node("n2"), node("n3"), node("n4"))
    return ClusterSnapshot(NOW, pods=tuple(pods), nodes=nodes, workloads=(job("old-ckpt"), job("new-ckpt")))


def _two_services_input(
    decisions: list[ScaleDecision], over: frozenset[str] = frozenset(), now: float = NOW
) -> ArbitrationInput:
    """``_two_services`` at ``now``, chat with a usable flat forecast of 9 replicas' demand, search with none."""
    return ArbitrationInput(
        now,
        replace(_two_services(), time=now),
        {RATE_CHAT.key: RATE_CHAT, SEARCH.key: SEARCH},
        decisions,
        {RATE_CHAT.key: (flat(9.0, now), 0.99, 90.0)},
        over_slo=over,
    )


def _two_services_arbitrate(over: frozenset[str], state: CapacityState | None = None, now: float = NOW):  # type: ignore[no-untyped-def]
    decisions = [
        chat_decision(8, 9),  # one replica short at its P99: cheaper to wait (RISK_10)
        ScaleDecision(SEARCH.key, 8, 10, Reason.SLO_BREACH, ""),  # the metric's demand, no forecast
    ]
    return arbitrate(_two_services_input(decisions, over, now), state or CapacityState(), RISK_10)


def test_a_waited_out_service_does_not_starve_a_lower_one_it_would_take_the_gpus_from() -> None:
    """chat's one replica short at the P99 is cheaper to wait out; search, below it, is over its SLO and two short
    now. What search would free, chat's Pending pod takes first (the blockers), so search waited behind a shortfall
    that was waited out on purpose -- every tick, for as long as chat's P99 stays above its capacity, search over
    its SLO all along. Before the wait-out one stop served both. Waiting saves nothing once a later service's action
    would hand the GPUs to the waiting one: it is acted on (once), and the later one is served with it."""
    state = CapacityState()
    for i in range(4):
        actions, report, state = _two_services_arbitrate(frozenset({SEARCH.key}), state, NOW + 15.0 * i)
        assert acted(actions) == [("suspend", "new-ckpt")], (i, [o.detail for o in report.options if o.chosen])
        assert "waited out" not in chosen(report, RATE_CHAT.key).detail
        assert any(RATE_CHAT.key in n and SEARCH.key in n and "not waited out" in n for n in report.notes)


def test_a_waited_out_service_with_nothing_below_it_acting_stays_waited_out() -> None:
    """The revocation above is only for a later action the waited-out replicas would take: search within its SLO
    and without a shortfall leaves chat's wait-out as it was."""
    decisions = [chat_decision(8, 9), ScaleDecision(SEARCH.key, 8, 8, Reason.WITHIN_TOLERANCE, "")]
    arb = _two_services_input(decisions)
    actions, report, _ = arbitrate(arb, CapacityState(), RISK_10)
    assert actions == []
    assert "waited out" in chosen(report, RATE_CHAT.key).detail
    assert not any("not waited out" in n for n in report.notes)


def test_a_lower_service_itself_confirming_does_not_revoke_the_wait_out() -> None:
    """search's own shortfall not yet confirmed (no forecast, first seen now): it would not act this tick, so chat's
    wait-out stands (search waits behind it, as it would for its confirmation)."""
    decisions = [chat_decision(8, 9), ScaleDecision(SEARCH.key, 8, 10, Reason.METRIC_ABOVE_TARGET, "")]
    arb = _two_services_input(decisions)
    actions, report, _ = arbitrate(arb, CapacityState(), replace(RISK_10, shortfall_confirm_s=30.0))
    assert actions == []
    assert "waited out" in chosen(report, RATE_CHAT.key).detail
    assert not any("not waited out" in n for n in report.notes)


# ---- Finding 3: "latency meets the SLO" without a latency reading ------------------------------------------------


def _tick_over_slo(monkeypatch: pytest.MonkeyPatch, policy: ServicePolicy, obs: ServiceObservation) -> frozenset[str]:
    return over_slo_handed(monkeypatch, policy, obs)


@pytest.mark.parametrize(
    ("case", "latency_s", "partial", "stale", "over"),
    [
        # the Prometheus reader's "NaN with no finished requests in the window but 40 requests waiting": the worst
        # overload reads as no latency at all, with the reason as a partial one
        ("no latency, requests waiting", None, ("latency: NaN with no finished requests but 40 waiting",), (), True),
        ("latency query failed", None, ("latency: query timed out",), (), True),
        ("no latency, metric stale", None, (), ("request_rate: sample 900 s old",), True),
        # no traffic at all (the reader's "nothing to guard": no reason given): nothing is served late
        ("no traffic", None, (), (), False),
        # a fresh latency within the SLO is the evidence, whatever else is partial
        (
            "fresh latency within, a pod not reporting",
            3.0,
            ("gpu_utilization: 1 of 8 pods without a sample",),
            (),
            False,
        ),
        ("fresh latency above, partial", 5.0, ("gpu_utilization: 1 of 8 pods without a sample",), (), True),
    ],
)
def test_a_latency_not_read_is_not_one_that_meets_the_slo(
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    latency_s: float | None,
    partial: tuple[str, ...],
    stale: tuple[str, ...],
    over: bool,
) -> None:
    """The wait-out is safe only while latency is seen to meet the SLO (its detail says so). A latency the reader
    could not read -- its query failing, or the NaN of a window in which no request finished while requests wait,
    the deepest overload there is -- was taken as meeting it, and a forecast shortfall waited out right then."""
    obs = ServiceObservation(
        RATE_CHAT.key, 8, 8, metric_total=8.0, latency_s=latency_s, request_rate=8.0,
        partial_reasons=partial, stale_reasons=stale,
    )  # fmt: skip
    assert (RATE_CHAT.key in _tick_over_slo(monkeypatch, RATE_CHAT, obs)) is over, case


def test_a_service_without_a_latency_slo_is_not_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a latency SLO nothing can show a waited-out shortfall being served late (the escape the wait-out
    relies on), and "latency meets the SLO" in its detail is no claim the controller can make: acted on as before."""
    no_slo = replace(RATE_CHAT, latency_slo_s=None)
    obs = ServiceObservation(no_slo.key, 8, 8, metric_total=8.0, latency_s=3.0, request_rate=8.0)
    assert no_slo.key in _tick_over_slo(monkeypatch, no_slo, obs)


# ---- Finding 4 (decided): the request rate read is the finished requests', which saturates -------------------------


RATE = ServicePolicy(
    namespace="ml", name="chat", min_replicas=1, max_replicas=40, metric=MetricKind.REQUEST_RATE, target=2.5,
    latency_slo_s=4.0,
)  # fmt: skip


# Decided at stop 45: the one-more-replica guard on a request rate is reverted (core.decide._slo_guard): every metric
# grows in proportion to the overshoot again.
def test_a_saturated_request_rate_breach_grows_in_proportion() -> None:
    """6 replicas each finishing their 2.5 requests/s (the target, what a replica serves) while 30/s arrive: the
    finished-request rate reads 15, exactly on target, and cannot see the other 15; latency is at twice the SLO and
    climbing. The guard is the only measure of the missing capacity, as for a busy GPU: the proportional growth asks
    for 12 (the one-more-replica version added one replica per cold start: 7 now, 8 once that one was ready)."""
    obs = ServiceObservation("ml/chat", 6, 6, metric_total=15.0, latency_s=8.0)
    decision, _ = decide_service(RATE, obs, ServiceState(), 0.0)
    assert decision.desired_replicas == 12, decision.detail


# ---- Finding 5 (decided at stop 46): a long wait-out held every give-back ------------------------------------------


H100 = BurstPool("h100", 8, "H100", boot_s=300.0, price_per_gpu_hour=6.0, nodes=1, min_nodes=0, max_nodes=2)
A100_POOL = BurstPool("a100", 8, "A100", boot_s=300.0, price_per_gpu_hour=4.0, nodes=1, min_nodes=0, max_nodes=2)


def _waited_out_beside(  # type: ignore[no-untyped-def]
    pool: BurstPool, chat_gpus: int, burst_pods: tuple[PodInfo, ...] = (), free_on_n4: int = 0, minutes: int = 15
):
    """chat (A100, ``chat_gpus`` a replica) one replica short at its P99 for ``minutes``, waited out every tick,
    beside a node ``b0`` of ``pool`` running ``burst_pods``, and an on-prem A100 node with ``free_on_n4`` GPUs free:
    the minutes a node of the pool is given back, and the last tick's notes."""
    base = full_cluster()
    big = replace(RATE_CHAT, gpus_per_replica=chat_gpus)
    chat = [replace(replica(i, "n1"), gpus=chat_gpus) for i in range(8 // chat_gpus)]
    filler = PodInfo("ml", "filler", "n4", 8 - free_on_n4, 100, "Running", True, "Deployment", "filler")
    snapshot = replace(
        base,
        pods=(*chat, *(p for p in base.pods if p.owner_kind != "Deployment"), filler, *burst_pods),
        nodes=(
            *base.nodes,
            NodeInfo("n4", 8, "A100", "onprem", True),
            NodeInfo("b0", 8, pool.gpu_type, pool.name, True),
        ),
        deployments=(
            DeploymentInfo("inference", "chat", len(chat) + 1, len(chat), gpu_product="A100", gpus_per_pod=chat_gpus),
        ),
    )
    # waiting costs 1 a GPU-hour: an hour of even 8 GPUs short is cheaper than stopping a gang (~16)
    config = replace(RISK_10, slo_risk_per_gpu_hour=1.0, pools=(pool,), burst_idle_cooldown_s=600.0)
    state = CapacityState()
    given_back: list[int] = []
    notes: list[str] = []
    for minute in range(minutes):
        now = NOW + 60.0 * minute
        forecasts = {big.key: (flat(len(chat) + 1.0, now), 0.99, 90.0)}
        decision = ScaleDecision(big.key, len(chat), len(chat) + 1, Reason.FORECAST_FLOOR, "")
        arb = ArbitrationInput(now, replace(snapshot, time=now), {big.key: big}, [decision], forecasts)
        actions, report, state = arbitrate(arb, state, config)
        assert "waited out" in chosen(report, big.key).detail, report.options
        assert state.free_since is None and state.short_since is None  # neither stretch decided
        given_back += [minute for a in actions if isinstance(a, ScaleNodePool) and a.nodes < a.previous_nodes]
        notes = list(report.notes)
    return given_back, notes


def test_an_idle_burst_node_the_waiting_service_cannot_use_is_given_back() -> None:
    """Fixed (was a strict xfail). chat selects A100 and is one replica short at its P99, cheaper to wait out, tick
    after tick. An H100 burst node left idle from earlier is no room for chat (another GPU type) and billed 48/h:
    a wait-out held every give-back's timer where it stood, for as long as the forecast stayed above capacity
    (hours). Now only the pools the waiting replicas could run on are held: the H100 node goes after its 600 s."""
    given_back, _ = _waited_out_beside(H100, chat_gpus=1)
    assert given_back == [10]


def test_a_burst_node_the_waiting_service_could_use_is_kept() -> None:
    """The control: chat's replicas take 8 GPUs; an A100 burst node runs one 1-GPU pod that would fit in the 4 GPUs
    free on n4 -- spare, and given back after 600 s on a tick without a shortfall. Emptied, it is the room a replica
    of chat needs, so its timer stands while chat waits out its shortfall, with a note saying why."""
    stray = PodInfo("inference", "embed-0", "b0", 1, 1000, "Running", True, "Deployment", "embed")
    given_back, notes = _waited_out_beside(A100_POOL, chat_gpus=8, burst_pods=(stray,), free_on_n4=4)
    assert given_back == []
    assert any("could host inference/chat" in n and "waited out" in n for n in notes), notes


def test_suspended_training_is_resumed_on_gpus_the_waiting_service_cannot_use() -> None:
    """A gang this controller suspended an hour ago fits on an idle H100 node of the cluster's own (chat selects
    A100): while chat waits out its shortfall the gang is resumed there, as on a tick without one -- the waiting
    replicas were placed first, so what is left free is room they cannot use (a wait-out held it suspended)."""
    base = full_cluster()
    suspended = job("stopped", suspended=True, by_us=NOW - 3600.0)
    snapshot = replace(
        base,
        nodes=(*base.nodes, NodeInfo("h4", 8, "H100", "onprem", True)),
        deployments=(DeploymentInfo("inference", "chat", 9, 8, gpu_product="A100"),),
        workloads=(*base.workloads, suspended),
    )
    forecasts = {RATE_CHAT.key: (flat(9.0), 0.99, 90.0)}
    arb = ArbitrationInput(NOW, snapshot, {RATE_CHAT.key: RATE_CHAT}, [chat_decision(8, 9)], forecasts)
    state = replace(CapacityState(), resumable_since={"Job/ml/stopped": NOW - 7200.0})
    actions, report, _ = arbitrate(arb, state, RISK_10)
    assert "waited out" in chosen(report, RATE_CHAT.key).detail
    assert [(type(a).__name__, a.name) for a in actions] == [("ResumeWorkload", "stopped")], report.notes


# ---- Checked and found right -------------------------------------------------------------------------------------


def test_a_recommend_only_service_is_neither_acted_on_nor_waited_out() -> None:
    """Recommend-only services are left out of the arbitration before any costing: no wait option, no action."""
    arb = ArbitrationInput(
        NOW,
        full_cluster(),
        {RATE_CHAT.key: RATE_CHAT},
        [dataclasses.replace(chat_decision(8, 9), recommend_only=True)],
        {RATE_CHAT.key: (flat(9.0), 0.99, 90.0)},
    )
    actions, report, _ = arbitrate(arb, CapacityState(), RISK_10)
    assert actions == [] and report.options == () and report.shortfalls == ()


def test_the_wait_cost_counts_every_gpu_of_a_multi_gpu_replica() -> None:
    """A 2-GPU replica short for an hour at 10/GPU-hour is 20 > the 16.27 of stopping the just-checkpointed gang."""
    two_gpus = replace(RATE_CHAT, gpus_per_replica=2)
    pods = [replace(replica(i, "n1"), gpus=2) for i in range(4)]
    pods += gang_pods("old-ckpt", ["n2"], checkpoint_age=1800.0) + gang_pods("new-ckpt", ["n3"], checkpoint_age=60.0)
    snapshot = ClusterSnapshot(
        NOW, pods=tuple(pods), nodes=(node("n1"), node("n2"), node("n3")), workloads=(job("old-ckpt"), job("new-ckpt"))
    )
    forecasts = {two_gpus.key: (flat(5.0), 0.99, 90.0)}
    arb = ArbitrationInput(NOW, snapshot, {two_gpus.key: two_gpus}, [chat_decision(4, 5)], forecasts)
    actions, report, _ = arbitrate(arb, CapacityState(), RISK_10)
    assert acted(actions) == [("suspend", "new-ckpt")], [o.detail for o in report.options]


def test_over_slo_is_per_service() -> None:
    """search over its SLO does not lift chat's wait-out when nothing of search's would go to chat's pods: here
    search has no shortfall, so chat stays waited out although another service breaches."""
    decisions = [chat_decision(8, 9), ScaleDecision(SEARCH.key, 8, 8, Reason.WITHIN_TOLERANCE, "")]
    arb = _two_services_input(decisions, frozenset({SEARCH.key}))
    actions, report, _ = arbitrate(arb, CapacityState(), RISK_10)
    assert actions == [] and "waited out" in chosen(report, RATE_CHAT.key).detail


def test_the_waited_out_service_keeps_its_shortfall_stretch() -> None:
    """The per-service stretch goes on through a wait-out (it says when replicas first lacked GPUs, not when the
    arbitration acted): a later shortfall of it without a usable forecast is not confirmed afresh."""
    state = CapacityState()
    for i in range(3):
        _, _, state = _two_services_arbitrate(frozenset(), state, NOW + 15.0 * i)
    assert state.service_short_since.get(RATE_CHAT.key) == NOW


@pytest.mark.parametrize(
    ("spec", "ready", "max_replicas", "desired"),
    [
        (3, 0, 40, 3),  # nothing ready yet: the 3 starting are the answer (max(current, ceil(max(0, 1) x 2)))
        (1, 0, 40, 2),
        (40, 40, 40, 40),  # at maxReplicas: nothing asked beyond it
        (8, 9, 40, 16),  # a surge pod ready above spec (rolling update): the 9 ready doubled, within the rate limit
    ],
)
def test_the_request_rate_guard_at_its_edges(spec: int, ready: int, max_replicas: int, desired: int) -> None:
    policy = replace(RATE, max_replicas=max_replicas)
    obs = ServiceObservation("ml/chat", spec, ready, metric_total=2.5 * spec, latency_s=8.0)
    decision, _ = decide_service(policy, obs, ServiceState(), 0.0)
    assert decision.desired_replicas == desired, decision.detail


def test_a_nan_or_missing_latency_never_trips_the_request_rate_guard() -> None:
    for latency in (math.nan, None):
        obs = ServiceObservation("ml/chat", 6, 6, metric_total=15.0, latency_s=latency)
        decision, _ = decide_service(RATE, obs, ServiceState(), 0.0)
        assert decision.desired_replicas == 6 and decision.reason is not Reason.SLO_BREACH


# ---- Finding 6: the plan showed a priced wait-out at cost 0 ------------------------------------------------------


def test_a_waited_out_shortfall_shows_what_waiting_was_priced_at() -> None:
    """``autoscaler plan`` lists each option with its cost: the wait-out chosen at 0.00 beside a preemption at 16.27
    read as free, when it was chosen for costing at most 10.00 (1 GPU x 1 h x 10). A forced wait (behind another
    service, confirming) stays at 0: it was not priced."""
    arb = ArbitrationInput(
        NOW, full_cluster(), {RATE_CHAT.key: RATE_CHAT}, [chat_decision(8, 9)], {RATE_CHAT.key: (flat(9.0), 0.99, 90.0)}
    )
    _, report, _ = arbitrate(arb, CapacityState(), RISK_10)
    wait = chosen(report, RATE_CHAT.key)
    assert wait.kind == "wait" and wait.cost == pytest.approx(10.0)
    # search, blocked behind chat's wait-out in a pass that is then revoked, and chat acted on: no priced wait left
    _, report, _ = _two_services_arbitrate(frozenset({SEARCH.key}))
    assert all(o.cost == 0.0 for o in report.options if o.kind == "wait")
