"""Review 37: the provider's min/max pool bounds (``NodePoolScaler.bounds``) in the capacity arbitration.

The tests whose comment says "Found by the review, fixed" failed on the code as reviewed (each a strict xfail then)
and pass since the fixes; the others pin what was checked and found fine."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from runtime_fakes import add_serving_pods, controller_on

from autoscaler import app
from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.app import Adapters
from autoscaler.cli import main
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
from autoscaler.ports import PortError
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

T0 = 1_800_000_000.0
POOL = BurstPool("burst", 4, "A100", boot_s=300.0, price_per_gpu_hour=0.1, nodes=0, min_nodes=0, max_nodes=4)
CHAT = ServicePolicy("inference", "chat", min_replicas=1, max_replicas=40, target=70.0, priority=1000)
MAX_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"

Bounds = Mapping[str, tuple[int | None, int | None]] | None


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("AUTOSCALER_"):
            monkeypatch.delenv(key)
    yield


def stops(actions) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for a in actions if isinstance(a, (SuspendWorkload, EvictPod)))


def resizes(actions) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return [(a.previous_nodes, a.nodes) for a in actions if isinstance(a, ScaleNodePool)]


# ---- the controller on the FakeCluster ---------------------------------------------------------------------------


def world(provider_max: int | None, training_priority: int = 100) -> tuple[Controller, FakeCluster]:
    """As tests/runtime/test_provider_pool_bounds.py: chat fills n1 and wants 16 (8 GPUs short, 2 burst nodes of 4);
    an 8-GPU training gang on n2 and on n3 at ``training_priority`` (above chat's 1000: not preemptible)."""
    nodes = [NodeInfo(n, 8, "A100", "onprem", True) for n in ("n1", "n2", "n3")]
    cluster = FakeCluster(nodes=nodes, clock=lambda: T0)
    cluster.add_deployment("inference", "chat", 8)
    add_serving_pods(cluster, CHAT, "n1", 8, T0 - 3600)
    for name, node in (("a", "n2"), ("b", "n3")):
        cluster.add_pod(PodInfo("ml", f"{name}-0", node, 8, training_priority, "Running", True, "Job", name,
                                gang=f"job/ml/{name}", created_at=T0 - 7200, ready_at=T0 - 7200))  # fmt: skip
        cluster.add_workload(WorkloadInfo("Job", "ml", name, f"job/ml/{name}", False, training_priority, (8,), None,
                                          None))  # fmt: skip
    cluster.add_pool("burst", 0, gpus_per_node=4, gpu_product="A100", boot_s=300.0, max_size=provider_max)
    metrics = FakeMetricsSource()
    metrics.set_service(CHAT.key, spec_replicas=8, ready_replicas=8, pods=PodMetrics(8, 8 * 175.0))
    capacity = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600, training_gpu_hour_value=50.0)
    return controller_on(cluster, CHAT, metrics, capacity, T0), cluster


# Found by the review, fixed: choose_burst is all-or-nothing: with the provider's max (1) below the 2 nodes needed and
# no preemptible training, nothing is planned at all; before the change the clamped write still brought the 1 node the
# provider allows (Cluster Autoscaler caps a scale-up at the group's max, it does not drop it)
def test_a_capped_pool_still_brings_the_nodes_it_allows_when_nothing_else_can_meet_the_shortfall() -> None:
    controller, cluster = world(provider_max=None, training_priority=5000)
    plan = controller.run_once(T0)
    assert resizes(plan.actions) == [(0, 2)] and stops(plan.actions) == 0  # the premise: only a burst helps
    controller, cluster = world(provider_max=1, training_priority=5000)
    plan = controller.run_once(T0)
    assert stops(plan.actions) == 0
    assert cluster.node_count("burst") == 1  # what the provider allows (and what the clamped write gave before)


def test_telemetry_counts_a_bounds_read_error_under_node_pool_and_the_tick_goes_on() -> None:
    controller, cluster = world(provider_max=1)
    cluster.fail("bounds")
    controller.run_once(T0)
    assert controller.last_report is not None and controller.last_report.result == "ok"
    assert controller.telemetry.errors.labels(component="node_pool")._value.get() == 1


