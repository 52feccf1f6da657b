"""What the tests that run ``autoscaler run`` against the real control plane share: a world (two kwok GPU nodes of
the test's own, a Deployment, a real Prometheus scraping a fake dcgm/vLLM exporter of the Deployment's *real* pods,
the GPUScalingPolicy CRD), ServiceAccount credentials of the kind a controller pod has, the controller subprocess,
readers of the cluster, the apiserver's audit log, and a timeline printer.

Used by test_e2e_real.py (the whole loop), test_leader_failover.py (two controller processes, one Lease, SIGKILL of
the leader; the apiserver restarted under a running controller) and test_deploy_as_serviceaccount.py (the
controller as the ServiceAccount the production overlay creates).
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
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
from tests.realkube import manifests
from tests.realkube.control_plane import ApiError, ControlPlane, GpuNode
from tests.realkube.manifests import gpu_pod_spec
from tests.runtime.controller_process import REPO, Controller

CRD_FILE = REPO / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"
DEPLOYMENT = "chat"
POLICY = "chat-policy"
LEASE_NAME = "gpu-autoscaler"  # the settings' default lease_name
TARGET = 50.0  # % GPU utilisation per pod
OVERLOADED = 170.0  # total demand, GPU-%: 2 pods at 85 % -> ceil(2 x 1.7) = 4; 4 at 42.5 % -> ceil(3.4) = 4
IDLE = 20.0  # 4 pods at 5 % -> ceil(4 x 0.1) = 1; 2 pods at 10 % -> 1
STEADY = 100.0  # 2 pods at 50 % -> 2
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


# ---- the fake GPUs and application -------------------------------------------------------------------------------


class PodMetricsExporter(Collector):
    """dcgm-exporter + vLLM metrics for the Running pods of the Deployment, computed at every scrape.

    ``demand`` is the total GPU work in GPU-percent; each Running pod gets ``min(100, demand / pods)``. The queue
    follows the same story (waiting requests when overloaded, none when idle), the request counter grows. When the
    API cannot be read (an apiserver outage) the pods of the last answer keep being reported.
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
    cleanup: list[Callable[[], None]] = field(default_factory=list)


def deployment(product: str, replicas: int, container: str = "c") -> dict[str, Any]:
    """The inference Deployment the controller scales: one GPU per replica, pods gone at once when deleted."""
    spec = gpu_pod_spec(1, product, container=container, image="vllm/vllm-openai", requests=False, grace_s=0)
    return manifests.deployment(DEPLOYMENT, replicas, spec)


def policy(scale_down_window_s: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "targetRef": {"name": DEPLOYMENT},
            "minReplicas": 1,
            "maxReplicas": 8,
            "metric": {"type": "gpu_utilization", "target": int(TARGET)},
            # A short scale-down stabilisation, so the test sees the scale-down within seconds (it is also the
            # takeover grace of a new leader).
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": scale_down_window_s}},
        },
    }


def create_policy(w: World, scale_down_window_s: int = 2) -> None:
    path = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{w.namespace}/{PLURAL}"
    w.cp.request("POST", path, policy(scale_down_window_s))


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


@contextlib.contextmanager
def open_world(cp: ControlPlane, namespace: str, tmp_path: Path, replicas: int = 2) -> Iterator[World]:
    """Two kwok nodes of 8 GPUs with a product no other test selects, the CRD, the exporter, Prometheus and the
    Deployment (``replicas``). On exit every controller started is SIGKILLed, Prometheus and the exporter stopped,
    the cleanups run and the nodes deleted; the namespace (Deployment, pods, policy, Lease, Events) goes with the
    namespace fixture."""
    found = binaries()
    if found is None:
        message = "prometheus is not installed: apt-get install -y --no-install-recommends prometheus"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
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
        cp.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment(product, replicas))
        w = World(cp, namespace, nodes, exporter, prometheus, tmp_path)
        yield w
    finally:
        for ctrl in w.started if w is not None else []:
            ctrl.stop(signal.SIGKILL)
        if prometheus is not None:
            prometheus.stop()
        if exporter is not None:
            exporter.close()
        for undo in reversed(w.cleanup if w is not None else []):
            with contextlib.suppress(ApiError, OSError):
                undo()
        for name in nodes:
            with contextlib.suppress(ApiError):
                cp.request("DELETE", f"/api/v1/nodes/{name}")


# ---- a controller's credentials and process ----------------------------------------------------------------------


def service_account_token(cp: ControlPlane, namespace: str, account: str, pod: dict[str, Any] | None) -> str:
    """A token from the TokenRequest API, bound to ``pod`` when given (as the kubelet gets one for a pod: the audit
    log then names the pod in ``user.extra``, and the token dies with the pod)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    answer = cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body)
    return str(answer["status"]["token"])


def controller_pod(w: World, name: str, account: str) -> dict[str, Any]:
    """A stand-in Pod of a controller replica (kwok runs it; nothing runs in it): the object its token is bound to."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "controller-stand-in"}},
        "spec": {
            "serviceAccountName": account,
            "containers": [{"name": "controller", "image": "gpu-autoscaler"}],
            "terminationGracePeriodSeconds": 0,
        },
    }
    return dict(w.cp.request("POST", f"/api/v1/namespaces/{w.namespace}/pods", body))


