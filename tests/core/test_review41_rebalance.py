"""Review of stop 41 (df77193 the doubling retry wait, db78bd8 resumable_once_gathered): defects (xfail, strict) and
pins of the behaviours checked and found right."""

from __future__ import annotations

from dataclasses import replace

from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import ResumeWorkload
from autoscaler.core.rebalance import (
    Move,
    RebalancePlan,
    RebalanceState,
    merge_moved_for,
    plan_rebalance,
    record_pass,
)
from tests.core import test_arbitrate as arb
from tests.core import test_rebalance as reb
from tests.core.test_rebalance_backoff import TARGET
from tests.core.test_rebalance_resumable import PAUSED, _report

A100_PAUSED = WorkloadInfo("Job", "ml", "paused", "job/ml/paused", True, 100, (8,), "A100", arb.NOW - 900)


def _h100(name: str) -> NodeInfo:
    return NodeInfo(name, 8, "H100", "onprem", True)


def _resumed(actions) -> list[str]:
    return [a.name for a in actions if isinstance(a, ResumeWorkload)]


# -- resumable_once_gathered ------------------------------------------------------------------------------------------


def _typed_reserve_world(chat_on_n1: int) -> ClusterSnapshot:
    """An A100 Job (8 GPUs) is suspended; chat is pinned to A100 (8 replicas: ``chat_on_n1`` on n1, the rest on n2);
    n3 is an empty H100 node."""
    pods = [arb.replica(i, "n1") for i in range(chat_on_n1)] + [arb.replica(i, "n2") for i in range(chat_on_n1, 8)]
    chat = DeploymentInfo("inference", "chat", 8, 8, gpu_product="A100")
    return ClusterSnapshot(
        arb.NOW,
        deployments=(chat,),
        pods=tuple(pods),
        nodes=(arb.node("n1"), arb.node("n2"), _h100("n3")),
        workloads=(A100_PAUSED,),
    )


def test_free_gpus_of_another_type_do_not_cover_the_reserve_of_a_typed_service() -> None:
    """Fixed (was a strict xfail).

    WRONG: n1 has 6 A100 free, n2 2, n3 (H100) 8; chat (A100 only) wants 2 more replicas soon. The Job is listed
    resumable_once_gathered because 16 free - 2 reserved >= 8; but once gathered (n1 emptied, n2 full) the 2 A100
    replicas fit nowhere and the arbitration keeps the Job suspended -- the moves only restart replicas (what db78bd8
    meant to stop). RIGHT: the reserve of services the Job's nodes serve is kept out of the Job's usable GPUs (or the
    check is made per GPU type / with _reserve_fits on a gathered layout): not listed."""
    # once gathered, it is indeed not resumed: the A100 reserve has no room left
    gathered_actions, gathered_report = _report(_typed_reserve_world(0), 8, demand=10.0)
    assert _resumed(gathered_actions) == []
    assert any("paused" in n and "reserved" in n for n in gathered_report.notes)
    # as things are, it is listed all the same
    actions, report = _report(_typed_reserve_world(2), 8, demand=10.0)
    assert _resumed(actions) == []
    assert report.resumable_once_gathered == ()


def _other_type_room_world(gathered: bool) -> ClusterSnapshot:
    """An A100 Job (8 GPUs) is suspended; chat and web (1-GPU replicas of any GPU type) run one replica each on n1
    (6 free; none when ``gathered``: all four on n3) and on n3 (H100); a running Job fills n2 (A100)."""
    pods = [
        PodInfo(
            "inference",
            f"{dep}-{i}",
            "n3" if gathered or i else "n1",
            1,
            1000,
            "Running",
            True,
            "Deployment",
            dep,
            created_at=arb.NOW - 3600,
        )
        for dep in ("chat", "web")
        for i in range(2)
    ]
    return ClusterSnapshot(
        arb.NOW,
        pods=(*pods, *arb.gang_pods("busy", ["n2"])),
        nodes=(arb.node("n1"), arb.node("n2"), _h100("n3")),
        workloads=(arb.job("busy"), A100_PAUSED),
    )


