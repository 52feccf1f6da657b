"""Start-up, probes and shut-down review: a Prometheus outage or a Kubernetes API error never causes a scale-down, a
preemption or a crash loop.

- ``autoscaler run`` as a program (the Deployment's environment) against the in-memory API server: the CRD not
  installed (404), RBAC refusing the policy list (403), the API server unreachable at start, Prometheus unresolvable.
  The process stays up, /healthz stays 200, /readyz and /metrics say what is wrong, it recovers by itself, and SIGTERM
  releases the Lease and exits well within terminationGracePeriodSeconds.
- /readyz judged on what the replica does now (the standby watches the Lease, the leader ticks), with the cause in
  its body; a tick held on its metrics alone (Prometheus down) keeps the leader Ready.
- SIGTERM between a gang's evictions (the real writer against the in-memory API server).
- A malformed setting exits 2 once, naming the variable.

Waits are polled with generous deadlines (a loaded 2-core machine); a condition met returns at once."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from controller_process import Controller as ControllerProcess
from controller_process import wait_until
from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object, wait_for

from autoscaler.adapters.kubernetes.crd import generate_crd
from autoscaler.adapters.kubernetes_lease import ElectionTimings, InMemoryLeaseStore, LeaderElector
from autoscaler.app import build_adapters, build_runtime
from autoscaler.controller import Controller
from autoscaler.core.model import EvictPod, Observation, Plan, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.ports import PortError
from autoscaler.runtime import Runtime
from autoscaler.settings import Settings
from autoscaler.telemetry import Telemetry
from tests.kube import objects as o
from tests.kube.fake_apiserver import JSON, FakeApiServer, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
NAMESPACE, DEPLOYMENT = "ml", "chat"
POLICY_LIST = r"/gpuscalingpolicies$"
SCALE_PATH = rf"^/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale$"
# deploy/base/deployment.yaml's terminationGracePeriodSeconds
TERMINATION_GRACE_S = 30


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class ForbiddingApiServer(FakeApiServer):
    """The in-memory API server, with RBAC refusing the requests whose path ``forbid`` matches (403, the Status the
    real authorizer writes)."""

    forbid: str | None = None

    def handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], JSON]:
        if self.forbid is not None and re.search(self.forbid, urlsplit(target).path):
            message = (
                'gpuscalingpolicies.gpuautoscaler.dev is forbidden: User "system:serviceaccount:default:gpu-autoscaler"'
                ' cannot list resource "gpuscalingpolicies" in API group "gpuautoscaler.dev" at the cluster scope'
            )
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": "Forbidden",
                "details": {"group": "gpuautoscaler.dev", "kind": "gpuscalingpolicies"},
                "code": 403,
            }
            return 403, {}, status
        return super().handle(method, target, headers, body)


def lease_holder(api: FakeApiServer) -> str | None:
    lease = api.get("coordination.k8s.io/v1", "Lease", "gpu-autoscaler", "default")
    return None if lease is None else str(lease["spec"].get("holderIdentity") or "")


def errors(ctrl: ControllerProcess, component: str) -> float:
    return ctrl.metric("gpu_autoscaler_errors_total", component=component) or 0.0


def assert_up_and_live(ctrl: ControllerProcess) -> None:
    assert ctrl.proc.poll() is None, ctrl.log()
    status, body = ctrl.get("/healthz")
    assert status == 200, body + ctrl.log()


def stop_within_the_grace(ctrl: ControllerProcess) -> float:
    sent = time.monotonic()
    code = ctrl.stop(signal.SIGTERM, timeout=TERMINATION_GRACE_S + 10)
    took = time.monotonic() - sent
    assert code == 0, ctrl.log()
    assert took < TERMINATION_GRACE_S, f"{took:.1f}s to exit after SIGTERM\n{ctrl.log()}"
    return took


def seed_service(api: FakeApiServer) -> None:
    """Deployment ml/chat (2 pods, one GPU each) and its GPUScalingPolicy on GPU utilisation."""
    api.seed(
        [o.node(f"gpu-{i}") for i in range(2)],
        [o.deployment_pod(DEPLOYMENT, i, NAMESPACE, node_name=f"gpu-{i}") for i in range(2)],
        o.deployment(DEPLOYMENT, NAMESPACE, replicas=2),
        {
            "apiVersion": "gpuautoscaler.dev/v1alpha1",
            "kind": "GPUScalingPolicy",
            "metadata": {"name": "chat-policy", "namespace": NAMESPACE},
            "spec": {
                "targetRef": {"name": DEPLOYMENT},
                "minReplicas": 1,
                "maxReplicas": 8,
                "metric": {"type": "gpu_utilization", "target": 50},
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        },
    )


@pytest.fixture
def processes() -> Iterator[list[ControllerProcess]]:
    started: list[ControllerProcess] = []
    yield started
    for ctrl in started:
        ctrl.stop(signal.SIGKILL)


# ---- 1. the Kubernetes API and Prometheus failing at start: up, live, saying why, recovering -------------------------


@pytest.mark.integration
def test_no_crd_then_forbidden_then_prometheus_unresolvable_the_process_stays_up_and_says_why(
    tmp_path: Path, processes: list[ControllerProcess]
) -> None:
    """The CRD not installed (404 on the policy list), then RBAC refusing the list (403), then a policy whose metrics
    cannot be read (Prometheus' host does not resolve): the process never exits, /healthz stays 200 (a restart cures
    none of it), the failures are counted, the leader's /readyz names what it cannot read (it said "no successful
    tick yet" whatever the cause), and the service whose metrics cannot be read is held: nothing is written.
    Prometheus coming back is test_faults.py::test_prometheus_down_holds_then_recovers (a real Prometheus)."""
    api = ForbiddingApiServer()
    api.start()
    try:
        ctrl = ControllerProcess(
            "ctrl-a", api.write_kubeconfig(tmp_path / "kubeconfig"), "http://prometheus.invalid:9090", tmp_path
        )
        processes.append(ctrl)
        wait_until(lambda: ctrl.metric("gpu_autoscaler_leader", identity="ctrl-a") == 1, 60, "leadership", ctrl.log)

        # the CRD is not installed
        wait_until(lambda: errors(ctrl, "policy_read") >= 2, 60, "policy reads failing", ctrl.log)
        assert_up_and_live(ctrl)
        status, body = ctrl.get("/readyz")
        assert status == 503, body
        assert "policy_read" in body and "404" in body and "gpuscalingpolicies" in body, body
        assert "HTTP 404 NotFound" in ctrl.log()

        # installed, but the Role does not allow listing it
        api.forbid = POLICY_LIST
        api.seed(generate_crd())
        wait_until(lambda: "403" in ctrl.get("/readyz")[1], 60, "/readyz to name the 403", ctrl.log)
        assert_up_and_live(ctrl)
        assert ctrl.get("/readyz")[0] == 503

        # allowed, no policy yet: the tick reads everything it needs
        api.forbid = None
        wait_until(lambda: ctrl.get("/readyz")[0] == 200, 60, "ready once the policies can be listed", ctrl.log)
        assert (ctrl.metric("gpu_autoscaler_ticks_total", result="ok") or 0) >= 1

        # a policy whose metrics cannot be read: the service holds (the Prometheus adapter reports an outage as stale
        # services, not as a failed read), the leader stays Ready and says why
        seed_service(api)
        wait_until(
            lambda: ctrl.metric("gpu_autoscaler_stale_services", service=DEPLOYMENT) == 1, 60, "ml/chat stale", ctrl.log
        )
        # the gauge is exported during the tick, the report /readyz reads is kept when the tick ends: a moment later
        wait_until(lambda: "ml/chat" in ctrl.get("/readyz")[1], 30, "/readyz to name ml/chat", ctrl.log)
        assert_up_and_live(ctrl)
        status, body = ctrl.get("/readyz")
        assert status == 200 and "ml/chat" in body and "prometheus.invalid" in body, body
        assert api.request_count("PATCH", SCALE_PATH) == 0
        replicas = api.get("apps/v1", "Deployment", DEPLOYMENT, NAMESPACE)
        assert replicas is not None and replicas["spec"]["replicas"] == 2

        assert lease_holder(api) == "ctrl-a"
        stop_within_the_grace(ctrl)
        assert lease_holder(api) == "", "the leader did not release the Lease on SIGTERM"
    finally:
        api.stop()


@pytest.mark.integration
def test_the_api_server_unreachable_at_start_then_up(tmp_path: Path, processes: list[ControllerProcess]) -> None:
    """Nothing listens where the kubeconfig points: the process serves /healthz (200), counts the Lease errors, its
    /readyz names the Lease it cannot reach; once the API server is up it takes the Lease and ticks, unaided."""
    port = closed_port()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    ctrl = ControllerProcess("ctrl-a", kubeconfig, f"http://127.0.0.1:{closed_port()}", tmp_path)
    processes.append(ctrl)
    wait_until(lambda: errors(ctrl, "leader_election") >= 2, 60, "Lease errors", ctrl.log)
    assert_up_and_live(ctrl)
    status, body = ctrl.get("/readyz")
    assert status == 503 and "lease default/gpu-autoscaler" in body, body

    api = FakeApiServer(port=port)
    api.seed(generate_crd())
    api.start()
    try:
        wait_until(lambda: ctrl.metric("gpu_autoscaler_leader", identity="ctrl-a") == 1, 60, "leadership", ctrl.log)
        wait_until(lambda: ctrl.get("/readyz")[0] == 200, 60, "ready after the first tick", ctrl.log)
        assert (ctrl.metric("gpu_autoscaler_ticks_total", result="ok") or 0) >= 1
        assert_up_and_live(ctrl)
        stop_within_the_grace(ctrl)
        assert lease_holder(api) == ""
    finally:
        api.stop()


# ---- 2. /readyz: what this replica does now, and what stops it --------------------------------------------------

FAST = ElectionTimings(lease_duration_s=5.0, renew_deadline_s=3.0, retry_period_s=0.05)


def leader_runtime(
    store: InMemoryLeaseStore | None = None, identity: str = "a"
) -> tuple[Runtime, FakeCluster, FakeMetrics, FakePolicies]:
    cluster = FakeCluster(deployments={"ml/chat": [2, 2]})
    metrics = FakeMetrics(cluster)
    metrics.util["ml/chat"] = 50.0
    policies = FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8, target=50.0))])
    telemetry = Telemetry(identity=identity)
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=policies,
        status_writer=FakeStatus(),
        telemetry=telemetry,
    )
    ref: list[Runtime] = []
    elector = None
    if store is not None:
        elector = LeaderElector(
            store,
            identity,
            FAST,
            on_started_leading=lambda: ref[0].on_started_leading(),
            on_stopped_leading=lambda: ref[0].on_stopped_leading(),
        )
    runtime = Runtime(controller, telemetry, tick_interval_s=60.0, elector=elector, http=None)
    ref.append(runtime)
    return runtime, cluster, metrics, policies


def test_a_leader_that_ticked_once_is_not_ready_while_it_cannot_read_the_policies() -> None:
    """The gate was "a tick ever succeeded": a leader that had ticked once stayed Ready through hours of failed
    reads, saying nothing."""
    runtime, _, _, policies = leader_runtime()
    runtime.tick()
    assert runtime.readyz() == (True, "ticking")
    policies.fail = PortError("list gpuscalingpolicies: HTTP 403 Forbidden")
    runtime.tick()
    ready, why = runtime.readyz()
    assert not ready and "policy_read" in why and "HTTP 403 Forbidden" in why, why
    policies.fail = None
    runtime.tick()
    assert runtime.readyz() == (True, "ticking")


def test_a_leader_holding_on_its_metrics_alone_is_ready_and_says_why() -> None:
    """Holding through a Prometheus outage is the controller doing its job: a replica that took over during the outage
    was NotReady until it ended (a rollout then stalled at 1 of 2 available), while its predecessor in the same
    outage was Ready."""
    runtime, _, metrics, _ = leader_runtime()
    metrics.fail = PortError("cannot reach Prometheus at http://prometheus.invalid:9090")
    runtime.tick()
    ready, why = runtime.readyz()
    assert ready and "metrics_read" in why and "prometheus.invalid" in why, why


def test_a_cluster_read_failure_makes_the_leader_not_ready_with_the_cause() -> None:
    runtime, cluster, _, _ = leader_runtime()
    cluster.fail_reads = PortError("list pods: HTTP 500 InternalError")
    runtime.tick()
    ready, why = runtime.readyz()
    assert not ready and "cluster_read" in why and "HTTP 500" in why, why


def test_a_standby_that_cannot_reach_the_lease_says_so() -> None:
    store = InMemoryLeaseStore()
    runtime, _, _, _ = leader_runtime(store)
    assert runtime.elector is not None
    store.fail = PortError("lease default/gpu-autoscaler: read: HTTP 403 Forbidden")
    assert not runtime.elector.try_acquire_or_renew()
    ready, why = runtime.readyz()
    assert not ready and "lease default/gpu-autoscaler: read: HTTP 403 Forbidden" in why, why
    store.fail = None
    other = LeaderElector(store, "b", FAST)
    assert other.try_acquire_or_renew()
    assert not runtime.elector.try_acquire_or_renew()
    assert runtime.readyz() == (True, "standby follower (leader: b)")


def test_readyz_before_any_tick_and_while_stopping() -> None:
    runtime, _, _, _ = leader_runtime()
    assert runtime.readyz() == (False, "no successful tick yet")
    runtime.tick()
    runtime.stop()
    assert runtime.readyz() == (False, "shutting down")


# ---- 3. SIGTERM between a gang's evictions -----------------------------------------------------------------------

GANG_NS = "train"
GANG_LABEL = "training.kubeflow.org/job-name"
WORKERS = ["g1-worker-0", "g1-worker-1", "g1-worker-2"]


class SigtermOnFirstEviction(FakeApiServer):
    """Stops the runtime (what SIGTERM does) while the gang's first real eviction is in flight, and answers it only
    once the runtime is stopping."""

    runtime: Runtime | None = None
    stopper: threading.Thread | None = None

    def handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], JSON]:
        runtime = self.runtime
        if method == "POST" and target.split("?")[0].endswith("/eviction") and runtime is not None:
            options = (json.loads(body) if body else {}).get("deleteOptions") or {}
            dry_run = options.get("dryRun") == ["All"] or "dryRun" in parse_qs(urlsplit(target).query)
            if not dry_run and self.stopper is None:
                self.stopper = threading.Thread(target=runtime.stop, name="sigterm")
                self.stopper.start()
                assert wait_for(runtime._stopping.is_set, timeout=10)
        return super().handle(method, target, headers, body)


class NoMetrics:
    def observe(self, services: Any, now: float, *, cluster: Any = None) -> Observation:
        return Observation(now, {})

    def history(self, *args: Any) -> Any:
        raise PortError("no history here")

    def set_service_queries(self, service_queries: Any) -> None:
        pass


@pytest.mark.integration
def test_sigterm_between_a_gangs_evictions_does_not_leave_it_partly_evicted(tmp_path: Path) -> None:
    """The leader has evicted the first pod of a three-pod gang when SIGTERM arrives. stop() makes can_act() False at
    once, so the second and third evictions were refused (not_leader): two workers kept running without their peer,
    holding GPUs for a job that cannot progress, and the inference replica the preemption was for found one GPU
    instead of three. The Lease was still this replica's, and stop() waits for a writing tick anyway."""
    api = SigtermOnFirstEviction()
    api.start()
    try:
        api.seed(generate_crd(), o.node("gpu-0"), o.node("gpu-1"))
        for i, name in enumerate(WORKERS):
            api.seed(o.pod(name, GANG_NS, node_name=f"gpu-{i % 2}", labels={GANG_LABEL: "g1"}))
        settings = Settings(
            leader_election={"identity": "ctrl-a", "lease_namespace": "default"},
            kubernetes={
                "config_mode": "kubeconfig",
                "kubeconfig": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                "request_timeout_seconds": 2,
            },
            prometheus={"url": f"http://127.0.0.1:{closed_port()}"},
            shutdown_grace_seconds=10,
        )
        adapters = replace(build_adapters(settings, check_prometheus=False), metrics=NoMetrics())
        runtime = build_runtime(settings, adapters, refit=lambda now: None, http=False)
        planned = [
            EvictPod(
                GANG_NS,
                name,
                Reason.PREEMPT_FOR_INFERENCE,
                "free 3 GPUs for ml/chat",
                gang=f"kubeflow/{GANG_NS}/g1",
                service="ml/chat",
            )
            for name in WORKERS
        ]
        runtime.controller._decide = lambda tick, state, config: (Plan(tick.now, (), tuple(planned)), state)
        assert runtime.elector is not None and runtime.elector.try_acquire_or_renew()
        api.runtime = runtime

        runtime.tick()
        assert api.stopper is not None
        api.stopper.join(timeout=30)

        running = [name for name in WORKERS if api.get("v1", "Pod", name, GANG_NS) is not None]
        report = runtime.controller.last_report
        results = [r.result for r in report.results] if report is not None else []
        assert running in ([], WORKERS), f"gang partly evicted: {running} still running; results {results}"
        assert lease_holder(api) == "", "the Lease was not released once the tick ended"
    finally:
        api.stop()


# ---- 4. a malformed setting: exit 2, once, naming the variable ---------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AUTOSCALER_TICK_INTERVAL_SECONDS", "15s"), ("AUTOSCALER_LEADER_ELECTION__LEASE_DURATION_SECONDS", "fifteen")],
)
def test_a_malformed_setting_exits_2_naming_the_variable(variable: str, value: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    env.update({"PYTHONPATH": str(REPO), "POD_NAME": "ctrl-a", "POD_NAMESPACE": "default", variable: value})
    result = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if variable in line]
    assert lines and f"(got '{value}')" in lines[0], result.stdout + result.stderr
