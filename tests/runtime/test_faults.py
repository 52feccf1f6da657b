"""The fault suite: ``autoscaler run`` as a program, against the REST-faithful API server and a real Prometheus
scraping an exporter whose every byte the test sets, with one fault injected per case (issue 17).

The faults here are on the metrics side (Prometheus, the exporter, the latency series), readiness, a SIGKILL and a
second policy. The API faults (500/503/429 and slow or dropped list pods, 500/409/429 on the scale write) run
against the real kube-apiserver through a fault-injecting proxy: tests/realkube/test_faults_real.py.

The cluster: Deployment ml/chat, 6 replicas, 6 Running+Ready pods (one GPU each, owned by the Deployment's
ReplicaSet, as a real cluster has them), a GPUScalingPolicy on GPU utilisation with a target of 50 % and no
scale-down window. Each case starts the controller with its fault already active, watches the Deployment's replicas
through at least five ticks (the controller ticks every second), then clears the fault and measures how long the
controller takes to act on the fresh data. Every case asserts the replica count at every sample: no scale-down on
stale or partial data, a scale-up not blocked by a missing guard signal, no double write.

The table of results (fault, replicas seen during the fault, first action after it, recovery seconds) is printed at
the end of the pytest run.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from controller_process import FAULT_TABLE, Controller, FaultRow, wait_for_leader, wait_until

from autoscaler.adapters.kubernetes.crd import generate_crd
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.prometheus.promserver import LoopbackGetServer, PrometheusServer, require_prometheus, scrape_config

pytestmark = [pytest.mark.integration, pytest.mark.faults]

NAMESPACE, DEPLOYMENT, POLICY = "ml", "chat", "chat-policy"
PODS = 6
TARGET = 50.0
SCALE_PATH = rf"^/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale$"
FAULT_WINDOW_S = 5.0  # five ticks at a 1 s interval
LATENCY_METRIC = "chat_latency_p95_seconds"


def pod_name(index: int) -> str:
    return str(o.deployment_pod(DEPLOYMENT, index, NAMESPACE)["metadata"]["name"])


# ---- the exporter: dcgm-exporter's shape, every byte set by the test --------------------------------------------


class DcgmExporter:
    """Serves ``DCGM_FI_DEV_GPU_UTIL`` per pod (value text as given: "10", "NaN", "+Inf", "150", or absent), an
    optional latency gauge, or a raw body / an HTTP status to break the scrape."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.latency: str | None = None
        self.raw: str | None = None
        self.status = 200
        self._http = LoopbackGetServer(self._handle)
        self.port = self._http.port
        self._http.start()

    def healthy(self, percent: float, pods: int = PODS, latency: str | None = None) -> None:
        self.values = {pod_name(i): f"{percent:g}" for i in range(pods)}
        self.latency, self.raw, self.status = latency, None, 200

    def body(self) -> str:
        if self.raw is not None:
            return self.raw
        lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        for i, (pod, value) in enumerate(sorted(self.values.items())):
            labels = (
                f'gpu="0",UUID="GPU-{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-{i}",'
                f'namespace="{NAMESPACE}",pod="{pod}",container="main"'
            )
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value}")
        if self.latency is not None:
            lines += [f"# TYPE {LATENCY_METRIC} gauge", f'{LATENCY_METRIC}{{namespace="{NAMESPACE}"}} {self.latency}']
        return "\n".join(lines) + "\n"

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        data = self.body().encode() if self.status == 200 else b"exporter failing\n"
        req.send_response(self.status)
        req.send_header("Content-Type", "text/plain; version=0.0.4")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def close(self) -> None:
        self._http.stop()


# ---- the world ------------------------------------------------------------------------------------------------------


