"""The rebalancer's hourly bound across restarts and changes of leader (the move ledger, ``ports.MoveLedger``).

Kept in memory only, the evictions of the last hour were forgotten by a new leader, which could then spend a second
hour's budget within the same hour. These tests fail on a controller without the ledger: the second leader moves
again in the first leader's hour."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest

from autoscaler.controller import Controller
from autoscaler.core.cluster import PodInfo
from autoscaler.core.rebalance import HOUR_S, RebalanceConfig, merge_move_times
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.ledger import InMemoryMoveLedger, SharedMoveRecord
from autoscaler.ports import PortError
from tests.runtime.test_rebalance_pass import CONFIG, T0, evicted, sample, world

ONE_PER_HOUR = replace(CONFIG, max_moves_per_pass=1, max_moves_per_hour=1, retry_after_s=0.0)


def put_back(cluster: FakeCluster) -> None:
    """The moved replica is back on n2 (a spreading scheduler's worst case): the same move is wanted again."""
    if "inf/chat-1" not in cluster.pods:
        cluster.add_pod(PodInfo("inf", "chat-1", "n2", 1, 1000, "Running", True, "Deployment", "chat",
                                labels={"app": "chat"}))


def leader(cluster: FakeCluster, record: SharedMoveRecord, config: RebalanceConfig = ONE_PER_HOUR) -> Controller:
    """A controller process on ``cluster`` whose ledger is ``record`` (the ConfigMap every replica shares)."""
    c, _, _ = world(config=config)
    c.cluster = c.writer = cluster
    c.actuator.writer = cluster
    c.move_ledger = InMemoryMoveLedger(record)
    return c


def shared_world(config: RebalanceConfig = ONE_PER_HOUR) -> tuple[FakeCluster, SharedMoveRecord]:
    _, cluster, _ = world(config=config)
    return cluster, SharedMoveRecord()


def test_a_new_leader_within_the_hour_does_not_spend_a_second_budget() -> None:
    cluster, record = shared_world()
    first = leader(cluster, record)
    first.run_once(T0)
    first.rebalance(T0 + 1)
    assert evicted(cluster) == ["chat-1"] and record.move_times == (T0 + 1,)
    put_back(cluster)

    second = leader(cluster, record)  # the first one died; its memory went with it
    for minutes in (5, 30, 59):
        now = T0 + 60 * minutes
        second.run_once(now)
        report = second.rebalance(now + 1)
        assert report is not None and report.result == "ok" and report.results == []
    assert evicted(cluster) == ["chat-1"]
    assert sample(second, "gpu_autoscaler_rebalance_moves_last_hour") == 1

    now = T0 + HOUR_S + 60  # the first move is over an hour old: the budget is back
    second.run_once(now)
    second.rebalance(now + 1)
    assert evicted(cluster) == ["chat-1", "chat-1"]
    assert record.move_times == (now + 1,)  # the hour-old one dropped


def test_the_evictions_are_recorded_before_they_go_out() -> None:
    cluster, record = shared_world()
    c = leader(cluster, record)
    seen_at_eviction: list[tuple[float, ...]] = []
    evict = cluster.evict_pod

    def evict_and_look(*args, **kwargs):
        seen_at_eviction.append(record.move_times)
        return evict(*args, **kwargs)

    cluster.evict_pod = evict_and_look  # type: ignore[method-assign]
    c.run_once(T0)
    c.rebalance(T0 + 1)
    assert seen_at_eviction == [(T0 + 1,)]  # a crash right after the eviction cannot forget it


@pytest.mark.parametrize("fault", ["read", "write"])
def test_a_ledger_that_cannot_be_read_or_written_moves_nothing(fault: str) -> None:
    cluster, record = shared_world()
    c = leader(cluster, record)
    if fault == "read":
        record.fail_reads = 1
    else:
        record.fail_writes = 1
    c.run_once(T0)
    report = c.rebalance(T0 + 1)
    assert report is not None and report.result == "held" and "move ledger" in report.held_because
    assert evicted(cluster) == [] and record.move_times == ()
    assert sample(c, "gpu_autoscaler_errors_total", component="rebalance") == 1
    c.run_once(T0 + 300)  # the next pass, the ledger answering again, moves
    c.rebalance(T0 + 301)
    assert evicted(cluster) == ["chat-1"] and record.move_times == (T0 + 301,)


class _OvertakenLedger(InMemoryMoveLedger):
    """Another process (the new leader) records a move right after this one's read: a former leader's pass that
    read the ledger just before it lost the Lease."""

    def read(self) -> tuple[float, ...]:
        seen = super().read()
        record = self.record
        record.move_times, record.version = (*record.move_times, T0 - 10.0), record.version + 1
        return seen


def test_a_write_after_another_process_wrote_moves_nothing() -> None:
    cluster, record = shared_world()
    old = leader(cluster, record, replace(ONE_PER_HOUR, max_moves_per_hour=2))
    old.move_ledger = _OvertakenLedger(record)
    old.run_once(T0)
    report = old.rebalance(T0 + 1)
    assert report is not None and report.result == "held" and "409" in report.held_because
    assert evicted(cluster) == [] and record.move_times == (T0 - 10.0,)  # the other process's record stands


def test_a_refused_eviction_gives_its_reservation_back() -> None:
    cluster, record = shared_world()
    c = leader(cluster, record)
    cluster.block_evictions("inf", "chat-1")
    c.run_once(T0)
    report = c.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["blocked"]
    assert record.move_times == ()  # reserved (T0 + 1) before the eviction, given back after the refusal
    assert c.move_ledger.writes == [(T0 + 1,), ()]  # type: ignore[union-attr]


def test_a_dry_run_reads_the_ledger_it_is_given_and_never_writes_it() -> None:
    """Since stop 40 (``autoscaler plan`` gives its dry-run controller the ledger, read only, so that the moves it
    shows are those the acting controller's budget allows; ``autoscaler run --dry-run`` is given none): the pass
    reads the ledger and writes nothing, not even the correction after its dry-run "evictions"; a failed read holds
    the pass as it holds the acting controller's."""
    c, _, _ = world(dry_run=True, config=ONE_PER_HOUR)
    record = SharedMoveRecord()
    record.fail_writes = 1  # would fail a write if one were made
    c.move_ledger = InMemoryMoveLedger(record)
    c.run_once(T0)
    report = c.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["dry_run"]
    assert record.fail_writes == 1 and record.move_times == () and record.version == 0
    record.fail_reads = 1
    c.run_once(T0 + 60)
    held = c.rebalance(T0 + 61)
    assert held is not None and held.result != "ok" and held.results == []


def test_merge_counts_each_instant_as_often_as_the_source_that_saw_it_more() -> None:
    now = T0
    kept = (now - 100, now - 100, now - 50)
    recorded = (now - 4000, now - 100, now - 50, now - 50, now - 10)
    assert merge_move_times(kept, recorded, now) == (now - 100, now - 100, now - 50, now - 50, now - 10)
    assert merge_move_times((), (), now) == ()
    assert merge_move_times((now - HOUR_S,), (), now) == ()  # exactly an hour old: out of the window


def test_the_settings_wire_a_configmap_ledger_beside_the_lease() -> None:
    from autoscaler.adapters.kubernetes.ledger import KubernetesMoveLedger
    from autoscaler.app import Adapters, _move_ledger
    from autoscaler.fakes.metrics import FakeMetricsSource
    from autoscaler.settings import Settings
    from tests.runtime.runtime_fakes import FakePolicies

    fake = FakeCluster()
    adapters = Adapters(metrics=FakeMetricsSource(), cluster=fake, writer=fake, policies=FakePolicies([]),
                        status_writer=None, node_pools=None, api_client=object())
    on = Settings(rebalance={"enabled": True}, leader_election={"lease_namespace": "ops"})
    ledger = _move_ledger(on, adapters)
    assert isinstance(ledger, KubernetesMoveLedger)
    assert (ledger.namespace, ledger.name) == ("ops", "gpu-autoscaler-rebalance-moves")
    assert _move_ledger(Settings(rebalance={"enabled": True, "ledger_configmap": ""}), adapters) is None
    assert _move_ledger(Settings(rebalance={"enabled": True}, dry_run=True), adapters) is None
    assert _move_ledger(Settings(), adapters) is None  # the rebalancer is off


def test_port_error_type_for_bad_ledger_data() -> None:
    from autoscaler.adapters.kubernetes.ledger import parse_move_times

    assert parse_move_times(None, "x") == ()
    assert parse_move_times("[3, 1.5]", "x") == (1.5, 3.0)
    for bad in ("nope", "{}", '["a"]', "[NaN]", "[true]"):
        with pytest.raises(PortError, match="moveTimes"):
            parse_move_times(bad, "x")


def test_the_passes_moved_for_merge_as_every_pass_either_saw_once() -> None:
    """Each pass of moves for a target counts towards its wait (the wait doubles with each): the merge keeps every
    (target, time) either side saw, once -- a ledger this process wrote holds its own passes again."""
    from autoscaler.core.rebalance import merge_moved_for

    kept = (("a", 10.0), ("b", 30.0))
    recorded = (("b", 20.0), ("c", 5.0), ("a", 40.0), ("a", 10.0))
    assert merge_moved_for(kept, recorded) == (("c", 5.0), ("a", 10.0), ("b", 20.0), ("b", 30.0), ("a", 40.0))
    assert merge_moved_for((), ()) == ()


# the per-target wait alone (put_back_checks=0: the put-back hold, stop 48, would hold every move after three
# futile passes; tests/core/test_rebalance_put_back.py tests it)
WAITS = replace(CONFIG, max_moves_per_pass=1, max_moves_per_hour=8, retry_after_s=1800.0, retry_after_max_s=14400.0,
                put_back_checks=0)  # fmt: skip


def passes(c: Controller, cluster: FakeCluster, minutes: Iterable[int], moved_at: list[int]) -> None:
    """A tick and a rebalance pass at each of ``minutes`` (after T0), the moved replica put back after each (a
    spreading scheduler's worst case); the minutes whose pass evicted something are appended to ``moved_at``."""
    for minute in minutes:
        now = T0 + 60 * minute
        c.run_once(now)
        before = len(evicted(cluster))
        c.rebalance(now + 1)
        if len(evicted(cluster)) > before:
            moved_at.append(minute)
        put_back(cluster)


def test_the_doubling_wait_holds_across_a_change_of_leader() -> None:
    """Each pass of moves for a target still waiting doubles its wait (30 min, 1 h, 2 h, ...); the ledger keeps every
    pass, so a new leader after two futile passes waits the third wait (2 h after the last), not the first (30 min)."""
    cluster, record = shared_world(WAITS)
    moved_at: list[int] = []
    passes(leader(cluster, record, WAITS), cluster, range(0, 120, 5), moved_at)  # every 5 minutes for 2 hours
    assert moved_at == [0, 30, 90]  # waits of 30 and 60 minutes
    assert [t for t, _ in record.moved_for] == ["gang job/ml/wait"] * 3
    # the first leader died at minute 120; its memory went with it
    passes(leader(cluster, record, WAITS), cluster, range(120, 330, 5), moved_at)
    assert moved_at == [0, 30, 90, 210]  # the third wait, 2 h, whichever leader moved
