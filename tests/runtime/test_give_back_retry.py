"""A burst node's give-back that fails to be written is not planned again before ``give_back_retry_s``.

Before, the arbitration could not see that a give-back failed (a paused MachineDeployment, a Machine not found, the
API answering 500): it planned the same give-back at every tick, each one a failed write, an error count and a
warning Event, for as long as the cause lasted. The actuator's results now record the failure in the capacity state
(``forget_unapplied``), and the pool's nodes are not given back again for the retry delay (Cluster Autoscaler's
--scale-down-delay-after-failure, 3 min by default)."""

from __future__ import annotations

import logging

import pytest
from runtime_fakes import add_serving_pods, controller_on

from autoscaler.actuator import ActionResult, forget_unapplied
from autoscaler.controller import Controller
from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo
from autoscaler.core.model import (
    CapacityState,
    ControllerState,
    PodMetrics,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
)
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.settings import CapacitySettings

T0 = 1_800_000_000.0
POOL = BurstPool("burst", 4, "A100", boot_s=300.0, price_per_gpu_hour=0.1, nodes=0, min_nodes=0, max_nodes=4)
CHAT = ServicePolicy("inference", "chat", min_replicas=1, max_replicas=40, target=70.0, priority=1000)


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


def idle_world() -> tuple[Controller, FakeCluster]:
    """chat (2 replicas) fits on n1; the burst pool's one node is empty and spare at once (no cooldown)."""
    cluster = FakeCluster(nodes=[NodeInfo("n1", 8, "A100", "onprem", True)], clock=lambda: T0)
    cluster.add_deployment("inference", "chat", 2)
    add_serving_pods(cluster, CHAT, "n1", 2, T0 - 3600)
    cluster.add_pool("burst", 1, gpus_per_node=4, gpu_product="A100")
    metrics = FakeMetricsSource()
    metrics.set_service(CHAT.key, spec_replicas=2, ready_replicas=2, pods=PodMetrics(2, 2 * 70.0))
    return controller_on(cluster, CHAT, metrics, CapacityConfig(pools=(POOL,), burst_idle_cooldown_s=0.0), T0), cluster


def test_a_failing_give_back_is_retried_after_the_delay_not_every_tick() -> None:
    controller, cluster = idle_world()
    cluster.fail("scale", times=None)  # every resize fails (a paused MachineDeployment, an API down...)
    planned = []
    t = T0
    while t < T0 + 600.0:
        plan = controller.run_once(t)
        planned += [t - T0 for a in plan.actions if isinstance(a, ScaleNodePool)]
        t += 15.0
    # 40 ticks: tried at 0, then once the 180 s delay is over (at 180 s, 360 s, 540 s), never in between
    assert planned == [0.0, 180.0, 360.0, 540.0]
    cluster.clear_faults()
    plan = controller.run_once(T0 + 720.0)
    assert [(a.previous_nodes, a.nodes) for a in plan.actions if isinstance(a, ScaleNodePool)] == [(1, 0)]
    assert cluster.node_count("burst") == 0


def test_only_a_failed_give_back_is_recorded() -> None:
    down = ScaleNodePool("burst", 0, 1, Reason.BURST_SCALE_DOWN, "")
    up = ScaleNodePool("burst", 2, 1, Reason.BURST_SCALE_UP, "")
    state = ControllerState()
    for action, result, recorded in [
        (down, "failed", {"burst": T0}),
        (down, "applied", {}),
        (down, "unchanged", {}),
        (up, "failed", {}),  # a failed burst is retried at the next tick: the shortfall wants it
    ]:
        after = forget_unapplied(state, state, [ActionResult(action, result, "")], T0)
        assert after.capacity.give_back_failed_at == recorded, (action.reason, result)


def test_the_core_holds_the_pool_within_the_delay_and_says_so() -> None:
    snapshot = ClusterSnapshot(T0, nodes=(NodeInfo("n1", 8, "A100", "onprem", True),
                                          NodeInfo("burst-0", 4, "A100", "burst", True)))  # fmt: skip
    config = CapacityConfig(pools=(POOL,), burst_idle_cooldown_s=0.0)
    decision = ScaleDecision(CHAT.key, 0, 0, Reason.WITHIN_TOLERANCE, "")

    def at(now: float, failed_at: float):  # type: ignore[no-untyped-def]
        arb = ArbitrationInput(now, snapshot, {CHAT.key: CHAT}, [decision], pool_nodes={"burst": 1})
        state = CapacityState(free_since=T0 - 3600, give_back_failed_at={"burst": failed_at})
        return arbitrate(arb, state, config)

    actions, report, state = at(T0 + 100.0, T0)
    assert [a for a in actions if isinstance(a, ScaleNodePool)] == []
    assert any("give-back of its nodes failed 100s ago" in n and "80s from now" in n for n in report.notes)
    assert state.give_back_failed_at == {"burst": T0}
    actions, _, state = at(T0 + 180.0, T0)
    assert [a.nodes for a in actions if isinstance(a, ScaleNodePool)] == [0]
    assert state.give_back_failed_at == {}  # the record is dropped once the delay is over
    # a wall clock stepped back: the delay counts from now at most
    _, report, state = at(T0, T0 + 3600.0)
    assert state.give_back_failed_at == {"burst": T0}


def test_the_setting_carries_it() -> None:
    assert CapacitySettings(enabled=True).to_config().give_back_retry_s == 180.0
    assert CapacitySettings(enabled=True, give_back_retry_seconds=0).to_config().give_back_retry_s == 0.0
