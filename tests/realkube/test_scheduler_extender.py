"""The real kube-scheduler calls the controller's extender and places GPU pods where it advises.

A second kube-scheduler (the control plane's binary, its own schedulerName, leader election off) runs with the
``extenders:`` entry of ``deploy/overlays/scheduler-extender/kube-scheduler-config.yaml`` -- only the URL points at
the controller this test runs on 127.0.0.1: ``build_runtime`` with the real Kubernetes reader (dry run, no
Prometheus), ticking every second, its extender answering from the snapshot the latest tick read. A GPU pod naming
that scheduler lands on the node the extender prefers; a scorer swapped in to prefer another node than the default
scheduler's choice moves the next pod there (the extender's weight outweighs the scheduler's own plugins); without
a snapshot the extender fails open; with the extender down the scheduler goes on without it (``ignorable``).
Latencies of the calls are printed, not asserted.
"""

from __future__ import annotations

import json
import secrets
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter
from autoscaler.app import Adapters, build_runtime
from autoscaler.core.extender import PodRequest, fgd_scores, prioritize_nodes
from autoscaler.core.fragmentation import GpuNode, Task, TaskMix
from autoscaler.extender_http import Extender, LatestSnapshot
from autoscaler.fakes.metrics import FakeMetricsSource
from autoscaler.runtime import Runtime
from autoscaler.settings import Settings
from tests.realkube.control_plane import GPU_RESOURCE, Component, ControlPlane
from tests.realkube.manifests import start_scheduler

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = REPO / "deploy" / "overlays" / "scheduler-extender" / "kube-scheduler-config.yaml"
GPU_NODES = ("kwok-a100-0", "kwok-a100-1", "kwok-l4-0")


@dataclass
class Call:
    verb: str
    pod: str
    node_names: list[str] | None
    status: int
    answer: Any
    seconds: float


def record_calls(extender: Extender) -> list[Call]:
    """Every call the scheduler makes to the controller's extender: what it sent, what it got, how long it took."""
    calls: list[Call] = []
    handle = extender.handle

    def recording(verb: str, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        status, answer = handle(verb, body)
        seconds = time.perf_counter() - started
        args = json.loads(body)
        pod = args.get("Pod") or {}
        name = f"{pod.get('metadata', {}).get('namespace')}/{pod.get('metadata', {}).get('name')}"
        calls.append(Call(verb, name, args.get("NodeNames"), status, json.loads(answer), seconds))
        return status, answer

    extender.handle = recording  # type: ignore[method-assign]
    return calls


class NoPolicies:
    def list_policies(self) -> list[Any]:
        return []


@dataclass
class Setup:
    cp: ControlPlane
    namespace: str
    scheduler_name: str
    runtime: Runtime
    extender: Extender
    snapshots: LatestSnapshot
    calls: list[Call]
    scheduler: Component


def pod_manifest(name: str, gpus: int, *, scheduler: str | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node is not None:
        spec["nodeName"] = node  # bound directly: no scheduler involved
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}}, "spec": spec}


def create_pod(cp: ControlPlane, namespace: str, manifest: dict[str, Any]) -> None:
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)


def wait_bound(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 60) -> str:
    def node() -> str | None:
        pod = cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod.get("spec", {}).get("nodeName") or None

    return cp.wait(f"pod {namespace}/{name} bound", node, timeout_s=timeout_s)


def wait_running(cp: ControlPlane, namespace: str, name: str) -> None:
    cp.wait(
        f"pod {namespace}/{name} Running",
        lambda: cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}").get("status", {}).get("phase") == "Running",
    )


