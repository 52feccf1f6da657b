"""End to end: the fake Kubernetes API server + a real Prometheus scraping a DCGM-like exporter + ``autoscaler run``
as subprocesses.

What is real here: the controller process (settings from the environment, apscheduler, leader election, HTTP), the
official ``kubernetes`` client over HTTP, Prometheus 2.42 scraping and answering PromQL, prometheus-api-client. What
is fake: the API server (tests/kube/fake_apiserver.py, real REST semantics) and the GPUs (a prometheus_client
exporter publishing ``DCGM_FI_DEV_GPU_UTIL`` for two pods of the Deployment).

Every wait is bounded; processes are killed by their pid in finalizers; ports are free ones on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_process import LEASE, REPO, Controller, wait_until
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from autoscaler.adapters.kubernetes.crd import generate_crd
from tests.kube.fake_apiserver import FakeApiServer
from tests.prometheus.promserver import PrometheusServer, binaries, free_port, in_ci, scrape_config

pytestmark = pytest.mark.integration

NAMESPACE, DEPLOYMENT = "ml", "chat"
# Pod names as a Deployment makes them (<deployment>-<pod-template-hash>-<suffix>), so Prometheus samples map to it.
PODS = ("chat-6b7f9d8c4-xk2pz", "chat-6b7f9d8c4-q5mwz", "chat-6b7f9d8c4-r7tnb", "chat-6b7f9d8c4-w2lcd")
SCALE_PATH = rf"^/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale$"


# ---- helpers ------------------------------------------------------------------------------------------------------


class GpuExporter:
    """dcgm-exporter's shape: one DCGM_FI_DEV_GPU_UTIL series per GPU, labelled with the pod using it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.util = Gauge(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %).",
            ["gpu", "UUID", "modelName", "Hostname", "namespace", "pod", "container"],
            registry=self.registry,
        )
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def set(self, percent: float, pods: int = 2) -> None:
        """Every GPU of the first ``pods`` pods at ``percent``: as many as the Deployment has ready replicas (fewer
        reporting is a partial answer, on which the controller never scales down)."""
        for i, pod in enumerate(PODS[:pods]):
            self.util.labels(str(i), f"GPU-node1-{i}", "NVIDIA A100-SXM4-80GB", "node1", NAMESPACE, pod, "main").set(
                percent
            )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_config(exporter_port: int) -> str:
    return scrape_config(exporter_port)


