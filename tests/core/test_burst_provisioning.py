"""Burst nodes the provider counts but that are not registered: a cordoned node is not one of them, and one that
never registers stops counting as capacity on its way after the provision timeout.

Before: a burst node cordoned by hand (``kubectl cordon``, or a drain in progress) was left out of the pool's
registered nodes, so the provider's count read as one node "requested, not registered" -- capacity on its way that
never came, hiding a real shortfall for as long as the node stayed cordoned. And a node the provider never delivered
(a quota, a stock-out, a broken machine template) counted as coming for ever: the shortfall was never met, by
another pool or by preemption."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import CapacityState, EvictPod, ScaleDecision, ScaleNodePool, ServicePolicy, SuspendWorkload
from autoscaler.core.reasons import Reason

NOW = 100_000.0
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=0, min_nodes=0, max_nodes=4)
SPARE = BurstPool("spare", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.9, nodes=0, min_nodes=0, max_nodes=4)
LONG = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600)


def replica(index: int, node: str | None) -> PodInfo:
    return PodInfo(
        "inference", f"chat-{index}", node, 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600
    )


def full(*extra_nodes: NodeInfo, extra_pods: tuple[PodInfo, ...] = (), workloads=()) -> ClusterSnapshot:  # type: ignore[no-untyped-def]
    """chat holds every GPU of n1 (8 replicas) and wants 12."""
    pods = (*(replica(i, "n1") for i in range(8)), *extra_pods)
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), *extra_nodes)
    return ClusterSnapshot(NOW, pods=pods, nodes=nodes, workloads=tuple(workloads))


def tick(
    snapshot: ClusterSnapshot,
    pool_nodes: dict[str, int] | None,
    config: CapacityConfig = LONG,
    state: CapacityState | None = None,
    now: float = NOW,
    want: int = 12,
):  # type: ignore[no-untyped-def]
    """chat runs 8 replicas and wants ``want`` (12: 4 short)."""
    decision = ScaleDecision(CHAT.key, 8, want, Reason.METRIC_ABOVE_TARGET, "")
    arb = ArbitrationInput(now, replace(snapshot, time=now), {CHAT.key: CHAT}, [decision], {}, pool_nodes=pool_nodes)
    return arbitrate(arb, state or CapacityState(), config)


def scale_ups(actions) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP]


def cordoned(name: str = "burst-a") -> NodeInfo:
    """A burst node cordoned by hand: ready=False and leaving as the reader reads it, no removal taint."""
    return NodeInfo(name, 8, "A100", "burst", False, leaving=True, out_of_service=True)


# -- a cordoned node is still the provider's ------------------------------------------------------------------------


def test_a_cordoned_burst_node_is_no_capacity_and_no_phantom_node_on_its_way() -> None:
    """The provider counts 1 node, which is the cordoned one: nothing is on its way, the shortfall is real."""
    actions, report, _ = tick(full(cordoned()), {"burst": 1})
    (up,) = scale_ups(actions)
    assert (up.previous_nodes, up.nodes) == (1, 2)
    assert [s.covered_by_booting for s in report.shortfalls] == [0]


def test_a_cordoned_node_beside_a_requested_one_leaves_the_requested_one_on_its_way() -> None:
    """Two counted by the provider, one cordoned, one not registered yet: the one booting covers 4 replicas."""
    actions, report, _ = tick(full(cordoned()), {"burst": 2})
    assert scale_ups(actions) == []
    assert report.shortfalls == ()  # the booting node's 8 GPUs cover the 4 replicas short


def test_a_node_being_removed_is_not_counted_by_the_provider() -> None:
    """A removal taint or a deletionTimestamp (leaving, not merely cordoned): the provider's size has let it go, so
    the count of 1 is a new node on its way."""
    removing = NodeInfo("burst-old", 8, "A100", "burst", False, leaving=True)
    actions, report, _ = tick(full(removing), {"burst": 1})
    assert scale_ups(actions) == []
    assert report.shortfalls == ()  # the booting node's 8 GPUs cover the 4 replicas short


# -- the provision timeout ------------------------------------------------------------------------------------------


def run(snapshot: ClusterSnapshot, pool_nodes: dict[str, int], seconds: float, config: CapacityConfig = LONG):  # type: ignore[no-untyped-def]
    """Ticks every 15 s for ``seconds``, the provider's count fixed; the last tick's (actions, report, state)."""
    state = CapacityState()
    t = NOW
    out = None
    while t <= NOW + seconds:
        out = tick(snapshot, pool_nodes, config, state, t)
        state = out[2]
        t += 15.0
    assert out is not None
    return out


def test_a_requested_node_counts_as_coming_within_the_provision_timeout() -> None:
    actions, report, state = run(full(), {"burst": 1}, 885.0)
    assert scale_ups(actions) == []
    assert report.shortfalls == ()  # the booting node's 8 GPUs cover the 4 replicas short
    assert state.unregistered_since == {"burst": (NOW, 1)}


def test_a_node_never_registered_stops_counting_after_the_provision_timeout() -> None:
    """Past 900 s the shortfall is met another way (here: another pool), and the stuck pool is not grown again."""
    config = replace(LONG, pools=(POOL, SPARE))
    actions, report, _ = run(full(), {"burst": 1, "spare": 0}, 900.0, config)
    (up,) = scale_ups(actions)
    assert up.pool == "spare"
    assert [s.covered_by_booting for s in report.shortfalls] == [0]
    assert any("burst: 1 node(s)" in n and "not registered for 900s" in n for n in report.notes)


def test_after_the_timeout_training_is_stopped_when_the_only_pool_never_delivers() -> None:
    job = WorkloadInfo("Job", "ml", "train", "job/ml/train", False, 100, (8,), None, None)
    gang = PodInfo(
        "ml", "train-0", "n2", 8, 100, "Running", True, "Job", "train", gang="job/ml/train",
        created_at=NOW - 7200, ready_at=NOW - 7000, last_checkpoint_at=NOW - 600,
    )  # fmt: skip
    snapshot = full(NodeInfo("n2", 8, "A100", "onprem", True), extra_pods=(gang,), workloads=(job,))
    before, _, _ = run(snapshot, {"burst": 1}, 600.0)
    assert before == []  # the requested node covers the shortfall while it may still come
    actions, report, _ = run(snapshot, {"burst": 1}, 900.0)
    assert scale_ups(actions) == []  # the pool that never delivered is not grown again
    assert any(isinstance(a, (SuspendWorkload, EvictPod)) for a in actions)
    burst = next(o for o in report.options if o.kind == "burst")
    assert "requested nodes never registered" in burst.detail


def test_the_timeout_is_at_least_twice_the_pools_boot_time() -> None:
    slow = replace(POOL, boot_s=1200.0)
    config = replace(LONG, pools=(slow,))
    actions, _, _ = run(full(), {"burst": 1}, 2385.0, config)
    assert scale_ups(actions) == []
    actions, _, _ = run(full(), {"burst": 1}, 2400.0, config)
    assert scale_ups(actions) == []  # overdue, and the only pool is stuck: nothing bought from it
    _, report, _ = run(full(), {"burst": 1}, 2400.0, config)
    assert report.shortfalls[0].covered_by_booting == 0


def test_a_new_request_restarts_the_timer_and_a_registration_drops_it() -> None:
    state = CapacityState(unregistered_since={"burst": (NOW - 800.0, 1)})
    # the pool grew to 2: a new request, a new timer
    _, _, after = tick(full(), {"burst": 2}, state=state, now=NOW)
    assert after.unregistered_since == {"burst": (NOW, 2)}
    # one registered (booting): the timer stands for the other
    booting = NodeInfo("burst-a", 0, "A100", "burst", False)
    _, _, after2 = tick(full(booting), {"burst": 2}, state=after, now=NOW + 60)
    assert after2.unregistered_since == {"burst": (NOW, 1)}
    # both registered: no timer
    _, _, after3 = tick(full(booting, replace(booting, name="burst-b")), {"burst": 2}, state=after2, now=NOW + 120)
    assert after3.unregistered_since == {}


# -- giving back what never came, and backing the pool off ----------------------------------------------------------
#
# Before: a pool whose requested node never registered was "not grown again until it registers", which for a node
# that never will meant for ever: the pool's size stayed inflated (a VM that booted and could not join is billed; a
# request stuck in a quota holds the size), and the pool could never serve a later shortfall.


def gives_back(actions) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_NODE_NOT_REGISTERED]


def test_a_node_past_the_provision_timeout_is_given_back_by_its_machine() -> None:
    actions, report, state = run(full(), {"burst": 1}, 900.0)
    (back,) = gives_back(actions)
    assert (back.pool, back.previous_nodes, back.nodes) == ("burst", 1, 0)
    assert back.remove_unregistered and back.remove_node is None
    # the Machine removed must itself have waited the provision limit (not a MachineHealthCheck's fresh replacement)
    assert back.unregistered_min_age_s == 900.0
    assert "never registered" in back.detail
    assert any("one given back" in n for n in report.notes)
    assert state.provision_failures == {"burst": (NOW + 900.0, 1)}


def test_nothing_is_given_back_before_the_timeout() -> None:
    actions, _, state = run(full(), {"burst": 1}, 885.0)
    assert gives_back(actions) == []
    assert state.provision_failures == {}


def test_a_pool_at_its_minimum_keeps_its_unregistered_node_and_says_why() -> None:
    at_min = replace(POOL, min_nodes=1)
    actions, report, _ = run(full(), {"burst": 1}, 900.0, replace(LONG, pools=(at_min,)))
    assert gives_back(actions) == []
    assert any("at its minimum size 1" in n for n in report.notes)


def test_the_give_back_happens_without_a_shortfall_and_is_the_pools_only_resize() -> None:
    """No service short (chat wants what it has), a spare registered burst node too: the pool is resized once, by
    the give-back of the node that never came; its spare node waits for a later tick."""
    spare = NodeInfo("burst-a", 8, "A100", "burst", True)
    config = replace(LONG, burst_idle_cooldown_s=0.0)
    state = CapacityState(unregistered_since={"burst": (NOW - 900.0, 1)})
    decision = ScaleDecision(CHAT.key, 8, 8, Reason.WITHIN_TOLERANCE, "")
    arb = ArbitrationInput(NOW, full(spare), {CHAT.key: CHAT}, [decision], {}, pool_nodes={"burst": 2})
    actions, _, _ = arbitrate(arb, state, config)
    resizes = [a for a in actions if isinstance(a, ScaleNodePool)]
    assert [(a.reason, a.previous_nodes, a.nodes) for a in resizes] == [(Reason.BURST_NODE_NOT_REGISTERED, 2, 1)]


class Provider:
    """A pool whose requested nodes never register: a scale-up raises the count, a give-back lowers it."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def apply(self, actions) -> None:  # type: ignore[no-untyped-def]
        for a in actions:
            if isinstance(a, ScaleNodePool) and a.pool == "burst":
                assert a.previous_nodes == self.nodes
                self.nodes = a.nodes