def test_size_unreadable_bounds_are_not_read_and_the_snapshot_counts() -> None:
    """The size read fails: the pool is left out of pool_nodes and its bounds are not asked for (the write that
    follows reads the MachineDeployment again and clamps)."""
    controller, cluster = world(provider_max=1)
    asked: list[str] = []
    real = cluster.bounds

    def counted(pool: str) -> tuple[int | None, int | None]:
        asked.append(pool)
        return real(pool)

    cluster.bounds = counted  # type: ignore[method-assign]
    cluster.fail("node_count")
    assert controller._pool_nodes() == ({}, None)
    assert asked == []


def test_a_bounds_method_returning_garbage_is_an_error_not_a_crash() -> None:
    controller, cluster = world(provider_max=1)
    cluster.bounds = lambda pool: None  # type: ignore[assignment,method-assign,return-value]
    assert controller._pool_nodes() == ({"burst": 0}, None)


# ---- the fake's clamp against the adapter's --------------------------------------------------------------------


def idle_world(
    size: int, *, min_size: int | None = None, max_size: int | None = None
) -> tuple[Controller, FakeCluster]:
    """Chat (2 replicas) fits on n1; the burst pool's ``size`` nodes are empty: one goes back per tick."""
    cluster = FakeCluster(nodes=[NodeInfo("n1", 8, "A100", "onprem", True)], clock=lambda: T0)
    cluster.add_deployment("inference", "chat", 2)
    add_serving_pods(cluster, CHAT, "n1", 2, T0 - 3600)
    cluster.add_pool("burst", size, gpus_per_node=4, gpu_product="A100", min_size=min_size, max_size=max_size)
    metrics = FakeMetricsSource()
    metrics.set_service(CHAT.key, spec_replicas=2, ready_replicas=2, pods=PodMetrics(2, 2 * 70.0))
    return controller_on(cluster, CHAT, metrics, CapacityConfig(pools=(POOL,), burst_idle_cooldown_s=0.0), T0), cluster


def test_a_pool_above_the_provider_max_gives_back_one_idle_node_per_tick() -> None:
    controller, _ = idle_world(3, max_size=1)
    plan = controller.run_once(T0)
    assert resizes(plan.actions) == [(3, 2)]
    assert plan.capacity.pools[0].max_nodes == 1


# Found by the review, fixed: FakeCluster.scale clamps absolutely (min(target, max_size)), the Cluster API adapter
# only towards the live size: a 3 -> 2 give-back on a pool above max_size 1 removes two nodes in the fake, one in the
# adapter
def test_the_fake_clamps_like_the_adapter_on_a_pool_above_its_max() -> None:
    controller, cluster = idle_world(3, max_size=1)
    controller.run_once(T0)
    assert cluster.node_count("burst") == 2


# Found by the review, fixed: FakeCluster.scale clamps absolutely: a scale-down of a pool below min_size grows it to
# min_size; the adapter writes nothing (clamped towards the live size)
def test_the_fake_never_grows_a_pool_on_a_scale_down() -> None:
    cluster = FakeCluster()
    cluster.add_pool("burst", 1, gpus_per_node=4, min_size=3)
    cluster.scale("burst", 0, expected=1)
    assert cluster.node_count("burst") == 1


# ---- the pure arbitration --------------------------------------------------------------------------------------