@dataclass
class World:
    api: FakeApiServer
    exporter: DcgmExporter
    prometheus: PrometheusServer
    tmp: Path
    started: list[Controller] = field(default_factory=list)

    def controller(self, identity: str = "ctrl-a") -> Controller:
        kubeconfig = self.api.write_kubeconfig(self.tmp / "kubeconfig")
        ctrl = Controller(identity, kubeconfig, self.prometheus.url, self.tmp)
        self.started.append(ctrl)
        return ctrl

    def replicas(self) -> int:
        deployment = self.api.get("apps/v1", "Deployment", DEPLOYMENT, NAMESPACE)
        assert deployment is not None
        return int(deployment["spec"]["replicas"])

    def scale_writes(self) -> int:
        return self.api.request_count("PATCH", SCALE_PATH)

    def conditions(self, name: str = POLICY) -> dict[str, str]:
        obj = self.api.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", name, NAMESPACE) or {}
        return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.api.objects("events.k8s.io/v1", "Event", NAMESPACE) if e.get("reason") == reason]

    def prometheus_sees(self, series: int) -> bool:
        query = urllib.parse.urlencode({"query": "DCGM_FI_DEV_GPU_UTIL"})
        with urllib.request.urlopen(f"{self.prometheus.url}/api/v1/query?{query}", timeout=2) as response:
            return len(json.load(response)["data"]["result"]) == series

    def wait_scraped(self) -> None:
        """Until Prometheus holds a scrape of the exporter that began after now, i.e. of what the test has just set.

        Prometheus and the exporter live for the whole module and the pods have the same names in every case, so until
        that scrape the controller reads the previous case's values (10 % or 90 % on healthy GPUs): acting on those
        is a scale-down or scale-up the case forbids. A fixed 1.5 s sleep (one scrape interval and a half) assumed
        the scrape came in time; on a loaded machine it may not. ``timestamp(up)`` is the start of the newest scrape,
        failed ones included (a 503 or a garbage body is a scrape too); its samples are committed with it."""
        after = time.time() + 0.01  # Prometheus may move a scrape's timestamp by up to 2 ms to its grid
        query = urllib.parse.urlencode({"query": 'timestamp(up{job="dcgm"})'})

        def scraped() -> bool:
            with urllib.request.urlopen(f"{self.prometheus.url}/api/v1/query?{query}", timeout=10) as response:
                result = json.load(response)["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) >= after

        wait_until(scraped, 60, "a scrape of the exporter as the test set it", self.prometheus.log_tail)


@pytest.fixture(scope="module")
def exporter() -> Iterator[DcgmExporter]:
    exp = DcgmExporter()
    yield exp
    exp.close()


@pytest.fixture(scope="module")
def prometheus(exporter: DcgmExporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    data = tmp_path_factory.mktemp("faults-prom") / "data"
    server = PrometheusServer(require_prometheus(), data, config=scrape_config(exporter.port))
    server.start()
    yield server
    server.stop()


def policy(name: str = POLICY, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "targetRef": {"name": DEPLOYMENT},
        "minReplicas": 1,
        "maxReplicas": 12,
        "metric": {"type": "gpu_utilization", "target": TARGET},
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
    }
    body.update(spec)
    return {
        "apiVersion": "gpuautoscaler.dev/v1alpha1",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": body,
    }


@pytest.fixture
def world(exporter: DcgmExporter, prometheus: PrometheusServer, tmp_path: Path) -> Iterator[World]:
    api = FakeApiServer(simulate_deployments=True)
    api.seed(generate_crd())
    w = World(api, exporter, prometheus, tmp_path)
    yield w
    for ctrl in w.started:
        ctrl.stop(signal.SIGKILL)
    api.stop()
    if prometheus.proc is None or prometheus.proc.poll() is not None:
        prometheus.start()


def seed_cluster(w: World, replicas: int = PODS, ready: int = PODS, **policy_spec: Any) -> None:
    w.api.seed(
        [o.node(f"gpu-{i}") for i in range(replicas)],
        [o.deployment_pod(DEPLOYMENT, i, NAMESPACE, node_name=f"gpu-{i}", ready=i < ready) for i in range(replicas)],
        o.deployment(DEPLOYMENT, NAMESPACE, replicas=replicas, ready=ready),
        policy(**policy_spec),
    )
    w.api.start()


def watch(w: World, seconds: float) -> list[int]:
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(w.replicas())
        time.sleep(0.2)
    return seen


def record(fault: str, during: list[int], first_action: str, recovery_s: float | None) -> None:
    FAULT_TABLE.append(FaultRow(fault, sorted(set(during)), first_action, recovery_s))


def recover(w: World, ctrl: Controller, expected: int, before: int, what: str) -> tuple[str, float]:
    """Time from the fault's end to the controller's first write, which must bring the replicas to ``expected``."""
    cleared = time.monotonic()
    wait_until(lambda: w.scale_writes() > before, 40, what, ctrl.log)
    took = time.monotonic() - cleared
    assert w.replicas() == expected, ctrl.log()
    time.sleep(1.5)
    assert w.scale_writes() == before + 1, ctrl.log()  # one change, one write
    return f"{PODS} -> {expected}", took


# ---- metric faults: low load (10 % against 50 %: the fresh answer is 6 -> 2), each must hold ------------------


def bad_values(value: str) -> Callable[[DcgmExporter], None]:
    def apply(exp: DcgmExporter) -> None:
        exp.healthy(10)
        exp.values = dict.fromkeys(exp.values, value)

    return apply


def partial(reporting: int) -> Callable[[DcgmExporter], None]:
    def apply(exp: DcgmExporter) -> None:
        exp.healthy(10, pods=reporting)

    return apply


def garbage(exp: DcgmExporter) -> None:
    exp.healthy(10)
    exp.raw = "DCGM_FI_DEV_GPU_UTIL{gpu=0 this is not the exposition format\n\x00\x01"


def exporter_gone(exp: DcgmExporter) -> None:
    exp.healthy(10)
    exp.status = 503


METRIC_FAULTS: Mapping[str, tuple[Callable[[DcgmExporter], None], str]] = {
    # fault -> (how to apply it, the Event the controller must emit on the policy)
    "NaN on every GPU": (bad_values("NaN"), "MetricsStale"),
    "+Inf on every GPU": (bad_values("+Inf"), "MetricsStale"),
    "-Inf on every GPU": (bad_values("-Inf"), "MetricsStale"),
    "out of range (150 %)": (bad_values("150"), "MetricsStale"),
    "garbage exposition (scrape fails)": (garbage, "MetricsStale"),
    "exporter gone (HTTP 503), Prometheus up": (exporter_gone, "MetricsStale"),
    "partial: 1 of 6 pods report": (partial(1), "MetricsPartial"),
    "partial: 3 of 6 pods report": (partial(3), "MetricsPartial"),
    "partial: 5 of 6 pods report": (partial(5), "MetricsPartial"),
}


@pytest.mark.parametrize("fault", list(METRIC_FAULTS))
def test_metric_fault_holds_then_recovers(world: World, fault: str) -> None:
    apply, event = METRIC_FAULTS[fault]
    apply(world.exporter)
    seed_cluster(world)
    world.wait_scraped()  # Prometheus has the faulted exporter's answer, not the previous case's healthy one
    ctrl = world.controller()
    wait_for_leader(ctrl)
    during = watch(world, FAULT_WINDOW_S)
    assert set(during) == {PODS}, ctrl.log()
    assert world.scale_writes() == 0, ctrl.log()
    wait_until(lambda: world.events(event), 30, f"the {event} Event", ctrl.log)

    world.exporter.healthy(10)
    first, took = recover(world, ctrl, 2, 0, "the scale-down on fresh data")
    record(fault, during, first, took)
    assert ctrl.proc.poll() is None


def test_prometheus_down_holds_then_recovers(world: World) -> None:
    world.exporter.healthy(10)
    seed_cluster(world)
    world.prometheus.stop()
    ctrl = world.controller()
    wait_for_leader(ctrl)
    during = watch(world, FAULT_WINDOW_S)
    assert set(during) == {PODS} and world.scale_writes() == 0, ctrl.log()
    wait_until(lambda: world.conditions().get("MetricsStale") == "True", 30, "MetricsStale=True", ctrl.log)

    world.prometheus.start()
    first, took = recover(world, ctrl, 2, 0, "the scale-down once Prometheus is back")
    record("Prometheus down", during, first, took)


# ---- guard and readiness on a scale-up: the scale-up must go -----------------------------------------------------


def test_latency_series_missing_does_not_block_a_scale_up(world: World) -> None:
    """Issue 17, defect 2: the SLO guard's latency absent, GPUs at 90 %: 6 -> 11 at once, never frozen."""
    world.exporter.healthy(90, latency=None)
    latency = {"sloSeconds": 0.5, "guard": True}
    seed_cluster(world, latency=latency, queries={"latency": f'max({LATENCY_METRIC}{{namespace="{{namespace}}"}})'})
    world.wait_scraped()
    started = time.monotonic()
    ctrl = world.controller()
    wait_until(lambda: world.scale_writes() > 0, 60, "the scale-up", ctrl.log)
    took = time.monotonic() - started
    assert world.replicas() == 11, ctrl.log()  # ceil(6 x 90 / 50)
    during = watch(world, 3.0)
    assert set(during) == {11} and world.scale_writes() == 1, ctrl.log()
    record("latency series missing, GPUs at 90 % (SLO guard on)", [PODS, *during], "6 -> 11", took)

    # ... but it still stops what it guards: low load, no latency -> no scale-down. The 5 new replicas' pods start and
    # report (the fake API server's Deployment status follows spec at once; fewer pods reporting than ready replicas
    # would be a partial answer, which holds a scale-down on its own)
    world.api.seed(
        [o.node(f"gpu-{i}") for i in range(PODS, 11)],
        [o.deployment_pod(DEPLOYMENT, i, NAMESPACE, node_name=f"gpu-{i}") for i in range(PODS, 11)],
    )
    world.exporter.healthy(10, pods=11, latency=None)
    held = watch(world, FAULT_WINDOW_S)
    assert set(held) == {11} and world.scale_writes() == 1, ctrl.log()
    world.exporter.healthy(10, pods=11, latency="0.1")
    wait_until(lambda: world.scale_writes() > 1, 60, "the scale-down with latency back", ctrl.log)
    assert world.replicas() < 11
    record("latency series missing, GPUs at 10 % (SLO guard on)", held, f"11 -> {world.replicas()}", None)


def test_unready_pods_on_a_scale_up(world: World) -> None:
    """8 pods, 2 of them starting (not Ready, no sample), 6 at 90 %: the HPA rule counts the starting ones as 0, so
    ceil(8 x (6 x 90) / (8 x 50)) = 11: a scale-up, never a scale-down."""
    world.exporter.healthy(90)
    seed_cluster(world, replicas=8, ready=6)
    world.wait_scraped()
    started = time.monotonic()
    ctrl = world.controller()
    wait_until(lambda: world.scale_writes() > 0, 60, "the scale-up", ctrl.log)
    took = time.monotonic() - started
    assert world.replicas() == 11, ctrl.log()
    during = watch(world, 3.0)
    assert set(during) == {11} and world.scale_writes() == 1, ctrl.log()
    record("2 of 8 pods unready, 6 at 90 %", [8, *during], "8 -> 11", took)


# ---- the controller killed mid-way, and two policies on one Deployment -------------------------------------------


def test_sigkill_after_a_scale_up_and_restart_repeats_no_write(world: World) -> None:
    world.exporter.healthy(90)
    seed_cluster(world)
    world.wait_scraped()
    first = world.controller("ctrl-a")
    wait_until(lambda: world.scale_writes() > 0, 60, "the scale-up", first.log)
    first.stop(signal.SIGKILL)
    killed = time.monotonic()
    assert world.replicas() == 11
    second = world.controller("ctrl-b")
    wait_for_leader(second)
    took = time.monotonic() - killed
    during = watch(world, FAULT_WINDOW_S)
    assert set(during) == {11} and world.scale_writes() == 1, second.log()
    record("controller SIGKILL after 6 -> 11, restart", during, "none (no repeated write)", took)


def test_a_second_policy_on_the_same_deployment_is_refused(world: World) -> None:
    """Issue 17, defect 3: the newcomer sorts first by name and asks for minReplicas 10; the established owner keeps
    the Deployment (6 on target), the newcomer gets InvalidSpec."""
    world.exporter.healthy(TARGET)
    seed_cluster(world)
    world.wait_scraped()  # not the previous case's 90 %: a scale-up of the owner's Deployment would be a write
    ctrl = world.controller()
    wait_for_leader(ctrl)
    wait_until(lambda: world.conditions().get("Ready") == "True", 30, "the owner's Ready condition", ctrl.log)
    newcomer = policy("a-newcomer", minReplicas=10)
    # Created within the same second as the owner (timestamps have 1 s resolution): age alone cannot tell them apart.
    owner = world.api.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", POLICY, NAMESPACE) or {}
    newcomer["metadata"]["creationTimestamp"] = owner["metadata"]["creationTimestamp"]
    world.api.seed(newcomer)
    wait_until(
        lambda: world.conditions("a-newcomer").get("InvalidSpec") == "True", 30, "the newcomer refused", ctrl.log
    )
    during = watch(world, FAULT_WINDOW_S)
    assert set(during) == {PODS} and world.scale_writes() == 0, ctrl.log()
    assert world.conditions().get("InvalidSpec") == "False"
    record("a second policy on the Deployment (minReplicas 10)", during, "none (newcomer InvalidSpec)", None)
