"""The rebalance pass against a real control plane (issue 15, item 3): the controller (``build_runtime`` with the real
Kubernetes adapters, ticking every second) finds an 8-GPU pod that fits nowhere because two 1-GPU replicas sit on
two 8-GPU nodes, evicts one replica through the real Eviction API, the real ReplicaSet recreates it, a real
kube-scheduler with the shipped extender entry (``deploy/overlays/scheduler-extender``) places the replacement on
the fuller node as the controller's advice says, and the 8-GPU pod is bound on the node that was freed. A
PodDisruptionBudget that allows no disruption keeps everything where it is.

The test makes its own two kwok nodes, with a GPU product no other test selects, so other tests' pods (their
namespaces are deleted without waiting) cannot take the GPUs it counts.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter
from autoscaler.app import Adapters, build_runtime
from autoscaler.core.rebalance import REBALANCE_LABEL
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.runtime import Runtime
from autoscaler.settings import Settings
from tests.realkube import manifests
from tests.realkube.control_plane import GPU_PRODUCT_LABEL, GPU_RESOURCE, Component, ControlPlane, GpuNode
from tests.realkube.manifests import gpu_pod_spec, start_scheduler
from tests.realkube.test_scheduler_extender import NoPolicies, scheduler_config

pytestmark = [pytest.mark.integration, pytest.mark.realkube]


@dataclass
class World:
    cp: ControlPlane
    namespace: str
    nodes: tuple[str, str]
    product: str
    scheduler_name: str
    runtime: Runtime


def deployment(name: str, replicas: int, product: str, scheduler: str) -> dict[str, Any]:
    spec = gpu_pod_spec(1, product, container="c", requests=False, grace_s=0, scheduler=scheduler)
    body = manifests.deployment(name, replicas, spec)
    # No GPUScalingPolicy scales chat here (NoPolicies): its pods opt in to being moved
    body["spec"]["template"]["metadata"]["labels"][REBALANCE_LABEL] = "allowed"
    return body


def big_pod(product: str, scheduler: str) -> dict[str, Any]:
    # The same scheduler as the replicas': two schedulers binding into one freed node race (each with its own cache;
    # kwok admits both where a kubelet would reject one), which is why the extender is best added to the cluster's
    # own scheduler rather than to a second one.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "big", "labels": {"app": "big"}},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {GPU_PRODUCT_LABEL: product},
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": {GPU_RESOURCE: "8"}}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def pods_of(cp: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    return list(cp.get(f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": f"app={app}"})["items"])


def pods(w: World, app: str) -> list[dict[str, Any]]:
    return pods_of(w.cp, w.namespace, app)


def running(items: list[dict[str, Any]]) -> dict[str, str]:
    """pod name -> node, for the Running pods that are not being deleted."""
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in items
        if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def running_on(w: World, app: str) -> dict[str, str]:
    return running(pods(w, app))


def bind(cp: ControlPlane, namespace: str, pod: str, node: str) -> None:
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", body)


@pytest.fixture
def world(control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, tmp_path: Path) -> Iterator[World]:
    cp = control_plane
    tag = secrets.token_hex(3)
    product = f"REBALANCE-TEST-{tag}"
    nodes = (f"rb-{tag}-a", f"rb-{tag}-b")
    for name in nodes:
        cp.request("POST", "/api/v1/nodes", cp.node_manifest(GpuNode(name, 8, product, "onprem")))
    scheduler: Component | None = None
    runtime: Runtime | None = None
    try:
        cp.wait_nodes_schedulable(list(nodes), timeout_s=60)
        scheduler_name = f"gpu-placement-{tag}"
        # Two replicas, created before their scheduler runs: the test binds them, one per node, so the cluster starts
        # fragmented (7 + 7 free GPUs, no room for 8) whatever a scheduler would have chosen.
        cp.request(
            "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment("chat", 2, product, scheduler_name)
        )
        pending = cp.wait("two chat pods", lambda: names_if(pods_of(cp, namespace, "chat"), 2))
        for pod, node in zip(sorted(pending), nodes, strict=True):
            bind(cp, namespace, pod, node)
        cp.wait(
            "chat running on both nodes",
            lambda: len(set(running(pods_of(cp, namespace, "chat")).values())) == 2 or None,
        )
        cp.wait("chat Deployment ready", lambda: ready_replicas(cp, namespace) == 2 or None)

        settings = Settings(
            # the move ledger (a ConfigMap beside the Lease) in the test's namespace, on the real API server
            leader_election={"enabled": False, "lease_namespace": namespace},
            http={"bind_address": "127.0.0.1", "port": 0},
            scheduler_extender={"enabled": True, "bind_address": "127.0.0.1", "port": 0},
            rebalance={"enabled": True, "max_moves_per_pass": 2, "max_moves_per_hour": 4},
            rebalance_interval_seconds=3600,  # the test calls the pass itself
            tick_interval_seconds=1,
            tick_stall_seconds=60,
        )
        adapters = Adapters(
            metrics=FakeMetricsSource(),
            cluster=KubeClusterReader(api_client),
            writer=KubeClusterWriter(api_client),
            policies=NoPolicies(),
            status_writer=None,
            node_pools=None,
            api_client=api_client,
        )
        runtime = build_runtime(settings, adapters, refit=lambda now: None)
        assert runtime.extender is not None and runtime.controller.rebalance_config is not None
        runtime.start()
        config = scheduler_config(tmp_path, cp, scheduler_name, runtime.extender.port)
        scheduler = start_scheduler(cp, config, scheduler_name, tmp_path)
        yield World(cp, namespace, nodes, product, scheduler_name, runtime)
    finally:
        if scheduler is not None:
            scheduler.stop()
        if runtime is not None:
            runtime.stop()
        for name in nodes:
            cp.request("DELETE", f"/api/v1/nodes/{name}")


def names_on(placed: dict[str, str], count: int) -> dict[str, str] | None:
    return placed if len(placed) == count else None


def names_if(items: list[dict[str, Any]], count: int) -> list[str] | None:
    names = [p["metadata"]["name"] for p in items]
    return names if len(names) == count else None


def ready_replicas(cp: ControlPlane, namespace: str) -> int:
    return int(
        cp.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/chat").get("status", {}).get("readyReplicas") or 0
    )


def pass_after_a_tick(w: World) -> Any:
    """A rebalance pass right after a tick that read the cluster as it is now (the pass holds without one)."""
    started = time.time()

    def fresh() -> bool | None:
        report = w.runtime.controller.last_report
        return (report is not None and report.time >= started and report.result == "ok") or None

    w.cp.wait("a tick after now", fresh, timeout_s=60)
    return w.runtime.controller.rebalance(time.time())


def test_a_replica_is_moved_and_the_waiting_8_gpu_pod_runs_on_the_freed_node(world: World) -> None:
    w = world
    w.cp.request("POST", f"/api/v1/namespaces/{w.namespace}/pods", big_pod(w.product, w.scheduler_name))
    w.cp.wait("big pending", lambda: bool(pods(w, "big")) or None)
    time.sleep(1.5)  # let a tick see it pending
    report = pass_after_a_tick(w)
    assert report is not None and report.result == "ok", report
    assert report.plan is not None and len(report.plan.moves) == 1, report.plan
    move = report.plan.moves[0]
    assert move.target == f"pod {w.namespace}/big" and move.gain_gpus == 8
    assert [r.result for r in report.results] == ["applied"]
    moved_pod = move.pods[0][1]
    freed = next(iter(move.gpus_by_node))
    kept = next(n for n in w.nodes if n != freed)
    print(f"\nrebalance: {move.owner} {moved_pod} off {freed}: {move.detail}")

    # The ReplicaSet recreates the replica; the extender-advised scheduler places it next to the other one; the
    # 8-GPU pod takes the node that was freed.
    big_node = w.cp.wait("big bound", lambda: (running_on(w, "big") or {}).get("big"), timeout_s=90)
    placed = w.cp.wait("two chat replicas running", lambda: names_on(running_on(w, "chat"), 2), timeout_s=90)
    print(f"  chat replicas now on {sorted(placed.values())}; big on {big_node}")
    assert big_node == freed
    assert set(placed.values()) == {kept} and moved_pod not in placed
    events = w.cp.get(f"/api/v1/namespaces/{w.namespace}/events")["items"]
    mine = [
        e for e in events if e.get("involvedObject", {}).get("name") == moved_pod and e.get("reason") == "Rebalance"
    ]
    assert mine and "big" in mine[0]["message"], [e.get("reason") for e in events]
    stranded = w.runtime.controller.telemetry.registry.get_sample_value("gpu_autoscaler_stranded_gpus")
    assert stranded == 14  # before the move: 7 + 7 free GPUs of its type, none usable by the 8-GPU pod
    # the eviction is in the move ledger, where a new leader would count it against the hourly bound
    ledger = w.cp.get(f"/api/v1/namespaces/{w.namespace}/configmaps/gpu-autoscaler-rebalance-moves")
    assert json.loads(ledger["data"]["moveTimes"]) == [pytest.approx(report.time)]

    # Nothing waits any more: the next pass moves nothing.
    report = pass_after_a_tick(w)
    assert report is not None and report.plan is not None and report.plan.moves == ()


def test_a_pdb_allowing_no_disruption_keeps_every_replica_in_place(world: World) -> None:
    w = world
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "chat"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "chat"}}},
    }
    w.cp.request("POST", f"/apis/policy/v1/namespaces/{w.namespace}/poddisruptionbudgets", pdb)
    w.cp.wait(
        "the disruption controller computed the budget",
        lambda: (
            w.cp.get(f"/apis/policy/v1/namespaces/{w.namespace}/poddisruptionbudgets/chat")
            .get("status", {})
            .get("expectedPods")
            == 2
            or None
        ),
    )
    before = running_on(w, "chat")
    w.cp.request("POST", f"/api/v1/namespaces/{w.namespace}/pods", big_pod(w.product, w.scheduler_name))
    time.sleep(1.5)
    report = pass_after_a_tick(w)
    assert report is not None and report.plan is not None
    assert report.plan.actions == () and report.results == []
    assert any("no bounded set" in n for n in report.plan.notes), report.plan.notes
    time.sleep(2)
    assert running_on(w, "chat") == before
    assert running_on(w, "big") == {}