def prom_has_samples(url: str) -> bool:
    query = urllib.parse.urlencode({"query": "DCGM_FI_DEV_GPU_UTIL"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as response:
        return len(json.load(response)["data"]["result"]) >= 2  # the two pods exported from the start


# ---- fixtures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    found = binaries()
    if found is None:
        message = "prometheus is not installed: apt-get install -y --no-install-recommends prometheus"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


@pytest.fixture
def exporter() -> Iterator[GpuExporter]:
    exp = GpuExporter()
    yield exp
    exp.close()


@pytest.fixture
def prometheus(prometheus_binary: str, exporter: GpuExporter, tmp_path: Path) -> Iterator[PrometheusServer]:
    server = PrometheusServer(prometheus_binary, tmp_path / "prom-data", config=prometheus_config(exporter.port))
    yield server
    server.stop()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer(simulate_deployments=True)
    server.seed(generate_crd())
    server.seed(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": DEPLOYMENT}},
                "template": {
                    "metadata": {"labels": {"app": DEPLOYMENT}},
                    "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai"}]},
                },
            },
            "status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2},
        },
        {
            "apiVersion": "gpuautoscaler.dev/v1alpha1",
            "kind": "GPUScalingPolicy",
            "metadata": {"name": "chat-policy", "namespace": NAMESPACE},
            "spec": {
                "targetRef": {"name": DEPLOYMENT},
                "minReplicas": 1,
                "maxReplicas": 8,
                "metric": {"type": "gpu_utilization", "target": 50},
                # No scale-down window, so that the test sees a scale-down (and a hold) within seconds.
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        },
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def controllers(
    api: FakeApiServer, prometheus: PrometheusServer, tmp_path: Path
) -> Iterator[Callable[..., Controller]]:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    started: list[Controller] = []

    def start(identity: str, *args: str) -> Controller:
        controller = Controller(identity, kubeconfig, prometheus.url, tmp_path, args)
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.stop(signal.SIGKILL)


def replicas(api: FakeApiServer) -> int:
    deployment = api.get("apps/v1", "Deployment", DEPLOYMENT, NAMESPACE)
    assert deployment is not None
    return int(deployment["spec"]["replicas"])


def policy_status(api: FakeApiServer) -> dict[str, Any]:
    obj = api.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat-policy", NAMESPACE)
    assert obj is not None
    return dict(obj.get("status") or {})


def conditions(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in policy_status(api).get("conditions") or []}


def events(api: FakeApiServer, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.objects("events.k8s.io/v1", "Event", NAMESPACE) if e.get("reason") == reason]


def lease_holder(api: FakeApiServer) -> str | None:
    lease = api.get("coordination.k8s.io/v1", "Lease", "gpu-autoscaler", "default")
    return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")


# ---- the tests ----------------------------------------------------------------------------------------------------


def test_scales_under_load_with_event_and_status_and_holds_without_prometheus(
    api: FakeApiServer,
    exporter: GpuExporter,
    prometheus: PrometheusServer,
    controllers: Callable[..., Controller],
) -> None:
    exporter.set(90.0)  # 2 pods at 90 % against a 50 % target: ceil(2 x 1.8) = 4 replicas
    prometheus.start()
    wait_until(lambda: prom_has_samples(prometheus.url), 30, "Prometheus to scrape the exporter")
    ctrl = controllers("ctrl-a")
    logs = ctrl.log

    # -- a service under load gets scaled, once, with an Event and the CR status --
    wait_until(lambda: replicas(api) == 4, 60, "the Deployment to be scaled 2 -> 4", logs)
    wait_until(lambda: policy_status(api).get("currentReplicas") == 4, 30, "status.currentReplicas 4", logs)
    time.sleep(2)  # a few more ticks at the same load: no further change, no repeated write
    assert replicas(api) == 4
    assert api.request_count("PATCH", SCALE_PATH) == 1, logs()
    scaled = events(api, "MetricAboveTarget")
    assert len(scaled) == 1 and scaled[0]["regarding"]["kind"] == "Deployment", scaled
    assert "from 2 to 4" in scaled[0]["note"] and scaled[0]["type"] == "Normal"
    status = policy_status(api)
    assert status["desiredReplicas"] == 4
    assert status["lastAction"]["reason"] == "metric_above_target"
    assert (status["lastAction"]["fromReplicas"], status["lastAction"]["toReplicas"]) == (2, 4)
    assert conditions(api)["Ready"]["status"] == "True"
    assert conditions(api)["MetricsStale"]["status"] == "False"
    applied = {"kind": "ScaleDeployment", "reason": "metric_above_target", "dry_run": "false", "result": "applied"}
    assert ctrl.metric("gpu_autoscaler_actions_total", **applied) == 1
    assert ctrl.metric("gpu_autoscaler_leader", identity="ctrl-a") == 1
    assert ctrl.get("/healthz")[0] == 200 and ctrl.get("/readyz")[0] == 200
    assert lease_holder(api) == "ctrl-a"

    # -- Prometheus stops: the controller holds (the load it would scale down on is never seen as zero) --
    prometheus.stop()
    exporter.set(10.0, pods=4)  # the 4 replicas it now has
    wait_until(
        lambda: ctrl.metric("gpu_autoscaler_stale_services", service=DEPLOYMENT, reason="metrics_unavailable") == 1,
        30,
        "the stale_services gauge",
        logs,
    )
    wait_until(lambda: conditions(api)["MetricsStale"]["status"] == "True", 30, "MetricsStale=True", logs)
    writes_before = api.request_count("PATCH", SCALE_PATH)
    time.sleep(4)  # four ticks without Prometheus
    assert replicas(api) == 4
    assert api.request_count("PATCH", SCALE_PATH) == writes_before, logs()
    stale_events = events(api, "MetricsStale")
    assert len(stale_events) == 1 and stale_events[0]["type"] == "Warning", stale_events
    assert stale_events[0]["regarding"]["kind"] == "GPUScalingPolicy"
    assert ctrl.get("/healthz")[0] == 200  # holding is healthy: the loop runs

    # -- Prometheus is back: the same low load now scales down, so the hold above was the staleness --
    prometheus.start()
    wait_until(lambda: replicas(api) == 1, 60, "the scale-down once metrics are fresh again", logs)
    wait_until(lambda: conditions(api)["MetricsStale"]["status"] == "False", 30, "MetricsStale=False", logs)

    # -- SIGTERM: clean exit, lease released for a fast handover --
    assert ctrl.stop(signal.SIGTERM) == 0, logs()
    assert lease_holder(api) == "", logs()


def test_two_controllers_elect_one_leader_and_killing_it_hands_over(
    api: FakeApiServer,
    exporter: GpuExporter,
    prometheus: PrometheusServer,
    controllers: Callable[..., Controller],
) -> None:
    exporter.set(50.0)  # on target: nothing to do
    prometheus.start()
    wait_until(lambda: prom_has_samples(prometheus.url), 30, "Prometheus to scrape the exporter")
    a = controllers("ctrl-a")
    wait_until(lambda: lease_holder(api) == "ctrl-a", 60, "ctrl-a to take the lease", a.log)
    b = controllers("ctrl-b")

    def logs() -> str:
        return a.log() + "\n" + b.log()

    wait_until(lambda: b.get("/readyz")[0] == 200, 60, "ctrl-b to be ready as a standby", logs)
    assert "standby follower (leader: ctrl-a)" in b.get("/readyz")[1]
    wait_until(lambda: (b.metric("gpu_autoscaler_ticks_total", result="standby") or 0) >= 2, 30, "standby ticks", logs)
    assert a.metric("gpu_autoscaler_leader", identity="ctrl-a") == 1
    assert b.metric("gpu_autoscaler_leader", identity="ctrl-b") == 0

    # -- load: exactly one of them acts, exactly once --
    exporter.set(90.0)
    wait_until(lambda: replicas(api) == 4, 30, "the leader to scale 2 -> 4", logs)
    time.sleep(2)
    assert api.request_count("PATCH", SCALE_PATH) == 1, logs()
    assert not b.metric("gpu_autoscaler_ticks_total", result="ok")
    assert lease_holder(api) == "ctrl-a"

    # -- kill the leader (no clean shutdown, no release): the follower takes over after the lease expires --
    killed_at = time.monotonic()
    a.stop(signal.SIGKILL)
    wait_until(lambda: lease_holder(api) == "ctrl-b", 30, "ctrl-b to take over the lease", logs)
    handover = time.monotonic() - killed_at
    # lease duration (3 s) from the last renewal it saw, plus up to one retry period, plus the observation's and
    # the requests' latency (5 s for it here: two processes, the API server and Prometheus share two loaded cores):
    # after the configured 3 s lease, not the 15 s default one or some later time
    assert handover < LEASE["duration"] + 4 * LEASE["retry"] + 5, handover
    wait_until(lambda: b.metric("gpu_autoscaler_leader", identity="ctrl-b") == 1, 15, "ctrl-b leader gauge", logs)

    # -- the new leader acts --
    exporter.set(10.0, pods=4)  # the 4 replicas it now has
    wait_until(lambda: replicas(api) == 1, 60, "ctrl-b to scale 4 -> 1", logs)
    time.sleep(2)
    assert api.request_count("PATCH", SCALE_PATH) == 2, logs()  # two changes, two writes: no double action
    applied = {"kind": "ScaleDeployment", "reason": "metric_below_target", "dry_run": "false", "result": "applied"}
    assert b.metric("gpu_autoscaler_actions_total", **applied) == 1
    assert b.stop(signal.SIGTERM) == 0, logs()


def test_dry_run_and_plan_write_nothing_but_marked_events(
    api: FakeApiServer,
    exporter: GpuExporter,
    prometheus: PrometheusServer,
    controllers: Callable[..., Controller],
    tmp_path: Path,
) -> None:
    exporter.set(90.0)
    prometheus.start()
    wait_until(lambda: prom_has_samples(prometheus.url), 30, "Prometheus to scrape the exporter")
    kubeconfig = tmp_path / "kubeconfig"

    # -- autoscaler plan: one tick, printed with reasons, no write of any kind --
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_"))}
    env["PYTHONPATH"] = str(REPO)
    api.clear_requests()
    plan = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoscaler.cli",
            "plan",
            "--kubeconfig",
            str(kubeconfig),
            "--prometheus-url",
            prometheus.url,
            "-o",
            "json",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr
    doc = json.loads(plan.stdout)
    [decision] = doc["decisions"]
    assert (decision["service"], decision["currentReplicas"], decision["desiredReplicas"]) == ("ml/chat", 2, 4)
    assert decision["reason"] == "metric_above_target" and "ratio 1.80" in decision["detail"]
    assert [a["change"] for a in doc["actions"]] == ["scale deployment/ml/chat from 2 to 4"]
    assert {r.method for r in api.requests} == {"GET"}, [(r.method, r.path) for r in api.requests]

    # -- autoscaler run --dry-run: the plan every tick, an Event marked [dry-run], nothing else written --
    ctrl = controllers("ctrl-dry", "--dry-run")
    wait_until(lambda: events(api, "MetricAboveTarget"), 60, "the dry-run Event", ctrl.log)
    time.sleep(3)
    dry = {"kind": "ScaleDeployment", "reason": "metric_above_target", "dry_run": "true", "result": "dry_run"}
    # at least two dry-run ticks before the "one Event, not one per tick" check (three seconds at a 1 s interval
    # usually; a loaded machine may tick slower)
    wait_until(
        lambda: (ctrl.metric("gpu_autoscaler_actions_total", **dry) or 0) >= 2, 30, "two dry-run ticks", ctrl.log
    )
    assert replicas(api) == 2
    [event] = events(api, "MetricAboveTarget")  # one Event, not one per tick
    assert event["note"].startswith("[dry-run] would scale deployment/ml/chat from 2 to 4"), event
    assert policy_status(api) == {}  # no status writes either
    writes = [(r.method, r.path) for r in api.requests if r.method != "GET"]
    assert writes and all("/leases" in path or "/events" in path for _, path in writes), writes
    assert lease_holder(api) is None  # the real Lease is left to the real controller
    assert (ctrl.metric("gpu_autoscaler_actions_total", **dry) or 0) >= 2
    assert ctrl.metric("gpu_autoscaler_dry_run") == 1
    assert ctrl.stop(signal.SIGTERM) == 0, ctrl.log()
