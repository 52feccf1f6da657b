"""Review of stop 41 (df77193): the controller's doubling wait with the move ledger."""

from __future__ import annotations

from tests.runtime.test_rebalance_ledger import WAITS, leader, passes, shared_world
from tests.runtime.test_rebalance_pass import T0, training_pod

TARGET = "gang job/ml/wait"


def test_a_target_placed_is_forgotten_by_the_controller_too() -> None:
    """Fixed (was a strict xfail). WRONG: three futile passes for the gang (0, 30, 90 min), then it is placed; once
    its wait (2 h from minute 90) is over the pass forgets it in memory but, moving nothing, did not rewrite the
    ledger: a gang of the same name waiting again got the 3 old passes back at the next merge_moved_for, and after
    its move waited 4 h where plan_rebalance alone (the simulator, a controller without a ledger) starts over at
    30 minutes. RIGHT: the forgetting reaches the ledger -- a pass whose moved_for drops passes the ledger holds
    writes it (leader, not dry run), moves or not. (The review's first version placed the gang back at minute 105,
    within its wait; since the fix of test_a_target_missing_from_one_pass_keeps_its_wait an absent target keeps
    its passes until its wait is over, here and in the simulator alike.)"""
    cluster, record = shared_world(WAITS)
    c = leader(cluster, record, WAITS)
    moved_at: list[int] = []
    passes(c, cluster, range(0, 100, 5), moved_at)
    assert moved_at == [0, 30, 90]
    del cluster.pods["ml/wait"]  # placed (or deleted)
    passes(c, cluster, [100, 215], moved_at)  # within its wait, then past it
    assert TARGET not in {t for t, _ in c.rebalance_state.moved_for}  # forgotten in memory...
    assert record.moved_for == ()  # ... and in the ledger
    cluster.add_pod(training_pod("wait", None, 8))  # waiting again
    passes(c, cluster, [220, 245, 250], moved_at)
    assert moved_at == [0, 30, 90, 220, 250]  # then the first wait, 30 min, again


def test_pin_without_a_ledger_the_controller_forgets_a_placed_target() -> None:
    """The same story without a ledger: the target comes back with a fresh first wait and is moved for at once."""
    cluster, record = shared_world(WAITS)
    c = leader(cluster, record, WAITS)
    c.move_ledger = None
    moved_at: list[int] = []
    passes(c, cluster, range(0, 100, 5), moved_at)
    del cluster.pods["ml/wait"]
    passes(c, cluster, [100, 215], moved_at)
    cluster.add_pod(training_pod("wait", None, 8))
    passes(c, cluster, [220, 245, 250], moved_at)
    assert moved_at == [0, 30, 90, 220, 250]  # then the first wait, 30 min, again


def test_a_dry_run_never_writes_the_ledger_even_when_it_forgets() -> None:
    cluster, record = shared_world(WAITS)
    c = leader(cluster, record, WAITS)
    moved_at: list[int] = []
    passes(c, cluster, range(0, 100, 5), moved_at)
    c.dry_run = True
    del cluster.pods["ml/wait"]
    passes(c, cluster, [215], moved_at)
    assert TARGET not in {t for t, _ in c.rebalance_state.moved_for}  # the dry run forgot it...
    assert [t for t, _ in record.moved_for] == [TARGET] * 3  # ... the acting controller's record is untouched


def test_pin_a_refused_move_is_no_pass_in_the_ledger() -> None:
    """The ledger's movedFor is written before the evictions (this pass's target in it) and corrected after a
    refusal: a refused move is no pass of moves, and the next pass moves for the target again."""
    cluster, record = shared_world(WAITS)
    c = leader(cluster, record, WAITS)
    cluster.block_evictions("inf", "chat-1")
    moved_at: list[int] = []
    passes(c, cluster, [0], moved_at)
    assert moved_at == [] and record.moved_for == () and c.rebalance_state.moved_for == ()
    cluster.clear_faults()
    passes(c, cluster, [5], moved_at)
    assert moved_at == [5] and record.moved_for == ((TARGET, T0 + 301),)
