"""A shortfall no usable forecast vouches for is acted on only once it has lasted ``shortfall_confirm_s``.

Without a forecast the arbitration assumes a shortfall lasts ``assumed_shortfall_s`` (30 minutes): one sample of a
spike -- a burst of seconds, a scrape that read high -- stopped a training gang (its work since the last checkpoint
lost) or bought a node (billed for its minimum) at the first tick it was seen. Now it must be seen on the ticks of
``shortfall_confirm_s`` first; a usable forecast that says the need lasts is acted on at once, as before."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, PodInfo, WorkloadInfo
from autoscaler.core.model import (
    CapacityState,
    EvictPod,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.settings import CapacitySettings
from autoscaler.sim.scenario import Capacity
from tests.core.test_arbitrate import CHAT, NOW, decide, full_cluster, gang_pods, job, node, run

CONFIRM = CapacityConfig(shortfall_confirm_s=30.0)
TICK = 15.0


def stops(actions) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.name for a in actions if isinstance(a, (SuspendWorkload, EvictPod))]


def replay(wants: list[int], config: CapacityConfig = CONFIRM, demand: float | None = None):  # type: ignore[no-untyped-def]
    """One tick per entry (15 s apart), the service wanting that many replicas (it holds 8): per tick, the training
    stopped and the nodes bought; and the last state."""
    state = CapacityState()
    out = []
    for i, desired in enumerate(wants):
        now = NOW + TICK * i
        actions, report, state = run(replace(full_cluster(), time=now), desired, config, state, now=now, demand=demand)
        bought = [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP]
        out.append((stops(actions), len(bought), report))
    return out, state


def test_a_one_tick_spike_without_a_forecast_stops_no_training() -> None:
    ticks, state = replay([12, 8, 8])
    assert [t[0] for t in ticks] == [[], [], []]
    (wait,) = [o for o in ticks[0][2].options if o.chosen]
    assert wait.kind == "wait" and "no usable forecast vouches" in wait.detail and "30s" in wait.detail
    assert state.service_short_since == {}  # the stretch ended with the spike


def test_a_shortfall_that_lasts_is_acted_on_once_confirmed() -> None:
    ticks, state = replay([12, 12, 12])
    assert [bool(t[0]) for t in ticks] == [False, False, True]  # acted on at 30 s
    assert state.service_short_since == {"inference/chat": NOW}


def test_a_new_stretch_starts_its_own_confirmation() -> None:
    """Two one-tick spikes 30 s apart are two spikes, not one shortfall of 30 s."""
    ticks, _ = replay([12, 8, 12, 8, 12])
    assert [t[0] for t in ticks] == [[], [], [], [], []]


def test_a_usable_forecast_that_says_the_need_lasts_is_acted_on_at_once() -> None:
    ticks, _ = replay([12], demand=12.0)
    assert ticks[0][0] != []
    assert any(s.basis == "forecast" for s in ticks[0][2].shortfalls)


def test_zero_acts_at_the_first_tick_as_before() -> None:
    ticks, _ = replay([12], config=CapacityConfig(shortfall_confirm_s=0.0))
    assert ticks[0][0] != []


def test_no_node_is_bought_for_an_unconfirmed_shortfall_either() -> None:
    pool = BurstPool("burst", 8, None, boot_s=300.0, price_per_gpu_hour=0.1, nodes=0, min_nodes=0, max_nodes=4)
    # training at the inference priority: nothing is preemptible, burst is the only option
    config = replace(CONFIRM, pools=(pool,), preempt=False)
    ticks, _ = replay([12, 12, 12], config=config)
    assert [t[1] for t in ticks] == [0, 0, 1]


def test_a_hold_on_stale_metrics_neither_confirms_nor_ends_the_stretch() -> None:
    state = CapacityState()
    seen = []
    for i, (desired, reason) in enumerate(
        [(12, Reason.METRIC_ABOVE_TARGET), (12, Reason.METRICS_STALE), (12, Reason.METRIC_ABOVE_TARGET)]
    ):
        now = NOW + TICK * i
        decision = replace(decide(8, desired), reason=reason)
        arb = ArbitrationInput(now, replace(full_cluster(), time=now), {CHAT.key: CHAT}, [decision])
        actions, _, state = arbitrate(arb, state, CONFIRM)
        seen.append(stops(actions))
        if i == 1:
            assert state.service_short_since == {CHAT.key: NOW}
    assert [bool(s) for s in seen] == [False, False, True]


def test_a_wall_clock_stepped_back_does_not_lengthen_the_confirmation() -> None:
    state = CapacityState(service_short_since={"inference/chat": NOW + 600.0})
    _, _, state = run(full_cluster(), 12, CONFIRM, state)
    assert state.service_short_since == {"inference/chat": NOW}


def test_the_settings_carry_it_with_a_30_s_default() -> None:
    assert CapacitySettings(enabled=True).to_config().shortfall_confirm_s == 30.0
    assert CapacitySettings(enabled=True, shortfall_confirm_seconds=0).to_config().shortfall_confirm_s == 0.0
    assert Capacity().shortfall_confirm_seconds == 30.0
    assert Capacity.model_validate({"shortfallConfirmSeconds": 45}).shortfall_confirm_seconds == 45.0



# -- a lower-priority service behind one whose replicas wait, and the stabilisation ---------------------------------

EMBED = ServicePolicy("inference", "embed", max_replicas=40, priority=500)


def _two_services(state: CapacityState, chat_reason: Reason = Reason.METRIC_ABOVE_TARGET):  # type: ignore[no-untyped-def]
    """chat (priority 1000) and embed (500) each hold 8 GPUs and want 12; training holds n2 (two 4-GPU gangs) and
    n3 (one 8-GPU gang)."""
    pods = [_serving(CHAT, i, "n1") for i in range(8)] + [_serving(EMBED, i, "n4") for i in range(8)]
    pods += gang_pods("g1", ["n2"], gpus=4) + gang_pods("g2", ["n2"], gpus=4, checkpoint_age=60.0)
    pods += gang_pods("g3", ["n3"], gpus=8, checkpoint_age=900.0)
    workloads = (
        *(WorkloadInfo("Job", "ml", g, f"job/ml/{g}", False, 100, (4,)) for g in ("g1", "g2")),
        WorkloadInfo("Job", "ml", "g3", "job/ml/g3", False, 100, (8,)),
    )
    nodes = tuple(node(n) for n in ("n1", "n2", "n3", "n4"))
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=nodes, workloads=workloads)
    decisions = [
        ScaleDecision(CHAT.key, 8, 12, chat_reason, ""),
        ScaleDecision(EMBED.key, 8, 12, Reason.METRIC_ABOVE_TARGET, ""),
    ]
    return arbitrate(ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT, EMBED.key: EMBED}, decisions), state, CONFIRM)


def _serving(policy: ServicePolicy, index: int, node_name: str) -> PodInfo:
    return PodInfo(policy.namespace, f"{policy.name}-{index}", node_name, 1, policy.priority, "Running", True,
                   "Deployment", policy.name, created_at=NOW - 3600)  # fmt: skip


def test_a_lower_priority_service_waits_behind_a_higher_one_whose_replicas_wait() -> None:
    """GPUs freed for the lower-priority service would go to the higher one's Pending replicas first (the scheduler
    binds by priority): behind a service that confirms, or holds on stale metrics, nothing is stopped or bought."""
    for reason in (Reason.METRIC_ABOVE_TARGET, Reason.METRICS_STALE):
        actions, report, state = _two_services(CapacityState(service_short_since={EMBED.key: NOW - 60.0}), reason)
        assert stops(actions) == [], reason
        (wait,) = [o for o in report.options if o.chosen and o.service == EMBED.key]
        assert wait.kind == "wait" and "inference/chat (priority 1000)" in wait.detail
        assert "(then: preempt)" in wait.detail  # the options are still costed
        assert state.service_short_since[EMBED.key] == NOW - 60.0  # its own stretch goes on


def test_behind_a_higher_service_that_is_served_the_lower_one_is_acted_on() -> None:
    state = CapacityState(service_short_since={CHAT.key: NOW - 60.0, EMBED.key: NOW - 60.0})
    actions, report, _ = _two_services(state)
    assert not [o for o in report.options if o.chosen and o.kind == "wait"]
    assert stops(actions) == ["g2", "g1"]  # 4 GPUs for chat (least lost work), then 4 for embed


def test_the_decision_says_what_the_metric_asked_before_the_stabilisation() -> None:
    from autoscaler.core.decide import decide_service
    from autoscaler.core.model import PodMetrics, ServiceObservation, ServiceState

    obs = ServiceObservation(CHAT.key, 12, 12, PodMetrics(12, 60.0 * 12))
    history = ServiceState(((NOW - 30.0, 12),))
    made, _ = decide_service(CHAT, obs, history, NOW, None)
    assert made.desired_replicas == 12 and made.reason is Reason.SCALE_DOWN_STABILISED
    assert made.recommended_replicas is not None and made.recommended_replicas < 12


# -- the block is only where the waiting service's pods could take what is freed or bought --------------------------


def _two_kinds(chat_reason: Reason, embed_type: str = "H100", embed_taint: bool = False):  # type: ignore[no-untyped-def]
    """chat (priority 1000, A100 nodes n1-n3) holds 8 and wants 12 with its shortfall first seen now; embed (500)
    holds 8 on n4 and wants 12, short for a minute; an 8-GPU training gang runs on n5, a node of embed's kind. With
    ``embed_taint`` n4 and n5 are A100s too, labelled ``tier=embed`` (embed's nodeSelector) and tainted
    ``dedicated=embed``, which only embed's pods tolerate."""
    from autoscaler.core.cluster import DeploymentInfo, NodeInfo, Taint, Toleration

    taints = (Taint("dedicated", "embed"),) if embed_taint else ()
    labels = {"tier": "embed"} if embed_taint else {}
    kind = "A100" if embed_taint else embed_type
    pods = [_serving(CHAT, i, "n1") for i in range(8)] + [_serving(EMBED, i, "n4") for i in range(8)]
    pods += gang_pods("a-gang", ["n2"], gpus=8) + gang_pods("b-gang", ["n5"], gpus=8)
    nodes = (
        node("n1"), node("n2"), node("n3"),
        *(NodeInfo(n, 8, kind, "onprem", True, labels=labels, taints=taints) for n in ("n4", "n5")),
    )  # fmt: skip
    pods += [_serving(CHAT, i, "n3") for i in range(8, 16)]  # n3 full of chat: it holds 16, wants 20
    deployments = (
        DeploymentInfo("inference", "chat", 16, 16, gpu_product="A100"),
        DeploymentInfo(
            "inference", "embed", 8, 8, gpu_product=None if embed_taint else embed_type,
            tolerations=(Toleration("dedicated", value="embed"),) if embed_taint else (), node_selector=labels,
        ),
    )  # fmt: skip
    workloads = (job("a-gang"), job("b-gang"))
    snapshot = ClusterSnapshot(NOW, pods=tuple(pods), nodes=nodes, workloads=workloads, deployments=deployments)
    decisions = [
        ScaleDecision(CHAT.key, 16, 20, chat_reason, ""),
        ScaleDecision(EMBED.key, 8, 12, Reason.METRIC_ABOVE_TARGET, ""),
    ]
    state = CapacityState(service_short_since={EMBED.key: NOW - 60.0})
    return arbitrate(ArbitrationInput(NOW, snapshot, {CHAT.key: CHAT, EMBED.key: EMBED}, decisions), state, CONFIRM)


def test_a_service_on_another_gpu_type_does_not_wait_behind_a_confirming_one() -> None:
    """chat's Pending pods select A100s: the H100 GPUs stopping b-gang frees for embed can never be theirs, so embed
    (confirmed) is served while chat confirms; chat's own A100 gang is not touched."""
    for reason in (Reason.METRIC_ABOVE_TARGET, Reason.METRICS_STALE):
        actions, report, _ = _two_kinds(reason)
        assert stops(actions) == ["b-gang"], reason
        assert not [o for o in report.options if o.chosen and o.kind == "wait" and o.service == EMBED.key]


def test_a_service_on_nodes_the_waiting_one_cannot_use_does_not_wait_behind_it() -> None:
    """Same GPU type, but embed's pods select n4 and n5, which carry a taint only they tolerate: chat's pods could
    not take what is freed there."""
    actions, _, _ = _two_kinds(Reason.METRIC_ABOVE_TARGET, embed_taint=True)
    assert stops(actions) == ["b-gang"]


def test_a_service_whose_pods_could_take_the_same_gpus_still_waits() -> None:
    """embed selects A100s too (any node): what is freed for it could go to chat's Pending pods first."""
    actions, report, _ = _two_kinds(Reason.METRIC_ABOVE_TARGET, embed_type="A100")
    assert stops(actions) == []
    (wait,) = [o for o in report.options if o.chosen and o.service == EMBED.key]
    assert wait.kind == "wait" and "inference/chat (priority 1000)" in wait.detail
