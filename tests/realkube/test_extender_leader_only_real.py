"""Only the leader answers the scheduler's extender calls, on a real control plane: the Service the shipped
kube-scheduler configuration calls (deploy/overlays/scheduler-extender, rendered by kubectl) lists only the pod of
the replica that holds the Lease in its EndpointSlice, and the slice follows the Lease when the leader stops.

Before, the overlay's scheduler called the controller's own Service, which selects both replicas: the EndpointSlice
listed both pods, and half the calls reached the standby, whose view of the cluster lags the leader's. Now the
Service also selects ``gpuautoscaler.dev/leader``, which the leader writes on its own pod
(``leader_election.label_leader_pod``, on in the overlay's Deployment patch).

Two stand-in Pods (the overlay Deployment's pod labels and ports, on a kwok node of the test's own: kwok makes them
Running and Ready with an IP) and two ``autoscaler run`` processes whose POD_NAME names them, each with a token bound
to its pod of the overlay's ServiceAccount and with the overlay's namespaced Roles only (the Lease's and the pod
label's, moved to the test's namespace; no ClusterRole, so their ticks hold on reads they may not make: the label is
written before them). The control plane runs no EndpointSlice controller (tests/realkube/control_plane.py,
CONTROLLERS), so the test starts a kube-controller-manager of its own with that controller alone.

First the leader is stopped with SIGTERM (it releases the Lease, then takes its label off), then, once the stopped
replica runs again as the standby, the new leader is SIGKILLed (its label stays until the other replica's Lease
takeover sweeps it). The moments with no endpoint, or with two, are printed.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL
from tests.realkube.control_plane import ApiError, Component, ControlPlane, GpuNode, find_kubectl, free_port
from tests.realkube.controller_world import audit_requests, lease_path, service_account_token
from tests.runtime.controller_process import LEASE, REPO, Controller

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

OVERLAY = REPO / "deploy" / "overlays" / "scheduler-extender"
SHIPPED_NAMESPACE = "gpu-autoscaler"
UNREACHABLE_PROMETHEUS = "http://127.0.0.1:9"  # nothing listens: the ticks hold on metrics, the label is not about them


def render() -> list[dict[str, Any]]:
    found, why = find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and kubectl is unavailable: {why}", pytrace=False)
        pytest.skip(why)
    out = subprocess.run(
        [str(found), "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def extender_service_name(docs: list[dict[str, Any]]) -> str:
    """The Service the shipped scheduler configuration calls (``<service>.<namespace>.svc:<port>``)."""
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and "kube-scheduler-config.yaml" in d["data"])
    config = yaml.safe_load(config_map["data"]["kube-scheduler-config.yaml"])
    host = config["extenders"][0]["urlPrefix"].removeprefix("http://").split(":")[0]
    name, namespace = host.split(".")[:2]
    assert namespace == SHIPPED_NAMESPACE, host
    return str(name)


def moved(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A namespaced object of the overlay in the test's namespace (a RoleBinding's subjects too)."""
    out = dict(doc, metadata={**doc["metadata"], "namespace": namespace})
    if "subjects" in out:
        out["subjects"] = [{**s, "namespace": namespace} for s in out["subjects"]]
    return out


