"""The fault suite's API faults on the real control plane (issue 13, item 6): ``autoscaler run`` as a program
against the real kube-apiserver through the fault proxy (fault_proxy.py), which answers 500/503/429/409, holds a
request past the client's timeout or cuts the connection for the requests its rule matches and forwards the rest
untouched. The Prometheus-side faults stay in tests/runtime/test_faults.py.

The cluster: a kwok node of this module's own GPU product (8 GPUs), a real Deployment ml-style ``chat`` of 6 pods
(one GPU each) placed by the real scheduler and Running under kwok, the GPUScalingPolicy CRD from ``deploy/base``,
a policy on GPU utilisation with a target of 50 %, no scale-down window and minReplicas 2. A real Prometheus scrapes
an exporter that reports 10 % for each of the Deployment's Running pods (their names read from the API): the fresh
answer is 6 -> ceil(6 x 10 / 50) = 2.

Each case starts the controller (its kubeconfig points at the proxy: same CA, same token) with the fault already
active, watches the Deployment's replicas (read straight from the apiserver) through five ticks: they must stay 6
(no scale-down on a failed or cut read, no write that went through), the controller must stay up and healthy;
then clears the fault and measures the time to the first write that reaches the apiserver, which must set 2, and
checks that no second write follows (no double write). The table is printed at the end of the module.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from tests.prometheus.promserver import LoopbackGetServer, PrometheusServer, require_prometheus, scrape_config
from tests.realkube import manifests
from tests.realkube.control_plane import REPO, ApiError, ControlPlane, GpuNode
from tests.realkube.fault_proxy import FaultProxy
from tests.realkube.manifests import gpu_pod_spec
from tests.runtime.controller_process import Controller, FaultRow, wait_for_leader, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.realkube, pytest.mark.faults]

CRD_FILE = REPO / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"
DEPLOYMENT, POLICY = "chat", "chat-policy"
PODS, PER_POD, TARGET, MIN_REPLICAS = 6, 10.0, 50.0, 2
SCALED_TO = 2  # ceil(6 x 10 / 50)
SCALE_PATH = rf"^/apis/apps/v1/namespaces/[^/]+/deployments/{DEPLOYMENT}/scale$"
PODS_LIST = r"^/api/v1/pods$"  # the reader's list of every pod (the query is matched apart)
FAULT_WINDOW_S = 5.0  # five ticks at a 1 s interval


# ---- the exporter: dcgm-exporter's gauge for the Deployment's real pods ------------------------------------------


class PodGpuExporter:
    """``DCGM_FI_DEV_GPU_UTIL`` = ``percent`` for each Running pod of the Deployment in ``namespace``, names and
    nodes read from the apiserver directly (never through the proxy) at every scrape."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.namespace = ""
        self.percent = PER_POD
        self._pods: list[dict[str, Any]] = []
        self._http = LoopbackGetServer(self._handle)
        self.port = self._http.port
        self._http.start()

    def running(self) -> list[dict[str, Any]]:
        if self.namespace:
            with contextlib.suppress(ApiError, OSError):
                self._pods = [
                    p
                    for p in self.cp.pods(self.namespace, f"app={DEPLOYMENT}")
                    if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                ]
        return self._pods

    def body(self) -> str:
        lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        for pod in sorted(self.running(), key=lambda p: p["metadata"]["name"]):
            meta = pod["metadata"]
            labels = (
                f'gpu="0",UUID="GPU-{meta["uid"]}",modelName="NVIDIA H100 80GB HBM3",'
                f'Hostname="{pod["spec"].get("nodeName", "")}",namespace="{meta["namespace"]}",pod="{meta["name"]}",'
                'container="main"'
            )
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {self.percent:g}")
        return "\n".join(lines) + "\n"

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        data = self.body().encode()
        req.send_response(200)
        req.send_header("Content-Type", "text/plain; version=0.0.4")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def close(self) -> None:
        self._http.stop()


# ---- module fixtures: the node, the CRD, Prometheus, the table ---------------------------------------------------


