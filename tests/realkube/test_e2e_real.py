"""End to end against the real control plane (issue 13, item 5): the whole loop with nothing of ours imitating
Kubernetes.

Real: etcd, kube-apiserver, kube-controller-manager (Deployment -> ReplicaSet -> Pod), kube-scheduler binding the
pods onto kwok GPU nodes, kwok running them; Prometheus (the Debian binary) scraping; ``autoscaler run`` as a
subprocess configured through the environment, with leader election on against the real Lease API, reading the
GPUScalingPolicy CRD from ``deploy/base``. Fake: only the GPUs and the application: one HTTP exporter on 127.0.0.1
publishing dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` and vLLM's ``vllm:num_requests_waiting`` /
``vllm:request_success_total`` for the Deployment's *real* pods (their names and nodes read from the API at every
scrape), from a fixed total demand shared by the pods that are Running, so scaling up really lowers the per-pod
utilisation.

The test makes its own two kwok nodes with a GPU product no other test selects, so other tests' pods cannot take
the GPUs it counts. Every wait is bounded; the controller, Prometheus and the exporter are stopped in finalizers and
the nodes deleted. The timeline (seconds from the controller's start) is printed.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from tests.prometheus.promserver import PrometheusServer, binaries, in_ci
from tests.prometheus.promserver import free_port as prom_free_port
from tests.realkube.control_plane import GPU_PRODUCT_LABEL, GPU_RESOURCE, ApiError, ControlPlane, GpuNode
from tests.runtime.controller_process import REPO, Controller

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

CRD_FILE = REPO / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"
DEPLOYMENT = "chat"
TARGET = 50.0  # % GPU utilisation per pod
OVERLOADED = 170.0  # total demand, GPU-%: 2 pods at 85 % -> ceil(2 x 1.7) = 4; 4 at 42.5 % -> ceil(3.4) = 4
IDLE = 20.0  # 4 pods at 5 % -> ceil(4 x 0.1) = 1


# ---- the fake GPUs and application -------------------------------------------------------------------------------


class PodMetricsExporter(Collector):
    """dcgm-exporter + vLLM metrics for the Running pods of the Deployment, computed at every scrape.

    ``demand`` is the total GPU work in GPU-percent; each Running pod gets ``min(100, demand / pods)``. The queue
    follows the same story (waiting requests when overloaded, none when idle), the request counter grows.
    """

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.namespace = cp, namespace
        self.demand = 0.0
        self.pods: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.port = prom_free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def running_pods(self) -> list[dict[str, Any]]:
        with contextlib.suppress(ApiError, OSError):  # keep the last answer: a scrape never fails on the API
            self.pods = [
                p
                for p in self.cp.pods(self.namespace, f"app={DEPLOYMENT}")
                if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            ]
        return self.pods

    def collect(self) -> Iterator[Any]:
        pods = self.running_pods()
        util = GaugeMetricFamily(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %).",
            labels=["gpu", "UUID", "modelName", "Hostname", "namespace", "pod", "container"],
        )
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting.", labels=["namespace", "pod"])
        done = CounterMetricFamily("vllm:request_success", "Finished requests.", labels=["namespace", "pod"])
        per_pod = min(100.0, self.demand / len(pods)) if pods else 0.0
        index: dict[str, int] = {}
        elapsed = time.monotonic() - self.started
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            name, node = pod["metadata"]["name"], pod["spec"].get("nodeName", "")
            gpu = index[node] = index.get(node, -1) + 1
            util.add_metric(
                [str(gpu), f"GPU-{pod['metadata']['uid']}", "NVIDIA A100-SXM4-80GB", node, self.namespace, name, "c"],
                per_pod,
            )
            waiting.add_metric([self.namespace, name], 8.0 if per_pod > TARGET else 0.0)
            done.add_metric([self.namespace, name], round(elapsed * per_pod / 10))
        yield util
        yield waiting
        yield done

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_config(port: int) -> str:
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpu-and-app\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )


# ---- the world ---------------------------------------------------------------------------------------------------


@dataclass
class World:
    cp: ControlPlane
    namespace: str
    nodes: tuple[str, str]
    exporter: PodMetricsExporter
    prometheus: PrometheusServer
    tmp_path: Path
    started: list[Controller] = field(default_factory=list)


def deployment(product: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": DEPLOYMENT}},
            "template": {
                "metadata": {"labels": {"app": DEPLOYMENT}},
                "spec": {
                    "nodeSelector": {GPU_PRODUCT_LABEL: product},
                    "containers": [
                        {"name": "c", "image": "vllm/vllm-openai", "resources": {"limits": {GPU_RESOURCE: "1"}}}
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def policy() -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": "chat-policy"},
        "spec": {
            "targetRef": {"name": DEPLOYMENT},
            "minReplicas": 1,
            "maxReplicas": 8,
            "metric": {"type": "gpu_utilization", "target": int(TARGET)},
            # A short scale-down stabilisation, so the test sees the scale-down within seconds.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 2}},
        },
    }


def install_crd(cp: ControlPlane) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    name = crd["metadata"]["name"]
    if not cp.exists(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"):
        try:
            cp.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        except ApiError as exc:
            if exc.status != 409:  # another test installed it in between
                raise

    def established() -> bool | None:
        obj = cp.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}
        if conds.get("Established") != "True":
            return None
        cp.get(f"/apis/{API_GROUP}/{API_VERSION}/{PLURAL}")
        return True

    cp.wait(f"CRD {name} Established", established, timeout_s=30)


@pytest.fixture
def world(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[World]:
    found = binaries()
    if found is None:
        message = "prometheus is not installed: apt-get install -y --no-install-recommends prometheus"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    cp = control_plane
    tag = secrets.token_hex(3)
    product = f"E2E-TEST-{tag}"
    nodes = (f"e2e-{tag}-a", f"e2e-{tag}-b")
    exporter: PodMetricsExporter | None = None
    prometheus: PrometheusServer | None = None
    w: World | None = None
    try:
        for name in nodes:
            cp.request("POST", "/api/v1/nodes", cp.node_manifest(GpuNode(name, 8, product, "e2e")))
        install_crd(cp)
        cp.wait_nodes_schedulable(list(nodes), timeout_s=60)
        exporter = PodMetricsExporter(cp, namespace)
        prometheus = PrometheusServer(found[0], tmp_path / "prom-data", config=prometheus_config(exporter.port))
        prometheus.start()
        cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment(product, 2))
        w = World(cp, namespace, nodes, exporter, prometheus, tmp_path)
        yield w
    finally:
        for ctrl in w.started if w is not None else []:
            ctrl.stop(signal.SIGKILL)
        if prometheus is not None:
            prometheus.stop()
        if exporter is not None:
            exporter.close()
        # The namespace (Deployment, pods, policy, Lease, Events) goes with the namespace fixture.
        for name in nodes:
            with contextlib.suppress(ApiError):
                cp.request("DELETE", f"/api/v1/nodes/{name}")


# ---- reading the cluster -----------------------------------------------------------------------------------------


def get_deployment(w: World) -> dict[str, Any]:
    return dict(w.cp.get(f"/apis/apps/v1/namespaces/{w.namespace}/deployments/{DEPLOYMENT}"))


def spec_replicas(w: World) -> int:
    return int(get_deployment(w)["spec"]["replicas"])


def running_pods(w: World) -> dict[str, str]:
    """pod -> node of the Deployment's Running pods that are not being deleted."""
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in w.cp.pods(w.namespace, f"app={DEPLOYMENT}")
        if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def all_pods(w: World) -> list[dict[str, Any]]:
    return w.cp.pods(w.namespace, f"app={DEPLOYMENT}")


