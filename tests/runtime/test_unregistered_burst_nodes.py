"""A burst node that never registers, through the controller (``Controller.run_once``) on the in-memory cluster.

Before: the capacity arbitration stopped counting such a node as capacity after the provision timeout and never grew
its pool again "until it registers": for a node that never will, for ever. Its Machine stayed (billed, or holding the
request in a quota), and the pool could not serve any later shortfall. Now it is given back by name (a Machine
without a Node, never a registered node), and the pool is tried again after a back-off.
"""

from __future__ import annotations

import logging

import pytest
from runtime_fakes import FakePolicies

from autoscaler.controller import Controller
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import NodeInfo, PodInfo
from autoscaler.core.model import PodMetrics, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.ports import PolicyObject
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=0, min_nodes=0, max_nodes=4)


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


def world() -> tuple[Controller, FakeCluster]:
    """chat fills n1 (8 replicas at 105 % of its target: it wants 12); the burst pool's one requested node never
    registers."""
    chat = ServicePolicy("inference", "chat", min_replicas=1, max_replicas=40, target=70.0, priority=1000)
    clock = [T0]
    cluster = FakeCluster(nodes=[NodeInfo("n1", 8, "A100", "onprem", True)], clock=lambda: clock[0])
    cluster.add_deployment("inference", "chat", 8)
    for i in range(8):
        cluster.add_pod(
            PodInfo("inference", f"chat-{i}", "n1", 1, 1000, "Running", True, "Deployment", "chat",
                    created_at=T0 - 3600)
        )  # fmt: skip
    cluster.add_pool("burst", 0, gpu_product="A100", boot_s=300.0)
    cluster.add_unregistered("burst", 1)
    metrics = FakeMetricsSource()
    metrics.set_service(chat.key, spec_replicas=8, ready_replicas=8, pods=PodMetrics(8, 8 * 105.0))
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        node_pools=cluster,
        policies=FakePolicies([PolicyObject("inference", "chat-policy", chat, generation=1)]),
        telemetry=Telemetry(),
        capacity=CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600, preempt=False),
    )
    controller.acting_since = T0 - 3600  # past the takeover grace
    return controller, cluster


def resizes(plan) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in plan.actions if isinstance(a, ScaleNodePool)]


def test_the_unregistered_node_is_given_back_and_the_pool_grown_again_after_its_back_off() -> None:
    controller, cluster = world()
    seen: list[tuple[float, Reason, int, int]] = []
    t = T0
    while t <= T0 + 1300.0:
        plan = controller.run_once(t)
        seen.extend((t - T0, a.reason, a.previous_nodes, a.nodes) for a in resizes(plan))
        t += 15.0
    # counted as coming (nothing bought) until the provision timeout, then given back by its Machine
    assert seen[0] == (900.0, Reason.BURST_NODE_NOT_REGISTERED, 1, 0)
    give_backs = [w for w in cluster.writes if w.op == "scale" and w.outcome == "applied"]
    assert give_backs, cluster.writes
    # the pool backs off 300 s from the moment the node went overdue, then is grown again for the shortfall
    assert seen[1] == (1200.0, Reason.BURST_SCALE_UP, 0, 1)
    assert cluster.pools["burst"].unregistered == 0


def test_a_give_back_that_finds_no_unregistered_machine_writes_nothing() -> None:
    """The provider's count and the registered Nodes disagree, yet every Machine has its Node (here: the fake says
    none never registered): the pool is not shrunk by a node of the provider's choosing."""
    controller, cluster = world()
    cluster.pools["burst"].unregistered = 0  # the count still says 1 node beyond the registered ones
    t = T0
    results = []
    while t <= T0 + 900.0:
        controller.run_once(t)
        t += 15.0
    results = [w for w in cluster.writes if w.op == "scale"]
    assert [w.outcome for w in results] == ["failed"]
    assert cluster.node_count("burst") == 1


class OldPlugin:
    """A provider plug-in written before ``remove_unregistered``: its ``scale`` would shrink the pool by a node of
    its own choosing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def node_count(self, pool: str) -> int:
        return 2

    def scale(self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None) -> None:
        self.calls.append((pool, nodes))


def test_a_provider_plugin_that_cannot_name_an_unregistered_node_is_not_asked_to_shrink() -> None:
    from autoscaler.actuator import Actuator, GuardContext, describe_action

    cluster = FakeCluster()
    plugin = OldPlugin()
    give_back = ScaleNodePool(
        "burst", 1, 2, Reason.BURST_NODE_NOT_REGISTERED, "never registered", remove_unregistered=True
    )
    (result,) = Actuator(cluster, plugin).apply([give_back], GuardContext(T0, {}))
    assert result.result == "failed"
    assert "cannot remove a node that never registered" in result.message
    assert plugin.calls == []
    described = describe_action(give_back)
    assert described == "scale nodepool/burst from 2 to 1 nodes (removing a node that never registered)"


class AgeAwarePlugin(OldPlugin):
    """A provider plug-in that can give back a node that never registered, with or without a minimum age."""

    def __init__(self, takes_age: bool) -> None:
        super().__init__()
        self.options: list[dict[str, object]] = []
        self.takes_age = takes_age

    def scale(self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None,  # type: ignore[override]
              remove_unregistered: bool = False, unregistered_min_age_s: float = 0.0) -> None:  # fmt: skip
        self.calls.append((pool, nodes))
        self.options.append({"remove_unregistered": remove_unregistered, "min_age": unregistered_min_age_s})


class NoAgePlugin(OldPlugin):
    def __init__(self) -> None:
        super().__init__()
        self.options: list[dict[str, object]] = []

    def scale(self, pool: str, nodes: int, expected: int | None = None, remove_node: str | None = None,  # type: ignore[override]
              remove_unregistered: bool = False) -> None:  # fmt: skip
        self.calls.append((pool, nodes))
        self.options.append({"remove_unregistered": remove_unregistered})


def test_the_actuator_passes_the_minimum_age_of_the_machine_given_back_to_a_provider_that_takes_it() -> None:
    """The core's give-back carries the pool's provision limit; a provider that takes ``unregistered_min_age_s`` gets
    it (so a MachineHealthCheck's fresh replacement is not removed), one written before it is called as before."""
    from autoscaler.actuator import Actuator, GuardContext

    give_back = ScaleNodePool(
        "burst", 1, 2, Reason.BURST_NODE_NOT_REGISTERED, "never registered", remove_unregistered=True,
        unregistered_min_age_s=900.0,
    )  # fmt: skip
    aware = AgeAwarePlugin(takes_age=True)
    (result,) = Actuator(FakeCluster(), aware).apply([give_back], GuardContext(T0, {}))
    assert result.result == "applied", result.message
    assert aware.options == [{"remove_unregistered": True, "min_age": 900.0}]
    older = NoAgePlugin()
    (result,) = Actuator(FakeCluster(), older).apply([give_back], GuardContext(T0, {}))
    assert result.result == "applied", result.message
    assert older.options == [{"remove_unregistered": True}]