def replay(provider: Provider, start: float, seconds: float, state: CapacityState, config: CapacityConfig = LONG):  # type: ignore[no-untyped-def]
    """Ticks every 15 s, chat short by 4 replicas throughout; (time, action) of every resize, and the last state."""
    seen = []
    t = start
    while t < start + seconds:
        actions, _, state = tick(full(), {"burst": provider.nodes}, config, state, t)
        seen.extend((t - start, a) for a in actions if isinstance(a, ScaleNodePool))
        provider.apply(actions)
        t += 15.0
    return seen, state


def test_the_pool_is_given_back_every_unregistered_node_then_backs_off_then_tries_again() -> None:
    provider = Provider(2)
    seen, state = replay(provider, NOW, 2400.0, CapacityState(unregistered_since={"burst": (NOW, 2)}))
    kinds = [(t, a.reason, a.previous_nodes, a.nodes) for t, a in seen]
    # both given back, one per tick, as soon as they are overdue
    assert kinds[:2] == [
        (900.0, Reason.BURST_NODE_NOT_REGISTERED, 2, 1),
        (915.0, Reason.BURST_NODE_NOT_REGISTERED, 1, 0),
    ]
    # nothing bought during the back-off (300 s from the moment they went overdue), then grown again
    (t_up, reason, before, after) = kinds[2]
    assert reason is Reason.BURST_SCALE_UP and (before, after) == (0, 1)
    assert t_up == 1200.0
    # the new request never registers either: given back after its own timeout (counted from the next tick, the first
    # to see it), the second failure in a row
    assert (t_up + 15.0 + 900.0, Reason.BURST_NODE_NOT_REGISTERED, 1, 0) in kinds
    assert state.provision_failures["burst"][1] == 2