def scheduler_config(setup_dir: Path, cp: ControlPlane, scheduler_name: str, extender_port: int) -> Path:
    """The shipped configuration with this test's URL, scheduler name, credentials, and no leader election."""
    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    (extender,) = config["extenders"]
    extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}/scheduler"
    # The shipped 1 s suits an extender answering from memory on its own cores; here the test process shares two
    # cores with the whole control plane, and an ignored timeout would place a pod without the advice under test.
    extender["httpTimeout"] = "10s"
    config["profiles"] = [{"schedulerName": scheduler_name}]
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {"kubeconfig": str(cp.work_dir / "scheduler.kubeconfig")}
    path = setup_dir / "kube-scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def setup(control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, tmp_path: Path) -> Iterator[Setup]:
    cp = control_plane
    settings = Settings(
        dry_run=True,
        leader_election={"enabled": False},
        http={"bind_address": "127.0.0.1", "port": 0},
        scheduler_extender={"enabled": True, "bind_address": "127.0.0.1", "port": 0},
        tick_interval_seconds=1,
        tick_stall_seconds=60,
    )
    reader = KubeClusterReader(api_client)
    adapters = Adapters(
        metrics=FakeMetricsSource(),
        cluster=reader,
        writer=KubeClusterWriter(api_client),
        policies=NoPolicies(),
        status_writer=None,
        node_pools=None,
    )
    runtime = build_runtime(settings, adapters, refit=lambda now: None)
    assert runtime.extender is not None and runtime._extender_snapshots is not None
    extender = runtime.extender.extender
    calls = record_calls(extender)
    runtime.start()
    scheduler_name = f"gpu-placement-{secrets.token_hex(3)}"
    config = scheduler_config(tmp_path, cp, scheduler_name, runtime.extender.port)
    scheduler: Component | None = None
    try:
        scheduler = start_scheduler(cp, config, scheduler_name, tmp_path)
        yield Setup(cp, namespace, scheduler_name, runtime, extender, runtime._extender_snapshots, calls, scheduler)
    finally:
        if scheduler is not None:
            scheduler.stop()
        runtime.stop()


def others_gone(setup: Setup) -> bool:
    """No GPU pod of another test left on the nodes (their namespaces are deleted without waiting)."""
    snapshot = setup.snapshots.latest()
    if snapshot is None:
        return False
    return not [p for p in snapshot.pods if p.gpus and p.namespace != setup.namespace and p.node in GPU_NODES]


def tick_saw(setup: Setup, names: set[str], since: float) -> bool:
    """A tick after ``since`` read these pods of the test's namespace, bound and running."""
    snapshot = setup.snapshots.latest()
    if snapshot is None or snapshot.time < since:
        return False
    seen = {p.name for p in snapshot.pods if p.namespace == setup.namespace and p.node and p.phase == "Running"}
    return names <= seen


