"""Review of stop 48's put-back hold (5e26d10) and the burst exclusion of suspended training (a02ce23)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.rebalance import RebalanceState, plan_rebalance, put_back_hold, record_pass
from tests.core.test_rebalance import BASE_NODES, BASE_PODS, CONFIG, NOW, gang, node, replica, snap

TARGET = "gang job/ml/wait"
STEP = CONFIG.interval_s


def _applied(plan) -> set[tuple[str, str]]:
    return {(a.namespace, a.name) for a in plan.actions}


def test_a_target_whose_moves_were_partly_refused_is_not_watched() -> None:
    """Two replicas must leave n2 for the gang; a PodDisruptionBudget refuses the second eviction. The room was never
    made: the gang still fitting nowhere at the next pass is no room *put back* by the scheduler, and three such
    refusals must not hold every move (burst nodes' emptying included) for four hours."""
    nodes = [node("n1"), node("n2"), node("n3")]
    pods = [
        *gang("fixed", ["n1"], gpus=4), replica("chat", 0, "n1"), replica("web", 0, "n1"),
        replica("chat", 1, "n2"), replica("web", 1, "n2"),
        *gang("big", ["n3"], gpus=4),
        *gang("wait", [None]),
    ]  # fmt: skip
    plan, planned = plan_rebalance(snap(nodes, pods), NOW, CONFIG, RebalanceState())
    assert sorted(a.name for a in plan.actions) == ["chat-1", "web-1"]
    assert {m.target for m in plan.moves} == {TARGET}
    refused = record_pass(RebalanceState(), planned, plan, NOW, {("inf", "chat-1")})
    assert refused.watching == ()
    assert refused.move_times == (NOW,)  # the made eviction still counts against the bounds
    made = record_pass(RebalanceState(), planned, plan, NOW, _applied(plan))
    assert made.watching == ((TARGET, NOW),)


def test_a_target_moved_for_again_while_watched_is_watched_and_judged_once() -> None:
    """Retry wait under the watch time: at the second pass the gang still fits where the first moves made room (n2),
    so it stays watched -- but a higher-priority gang takes n2 first and the gang is moved for again (web-1 off n4).
    One target, one judgement: watched twice, its put-back counted two of the three at one pass."""
    config = replace(CONFIG, retry_after_s=60.0, retry_after_max_s=60.0)
    nodes = [node("n1"), node("n2"), node("n3"), node("n4")]
    first = [
        *gang("fixed", ["n1"], gpus=4), replica("chat", 0, "n1"), replica("web", 0, "n1"),
        replica("chat", 1, "n2"),
        *gang("big", ["n3"], gpus=6),
        replica("web", 1, "n4"),
        *gang("wait", [None]),
    ]  # fmt: skip
    plan, planned = plan_rebalance(snap(nodes, first), NOW, config, RebalanceState())
    assert [a.name for a in plan.actions] == ["chat-1"]
    state = record_pass(RebalanceState(), planned, plan, NOW, _applied(plan))
    assert state.watching == ((TARGET, NOW),)
    # chat-1's replacement on n1, n2 empty; a higher-priority gang now waits too and takes n2
    vip = [replace(p, priority=1000) for p in gang("vip", [None])]
    second = [p for p in first if p.name != "chat-1"] + [replica("chat", 9, "n1"), *vip]
    later = NOW + STEP
    plan, planned = plan_rebalance(snap(nodes, second), later, config, state)
    assert [a.name for a in plan.actions] == ["web-1"] and {m.target for m in plan.moves} == {TARGET}
    state = record_pass(state, planned, plan, later, _applied(plan))
    assert [t for t, _ in state.watching] == [TARGET]
    # both rooms refilled: the gang fits nowhere at the next pass -- one put back, not two
    third = [p for p in first if p.name not in ("chat-1", "web-1")]
    third += [replica("chat", 9, "n2"), replica("web", 9, "n4"), *vip]
    _, planned = plan_rebalance(snap(nodes, third), later + STEP, config, state)
    assert [back for _, back in planned.put_back] == [True]


def test_a_clock_stepped_back_holds_no_longer_than_put_back_hold_s() -> None:
    state = RebalanceState(put_back=((NOW, True),) * 3)
    assert put_back_hold(state, NOW - 86400.0, CONFIG) == CONFIG.put_back_hold_s


def test_a_clock_stepped_back_watches_no_longer_than_put_back_watch_s() -> None:
    """The gang fits where its move made room (n2 empty, not bound yet); the move's time is a day ahead of the clock
    (stepped back): watched from now, and judged kept once put_back_watch_s is over, not a day later."""
    kept = [p for p in BASE_PODS if p.name != "chat-1"] + [replica("chat", 9, "n1")]
    state = RebalanceState(watching=((TARGET, NOW + 86400.0),))
    _, planned = plan_rebalance(snap(BASE_NODES, kept), NOW, CONFIG, state)
    assert [t for t, _ in planned.watching] == [TARGET]
    _, planned = plan_rebalance(snap(BASE_NODES, kept), NOW + CONFIG.put_back_watch_s, CONFIG, planned)
    assert planned.watching == () and [back for _, back in planned.put_back] == [False]


@pytest.mark.parametrize("field", ["put_back_checks", "put_back_hold_s", "put_back_watch_s"])
def test_a_bad_put_back_setting_is_named_alone(field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be >= 0"):
        replace(CONFIG, **{field: -1})
