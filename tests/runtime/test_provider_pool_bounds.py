"""A burst pool whose provider allows fewer nodes than ``capacity.burst_pools`` says, through the controller.

The Cluster API adapter clamps every write to the MachineDeployment's Cluster Autoscaler min/max-size annotations,
but the arbitration only knew the configured ``max_nodes``. With the provider's maximum below it, the arbitration kept
choosing a burst the provider would not make: the first write was clamped (and reported applied at the size asked),
every later one wrote nothing ("unchanged"), and the shortfall was never met another way -- training that could have
been stopped for it kept running while inference waited, for as long as the shortfall lasted. Now the controller reads
the provider's bounds with the pool's size and the arbitration plans within the tighter of both."""

from __future__ import annotations

import logging

import pytest
from runtime_fakes import add_serving_pods, controller_on

from autoscaler.controller import Controller
from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import (
    CapacityState,
    EvictPod,
    PodMetrics,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource

T0 = 1_800_000_000.0
POOL = BurstPool("burst", 4, "A100", boot_s=300.0, price_per_gpu_hour=0.1, nodes=0, min_nodes=0, max_nodes=4)
CHAT = ServicePolicy("inference", "chat", min_replicas=1, max_replicas=40, target=70.0, priority=1000)


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


def world(provider_max: int | None) -> tuple[Controller, FakeCluster]:
    """chat fills n1 and wants 16 (8 replicas at 250 % of its target, at most double per tick); a 1-pod, 8-GPU
    training gang on n2 and on n3; the burst pool (4-GPU nodes) is configured up to 4 nodes, its provider allows
    ``provider_max``."""
    clock = [T0]
    nodes = [NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3")]
    cluster = FakeCluster(nodes=nodes, clock=lambda: clock[0])
    cluster.add_deployment("inference", "chat", 8)
    add_serving_pods(cluster, CHAT, "n1", 8, T0 - 3600)
    for name, node in (("a", "n2"), ("b", "n3")):
        cluster.add_pod(PodInfo("ml", f"{name}-0", node, 8, 100, "Running", True, "Job", name, gang=f"job/ml/{name}",
                                created_at=T0 - 7200, ready_at=T0 - 7200))  # fmt: skip
        cluster.add_workload(WorkloadInfo("Job", "ml", name, f"job/ml/{name}", False, 100, (8,), None, None))
    cluster.add_pool("burst", 0, gpus_per_node=4, gpu_product="A100", boot_s=300.0, max_size=provider_max)
    metrics = FakeMetricsSource()
    metrics.set_service(CHAT.key, spec_replicas=8, ready_replicas=8, pods=PodMetrics(8, 8 * 175.0))
    # training is dear: bursting is cheaper whenever the pool can grow
    capacity = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600, training_gpu_hour_value=50.0)
    return controller_on(cluster, CHAT, metrics, capacity, T0), cluster


def stops(plan) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for a in plan.actions if isinstance(a, (SuspendWorkload, EvictPod)))


def test_sanity_a_pool_the_provider_lets_grow_is_bought_for_the_shortfall() -> None:
    controller, cluster = world(provider_max=None)
    plan = controller.run_once(T0)
    (up,) = [a for a in plan.actions if isinstance(a, ScaleNodePool)]
    assert (up.previous_nodes, up.nodes, stops(plan)) == (0, 2, 0)
    assert cluster.node_count("burst") == 2


def test_a_pool_the_provider_caps_below_the_shortfall_is_not_chosen_and_training_is_stopped_instead() -> None:
    controller, cluster = world(provider_max=1)
    plan = controller.run_once(T0)
    assert [a for a in plan.actions if isinstance(a, ScaleNodePool)] == []
    assert stops(plan) >= 1
    burst = [o for o in plan.capacity.options if o.kind == "burst"]
    assert burst and "above maxNodes 1" in burst[0].detail
    assert any("provider allows at most 1" in n for n in plan.capacity.notes)
    assert cluster.node_count("burst") == 0


def test_a_provider_minimum_above_the_configured_one_bounds_the_give_back() -> None:
    """The core plans no give-back below the provider's minimum (the adapter would clamp it to a no-op every tick)."""
    snapshot = ClusterSnapshot(T0, nodes=(NodeInfo("burst-0", 4, "A100", "burst", True),
                                          NodeInfo("burst-1", 4, "A100", "burst", True)))  # fmt: skip
    config = CapacityConfig(pools=(POOL,), burst_idle_cooldown_s=0.0)
    decision = ScaleDecision(CHAT.key, 1, 1, Reason.WITHIN_TOLERANCE, "")

    def give_backs(bounds):  # type: ignore[no-untyped-def]
        arb = ArbitrationInput(T0, snapshot, {CHAT.key: CHAT}, [decision], pool_nodes={"burst": 2}, pool_bounds=bounds)
        actions, _, _ = arbitrate(arb, CapacityState(free_since=T0 - 3600), config)
        return [a.nodes for a in actions if isinstance(a, ScaleNodePool)]

    assert give_backs(None) == [1]  # the premise: an idle node goes back
    assert give_backs({"burst": (2, None)}) == []