def arbitrate_with(
    burst_nodes: int,
    bounds: Bounds,
    *,
    short: bool,
    pool_nodes: int | None = None,
    state: CapacityState | None = None,
    extra_nodes: tuple[NodeInfo, ...] = (),
):  # type: ignore[no-untyped-def]
    """n1 (8 GPUs) full of chat, a preemptible 8-GPU gang on n2, ``burst_nodes`` ready burst nodes of 4 GPUs (busy
    with another service's replicas when ``short``, else empty); chat wants 16 when ``short``, else keeps its 8."""
    burst = tuple(NodeInfo(f"burst-{i}", 4, "A100", "burst", True) for i in range(burst_nodes))
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), NodeInfo("n2", 8, "A100", "onprem", True), *burst,
             *extra_nodes)  # fmt: skip
    pods = [PodInfo("inference", f"chat-{i}", "n1", 1, 1000, "Running", True, "Deployment", "chat",
                    created_at=T0 - 3600) for i in range(8)]  # fmt: skip
    pods.append(PodInfo("ml", "a-0", "n2", 8, 100, "Running", True, "Job", "a", gang="job/ml/a",
                        created_at=T0 - 7200, ready_at=T0 - 7200))  # fmt: skip
    if short:
        pods += [PodInfo("other", f"o-{n.name}", n.name, 4, 1000, "Running", True, "Deployment", "o",
                         created_at=T0 - 3600) for n in burst]  # fmt: skip
    workloads = (WorkloadInfo("Job", "ml", "a", "job/ml/a", False, 100, (8,), None, None),)
    snapshot = ClusterSnapshot(T0, nodes=nodes, pods=tuple(pods), workloads=workloads)
    reason = Reason.SCALE_UP_RATE_LIMITED if short else Reason.WITHIN_TOLERANCE
    decision = ScaleDecision(CHAT.key, 8, 16 if short else 8, reason, "")
    config = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600, training_gpu_hour_value=50.0,
                            burst_idle_cooldown_s=0.0)  # fmt: skip
    arb = ArbitrationInput(T0, snapshot, {CHAT.key: CHAT}, [decision],
                           pool_nodes={"burst": burst_nodes if pool_nodes is None else pool_nodes},
                           pool_bounds=bounds)  # fmt: skip
    return arbitrate(arb, state or CapacityState(free_since=T0 - 3600), config)


def test_pool_above_the_provider_max_and_short_preempts_and_never_bursts() -> None:
    actions, _, _ = arbitrate_with(2, None, short=True)
    assert resizes(actions) == [(2, 4)] and stops(actions) == 0  # the premise: without the bounds, two more nodes
    actions, report, _ = arbitrate_with(2, {"burst": (None, 1)}, short=True)
    assert resizes(actions) == [] and stops(actions) == 1
    assert "above maxNodes 1" in next(o.detail for o in report.options if o.kind == "burst")


def test_pool_above_the_provider_max_and_idle_gives_back_one_node_not_down_to_the_max() -> None:
    actions, _, _ = arbitrate_with(3, {"burst": (None, 1)}, short=False)
    assert resizes(actions) == [(3, 2)]


def test_provider_min_above_the_count_blocks_every_give_back_and_allows_the_burst() -> None:
    actions, _, _ = arbitrate_with(1, {"burst": (2, None)}, short=False)
    assert resizes(actions) == []
    actions, _, _ = arbitrate_with(1, {"burst": (2, None)}, short=True)
    assert resizes(actions) == [(1, 3)]  # below the provider's min, a scale-up is not clamped by it


def test_min_above_max_annotations_plan_no_resize_either_way() -> None:
    bounds = {"burst": (3, 1)}
    for short in (False, True):
        actions, report, _ = arbitrate_with(2, bounds, short=short)
        assert resizes(actions) == []
    assert sum("provider" in n for n in report.notes) == 2


def test_unregistered_give_back_respects_the_provider_min() -> None:
    state = CapacityState(free_since=T0 - 3600, unregistered_since={"burst": (T0 - 3600, 1)})
    actions, _, _ = arbitrate_with(1, None, short=False, pool_nodes=2, state=state)
    assert [a.remove_unregistered for a in actions if isinstance(a, ScaleNodePool)] == [True]  # the premise
    actions, report, _ = arbitrate_with(1, {"burst": (2, None)}, short=False, pool_nodes=2, state=state)
    assert resizes(actions) == []
    assert any("at its minimum size 2" in n for n in report.notes)


