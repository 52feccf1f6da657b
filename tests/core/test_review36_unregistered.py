"""Review of the give-back of burst nodes that never registered (commits 5b4a9b2, 807b53c): core defects.

Each test was a strict xfail on that code, saying what was wrong and what the right behaviour is; all four are fixed
(``_provision_overdue``, ``_provision_backoff``, ``_give_back``'s ``resized``)."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason

NOW = 100_000.0
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=0, min_nodes=0, max_nodes=4)
LONG = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600)


def replica(index: int, node: str | None) -> PodInfo:
    return PodInfo(
        "inference", f"chat-{index}", node, 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600
    )


def snapshot(*extra_nodes: NodeInfo, workloads: tuple[WorkloadInfo, ...] = ()) -> ClusterSnapshot:
    """chat holds every GPU of the on-prem n1 (8 replicas)."""
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), *extra_nodes)
    return ClusterSnapshot(NOW, pods=tuple(replica(i, "n1") for i in range(8)), nodes=nodes, workloads=workloads)


def tick(snap: ClusterSnapshot, pool_nodes, state: CapacityState, now: float, want: int = 8, config=LONG):  # type: ignore[no-untyped-def]
    reason = Reason.METRIC_ABOVE_TARGET if want > 8 else Reason.WITHIN_TOLERANCE
    decision = ScaleDecision(CHAT.key, 8, want, reason, "")
    arb = ArbitrationInput(now, replace(snap, time=now), {CHAT.key: CHAT}, [decision], {}, pool_nodes=pool_nodes)
    return arbitrate(arb, state, config)


def resizes(actions) -> list[tuple[Reason, int, int]]:  # type: ignore[no-untyped-def]
    return [(a.reason, a.previous_nodes, a.nodes) for a in actions if isinstance(a, ScaleNodePool)]


def test_a_tick_giving_back_an_unregistered_node_does_not_resume_training_onto_the_pools_burst_node() -> None:
    """Fixed (was a strict xfail).

    WRONG before: the pool giving back a node that never registered is left out of ``_give_back``'s pools (``kept``) to
    keep it to one resize per tick. ``_give_back`` also uses that list to tell whether burst nodes are left
    (``burst_left``: "burst nodes are given back first", no training resumed while one stays) and which nodes are
    burst nodes (``burst_names``: training is never resumed onto them). So in that tick a suspended gang is resumed
    while the pool's registered burst node is still up, counting that burst node's free GPUs as room for training:
    its pods land on (or wait for) an inference burst node that is about to be given back, and the resumable timer is
    not cleared as it would be on any other tick.
    Now: the pool keeps counting as a burst pool with nodes left (no resume this tick, nothing resumed onto burst
    GPUs); only its spare-node give-back waits for the next tick. Fix: pass every pool to ``_give_back`` and skip
    the spare give-back/consolidation of the ``given_back`` pools inside its loop (still setting ``burst_left``)."""
    burst_node = NodeInfo("burst-a", 8, "A100", "burst", True)  # registered, empty
    job = WorkloadInfo("Job", "ml", "train", "job/ml/train", True, 100, (8,), None, NOW - 7200)
    state = CapacityState(
        unregistered_since={"burst": (NOW - 900.0, 1)},
        free_since=NOW - 3600,
        resumable_since={"Job/ml/train": NOW - 3600},
    )
    # the reference: the same cluster, but the unregistered node not yet overdue -- no resume (a burst node is left)
    ref_state = replace(state, unregistered_since={"burst": (NOW - 100.0, 1)})
    ref, _, _ = tick(snapshot(burst_node, workloads=(job,)), {"burst": 2}, ref_state, NOW)
    assert not any(isinstance(a, ResumeWorkload) for a in ref)
    actions, _, _ = tick(snapshot(burst_node, workloads=(job,)), {"burst": 2}, state, NOW)
    assert (Reason.BURST_NODE_NOT_REGISTERED, 2, 1) in resizes(actions)
    assert not any(isinstance(a, ResumeWorkload) for a in actions)


def test_a_pool_size_read_error_does_not_restart_the_provision_timer_nor_count_a_second_failure() -> None:
    """Fixed (was a strict xfail).

    WRONG before: the controller leaves a pool whose size it cannot read out of ``pool_nodes`` (an API error on
    one tick); ``_unregistered`` then has no entry for it and ``_provision_overdue`` drops its timer. On the next
    tick the node that has not registered for 900 s is a "new request": counted as capacity on its way again (hiding
    the shortfall) and not given back for another whole timeout (a VM billed 15 more minutes), and when it goes
    overdue again the back-off counts a second failure in a row (600 s instead of 300 s). One API error extends the
    cost and the back-off.
    Now: a pool whose size was not read keeps its timer (and its failure record) as they were; the next tick
    with the size gives the node back."""
    snap = snapshot()
    state = CapacityState(unregistered_since={"burst": (NOW - 900.0, 1)})
    # tick 1: overdue, given back -- but the give-back fails (a conflict): the provider still counts 1
    actions, _, state = tick(snap, {"burst": 1}, state, NOW, want=12)
    assert (Reason.BURST_NODE_NOT_REGISTERED, 1, 0) in resizes(actions)
    # tick 2: the pool's size could not be read
    _, _, state = tick(snap, {}, state, NOW + 15, want=12)
    # tick 3: read again, same count: still overdue, given back
    actions, report, state = tick(snap, {"burst": 1}, state, NOW + 30, want=12)
    assert (Reason.BURST_NODE_NOT_REGISTERED, 1, 0) in resizes(actions)
    assert report.shortfalls[0].covered_by_booting == 0
    assert state.provision_failures["burst"][1] == 1


def test_nodes_already_overdue_stay_overdue_when_the_count_rises() -> None:
    """Fixed (was a strict xfail).

    WRONG before: the timer is one per pool and restarts whenever the unregistered count rises. A pool with a node stuck
    past the timeout whose count rises by one (a Cluster Autoscaler drain of a registered node, which the provider
    still counts; a person or another autoscaler adding a node) makes the stuck node "on its way" again for a whole
    timeout: its GPUs hide the shortfall (nothing preempted or bought elsewhere), its give-back stops, and when it
    goes overdue again a second failure in a row is counted (the back-off doubles) for the same stuck node.
    Now: the nodes already overdue stay overdue (e.g. keep the old timer for the old count, a new timer for the
    extra one): still no capacity, still given back, the failure counted once."""
    # stuck since long; then a registered node starts being drained by the Cluster Autoscaler (still counted)
    draining = NodeInfo("burst-a", 8, "A100", "burst", False, leaving=True)
    state = CapacityState(
        unregistered_since={"burst": (NOW - 1000.0, 1)}, provision_failures={"burst": (NOW - 100.0, 1)}
    )
    # chat wants 20: 12 short; 16 GPUs "coming" would cover all of it, the drained node's 8 alone cover 8
    _, report, after = tick(snapshot(draining), {"burst": 2}, state, NOW, want=20)
    assert len(report.shortfalls) == 1  # before the fix: none, the stuck node's GPUs counted as coming again
    assert report.shortfalls[0].covered_by_booting <= 8
    assert any("have not registered for" in n for n in report.notes)
    # and 900 s on, the same stuck node is not a second failure
    _, _, later = tick(snapshot(draining), {"burst": 2}, after, NOW + 900.0, want=20)
    assert later.provision_failures["burst"][1] == 1


def test_a_wall_clock_stepped_back_does_not_lengthen_the_back_off() -> None:
    """Fixed (was a strict xfail).

    WRONG before: ``provision_failures`` keeps wall-clock times; the wall clock stepped back an hour (NTP, a VM),
    a failure recorded at T is an hour "in the future": ``_provision_backoff`` keeps it (``now - at`` is negative)
    and backs the pool off until ``at + backoff``, i.e. an hour and five minutes -- the pool the shortfall needs is
    not grown for an hour. (``core.decide._not_after`` clamps the replica state's entries for the same reason; the
    runtime resets the state only when the clock steps forward.)
    Now: entries later than ``now`` are taken as ``now`` (min(at, now)): at most the back-off from now."""
    state = CapacityState(provision_failures={"burst": (NOW + 3600.0, 1)})
    _, _, state = tick(snapshot(), {"burst": 0}, state, NOW, want=12)
    actions, _, _ = tick(snapshot(), {"burst": 0}, state, NOW + 400.0, want=12)
    assert (Reason.BURST_SCALE_UP, 0, 1) in resizes(actions)