def start_endpointslice_controller(cp: ControlPlane, work_dir: Path) -> Component:
    """kube-controller-manager with the EndpointSlice controller alone, as the control plane runs its others (its
    own ServiceAccount's credentials under the bootstrap RBAC role), once it answers /healthz; the caller stops it."""
    port = free_port()
    component = Component(
        "endpointslice-controller",
        [
            str(cp.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={cp.work_dir / 'kcm.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={work_dir / 'endpointslice-certs'}",
            "--controllers=endpointslice-controller",
            "--use-service-account-credentials=true",
            f"--root-ca-file={cp.ca_file}",
            "--leader-elect=false",
            "--v=1",
        ],
        cp.logs / f"endpointslice-controller-{work_dir.name}.log",
    )
    component.start(dict(cp.env))
    try:
        cp.wait(
            "the EndpointSlice controller's /healthz",
            lambda: cp._http_ok(f"https://127.0.0.1:{port}/healthz", verify=False) or component.dead() is not None,
            timeout_s=60,
        )
        assert component.dead() is None, component.dead()
    except BaseException:
        component.stop()
        raise
    return component


def stand_in_pod(template: dict[str, Any], name: str, node: str) -> dict[str, Any]:
    """A controller replica's pod as the Deployment makes it (its labels, ServiceAccount and named ports), bound to
    ``node``; nothing runs in it: the process whose POD_NAME names it runs here."""
    (container,) = template["spec"]["containers"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(template["metadata"]["labels"])},
        "spec": {
            "serviceAccountName": template["spec"]["serviceAccountName"],
            "nodeName": node,
            "containers": [{"name": container["name"], "image": "gpu-autoscaler", "ports": container["ports"]}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def endpoint_slices(cp: ControlPlane, namespace: str, service: str) -> list[dict[str, Any]]:
    return list(
        cp.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            params={"labelSelector": f"kubernetes.io/service-name={service}"},
        ).get("items")
        or []
    )


def ready_endpoints(cp: ControlPlane, namespace: str, service: str) -> dict[str, str]:
    """pod name -> address of the ready endpoints in the Service's EndpointSlices."""
    out = {}
    for item in endpoint_slices(cp, namespace, service):
        for endpoint in item.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is not False:
                out[(endpoint.get("targetRef") or {}).get("name", "?")] = endpoint["addresses"][0]
    return out


def pod_ips(cp: ControlPlane, namespace: str, names: tuple[str, ...]) -> dict[str, str] | None:
    """pod name -> IP once every pod is Ready with one (kwok's doing), else None."""
    ips = {}
    for name in names:
        pod = cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        ready = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}.get("Ready")
        ip = pod.get("status", {}).get("podIP")
        if ready != "True" or not ip:
            return None
        ips[name] = str(ip)
    return ips


class EndpointWatch:
    """Samples the Service's ready endpoints every 0.1 s in a thread: when the set changed, for the printout."""

    def __init__(self, cp: ControlPlane, namespace: str, service: str) -> None:
        self.cp, self.namespace, self.service = cp, namespace, service
        self.t0 = time.monotonic()
        self.changes: list[tuple[float, tuple[str, ...]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                pods = tuple(sorted(ready_endpoints(self.cp, self.namespace, self.service)))
            except (ApiError, OSError):
                continue
            if not self.changes or self.changes[-1][1] != pods:
                self.changes.append((time.monotonic() - self.t0, pods))

    def mark(self, what: str) -> None:
        self.changes.append((time.monotonic() - self.t0, (f"-- {what}",)))

    def close(self) -> str:
        self.stop.set()
        self.thread.join(timeout=5)
        return "\n".join(f"  {at:6.1f}s  {', '.join(pods) or '(no endpoint)'}" for at, pods in self.changes)


@pytest.fixture
def node(control_plane: ControlPlane) -> Iterator[str]:
    name = f"leader-only-{secrets.token_hex(3)}"
    control_plane.request("POST", "/api/v1/nodes", control_plane.node_manifest(GpuNode(name, 1, "LEADER-ONLY", name)))
    try:
        control_plane.wait_nodes_schedulable([name], timeout_s=60)
        yield name
    finally:
        control_plane.request("DELETE", f"/api/v1/nodes/{name}")


def test_the_extender_service_reaches_the_leader_only(
    control_plane: ControlPlane, namespace: str, node: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, namespace
    docs = render()
    deployment = find(docs, "Deployment", "gpu-autoscaler")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    overlay_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    service_name = extender_service_name(docs)

    # the overlay's ServiceAccount and its namespaced RBAC (the Roles bound to it), in the test's namespace
    account = template["spec"]["serviceAccountName"]
    cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": account}})
    subject = {"kind": "ServiceAccount", "name": account, "namespace": SHIPPED_NAMESPACE}
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and subject in d["subjects"]]
    roles = [find(docs, "Role", b["roleRef"]["name"]) for b in bindings]
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces"
    for role in roles:
        cp.request("POST", f"{rbac}/{ns}/roles", moved(role, ns))
    for binding in bindings:
        cp.request("POST", f"{rbac}/{ns}/rolebindings", moved(binding, ns))
    cp.request("POST", f"/api/v1/namespaces/{ns}/services", moved(find(docs, "Service", service_name), ns))

    names = ("ctrl-a", "ctrl-b")
    kubeconfigs: dict[str, Path] = {}
    for name in names:
        pod = cp.request("POST", f"/api/v1/namespaces/{ns}/pods", stand_in_pod(template, name, node))
        token = service_account_token(cp, ns, account, pod)
        kubeconfigs[name] = cp.write_kubeconfig(tmp_path / f"{name}.kubeconfig", name, token, ns)
    ips = cp.wait("both pods Ready with an IP", lambda: pod_ips(cp, ns, names), timeout_s=60)

    slices = start_endpointslice_controller(cp, tmp_path)
    watch: EndpointWatch | None = None
    ctrls: dict[str, Controller] = {}

    def start(name: str) -> Controller:
        env = {
            "POD_NAMESPACE": ns,
            "AUTOSCALER_NAMESPACES": ns,
            "AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD": overlay_env.get(
                "AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD", "false"
            ),
        }
        ctrls[name] = Controller(name, kubeconfigs[name], UNREACHABLE_PROMETHEUS, tmp_path, extra_env=env)
        return ctrls[name]

    def logs() -> str:
        return "\n".join(c.log() for c in ctrls.values())

    def endpoints_are(pod: str, what: str, timeout_s: float) -> None:
        try:
            cp.wait(what, lambda: ready_endpoints(cp, ns, service_name) == {pod: ips[pod]} or None, timeout_s=timeout_s)
        except Exception as exc:
            raise AssertionError(f"{exc}\nendpoints: {ready_endpoints(cp, ns, service_name)}\n{logs()}") from None

    def labelled() -> set[str]:
        return {p["metadata"]["name"] for p in cp.pods(ns, LEADER_LABEL)}

    try:
        # the Service exists before any replica leads: its slice is there, empty
        cp.wait("the Service's EndpointSlice", lambda: endpoint_slices(cp, ns, service_name) or None, timeout_s=60)
        assert ready_endpoints(cp, ns, service_name) == {}
        watch = EndpointWatch(cp, ns, service_name)
        for name in names:
            start(name)
        first = cp.wait("a holder of the Lease", lambda: lease_holder_in(cp, ns, names), timeout_s=60)
        second = next(n for n in names if n != first)
        endpoints_are(first, f"the EndpointSlice listing the leader {first} alone", 60)
        # the standby keeps ticking and never labels its pod
        cp.wait("standby ticks", lambda: standby_ticks(ctrls[second]) >= 3 or None, timeout_s=60)
        assert labelled() == {first}, logs()
        assert ready_endpoints(cp, ns, service_name) == {first: ips[first]}

        # -- SIGTERM: the leader releases the Lease and takes its label off; the standby takes both over --
        watch.mark(f"SIGTERM {first}")
        sigterm_at = time.time()
        assert ctrls[first].stop(signal.SIGTERM) == 0, ctrls[first].log()
        exited_at = time.time()
        endpoints_are(second, f"the EndpointSlice moved to {second}", 30)
        assert labelled() == {second}, logs()

        # -- the stopped replica back as the standby; then the leader SIGKILLed: its label stays until the sweep --
        start(first)
        cp.wait("the restarted replica's standby ticks", lambda: standby_ticks(ctrls[first]) >= 2 or None, timeout_s=60)
        watch.mark(f"SIGKILL {second}")
        ctrls[second].stop(signal.SIGKILL)
        killed = time.monotonic()
        killed_at = time.time()
        assert labelled() == {second}  # nobody took it off: the process is gone
        endpoints_are(first, f"the EndpointSlice moved back to {first}", 30)
        moved_after = time.monotonic() - killed
        assert labelled() == {first}, logs()
        # not before the Lease expired: a follower takes over only after a whole lease duration of silence
        assert moved_after >= LEASE["duration"] - 0.5, moved_after
        assert ctrls[first].stop(signal.SIGTERM) == 0, ctrls[first].log()
        assert "Traceback" not in logs(), logs()
        assert "leader pod label not" not in logs(), logs()  # no label write failed: the overlay's Role suffices
    finally:
        for ctrl in ctrls.values():
            ctrl.stop(signal.SIGKILL)
        history = watch.close() if watch is not None else ""
        slices.stop()
    print(f"\nready endpoints of Service {service_name} (seconds from just before the replicas started):\n{history}")

    # Who wrote which label (the audit log names the pod each token is bound to): the SIGTERMed leader took its own
    # off; the SIGKILLed one could not, its successor did; no replica wrote anything but pod labels and its Lease.
    writes = [r for r in audit_requests(cp, f"system:serviceaccount:{ns}:") if r.write and r.ok]
    patches = [r for r in writes if r.resource == "pods" and r.verb == "patch"]
    assert [r for r in patches if r.pod == r.name == first and sigterm_at <= r.received <= exited_at], patches
    assert [r for r in patches if (r.pod, r.name) == (first, second) and r.received >= killed_at], patches
    assert {r.resource for r in writes} == {"pods", "leases"}, "\n".join(map(str, writes))


def standby_ticks(ctrl: Controller) -> float:
    return ctrl.metric("gpu_autoscaler_ticks_total", result="standby") or 0


def lease_holder_in(cp: ControlPlane, namespace: str, names: tuple[str, ...]) -> str | None:
    try:
        holder = cp.get(lease_path(namespace))["spec"].get("holderIdentity")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return holder if holder in names else None