def install_crd(cp: ControlPlane) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    name = crd["metadata"]["name"]
    with contextlib.suppress(ApiError):  # 409: installed by another test already
        cp.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> bool | None:
        obj = cp.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}
        if conds.get("Established") != "True":
            return None
        cp.get(f"/apis/{API_GROUP}/{API_VERSION}/{PLURAL}")
        return True

    cp.wait(f"CRD {name} Established", established, timeout_s=30)


@pytest.fixture(scope="module")
def gpu_product(control_plane: ControlPlane) -> Iterator[str]:
    """A kwok node of a GPU product no other test selects: other tests' pods cannot take its GPUs."""
    tag = secrets.token_hex(3)
    product, node = f"FAULTS-TEST-{tag}", f"faults-{tag}"
    # kwok renews the node's Lease itself (control_plane.py passes --node-lease-duration-seconds), so the node
    # lifecycle controller never sees it miss a heartbeat and never marks its pods unready
    control_plane.request("POST", "/api/v1/nodes", control_plane.node_manifest(GpuNode(node, 8, product, "faults")))
    try:
        install_crd(control_plane)
        control_plane.wait_nodes_schedulable([node], timeout_s=60)
        yield product
    finally:
        with contextlib.suppress(ApiError):
            control_plane.request("DELETE", f"/api/v1/nodes/{node}")


@pytest.fixture(scope="module")
def exporter(control_plane: ControlPlane) -> Iterator[PodGpuExporter]:
    exp = PodGpuExporter(control_plane)
    yield exp
    exp.close()


@pytest.fixture(scope="module")
def prometheus(exporter: PodGpuExporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    data = tmp_path_factory.mktemp("faults-real-prom") / "data"
    server = PrometheusServer(require_prometheus(), data, config=scrape_config(exporter.port))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fault_table(request: pytest.FixtureRequest) -> Iterator[list[FaultRow]]:
    rows: list[FaultRow] = []
    yield rows
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if not rows or reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print_table(reporter, rows)


def print_table(reporter: Any, rows: list[FaultRow]) -> None:
    reporter.write_line("")
    reporter.write_line("fault suite, API faults on the real control plane (through the fault proxy):")
    reporter.write_line(f"{'fault':<58} {'replicas during':<16} {'first action after':<22} recovery s")
    for row in rows:
        during = ",".join(str(r) for r in row.replicas_during)
        took = "-" if row.recovery_s is None else f"{row.recovery_s:.1f}"
        reporter.write_line(f"{row.fault:<58} {during:<16} {row.first_action:<22} {took}")


# ---- the world of one case ---------------------------------------------------------------------------------------


@dataclass
class World:
    cp: ControlPlane
    namespace: str
    proxy: FaultProxy
    prometheus: PrometheusServer
    tmp: Path
    table: list[FaultRow]
    started: list[Controller] = field(default_factory=list)

    def controller(self, identity: str = "ctrl-a") -> Controller:
        kubeconfig = self.proxy.write_kubeconfig(
            self.tmp / "proxied.kubeconfig", self.cp.tokens["admin"], self.cp.ca_file, self.namespace
        )
        ctrl = Controller(
            identity,
            kubeconfig,
            self.prometheus.url,
            self.tmp,
            extra_env={"POD_NAMESPACE": self.namespace, "AUTOSCALER_NAMESPACES": self.namespace},
        )
        self.started.append(ctrl)
        return ctrl

    def replicas(self) -> int:
        """spec.replicas, read from the apiserver itself (not through the proxy)."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{DEPLOYMENT}"
        return int(self.cp.get(path)["spec"]["replicas"])

    def scale_writes(self) -> int:
        """Scale writes that reached the apiserver and succeeded (refused and cut ones are not writes)."""
        return self.proxy.count("PATCH", SCALE_PATH, forwarded=True, ok=True)

    def diagnosis(self, ctrl: Controller) -> str:
        """The controller's log and what the cluster says of the pods and nodes, for a failure message."""
        lines = [ctrl.log()]
        with contextlib.suppress(ApiError, OSError):
            for pod in self.cp.pods(self.namespace):
                conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}
                lines.append(
                    f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: {pod['status'].get('phase')} "
                    f"{conds} deleting={bool(pod['metadata'].get('deletionTimestamp'))}"
                )
            for node in self.cp.get("/api/v1/nodes")["items"]:
                conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
                lines.append(f"node {node['metadata']['name']}: Ready={conds.get('Ready')}")
        lines.append(f"proxy: {len(self.proxy.records)} requests, rules {self.proxy.rules}")
        return "\n".join(lines)

    def prometheus_series(self) -> int:
        query = urllib.parse.urlencode({"query": f'DCGM_FI_DEV_GPU_UTIL{{namespace="{self.namespace}"}}'})
        with urllib.request.urlopen(f"{self.prometheus.url}/api/v1/query?{query}", timeout=2) as response:
            return len(json.load(response)["data"]["result"])


