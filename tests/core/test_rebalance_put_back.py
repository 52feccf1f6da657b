"""The rebalancer's put-back hold (stop 48).

Under a spreading scorer (kube-scheduler's default LeastAllocated, no extender) the room a move makes is refilled at
once -- by the moved replica's replacement, or the service's next new replica, landing on the node just emptied --
and the target waits on. The per-target back-off (stop 41) only slows the moves for one target; every new waiting
gang got its own futile moves. Now each pass of moves is judged at a later pass: *kept* when its target is placed
or gone, or still fits where the moves made room after ``put_back_watch_s`` (it waits for something else: a resume's
quiet period); *put back* when its target still waits and fits nowhere. After ``put_back_checks`` (3) put back in a
row, no move is made for ``put_back_hold_s`` (4 h): one probe pass per hold, until a move's room is kept.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.rebalance import RebalanceConfig, RebalanceState, plan_rebalance, put_back_hold, record_pass
from tests.core.test_rebalance import BASE_NODES, BASE_PODS, CONFIG, NOW, gang, replica, snap

TARGET = "gang job/ml/wait"
STEP = CONFIG.interval_s
# after the move of chat-1 off n2: put back (the cluster as before), kept (chat-1's replacement on n1, n2 empty, the
# gang not bound yet), placed (the gang on n2)
PUT_BACK = list(BASE_PODS)
KEPT = [p for p in BASE_PODS if p.name != "chat-1"] + [replica("chat", 9, "n1")]
PLACED = [p for p in KEPT if not p.name.startswith("wait")] + gang("wait", ["n2"])


def _moved(config: RebalanceConfig = CONFIG) -> RebalanceState:
    """The state after one pass that moved chat-1 for the gang (the eviction made)."""
    plan, planned = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), NOW, config, RebalanceState())
    assert [a.name for a in plan.actions] == ["chat-1"]
    state = record_pass(RebalanceState(), planned, plan, NOW, {("inf", "chat-1")})
    assert state.watching == ((TARGET, NOW),)
    return state


@pytest.mark.parametrize(
    ("pods", "after", "judged", "watched"),
    [
        pytest.param(PUT_BACK, STEP, [True], (), id="still waiting, fits nowhere: put back"),
        pytest.param(PLACED, STEP, [False], (), id="placed: kept"),
        pytest.param(KEPT, STEP, [], ((TARGET, NOW),), id="fits where the move made room, not bound yet: watched"),
        pytest.param(KEPT, 900.0, [False], (), id="fits there after put_back_watch_s: kept"),
    ],
)  # fmt: skip
def test_a_pass_of_moves_is_judged_by_whether_its_room_was_refilled(
    pods: list, after: float, judged: list[bool], watched: tuple
) -> None:
    _, planned = plan_rebalance(snap(BASE_NODES, list(pods)), NOW + after, CONFIG, _moved())
    assert [back for _, back in planned.put_back] == judged
    assert planned.watching == watched


def test_three_refilled_rooms_in_a_row_hold_every_move_then_one_probe_pass() -> None:
    state = RebalanceState(put_back=((NOW - 2 * STEP, True), (NOW - STEP, True), (NOW, True)))
    assert put_back_hold(state, NOW + STEP, CONFIG) == CONFIG.put_back_hold_s - STEP
    plan, _ = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), NOW + STEP, CONFIG, state)
    assert plan.ran and plan.actions == ()
    assert any(n.startswith("moves held for 14100s more: the last 3 moved pods were put back") for n in plan.notes)
    # the hold over: one probe pass
    probe = NOW + CONFIG.put_back_hold_s
    plan, _ = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), probe, CONFIG, state)
    assert [a.name for a in plan.actions] == ["chat-1"]


@pytest.mark.parametrize(
    ("put_back", "held"),
    [
        pytest.param((True, True), False, id="two put back: not yet"),
        pytest.param((True, False, True), False, id="a kept room between: not in a row"),
        pytest.param((False, True, True, True), True, id="the latest three put back: held"),
    ],
)
def test_only_put_back_checks_in_a_row_hold(put_back: tuple[bool, ...], held: bool) -> None:
    state = RebalanceState(put_back=tuple((NOW - i, back) for i, back in enumerate(reversed(put_back)))[::-1])
    assert (put_back_hold(state, NOW + STEP, CONFIG) > 0) is held


def test_no_hold_when_put_back_checks_is_zero_and_bad_settings_are_refused() -> None:
    state = RebalanceState(put_back=((NOW, True),) * 3)
    assert put_back_hold(state, NOW, replace(CONFIG, put_back_checks=0)) == 0.0
    for field in ("put_back_checks", "put_back_hold_s", "put_back_watch_s"):
        with pytest.raises(ValueError, match="put_back"):
            replace(CONFIG, **{field: -1})


def test_emptying_a_burst_node_is_not_watched() -> None:
    """Its target is the node, not waiting work: whether it was refilled is the give-back's business."""
    from tests.core.test_rebalance import node

    nodes = [node("n1"), node("b1", pool="burst")]
    pods = [replica("chat", i, "n1") for i in range(4)] + [replica("chat", 9, "b1")]
    plan, planned = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert [m.target for m in plan.moves] == ["burst node b1"]
    state = record_pass(RebalanceState(), planned, plan, NOW, {(a.namespace, a.name) for a in plan.actions})
    assert state.watching == () and state.move_times == (NOW,)