def test_the_back_off_doubles_with_each_failure_in_a_row_up_to_its_maximum() -> None:
    config = replace(LONG, provision_backoff_s=300.0, provision_backoff_max_s=1050.0)
    for failures, backoff in ((1, 600.0), (2, 1050.0), (3, 1050.0), (5, 1050.0)):
        # a previous failure 100 s before this pool goes overdue at NOW
        state = CapacityState(
            unregistered_since={"burst": (NOW - 900.0, 1)}, provision_failures={"burst": (NOW - 100.0, failures)}
        )
        provider = Provider(1)
        seen, after = replay(provider, NOW, 1500.0, state, config)
        assert after.provision_failures["burst"][1] == failures + 1
        first_up = next(t for t, a in seen if a.reason is Reason.BURST_SCALE_UP)
        assert first_up == backoff, (failures, first_up)


def test_a_failure_long_after_the_last_counts_as_the_first_again() -> None:
    state = CapacityState(
        unregistered_since={"burst": (NOW - 900.0, 1)}, provision_failures={"burst": (NOW - 4 * 3600.0, 3)}
    )
    _, _, after = tick(full(), {"burst": 1}, state=state)
    assert after.provision_failures == {"burst": (NOW, 1)}


def test_an_old_failure_record_is_dropped_and_a_backing_off_pool_says_so() -> None:
    old = CapacityState(provision_failures={"burst": (NOW - 4 * 3600.0, 2)})
    actions, _, after = tick(full(), {"burst": 0}, state=old)
    assert after.provision_failures == {}
    assert [a.reason for a in actions if isinstance(a, ScaleNodePool)] == [Reason.BURST_SCALE_UP]
    recent = CapacityState(provision_failures={"burst": (NOW - 100.0, 1)})
    actions, report, _ = tick(full(), {"burst": 0}, state=recent)
    assert [a for a in actions if isinstance(a, ScaleNodePool)] == []
    burst = next(o for o in report.options if o.kind == "burst")
    assert "burst: backing off until 200s from now" in burst.detail