def controller_replicas(w: World, names: tuple[str, ...], account: str = "gpu-autoscaler-ctl") -> dict[str, Path]:
    """Credentials of controller replicas as a Deployment's pods have them: one ServiceAccount in the test namespace
    (bound to cluster-admin for the test's lifetime: RBAC itself is test_deploy_as_serviceaccount's subject), one Pod
    per replica and a token bound to it. Returns pod name -> kubeconfig (the apiserver's CA, the token)."""
    cp = w.cp
    cp.request("POST", f"/api/v1/namespaces/{w.namespace}/serviceaccounts", {"metadata": {"name": account}})
    binding = f"{w.namespace}-{account}"
    cp.request(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": w.namespace}],
        },
    )
    w.cleanup.append(lambda: cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}"))
    out = {}
    for name in names:
        token = service_account_token(cp, w.namespace, account, controller_pod(w, name, account))
        out[name] = cp.write_kubeconfig(w.tmp_path / f"{name}.kubeconfig", name, token, w.namespace)
    return out


def start_controller(
    w: World,
    identity: str,
    kubeconfig: Path,
    lease_namespace: str | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Controller:
    """``autoscaler run`` as replica ``identity`` (POD_NAME), leader election on (``LEASE`` timings), the Lease in
    ``lease_namespace`` (POD_NAMESPACE; default the test's namespace, deleted with it), policies of the test's
    namespace only."""
    env = {
        "POD_NAMESPACE": lease_namespace or w.namespace,
        "AUTOSCALER_NAMESPACES": w.namespace,
        # the leader writes only while last renewal + this is within the 3 s lease (LeaderElector.may_write)
        "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "2",
        **(extra_env or {}),
    }
    ctrl = Controller(identity, kubeconfig, w.prometheus.url, w.tmp_path, extra_env=env)
    w.started.append(ctrl)
    return ctrl


def leader_gauge(ctrl: Controller) -> float | None:
    """The controller's ``gpu_autoscaler_leader`` (1 while it holds the Lease and acts), None when unreachable."""
    try:
        return ctrl.metric("gpu_autoscaler_leader", identity=ctrl.identity)
    except (OSError, AssertionError):
        return None


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
    return dict(w.cp.get(f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{w.namespace}/{PLURAL}/{POLICY}"))


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


def lease_path(namespace: str, name: str = LEASE_NAME) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"


def lease_holder(w: World, namespace: str | None = None) -> str | None:
    try:
        return str(w.cp.get(lease_path(namespace or w.namespace))["spec"].get("holderIdentity") or "")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


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


def wait_steady(w: World, n: int, demand: float) -> dict[str, str]:
    """The Deployment's ``n`` pods Running on the test's nodes, ready, and Prometheus scraping them at ``demand``."""
    pods: dict[str, str] = w.cp.wait(f"the {n} initial pods Running", lambda: n_or_none(running_pods(w), n))
    assert set(pods.values()) <= set(w.nodes), pods
    w.cp.wait(f"Deployment ready {n}/{n}", lambda: ready(w) == n or None)
    w.exporter.demand = demand
    w.cp.wait(f"Prometheus to scrape the {n} pods", lambda: prom_pods(w) == set(pods) or None, timeout_s=60)
    return pods


# ---- the audit log -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request of a test ServiceAccount's token, from the apiserver's audit log."""

    received: float  # Unix seconds (the apiserver's clock, this machine's)
    done: float
    pod: str  # the pod the token is bound to ("" for a token bound to none)
    user: str
    agent: str
    verb: str
    resource: str  # "deployments/scale" for a subresource
    namespace: str
    name: str
    code: int

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.received:.3f} {self.pod or self.user} {self.verb} {self.resource} {where} -> {self.code}"


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def audit_requests(cp: ControlPlane, user_prefix: str) -> list[Request]:
    """The audited requests of the users starting with ``user_prefix`` (``system:serviceaccount:<ns>:``)."""
    out = []
    for event in cp.audit_events(user_prefix):
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        extra = event["user"].get("extra") or {}
        out.append(
            Request(
                received=_unix(event["requestReceivedTimestamp"]),
                done=_unix(event["stageTimestamp"]),
                pod=(extra.get("authentication.kubernetes.io/pod-name") or [""])[0],
                user=event["user"]["username"],
                agent=event.get("userAgent", ""),
                verb=event["verb"],
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code") or 0),
            )
        )
    return sorted(out, key=lambda r: r.received)


# ---- the timeline ------------------------------------------------------------------------------------------------


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

    def close(self, title: str) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        print(f"\n{title}")
        print("\n".join(self.lines()))