def test_room_made_by_moving_replicas_to_nodes_the_job_cannot_use_counts() -> None:
    """Fixed (was a strict xfail).

    WRONG: n1 (A100) holds 2 chat replicas of any GPU type (6 free), n2 is full, n3 (H100) is empty. Moving the two
    replicas to n3 frees n1 whole and the arbitration then resumes the Job (checked below), but it is not listed
    resumable_once_gathered (6 free A100 < 8), so the rebalancer no longer moves for it and it stays suspended for as
    long as those replicas stay. RIGHT: listed -- count, besides the free GPUs of its nodes, those held there
    by movable replicas that fit elsewhere (or leave the fine check to the rebalancer's _make_room)."""
    gathered_actions, _ = _report(_other_type_room_world(True), 2)
    assert _resumed(gathered_actions) == ["paused"]  # gathering would get it resumed
    # ... and the rebalancer can gather it when allowed to: two moves to n3
    world = reb.snap(
        [reb.node("n1"), reb.node("n2"), reb.node("n3", product="H100")],
        [
            reb.replica("chat", 0, "n1"),
            reb.replica("chat", 1, "n3"),
            reb.replica("web", 0, "n1"),
            reb.replica("web", 1, "n3"),
            *reb.gang("busy", ["n2"]),
        ],
        workloads=(replace(A100_PAUSED, suspended_by_us_at=reb.NOW - 900),),
    )
    plan, _ = plan_rebalance(world, reb.NOW, reb.CONFIG, RebalanceState(), resumable=frozenset({PAUSED}))
    assert reb.evicted(plan) == ["inf/chat-0", "inf/web-0"]
    assert all(set(m.destinations) == {"n3"} for m in plan.moves)
    actions, report = _report(_other_type_room_world(False), 2)
    assert _resumed(actions) == []
    assert report.resumable_once_gathered == (PAUSED,)


def test_pin_a_pending_gang_is_moved_for_whatever_resumable_says() -> None:
    """``resumable`` restricts only the workloads this controller suspended: a pending gang is moved for as before."""
    for resumable in (None, frozenset()):
        plan, _ = plan_rebalance(
            reb.snap(reb.BASE_NODES, reb.BASE_PODS), reb.NOW, reb.CONFIG, RebalanceState(), resumable=resumable
        )
        assert reb.evicted(plan) == ["inf/chat-1"] and plan.moves[0].target == TARGET


def test_pin_a_typed_job_with_enough_of_its_own_type_scattered_is_listed() -> None:
    """The A100 Job is listed when the A100 GPUs alone cover it and the reserve (no H100 node to blur the sum)."""
    snapshot = replace(_typed_reserve_world(2), nodes=(arb.node("n1"), arb.node("n2")))
    _, report = _report(snapshot, 8)
    assert report.resumable_once_gathered == (PAUSED,)
    _, reserved = _report(snapshot, 8, demand=10.0)  # 8 free - 2 reserved < 8
    assert reserved.resumable_once_gathered == ()


# -- the doubling wait ------------------------------------------------------------------------------------------------


def _pass(pods, now: float, state: RebalanceState) -> tuple[RebalancePlan, RebalanceState]:
    plan, planned = plan_rebalance(reb.snap(reb.BASE_NODES, list(pods)), now, reb.CONFIG, state)
    return plan, record_pass(state, planned, plan, now, {(a.namespace, a.name) for a in plan.actions})


def test_a_target_missing_from_one_pass_keeps_its_wait() -> None:
    """Fixed (was a strict xfail).

    WRONG: the gang is moved for at 0; at 5 min its pods are being recreated (none in the snapshot); at 10 min it
    waits again, as unplaceable as before, and is moved for at once -- 10 minutes after the last move, where the
    fixed wait before df77193 (kept whatever the snapshot) made it wait 30 minutes, and after 4 futile passes the 4 h
    wait drops to nothing the same way. RIGHT: a target absent from the snapshot keeps its passes until its current
    wait (retry_wait_s of their count) is over; only a target seen placed (its pods bound, the workload resumed) is
    forgotten at once."""
    _, state = _pass(reb.BASE_PODS, reb.NOW, RebalanceState())
    assert state.moved_for == ((TARGET, reb.NOW),)
    recreating = [p for p in reb.BASE_PODS if not p.name.startswith("wait")]
    _, state = _pass(recreating, reb.NOW + 300, state)
    plan, _ = _pass(reb.BASE_PODS, reb.NOW + 600, state)
    assert plan.actions == ()  # still within the 1800 s wait of the move at 0