def test_the_real_scheduler_places_gpu_pods_where_the_extender_advises(setup: Setup) -> None:
    cp, ns = setup.cp, setup.namespace
    cp.wait("GPU nodes free of other tests' pods", lambda: others_gone(setup), timeout_s=90, interval_s=1)
    # a100-0: 7 of 8 GPUs taken; a100-1: 4 of 8; l4-0 empty (4). The mix is 7- and 4-GPU tasks.
    create_pod(cp, ns, pod_manifest("big", 7, node="kwok-a100-0"))
    create_pod(cp, ns, pod_manifest("half", 4, node="kwok-a100-1"))
    for name in ("big", "half"):
        wait_running(cp, ns, name)

    # The controller's tick (every second) reads the cluster; the extender answers from what it read.
    started = time.time()
    cp.wait("a tick that read both pods", lambda: tick_saw(setup, {"big", "half"}, started), timeout_s=60)
    snapshot = setup.snapshots.latest()
    assert snapshot is not None
    view = setup.extender.view()
    advice = dict(
        prioritize_nodes(view, PodRequest(ns, "small", 1), GPU_NODES, time.time(), setup.extender.config).scores
    )
    best = max(advice, key=lambda n: advice[n])
    assert sorted(advice.values())[-1] > sorted(advice.values())[-2], advice  # one clear favourite
    assert best == "kwok-a100-0", advice  # the last free GPU of a100-0: no 7- or 4-GPU task could use it
    print(f"\nextender advice for a 1-GPU pod (0..10): {advice}; snapshot of {len(snapshot.pods)} pods")

    # For comparison, the same pod through the cluster's default scheduler (no extender), then removed.
    create_pod(cp, ns, pod_manifest("control", 1))
    control_node = wait_bound(cp, ns, "control")
    print(f"  default-scheduler (no extender) placed the same pod on {control_node}")
    cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/control", params={"gracePeriodSeconds": "0"})
    cp.wait("control pod gone", lambda: not cp.exists(f"/api/v1/namespaces/{ns}/pods/control"))
    # ... and gone from what the extender answers from: the snapshot of a tick that began after that (the extender
    # reads no API; with the control pod's GPU still in its snapshot it would advise for a cluster that is not there)
    gone = time.time()

    def read_without_control() -> bool:
        snapshot = setup.snapshots.latest()
        if snapshot is None or snapshot.time < gone:
            return False
        return "control" not in {p.name for p in snapshot.pods if p.namespace == ns}

    cp.wait("a tick that read the cluster without the control pod", read_without_control, timeout_s=60)

    create_pod(cp, ns, pod_manifest("small", 1, scheduler=setup.scheduler_name))
    placed = wait_bound(cp, ns, "small")
    calls = [c for c in setup.calls if c.pod == f"{ns}/small"]
    for c in calls:
        print(f"  scheduler -> {c.verb}: NodeNames={c.node_names} -> {c.status} {c.answer} ({c.seconds * 1e3:.2f} ms)")
    print(f"  bound to {placed}")
    verbs = [c.verb for c in calls]
    assert set(verbs) == {"prioritize"}, verbs  # the shipped configuration names no filterVerb (core.extender)
    assert all(c.status == 200 for c in calls)
    assert all(c.node_names is not None for c in calls)  # nodeCacheCapable: names only
    prioritized = next(c for c in calls if c.verb == "prioritize")
    assert {h["Host"]: h["Score"] for h in prioritized.answer}[best] == 10
    assert placed == best

    # The extender's ranking outweighs the scheduler's own plugins: a scorer (swapped in, as the core allows) that
    # prefers the node the default scheduler did not pick sends the next pod there.
    target = next(n for n in ("kwok-l4-0", "kwok-a100-1") if n != control_node)

    def prefer_target(nodes: Sequence[GpuNode], task: Task, mix: TaskMix) -> list[int | None]:
        return [100 if n.name == target else 0 for n in nodes]

    setup.extender._scorer = prefer_target
    create_pod(cp, ns, pod_manifest("steered", 1, scheduler=setup.scheduler_name))
    steered = wait_bound(cp, ns, "steered")
    print(f"  with a scorer preferring {target}: bound to {steered} (the default scheduler chose {control_node})")
    assert steered == target
    setup.extender._scorer = fgd_scores

    # No snapshot: the extender fails open (every node passes, scores 0) and the pod is still placed.
    setup.runtime.scheduler.pause()  # no more ticks
    time.sleep(1.5)  # a tick the scheduler handed to its executor just before has started
    # ... and every tick in flight has finished: one finishing after the reset would put a snapshot back (a tick
    # reading the whole cluster can take more than 1.5 s on a loaded machine)
    cp.wait("the tick in flight finished", lambda: setup.runtime.jobs_running() == 0 or None, timeout_s=60)
    setup.snapshots.set(None)
    create_pod(cp, ns, pod_manifest("blind", 1, scheduler=setup.scheduler_name))
    wait_bound(cp, ns, "blind")
    blind = [c for c in setup.calls if c.pod == f"{ns}/blind"]
    assert blind and all(c.status == 200 for c in blind)
    for c in blind:
        print(f"  (no snapshot) scheduler -> {c.verb}: -> {c.answer}")
        if c.verb == "filter":
            assert c.answer["NodeNames"] == c.node_names
        else:
            assert {h["Score"] for h in c.answer} == {0}
    fail_open = setup.runtime.telemetry.registry.get_sample_value(
        "gpu_autoscaler_extender_fail_open_total", {"verb": "prioritize", "reason": "no_snapshot"}
    )
    assert fail_open is not None and fail_open >= 1

    # The extender down: ignorable, so the scheduler places the pod without it.
    assert setup.runtime.extender is not None
    setup.runtime.extender.stop()
    create_pod(cp, ns, pod_manifest("unadvised", 1, scheduler=setup.scheduler_name))
    print(f"  (extender down) bound to {wait_bound(cp, ns, 'unadvised')}")

    times = {verb: [c.seconds * 1e3 for c in setup.calls if c.verb == verb] for verb in ("filter", "prioritize")}
    for verb, ms in times.items():
        if ms:
            print(
                f"  {verb}: {len(ms)} calls, median {statistics.median(ms):.2f} ms, max {max(ms):.2f} ms (in-process)"
            )
    assert setup.scheduler.dead() is None