def policy_obj(w: World) -> dict[str, Any]:
    return dict(w.cp.get(f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{w.namespace}/{PLURAL}/chat-policy"))


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


def events(w: World, reason: str) -> list[dict[str, Any]]:
    items = w.cp.get(f"/apis/events.k8s.io/v1/namespaces/{w.namespace}/events").get("items") or []
    return [e for e in items if e.get("reason") == reason]


def managers(obj: dict[str, Any]) -> set[tuple[str, str]]:
    """(manager, subresource) of every managedFields entry: how the apiserver saw the object written."""
    return {(m.get("manager", ""), m.get("subresource", "")) for m in obj["metadata"].get("managedFields") or []}


def prom_pods(w: World) -> set[str]:
    query = urllib.parse.urlencode({"query": f'DCGM_FI_DEV_GPU_UTIL{{namespace="{w.namespace}"}}'})
    with urllib.request.urlopen(f"{w.prometheus.url}/api/v1/query?{query}", timeout=2) as response:
        return {r["metric"]["pod"] for r in json.load(response)["data"]["result"]}


# ---- the test ----------------------------------------------------------------------------------------------------


class Timeline:
    """Milestones as first observed by a poller (every 0.1 s) in its own thread, in seconds from ``t0``; the
    assertions wait on their own, this only makes the printed times independent of the order they are checked in."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.seen: dict[str, float] = {}
        self.probes: dict[str, Callable[[], bool]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, what: str, probe: Callable[[], bool]) -> None:
        self.probes[what] = probe

    def mark(self, what: str) -> None:
        self.seen.setdefault(what, time.monotonic() - self.t0)

    def _run(self) -> None:
        # Effects before causes in each cycle (probes are registered in causal order): whatever is seen true was
        # true before the cycle ended, so every milestone newly seen in a cycle is stamped with the cycle's end and a
        # cause is never printed after its effect.
        while not self.stop.wait(0.1):
            fresh = []
            for what, probe in reversed(list(self.probes.items())):
                if what not in self.seen:
                    with contextlib.suppress(Exception):
                        if probe():
                            fresh.append(what)
            for what in fresh:
                self.mark(what)

    def lines(self) -> list[str]:
        order = list(self.probes)

        def key(kv: tuple[str, float]) -> tuple[float, int]:
            return (round(kv[1], 1), order.index(kv[0]) if kv[0] in order else -1)

        return [f"  {at:6.1f}  {what}" for what, at in sorted(self.seen.items(), key=key)]


def n_or_none(items: Any, n: int) -> Any:
    return items if len(items) == n else None


def bound(w: World, n: int) -> list[dict[str, Any]] | None:
    pods = all_pods(w)
    return pods if len(pods) == n and all(p["spec"].get("nodeName") for p in pods) else None


def ready(w: World) -> int:
    return int(get_deployment(w).get("status", {}).get("readyReplicas") or 0)


def status_at(w: World, current: int) -> dict[str, Any] | None:
    status = policy_obj(w).get("status") or {}
    return status if status.get("currentReplicas") == current and status.get("lastAction") else None


def test_whole_loop_prometheus_controller_scheduler_kwok(world: World) -> None:
    w, cp = world, world.cp

    # -- the Deployment's two pods placed by the real scheduler and Running on the test's nodes --
    first = cp.wait("the 2 initial pods Running", lambda: n_or_none(running_pods(w), 2))
    assert set(first.values()) <= set(w.nodes), first
    cp.wait("Deployment ready 2/2", lambda: ready(w) == 2 or None)
    w.exporter.demand = OVERLOADED
    cp.wait("Prometheus to scrape both pods", lambda: prom_pods(w) == set(first) or None, timeout_s=30)
    cp.request("POST", f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{w.namespace}/{PLURAL}", policy())

    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{w.namespace}/leases/gpu-autoscaler"
    identity = f"e2e-ctrl-{secrets.token_hex(2)}"
    timeline = Timeline()
    timeline.watch("Lease acquired", lambda: cp.get(lease_path)["spec"].get("holderIdentity") == identity)
    timeline.watch("first action: Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4)
    timeline.watch("4 pods bound by kube-scheduler", lambda: bound(w, 4) is not None)
    timeline.watch("4 pods Running on kwok GPU nodes", lambda: len(running_pods(w)) == 4)
    timeline.watch("Deployment ready 4/4", lambda: ready(w) == 4)
    timeline.watch("Event MetricAboveTarget", lambda: bool(events(w, "MetricAboveTarget")))
    timeline.watch("GPUScalingPolicy status: current 4", lambda: status_at(w, 4) is not None)
    timeline.watch("Prometheus has the 4 pods' series", lambda: len(prom_pods(w)) == 4)
    timeline.thread.start()
    ctrl = Controller(
        identity,
        cp.admin_kubeconfig,
        w.prometheus.url,
        w.tmp_path,
        extra_env={
            "POD_NAMESPACE": w.namespace,  # the Lease lives (and is deleted) with the test's namespace
            "AUTOSCALER_NAMESPACES": w.namespace,
            "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "5",
        },
    )
    w.started.append(ctrl)
    timeline.mark("`autoscaler run` started")

    def wait(what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        try:
            return cp.wait(what, probe, timeout_s=timeout_s, interval_s=0.25)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{ctrl.log()}\n--- prometheus ---\n{w.prometheus.log_tail()}") from None

    try:
        # -- leader election against the real Lease API --
        wait("the Lease", lambda: cp.get(lease_path)["spec"].get("holderIdentity") == identity or None, 30)

        # -- overloaded: 2 pods at 85 % against 50 % -> 4 replicas, through the scale subresource --
        wait("the Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4 or None, 45)
        scale_writers = {m for m, sub in managers(get_deployment(w)) if sub == "scale"}
        assert scale_writers == {"gpu-autoscaler"}, managers(get_deployment(w))  # the controller's User-Agent
        placed = wait("4 pods bound by kube-scheduler", lambda: bound(w, 4), 30)
        running = wait("4 pods Running", lambda: n_or_none(running_pods(w), 4), 30)
        assert set(running.values()) <= set(w.nodes), running
        for pod in placed:
            conds = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
            assert conds.get("PodScheduled") == "True", pod["status"]
            assert pod["spec"].get("schedulerName") == "default-scheduler", pod["spec"]
        wait("Deployment ready 4/4", lambda: ready(w) == 4 or None, 30)

        status = wait("GPUScalingPolicy status current 4", lambda: status_at(w, 4), 20)
        assert status["desiredReplicas"] == 4, status
        assert status["lastAction"]["reason"] == "metric_above_target", status
        assert (status["lastAction"]["fromReplicas"], status["lastAction"]["toReplicas"]) == (2, 4), status
        assert conditions(status).get("Ready") == "True", status
        assert conditions(status).get("MetricsStale") == "False", status
        status_writers = {m for m, sub in managers(policy_obj(w)) if sub == "status"}
        assert status_writers == {"gpu-autoscaler"}, managers(policy_obj(w))

        [scaled] = wait("Event MetricAboveTarget", lambda: events(w, "MetricAboveTarget") or None, 15)
        assert scaled["regarding"]["kind"] == "Deployment" and scaled["regarding"]["name"] == DEPLOYMENT, scaled
        assert "from 2 to 4" in scaled["note"] and scaled["type"] == "Normal", scaled

        # -- steady: 4 pods at 42.5 % -> ceil(4 x 0.85) = 4, nothing more (no second write, no second Event) --
        wait("Prometheus to see the 4 pods", lambda: prom_pods(w) == set(running) or None, 20)
        time.sleep(3)
        assert spec_replicas(w) == 4, ctrl.log()
        assert len(events(w, "MetricAboveTarget")) == 1, events(w, "MetricAboveTarget")
        applied = {"kind": "ScaleDeployment", "reason": "metric_above_target", "dry_run": "false", "result": "applied"}
        assert ctrl.metric("gpu_autoscaler_actions_total", **applied) == 1, ctrl.log()

        # -- idle: 4 pods at 5 % -> 1 replica after the 2 s stabilisation; the extra pods go away --
        timeline.watch("Deployment scaled 4 -> 1", lambda: spec_replicas(w) == 1)
        timeline.watch("Event MetricBelowTarget", lambda: bool(events(w, "MetricBelowTarget")))
        timeline.watch("pods down to 1 Running", lambda: len(all_pods(w)) == 1 and len(running_pods(w)) == 1)
        timeline.watch("GPUScalingPolicy status: current 1", lambda: status_at(w, 1) is not None)
        w.exporter.demand = IDLE
        timeline.mark("metrics say idle")
        wait("the Deployment scaled 4 -> 1", lambda: spec_replicas(w) == 1 or None, 45)
        wait("pods down to 1", lambda: (len(all_pods(w)) == 1 and len(running_pods(w)) == 1) or None, 30)
        down = wait("GPUScalingPolicy status current 1", lambda: status_at(w, 1), 20)
        assert down["lastAction"]["reason"] == "metric_below_target", down
        assert (down["lastAction"]["fromReplicas"], down["lastAction"]["toReplicas"]) == (4, 1), down
        [below] = wait("Event MetricBelowTarget", lambda: events(w, "MetricBelowTarget") or None, 15)
        assert "from 4 to 1" in below["note"], below

        # -- SIGTERM: clean exit, the Lease released --
        assert ctrl.stop(signal.SIGTERM) == 0, ctrl.log()
        timeline.mark("controller exited on SIGTERM")
        assert not cp.get(lease_path)["spec"].get("holderIdentity"), cp.get(lease_path)
    finally:
        timeline.stop.set()
        timeline.thread.join(timeout=5)
        print(
            "\nend-to-end timeline (seconds from `autoscaler run` start; upper bounds: the end of "
            "the ~0.1 s poller cycle that first saw each):"
        )
        print("\n".join(timeline.lines()))
    print(f"scale subresource written by {sorted(scale_writers)}; policy status by {sorted(status_writers)}")