def deployment(product: str) -> dict[str, Any]:
    # container "main", the name this suite's exporter gives its series (controller_world's uses "c")
    spec = gpu_pod_spec(1, product, container="main", image="vllm/vllm-openai", requests=False, grace_s=0)
    return manifests.deployment(DEPLOYMENT, PODS, spec)


def policy() -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "targetRef": {"name": DEPLOYMENT},
            "minReplicas": MIN_REPLICAS,
            "maxReplicas": 12,
            "metric": {"type": "gpu_utilization", "target": int(TARGET)},
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
        },
    }


@pytest.fixture
def world(
    control_plane: ControlPlane,
    namespace: str,
    gpu_product: str,
    exporter: PodGpuExporter,
    prometheus: PrometheusServer,
    fault_table: list[FaultRow],
    tmp_path: Path,
) -> Iterator[World]:
    cp = control_plane
    exporter.namespace, exporter.percent = namespace, PER_POD
    cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment(gpu_product))
    proxy = FaultProxy.for_control_plane(cp).start()
    w = World(cp, namespace, proxy, prometheus, tmp_path, fault_table)
    try:
        cp.wait(f"{PODS} pods Running", lambda: len(exporter.running()) == PODS or None, timeout_s=60)
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{DEPLOYMENT}"
        cp.wait(f"Deployment ready {PODS}/{PODS}", lambda: cp.get(path)["status"].get("readyReplicas") == PODS or None)
        cp.wait("Prometheus to scrape the pods", lambda: w.prometheus_series() == PODS or None, timeout_s=60)
        cp.request("POST", f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{PLURAL}", policy())
        yield w
    finally:
        for ctrl in w.started:
            ctrl.stop(signal.SIGKILL)
        proxy.stop()
        exporter.namespace = ""


def watch(w: World, seconds: float) -> list[int]:
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(w.replicas())
        time.sleep(0.2)
    return seen


def recover(w: World, ctrl: Controller, before: int, what: str) -> tuple[str, float]:
    """Time from the fault's end to the controller's first write that reaches the apiserver, which must set
    ``SCALED_TO``; then no second write."""
    cleared = time.monotonic()
    wait_until(lambda: w.scale_writes() > before, 40, what, lambda: w.diagnosis(ctrl))
    took = time.monotonic() - cleared
    assert w.replicas() == SCALED_TO, w.diagnosis(ctrl)
    time.sleep(1.5)
    assert w.scale_writes() == before + 1, w.diagnosis(ctrl)  # one change, one write
    return f"{PODS} -> {SCALED_TO}", took


# ---- API faults: the cluster cannot be read, or writes fail ------------------------------------------------------

API_FAULTS: Mapping[str, dict[str, Any]] = {
    "API 500 on list pods": {"method": "GET", "path": PODS_LIST, "status": 500},
    "API 503 on list pods": {"method": "GET", "path": PODS_LIST, "status": 503},
    "API 429 on list pods (Retry-After 1)": {"method": "GET", "path": PODS_LIST, "status": 429, "retry_after": 1},
    "API slow (5 s > 2 s timeout) on list pods": {"method": "GET", "path": PODS_LIST, "delay_s": 5.0},
    "API drops connections on list pods": {"method": "GET", "path": PODS_LIST, "drop": "before"},
    "API cuts list pods mid-body": {"method": "GET", "path": PODS_LIST, "drop": "mid", "drop_after_bytes": 300},
    "API 500 on the scale write": {"method": "PATCH", "path": SCALE_PATH, "status": 500},
    "API 409 storm on the scale write": {"method": "PATCH", "path": SCALE_PATH, "status": 409},
    "API 429 on the scale write (Retry-After 1)": {
        "method": "PATCH",
        "path": SCALE_PATH,
        "status": 429,
        "retry_after": 1,
    },
    "API slow (5 s > 2 s timeout) on the scale read": {
        "method": "GET",
        "path": SCALE_PATH,
        "delay_s": 5.0,
    },
}


@pytest.mark.parametrize("fault", list(API_FAULTS))
def test_api_fault_holds_then_recovers(world: World, fault: str) -> None:
    rule = world.proxy.inject(**API_FAULTS[fault])
    ctrl = world.controller()
    wait_for_leader(ctrl)
    during = watch(world, FAULT_WINDOW_S)
    assert set(during) == {PODS}, world.diagnosis(ctrl)
    assert world.scale_writes() == 0, world.diagnosis(ctrl)  # nothing reached the apiserver's Deployment
    assert rule.hits > 0, "the fault never matched: " + world.diagnosis(ctrl)
    assert ctrl.proc.poll() is None, world.diagnosis(ctrl)  # no crash loop
    assert ctrl.get("/healthz")[0] == 200

    world.proxy.clear()
    first, took = recover(world, ctrl, 0, "the scale-down once the API answers")
    world.table.append(FaultRow(fault, sorted(set(during)), first, took))
    assert ctrl.proc.poll() is None


def test_a_short_409_storm_is_retried_within_one_write(world: World) -> None:
    """Three 409s on the scale write, then the apiserver's answers: the writer re-reads and retries inside one tick
    (bounded at 5), so the scale-down goes through at the first tick with exactly one write."""
    rule = world.proxy.inject("PATCH", SCALE_PATH, 409, times=3)
    started = time.monotonic()
    ctrl = world.controller()
    wait_until(lambda: world.scale_writes() > 0, 40, "the scale-down", lambda: world.diagnosis(ctrl))
    took = time.monotonic() - started
    assert rule.hits == 3 and world.replicas() == SCALED_TO, world.diagnosis(ctrl)
    during = watch(world, 2.0)
    assert set(during) == {SCALED_TO} and world.scale_writes() == 1, world.diagnosis(ctrl)
    assert world.proxy.count("PATCH", SCALE_PATH) == 4  # three refused, one written
    world.table.append(FaultRow("API 409 x3 on the scale write (from start)", sorted({PODS, *during}), "6 -> 2", took))


def test_failed_and_conflicting_writes_are_retried_without_crash_or_double_action(world: World) -> None:
    """Two ticks whose scale write fails with 500, then a 409 (re-read, written): one write, one Event, the failures
    counted (moved from tests/runtime/test_e2e.py, where the fake API server injected them)."""
    world.proxy.inject("PATCH", SCALE_PATH, 500, times=2)
    world.proxy.inject("PATCH", SCALE_PATH, 409, times=1)  # rules apply in order
    started = time.monotonic()
    ctrl = world.controller()
    wait_until(lambda: world.scale_writes() > 0, 40, "the scale-down to get through", lambda: world.diagnosis(ctrl))
    took = time.monotonic() - started
    during = watch(world, 2.0)
    assert set(during) == {SCALED_TO}, world.diagnosis(ctrl)
    assert world.proxy.count("PATCH", SCALE_PATH) == 4, world.diagnosis(ctrl)  # 500, 500, 409 -> re-read -> 200
    assert world.scale_writes() == 1
    events = world.cp.get(f"/apis/events.k8s.io/v1/namespaces/{world.namespace}/events")["items"]
    below = [e for e in events if e.get("reason") == "MetricBelowTarget"]
    assert len(below) == 1, below  # the Event follows the one write that happened
    assert ctrl.metric("gpu_autoscaler_errors_total", component="cluster_write") == 2
    failed = {"kind": "ScaleDeployment", "reason": "metric_below_target", "dry_run": "false", "result": "failed"}
    assert ctrl.metric("gpu_autoscaler_actions_total", **failed) == 2
    assert ctrl.proc.poll() is None and ctrl.get("/healthz")[0] == 200
    assert ctrl.stop(signal.SIGTERM) == 0, world.diagnosis(ctrl)
    world.table.append(FaultRow("API 500, 500, then 409 on the scale write", sorted({PODS, *during}), "6 -> 2", took))