def test_nothing_is_given_back_while_as_many_nodes_are_being_removed() -> None:
    """A Cluster Autoscaler drain: its removal taint is on the node, and the provider still counts it until the
    drain is done. The "unregistered" node is that one; the pool has no Machine without a Node to give back."""
    draining = NodeInfo("burst-old", 8, "A100", "burst", False, leaving=True)
    actions, report, _ = run(full(draining), {"burst": 1}, 900.0)
    assert gives_back(actions) == []
    assert any("not given back while 1 of its nodes are being removed" in n for n in report.notes)
    # two counted beyond the registered nodes, one being removed: one never registered, given back
    actions, _, _ = run(full(draining), {"burst": 2}, 900.0)
    (back,) = gives_back(actions)
    assert (back.previous_nodes, back.nodes) == (2, 1)


# -- a burst node that registered but never became ready ------------------------------------------------------------
#
# Before: a burst node not ready (its device plugin never reported GPUs, its kubelet NotReady) counted as booting
# capacity for as long as it stayed so, however long after it registered: a shortfall hidden for ever.


def booting_node(age_s: float | None) -> NodeInfo:
    created = None if age_s is None else NOW - age_s
    return NodeInfo("burst-a", 0, "A100", "burst", False, state_since=created)


def test_a_burst_node_not_ready_long_after_registering_is_no_capacity_and_is_given_back() -> None:
    """No capacity on its way; given back by name (no GPU pod on it); its pool not grown while it is counted (a
    broken image would make every node it boots stuck), then backed off."""
    actions, report, state = tick(full(booting_node(900.0)), {"burst": 1})
    assert [s.covered_by_booting for s in report.shortfalls] == [0]
    assert scale_ups(actions) == []
    assert any("burst-a (burst): not ready for 900s" in n and "given back" in n for n in report.notes)
    assert gives_back(actions) == []  # registered: not a node the provider counts that never came
    (back,) = [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_NODE_NOT_READY]
    assert (back.previous_nodes, back.nodes, back.remove_node) == (1, 0, "burst-a")
    assert state.provision_failures == {"burst": (NOW, 1)}
    burst = next(o for o in report.options if o.kind == "burst")
    assert "registered nodes never became ready" in burst.detail


def test_a_not_ready_burst_node_with_gpu_pods_bound_is_not_given_back_nor_closes_its_pool() -> None:
    """It served once (its kubelet went NotReady since): no capacity, not given back with its pods, and no sign
    that the pool's new nodes fail: the pool is grown for the shortfall, no failure counted."""
    bound = PodInfo("inference", "chat-9", "burst-a", 1, 1000, "Running", False, "Deployment", "chat")
    actions, report, state = tick(full(booting_node(900.0), extra_pods=(bound,)), {"burst": 1})
    assert [a.reason for a in actions if isinstance(a, ScaleNodePool)] == [Reason.BURST_SCALE_UP]
    assert any("not given back, and its pool not closed: GPU pods are bound to it" in n for n in report.notes)
    assert state.provision_failures == {}


@pytest.mark.parametrize("age", [600.0, None])
def test_a_burst_node_booting_within_the_timeout_or_of_unknown_age_is_capacity_on_its_way(age: float | None) -> None:
    actions, report, _ = tick(full(booting_node(age)), {"burst": 1})
    assert report.shortfalls == ()  # its 8 GPUs cover the 4 replicas short
    assert scale_ups(actions) == []
