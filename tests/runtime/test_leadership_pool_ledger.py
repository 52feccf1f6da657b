"""The node-pool resize and the rebalancer's move ledger ask whether this replica still leads, like every other write.

Before the fix two write paths skipped the guard: ``NodePoolScaler.scale`` took no ``can_write`` (the actuator asked
``can_act`` once before the call, but a provider reads before it writes, and those reads may outlast the Lease), so a
replica that lost the Lease mid-tick still grew or shrank a burst pool; and ``Controller._rebalance`` wrote the move
ledger (the reservation before its evictions, the give-back after) without asking at all.
"""

from __future__ import annotations

import inspect
from typing import Any

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.controller import Controller
from autoscaler.core.model import ControllerState, Plan, ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.core.tick import TickConfig, TickInput
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.ledger import InMemoryMoveLedger
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import WriteNotAllowed
from autoscaler.sim.cluster import SimCluster
from autoscaler.telemetry import Telemetry
from tests.runtime.runtime_fakes import FakePolicies
from tests.runtime.test_rebalance_ledger import ONE_PER_HOUR, leader, shared_world
from tests.runtime.test_rebalance_pass import T0, evicted, sample

UP = ScaleNodePool("burst", 3, 1, Reason.BURST_SCALE_UP, "t")
DOWN = ScaleNodePool("burst", 1, 2, Reason.BURST_SCALE_DOWN, "t", remove_node="burst-0")


def pool_controller(action: ScaleNodePool, lease: dict[str, bool]) -> tuple[Controller, FakeCluster]:
    """A controller whose tick plans ``action`` on a fake cluster with a ``burst`` pool of 2 (1 for a scale-up)."""
    cluster = FakeCluster()
    cluster.add_pool("burst", action.previous_nodes, gpus_per_node=8)
    controller = Controller(
        metrics=FakeMetricsSource(), cluster=cluster, writer=cluster, policies=FakePolicies([]),
        node_pools=cluster, telemetry=Telemetry(), can_act=lambda: lease["value"],
    )  # fmt: skip

    def decide(tick: TickInput, state: ControllerState, config: TickConfig) -> tuple[Plan, ControllerState]:
        return Plan(tick.now, actions=(action,)), state

    controller._decide = decide
    return controller, cluster


def lose_lease_inside_the_providers_call(cluster: FakeCluster, lease: dict[str, bool]) -> None:
    """The Lease lapses after the actuator's own check, while the provider reads before its write (the Cluster API
    adapter's GET of the MachineDeployment, retried, can outlast it)."""
    original = cluster.scale

    def scale(*args: Any, **kwargs: Any) -> None:
        lease["value"] = False
        original(*args, **kwargs)

    cluster.scale = scale  # type: ignore[method-assign]


# ---- 1. the node-pool write -------------------------------------------------------------------------------------


def test_a_lease_lost_between_the_plan_and_the_pool_write_resizes_nothing() -> None:
    for action in (UP, DOWN):
        lease = {"value": True}
        c, cluster = pool_controller(action, lease)
        lose_lease_inside_the_providers_call(cluster, lease)
        c.run_once(T0)
        assert c.last_report is not None
        (result,) = c.last_report.results
        # before the fix: "applied", and the pool was grown (money) or shrunk by a replica that no longer leads
        assert result.result == "not_leader", (action, result)
        assert cluster.pools["burst"].size == action.previous_nodes
        assert [w.outcome for w in cluster.writes if w.op == "scale"] == ["not_allowed"]
        # a lost Lease is not an error of the node-pool provider
        assert sample(c, "gpu_autoscaler_errors_total", component="node_pool") == 0


def test_the_leader_still_resizes_the_pool() -> None:
    for action in (UP, DOWN):
        c, cluster = pool_controller(action, {"value": True})
        c.run_once(T0)
        assert c.last_report is not None and [r.result for r in c.last_report.results] == ["applied"]
        assert cluster.pools["burst"].size == action.nodes


