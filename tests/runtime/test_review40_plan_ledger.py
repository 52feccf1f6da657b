"""``autoscaler plan`` and the rebalancer's hourly budget (stop 40, a leftover of stop 39's review).

A dry run (the plan's controller) skipped the move ledger altogether: it showed the moves a fresh hour's budget would
allow, while the acting controller, whose ledger records the evictions of the last hour, would make none. A dry run
now reads the ledger it is given -- the budget and the targets' retry waits are the acting controller's -- and never
writes it; ``autoscaler plan`` gives its controller the ledger read only.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.commands.plan import ReadOnlyMoveLedger
from autoscaler.fakes.ledger import InMemoryMoveLedger, SharedMoveRecord
from tests.runtime.test_rebalance_pass import CONFIG, T0, evicted, world

ONE_PER_HOUR = replace(CONFIG, max_moves_per_pass=1, max_moves_per_hour=1, retry_after_s=0.0)


def _planned_moves(record: SharedMoveRecord, read_only: bool = False) -> tuple[list[str], InMemoryMoveLedger]:
    controller, cluster, _ = world(dry_run=True, config=ONE_PER_HOUR)
    ledger = InMemoryMoveLedger(record)
    controller.move_ledger = ReadOnlyMoveLedger(ledger) if read_only else ledger
    controller.run_once(T0)
    report = controller.rebalance(T0 + 1)
    assert report is not None and report.result == "ok", report
    assert evicted(cluster) == []  # a dry run evicts nothing
    # pre-created at 0: no error counted (the read-only ledger's refused write was one)
    errors = controller.telemetry.registry.get_sample_value("gpu_autoscaler_errors_total", {"component": "rebalance"})
    assert errors == 0
    return [r.action.name for r in report.results], ledger


@pytest.mark.parametrize("read_only", [False, True], ids=["ledger", "plan's read-only ledger"])
def test_a_dry_run_shows_no_move_the_acting_controllers_spent_budget_forbids(read_only: bool) -> None:
    """The acting controller moved a pod 10 minutes ago; one move an hour is allowed: the dry run shows none."""
    record = SharedMoveRecord(move_times=(T0 - 600,))
    moves, ledger = _planned_moves(record, read_only)
    assert moves == []
    assert ledger.writes == [] and record.move_times == (T0 - 600,)


@pytest.mark.parametrize("read_only", [False, True], ids=["ledger", "plan's read-only ledger"])
def test_a_dry_run_shows_the_move_a_budget_left_allows_and_records_nothing(read_only: bool) -> None:
    """The last move is over an hour old: the dry run shows the move, and the ledger is left as it was (a dry run
    reserves nothing: the acting controller's next pass must still find the budget)."""
    record = SharedMoveRecord(move_times=(T0 - 4000,))
    moves, ledger = _planned_moves(record, read_only)
    assert moves == ["chat-1"]
    assert ledger.writes == [] and record.move_times == (T0 - 4000,)


def test_the_plans_ledger_refuses_writes() -> None:
    with pytest.raises(RuntimeError, match="read-only"):
        ReadOnlyMoveLedger(InMemoryMoveLedger()).write((T0,))