def test_pin_record_pass_keeps_earlier_passes_and_only_the_made_targets_of_this_one() -> None:
    """Several passes of one target, a burst-node target in the same pass, one eviction refused: record_pass slices
    off exactly this pass's entries (one per target moved for) and keeps the earlier passes."""
    now = reb.NOW
    earlier = ((TARGET, now - 5400.0), ("pod inf/other", now - 4000.0), (TARGET, now - 3600.0))
    moves = (
        Move((("inf", "chat-1"),), {"n2": 1}, {"n1": 1}, "deployment/inf/chat", None, TARGET, 8, ""),
        Move((("inf", "web-0"),), {"b1": 1}, {"n3": 1}, "deployment/inf/web", None, "burst node b1", 8, ""),
        Move((("inf", "web2-0"),), {"b1": 1}, {"n3": 1}, "deployment/inf/web2", None, "burst node b1", 8, ""),
    )
    plan = RebalancePlan(True, moves)
    planned = RebalanceState(now, (now, now, now), (*earlier, (TARGET, now), ("burst node b1", now)))
    refused_chat = record_pass(RebalanceState(), planned, plan, now, {("inf", "web2-0")})
    assert refused_chat.moved_for == (*earlier, ("burst node b1", now))
    none_made = record_pass(RebalanceState(), planned, plan, now, set())
    assert none_made.moved_for == earlier
    all_made = record_pass(RebalanceState(), planned, plan, now, {("inf", "chat-1"), ("inf", "web-0")})
    assert all_made.moved_for == planned.moved_for


def test_pin_burst_node_entries_and_surplus_passes_do_not_grow_the_ledger() -> None:
    """A burst node's entry (no waiting target) lasts no longer than a first wait; a target's passes beyond
    attempts_remembered() are dropped (the newest kept), each instant once."""
    old = tuple((TARGET, reb.NOW - 100_000.0 + i * 10_000.0) for i in range(8))
    burst = (("burst node b1", reb.NOW - 300.0), ("burst node b2", reb.NOW - 2000.0))
    state = RebalanceState(moved_for=merge_moved_for(old, (*old, *burst)))
    plan, planned = plan_rebalance(reb.snap(reb.BASE_NODES, reb.BASE_PODS), reb.NOW, reb.CONFIG, state)
    kept = [at for t, at in planned.moved_for if t == TARGET]
    assert [t for t, _ in planned.moved_for if t.startswith("burst")] == ["burst node b1"]  # b2's 1800 s are over
    # 4 remembered (30 min doubled up to 4 h) -- the latest, NOW - 30000 the last: its wait (4 h) is over, moved
    assert kept == [reb.NOW - 60_000.0, reb.NOW - 50_000.0, reb.NOW - 40_000.0, reb.NOW - 30_000.0, reb.NOW]
    assert reb.evicted(plan) == ["inf/chat-1"]


def test_pin_a_pass_timed_before_the_last_one_still_waits() -> None:
    """A wall clock stepped back: a pass recorded 10 minutes "in the future" still makes the target wait (the wait
    counts from that instant), and the state keeps it."""
    state = RebalanceState(moved_for=((TARGET, reb.NOW + 600.0),))
    plan, planned = _pass(reb.BASE_PODS, reb.NOW, state)
    assert plan.actions == () and any("still waiting" in n for n in plan.notes)
    assert planned.moved_for == ((TARGET, reb.NOW + 600.0),)
    plan, _ = _pass(reb.BASE_PODS, reb.NOW + 600.0 + 1800.0, planned)
    assert reb.evicted(plan) == ["inf/chat-1"]


def test_pin_another_leaders_passes_add_to_the_count() -> None:
    """Two leaders' ledgers merged: each distinct pass counts once (here 3: the wait is 2 h from the latest)."""
    mine = ((TARGET, reb.NOW - 9000.0), (TARGET, reb.NOW - 7200.0))
    theirs = ((TARGET, reb.NOW - 7200.0), (TARGET, reb.NOW - 3600.0))
    state = RebalanceState(moved_for=merge_moved_for(mine, theirs))
    plan, _ = _pass(reb.BASE_PODS, reb.NOW + 3500.0, state)
    assert plan.actions == ()
    plan, _ = _pass(reb.BASE_PODS, reb.NOW + 3600.0, state)
    assert reb.evicted(plan) == ["inf/chat-1"]