class LegacyPools:
    """A provider plug-in written before ``remove_node`` and ``can_write``: its scale takes neither."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []

    def node_count(self, pool: str) -> int:
        return 1

    def scale(self, pool: str, nodes: int, expected: int | None = None) -> None:
        self.calls.append((pool, nodes, expected))


class NoGuardPools(LegacyPools):
    """A provider that knows ``remove_node`` but not ``can_write``."""

    def scale(self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None) -> None:
        self.calls.append((pool, nodes, expected))


class KeywordsPools(LegacyPools):
    """A provider that takes any keyword (and so is handed the guard)."""

    def __init__(self) -> None:
        super().__init__()
        self.guards: list[Any] = []

    def scale(self, pool: str, nodes: int, expected: int | None = None, **options: Any) -> None:
        self.calls.append((pool, nodes, expected))
        self.guards.append(options.get("can_write"))


def test_providers_without_the_guard_keyword_keep_working() -> None:
    legacy = LegacyPools()
    (got,) = Actuator(FakeCluster(), node_pools=legacy).apply([UP], GuardContext(T0, {}))
    assert got.result == "applied" and legacy.calls == [("burst", 3, 1)]

    no_guard = NoGuardPools()
    results = Actuator(FakeCluster(), node_pools=no_guard).apply([UP, DOWN], GuardContext(T0, {}))
    assert [r.result for r in results] == ["applied", "applied"]
    assert no_guard.calls == [("burst", 3, 1), ("burst", 1, 2)]

    keywords = KeywordsPools()
    lease = {"value": True}
    actuator = Actuator(FakeCluster(), node_pools=keywords, can_act=lambda: lease["value"])
    (got,) = actuator.apply([UP], GuardContext(T0, {}))
    assert got.result == "applied" and keywords.guards[0] is not None
    lease["value"] = False
    assert keywords.guards[0]() is False  # the actuator's own check, asked when the provider asks


def test_a_provider_without_the_guard_is_not_called_once_the_lease_is_lost() -> None:
    legacy = LegacyPools()
    (got,) = Actuator(FakeCluster(), node_pools=legacy, can_act=lambda: False).apply([UP], GuardContext(T0, {}))
    assert got.result == "not_leader" and legacy.calls == []


def test_the_fake_and_the_simulator_take_the_guard() -> None:
    cluster = FakeCluster()
    cluster.add_pool("burst", 1)
    try:
        cluster.scale("burst", 2, expected=1, can_write=lambda: False)
    except WriteNotAllowed:
        pass
    else:  # pragma: no cover - the assertion below says it
        raise AssertionError("the fake resized a pool its guard refused")
    assert cluster.pools["burst"].size == 1
    cluster.scale("burst", 2, expected=1, can_write=lambda: True)
    assert cluster.pools["burst"].size == 2
    # the simulated cluster has one writer and no Lease: it accepts the keyword (the Protocol's) and ignores it
    assert "can_write" in inspect.signature(SimCluster.scale).parameters


# ---- 2. the move ledger -----------------------------------------------------------------------------------------


def test_a_lease_lost_before_the_reservation_writes_no_ledger_and_moves_nothing() -> None:
    cluster, record = shared_world()
    lease = {"value": True}
    c = leader(cluster, record)
    c.can_act = lambda: lease["value"]
    c.run_once(T0)
    ledger = c.move_ledger
    assert isinstance(ledger, InMemoryMoveLedger)
    read = ledger.read

    def read_then_lose_lease() -> tuple[float, ...]:
        seen = read()
        lease["value"] = False  # the renew deadline passed while the pass read the ledger and planned
        return seen

    ledger.read = read_then_lose_lease  # type: ignore[method-assign]
    report = c.rebalance(T0 + 1)
    # before the fix: the reservation (T0 + 1,) and then its give-back () were written by a replica not leading
    assert ledger.writes == [] and record.move_times == () and record.version == 0
    assert evicted(cluster) == []
    assert report is not None and report.result == "held" and "not the leader" in (report.held_because or "")
    assert sample(c, "gpu_autoscaler_errors_total", component="rebalance") == 0  # not an error


def test_a_lease_lost_after_the_reservation_gives_nothing_back() -> None:
    cluster, record = shared_world()
    lease = {"value": True}
    c = leader(cluster, record)
    c.can_act = lambda: lease["value"]
    c.run_once(T0)
    ledger = c.move_ledger
    assert isinstance(ledger, InMemoryMoveLedger)
    write = ledger.write

    def write_then_lose_lease(move_times: tuple[float, ...], targets: tuple[tuple[str, float], ...] = ()) -> None:
        write(move_times, targets)
        lease["value"] = False

    ledger.write = write_then_lose_lease  # type: ignore[method-assign]
    report = c.rebalance(T0 + 1)
    assert report is not None and [r.result for r in report.results] == ["not_leader"]
    assert evicted(cluster) == []
    # the reservation stands (it only over-counts: the new leader moves less this hour, never more); no give-back
    assert ledger.writes == [(T0 + 1,)] and record.move_times == (T0 + 1,)


def test_a_new_leader_after_a_lost_pass_still_moves_within_the_bound() -> None:
    cluster, record = shared_world(ONE_PER_HOUR)
    old = leader(cluster, record)
    old.can_act = lambda: False
    old.run_once(T0)
    old.rebalance(T0 + 1)
    assert record.version == 0  # nothing written by a replica that does not lead
    new = leader(cluster, record)
    new.run_once(T0 + 60)
    new.rebalance(T0 + 61)
    assert evicted(cluster) == ["chat-1"] and record.move_times == (T0 + 61,)
