"""Review 34 against the real kube-apiserver: a Job Kueue manages is not suspended through its own spec while Kueue
Workloads cannot be read (403 on workloads.kueue.x-k8s.io from the start, Jobs readable): Kueue would start the
admitted Job again (refused after it answered, the snapshot also names it and no training is stopped: review 47).
Its gang is left to pod-by-pod eviction; a Job no queue manages is still suspended through its spec. And a Workload
stands for its owner only when the owner reference names the kind in its own API group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes.config import load_api_client
from tests.kube import objects as o
from tests.realkube.control_plane import ControlPlane
from tests.realkube.fault_proxy import FaultProxy
from tests.realkube.test_adapter_faults_real import NO_NODE, NOW, crd, reader

pytestmark = [pytest.mark.integration, pytest.mark.realkube]


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy.for_control_plane(control_plane) as p:
        yield p


@pytest.fixture
def api(proxy: FaultProxy, control_plane: ControlPlane, tmp_path: Path) -> Iterator[client.ApiClient]:
    """An ``ApiClient`` built the way the controller builds it, pointed at the fault proxy."""
    kubeconfig = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig", control_plane.tokens["admin"],
                                        control_plane.ca_file)  # fmt: skip
    api_client = load_api_client("kubeconfig", kubeconfig)
    try:
        yield api_client
    finally:
        api_client.close()  # type: ignore[no-untyped-call]


def _job(namespace: str, name: str, queue: str | None) -> dict:  # type: ignore[type-arg]
    job = o.job(name, namespace, gpus=1)
    job["spec"]["template"]["spec"]["nodeSelector"] = NO_NODE  # Pending: no GPU taken, no kwok work
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    if queue:
        job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    return job


def test_a_kueue_job_is_not_suspendable_while_workloads_are_forbidden(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, api: client.ApiClient
) -> None:
    cp = control_plane
    with crd(cp, o.workload_crd()):
        for name, queue in (("queued-train", "team-a"), ("plain-train", None)):
            cp.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", _job(namespace, name, queue))
        r = reader(api)
        readable = {w.name for w in r.snapshot(NOW).workloads if w.namespace == namespace}
        assert readable == {"queued-train", "plain-train"}  # no Workload for it yet: Kueue does not run here
        proxy.inject("GET", r"^/apis/kueue.x-k8s.io/v1beta1/workloads$", 403)
        # refused from the start (a reader that never saw the list answer: an install without the permission)
        forbidden = {w.name for w in reader(api).snapshot(NOW).workloads if w.namespace == namespace}
        assert forbidden == {"plain-train"}
        # review 47: refused after it answered (an authorization webhook down, a ClusterRole re-applied) the snapshot
        # names it -- read as none, the training Kueue manages lost its protections -- and no training is stopped
        unread = r.snapshot(NOW)
        assert unread.training_unread == ("workloads.kueue.x-k8s.io",)
        assert {w.name for w in unread.workloads if w.namespace == namespace} == {"plain-train"}


def test_a_workload_owned_by_another_groups_job_does_not_stand_for_the_batch_job(
    control_plane: ControlPlane, namespace: str, api: client.ApiClient
) -> None:
    cp = control_plane
    with crd(cp, o.workload_crd()):
        cp.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", _job(namespace, "train", None))
        wl = o.workload("vc-train", namespace, pod_sets=[(1, 1)], owner=("Job", "train"))
        wl["metadata"]["ownerReferences"][0]["apiVersion"] = "batch.volcano.sh/v1alpha1"
        cp.request("POST", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{namespace}/workloads", wl)
        found = {w.name: w for w in reader(api).snapshot(NOW).workloads if w.namespace == namespace}
        assert found["train"].kind == "Job" and found["train"].gang == f"job/{namespace}/train"
        assert found["vc-train"].gang == f"kueue/{namespace}/vc-train"