def test_stuck_not_ready_give_back_respects_the_provider_min() -> None:
    stuck = NodeInfo("burst-x", 0, "A100", "burst", False, state_since=T0 - 7200)
    actions, _, _ = arbitrate_with(1, None, short=False, pool_nodes=2, extra_nodes=(stuck,))
    assert [a.remove_node for a in actions if isinstance(a, ScaleNodePool)] == ["burst-x"]  # the premise
    actions, report, _ = arbitrate_with(1, {"burst": (2, None)}, short=False, pool_nodes=2, extra_nodes=(stuck,))
    assert resizes(actions) == []
    assert any("at its minimum size 2" in n for n in report.notes)


# ---- autoscaler plan -------------------------------------------------------------------------------------------


# Found by the review, fixed: commands/plan.py builds its Controller with node_pools=None: no provider size and no
# bounds, so the plan shows the 0 -> 2 burst the provider caps at 1 while the controller stops training instead
def test_plan_command_plans_within_the_provider_bounds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    controller, cluster = world(provider_max=1)
    assert resizes(controller.run_once(T0).actions) == []  # the premise: the controller itself does not burst
    controller, cluster = world(provider_max=1)

    def fake_build(settings: object, *, check_prometheus: bool = True) -> Adapters:
        return Adapters(controller.metrics, cluster, cluster, controller.policies, None, cluster)

    monkeypatch.setattr(app, "build_adapters", fake_build)
    pools = {"burst": {"gpus_per_node": 4, "gpu_type": "A100", "boot_seconds": 300, "price_per_gpu_hour": 0.1,
                       "max_nodes": 4}}  # fmt: skip
    for key, value in {
        "ENABLED": "true",
        "BURST_POOLS": json.dumps(pools),
        "ASSUMED_SHORTFALL_SECONDS": "28800",
        "TRAINING_GPU_HOUR_VALUE": "50",
        "SHORTFALL_CONFIRM_SECONDS": "0",
    }.items():
        monkeypatch.setenv(f"AUTOSCALER_CAPACITY__{key}", value)
    assert main(["plan", "-o", "json", "--time", f"{T0:.0f}"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [a for a in document["actions"] if a["kind"] == "ScaleNodePool"] == []
    assert any("provider allows at most 1" in n for n in document["capacity"]["notes"])


# ---- the Cluster API adapter -------------------------------------------------------------------------------------


@pytest.fixture
def capi(tmp_path: Path) -> Iterator[tuple[FakeApiServer, MachineDeploymentNodePools]]:
    server = FakeApiServer().start()
    api = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        yield server, MachineDeploymentNodePools(api, "capi-system", sleep=lambda s: None)
    finally:
        api.close()
        server.stop()


def test_adapter_bounds_cost_one_more_get_per_pool_and_tick(capi) -> None:  # type: ignore[no-untyped-def]
    server, pools = capi
    server.seed(o.machine_deployment_crd(), o.machine_deployment("b", replicas=2, min_size=1, max_size=4))
    before = len(server.requests)
    assert (pools.node_count("b"), pools.bounds("b")) == (2, (1, 4))
    assert [r.method for r in server.requests[before:]] == ["GET", "GET"]  # /scale, then the MachineDeployment


def test_adapter_unparsable_annotation_reads_as_unset_as_the_write_clamp_reads_it(capi) -> None:  # type: ignore[no-untyped-def]
    server, pools = capi
    md = o.machine_deployment("b", replicas=2)
    md["metadata"]["annotations"][MAX_ANNOTATION] = "three"
    server.seed(o.machine_deployment_crd(), md)
    assert pools.bounds("b") == (None, None)
    pools.scale("b", 5, expected=2)  # no clamp either: what the arbitration planned is written
    assert pools.node_count("b") == 5


def test_adapter_missing_machine_deployment_raises_a_port_error_the_controller_catches(capi) -> None:  # type: ignore[no-untyped-def]
    server, pools = capi
    server.seed(o.machine_deployment_crd())
    with pytest.raises(PortError):
        pools.bounds("gone")
    controller, _ = world(provider_max=None)
    controller.node_pools = pools
    assert controller._pool_nodes() == ({}, None)  # the size read fails first: the pool is left out
