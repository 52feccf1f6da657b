"""The rebalancer's back-off for a target still waiting after its moves (issue 15, stop 41).

Under a spreading scheduler (LeastAllocated, no extender) a moved replica's replacement lands back on the node the
move just emptied, and the gang it was moved for waits on. A fixed ``retry_after_s`` repeated the same futile moves
every 30 minutes for as long as the gang waited (the mixed scenario's seed 14: 104 evictions in 3 days, 37 of them
for one suspended Job). Now each further pass of moves for a target still waiting doubles its wait, up to
``retry_after_max_s``; a target no longer waiting (placed, or gone) is forgotten, so its next wait starts over.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.core.rebalance import (
    RebalanceConfig,
    RebalanceState,
    merge_moved_for,
    plan_rebalance,
    record_pass,
)
from tests.core.test_rebalance import BASE_NODES, BASE_PODS, CONFIG, NOW, snap

TARGET = "gang job/ml/wait"


@pytest.mark.parametrize(
    ("retry", "cap", "waits", "remembered"),
    [
        (1800.0, 14400.0, [1800.0, 3600.0, 7200.0, 14400.0, 14400.0, 14400.0], 4),
        (1800.0, 5000.0, [1800.0, 3600.0, 5000.0, 5000.0], 3),  # the cap need not be a doubling of the first wait
        (1800.0, 1800.0, [1800.0, 1800.0, 1800.0], 1),  # cap = first wait: the fixed wait of before
        (7200.0, 100.0, [7200.0, 7200.0], 1),  # a cap below the first wait never shortens it
        (0.0, 14400.0, [0.0, 0.0, 0.0], 1),  # no wait: nothing to double
        (1.0, 1e12, [1.0, 2.0, 4.0, 8.0], 41),  # a huge cap: still a bounded memory
    ],
)
def test_the_wait_doubles_with_each_pass_up_to_the_cap(
    retry: float, cap: float, waits: list[float], remembered: int
) -> None:
    config = RebalanceConfig(retry_after_s=retry, retry_after_max_s=cap)
    assert [config.retry_wait_s(n) for n in range(1, len(waits) + 1)] == waits
    assert config.attempts_remembered() == remembered
    # the passes remembered are exactly those that reach the longest wait (none to reach without a first wait)
    assert config.retry_wait_s(config.attempts_remembered()) == (max(retry, cap) if retry > 0 else 0.0)


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="retry_after_max_s"):
        RebalanceConfig(retry_after_max_s=-1.0)


def _passes(config: RebalanceConfig, hours: float, pods=BASE_PODS) -> tuple[list[float], RebalanceState]:
    """Passes every interval_s over ``hours``, the cluster unchanged (every move is undone at once), every eviction
    made: the instants of the passes that moved, and the last state."""
    state = RebalanceState()
    moved: list[float] = []
    now = NOW
    while now < NOW + hours * 3600:
        plan, planned = plan_rebalance(snap(BASE_NODES, list(pods)), now, config, state)
        state = record_pass(state, planned, plan, now, {(a.namespace, a.name) for a in plan.actions})
        if plan.actions:
            moved.append(now - NOW)
        # the ledger never holds more than the passes that set the wait (and this pass's)
        assert sum(1 for t, _ in state.moved_for if t == TARGET) <= config.attempts_remembered() + 1
        now += config.interval_s
    return moved, state


def test_a_target_whose_moves_are_always_undone_is_moved_for_ever_more_rarely() -> None:
    alone = replace(CONFIG, put_back_checks=0)  # the per-target wait alone (the put-back hold: below)
    moved, _ = _passes(alone, 16)
    assert moved == [0.0, 1800.0, 5400.0, 12600.0, 27000.0, 41400.0, 55800.0]
    fixed, _ = _passes(replace(alone, retry_after_max_s=CONFIG.retry_after_s), 16)
    assert fixed == [i * 1800.0 for i in range(32)]  # the wait of before: every 30 minutes for 16 hours


def test_with_the_put_back_hold_three_refilled_rooms_hold_every_move_for_four_hours() -> None:
    """Stop 48: each pass of moves is judged at the next pass -- the gang still waits and fits nowhere: the room was
    refilled (here the cluster is unchanged, as when a spreading scorer puts the moved replica back). After three in
    a row no move is made for ``put_back_hold_s`` (4 h) after the third judgement (5,700 s), whatever the target's
    own wait (12,600 s): one probe pass per hold then."""
    moved, state = _passes(CONFIG, 16)
    assert moved == [0.0, 1800.0, 5400.0, 20100.0, 34800.0, 49500.0]
    assert [back for _, back in state.put_back] == [True, True, True]
    fixed, _ = _passes(replace(CONFIG, retry_after_max_s=CONFIG.retry_after_s), 16)
    assert fixed == [0.0, 1800.0, 3600.0, 18300.0, 33000.0, 47700.0]  # the fixed wait is held too


def test_a_target_no_longer_waiting_is_forgotten_once_its_wait_is_over_and_its_wait_starts_over() -> None:
    config = replace(CONFIG, put_back_checks=0)  # the per-target wait alone
    _, state = _passes(config, 4)  # four passes of moves (0, 0.5, 1.5, 3.5 h): the next wait would be 4 h
    assert [t for t, _ in state.moved_for] == [TARGET] * 4
    placed = [p for p in BASE_PODS if not p.name.startswith("wait")]  # the gang ran (or was deleted)
    # missing from a snapshot within its wait (its pods being recreated, say): remembered
    soon = NOW + 4 * 3600
    plan, planned = plan_rebalance(snap(BASE_NODES, placed), soon, config, state)
    assert plan.actions == () and [t for t, _ in planned.moved_for] == [TARGET] * 4
    # ... once the wait (4 h after 3.5 h) is over, forgotten
    later = NOW + 7.5 * 3600
    state = record_pass(state, planned, plan, soon, set())
    plan, planned = plan_rebalance(snap(BASE_NODES, placed), later, config, state)
    assert plan.actions == () and planned.moved_for == ()
    state = record_pass(state, planned, plan, later, set())
    assert state.moved_for == ()
    # a gang of the same name waits again five minutes later: moved for at once, its first wait 1800 s again
    back = later + CONFIG.interval_s
    plan, planned = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), back, config, state)
    assert len(plan.actions) == 1 and planned.moved_for == ((TARGET, back),)


def test_a_new_leader_waits_as_long_as_the_ledger_says_the_old_one_would_have() -> None:
    """The ledger holds every pass of moves for a target still waiting (merge_moved_for keeps them all): a leader
    that took over after three futile passes waits 7200 s, not the first wait's 1800 s."""
    recorded = ((TARGET, NOW - 9000.0), (TARGET, NOW - 7200.0), (TARGET, NOW - 3600.0))
    state = RebalanceState(moved_for=merge_moved_for((), recorded))
    plan, _ = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), NOW, CONFIG, state)
    assert plan.actions == ()
    assert any("3 pass(es) of moves" in n and "7200s" in n for n in plan.notes), plan.notes
    plan, _ = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), NOW + 3600.0, CONFIG, state)
    assert len(plan.actions) == 1