def test_bounds_that_cannot_be_read_leave_the_configured_ones() -> None:
    """An API error on the bounds: the pool is planned within its configured bounds (as before), and the tick goes
    on; the size itself was read."""
    controller, cluster = world(provider_max=1)
    cluster.fail("bounds")
    plan = controller.run_once(T0)
    (up,) = [a for a in plan.actions if isinstance(a, ScaleNodePool)]
    assert (up.previous_nodes, up.nodes) == (0, 2)  # what the configured max allows; the provider clamps it to 1
    assert not any("provider allows" in n for n in plan.capacity.notes)


def test_a_provider_without_bounds_is_planned_within_the_configured_ones() -> None:
    class SizeOnly:
        """A provider plug-in with a size and a resize, no bounds."""

        def __init__(self, cluster: FakeCluster) -> None:
            self.cluster = cluster

        def node_count(self, pool: str) -> int:
            return self.cluster.node_count(pool)

        def scale(self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None, **kw):  # type: ignore[no-untyped-def]
            return self.cluster.scale(pool, nodes, expected, remove_node, **kw)

    controller, cluster = world(provider_max=None)
    controller.node_pools = SizeOnly(cluster)
    plan = controller.run_once(T0)
    assert [(a.previous_nodes, a.nodes) for a in plan.actions if isinstance(a, ScaleNodePool)] == [(0, 2)]


def test_a_failed_bounds_read_keeps_the_bounds_last_read() -> None:
    """Falling back to the configured bounds on a failed read would swap the plan between stopping training and a
    burst the provider clamps, tick after tick, while the reads fail now and then."""
    controller, cluster = world(provider_max=1)
    first = controller.run_once(T0)
    assert [a for a in first.actions if isinstance(a, ScaleNodePool)] == []  # within the provider's 1
    cluster.fail("bounds")
    plan = controller.run_once(T0 + 15.0)
    assert all(a.nodes <= 1 for a in plan.actions if isinstance(a, ScaleNodePool))  # never the configured 4
    assert any("provider allows at most 1" in n for n in plan.capacity.notes)
    assert plan.capacity.pools[0].max_nodes == 1


class OneRead:
    """A provider that reads the size and the bounds in one request (``size_and_bounds``, as the Cluster API adapter
    does): its separate methods must not be called as well (a second GET per pool and tick)."""

    def __init__(self, cluster: FakeCluster, fail: bool = False) -> None:
        self.cluster, self.fail, self.reads = cluster, fail, 0

    def size_and_bounds(self, pool: str) -> tuple[int, tuple[int | None, int | None]]:
        self.reads += 1
        if self.fail:
            raise ConnectionError("apiserver unreachable")
        return self.cluster.node_count(pool), self.cluster.bounds(pool)

    def node_count(self, pool: str) -> int:
        raise AssertionError("node_count read beside size_and_bounds")

    def bounds(self, pool: str) -> tuple[int | None, int | None]:
        raise AssertionError("bounds read beside size_and_bounds")

    def scale(self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None, **kw):  # type: ignore[no-untyped-def]
        return self.cluster.scale(pool, nodes, expected, remove_node, **kw)


@pytest.mark.parametrize(("provider_max", "resizes"), [(None, [(0, 2)]), (1, [])])
def test_size_and_bounds_are_read_in_one_request(provider_max: int | None, resizes: list[tuple[int, int]]) -> None:
    """The same plans as with the two reads (the sanity case above, and the provider's max of 1 making training
    stop instead), from one read per pool and tick."""
    controller, cluster = world(provider_max=provider_max)
    provider = OneRead(cluster)
    controller.node_pools = provider
    plan = controller.run_once(T0)
    assert [(a.previous_nodes, a.nodes) for a in plan.actions if isinstance(a, ScaleNodePool)] == resizes
    assert (stops(plan) >= 1) is (provider_max == 1)
    assert any("provider allows at most 1" in n for n in plan.capacity.notes) is (provider_max == 1)
    assert provider.reads == 1


def test_a_failed_one_read_leaves_the_pool_to_the_snapshot_and_keeps_the_bounds_last_read() -> None:
    """As a size that cannot be read: the pool's nodes are counted from the snapshot and the tick still plans; the
    provider's bounds last read stand (falling back to the configured ones would swap the plan between stopping
    training and a burst the provider clamps, as ``test_a_failed_bounds_read_keeps_the_bounds_last_read``)."""
    controller, cluster = world(provider_max=1)
    provider = OneRead(cluster)
    controller.node_pools = provider
    first = controller.run_once(T0)
    assert stops(first) >= 1  # the provider's max of 1 read: training stopped, no burst
    provider.fail = True
    plan = controller.run_once(T0 + 15.0)
    assert all(a.nodes <= 1 for a in plan.actions if isinstance(a, ScaleNodePool))  # never the configured 4
    assert any("provider allows at most 1" in n for n in plan.capacity.notes), plan.capacity.notes
    assert plan.capacity.pools[0].max_nodes == 1