def test_an_old_ledger_with_one_entry_per_target_reads_as_one_pass() -> None:
    """A ledger written before the back-off (one [target, time] per target) means one pass: the first wait."""
    state = RebalanceState(moved_for=((TARGET, NOW - 1700.0),))
    plan, _ = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), NOW, CONFIG, state)
    assert plan.actions == ()
    plan, _ = plan_rebalance(snap(BASE_NODES, list(BASE_PODS)), NOW + 100.0, CONFIG, state)
    assert len(plan.actions) == 1


def test_the_settings_and_the_scenario_carry_the_cap_and_refuse_one_below_the_first_wait() -> None:
    from pydantic import ValidationError

    from autoscaler.settings import RebalanceSettings
    from autoscaler.sim.scenario import Rebalance

    config = RebalanceSettings(enabled=True, retry_after_seconds=600, retry_after_max_seconds=3000).to_config(
        300.0, ()
    )
    assert (config.retry_after_s, config.retry_after_max_s) == (600.0, 3000.0)
    assert RebalanceSettings(enabled=True).to_config(300.0, ()).retry_after_max_s == 14400.0
    with pytest.raises(ValidationError, match=r"retry_after_max_seconds.*must be >= .*retry_after_seconds"):
        RebalanceSettings(retry_after_seconds=3600, retry_after_max_seconds=1800)
    block = Rebalance.model_validate({"retryAfterSeconds": 900, "retryAfterMaxSeconds": 900})
    assert (block.retry_after_seconds, block.retry_after_max_seconds) == (900.0, 900.0)
    with pytest.raises(ValidationError, match=r"retryAfterMaxSeconds .* must be >= retryAfterSeconds"):
        Rebalance.model_validate({"retryAfterSeconds": 900, "retryAfterMaxSeconds": 600})


def test_the_simulator_runs_the_rebalancer_with_the_scenarios_waits() -> None:
    from autoscaler.sim.scenario import SCENARIO_DIR, load_scenario
    from autoscaler.sim.training import rebalance_config

    scenario, _ = load_scenario(SCENARIO_DIR / "mixed-training.yaml")
    block = scenario.rebalance.model_copy(update={"retry_after_seconds": 60.0, "retry_after_max_seconds": 240.0})
    config = rebalance_config(scenario.model_copy(update={"rebalance": block}))
    assert (config.retry_after_s, config.retry_after_max_s, config.attempts_remembered()) == (60.0, 240.0, 3)
