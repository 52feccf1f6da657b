"""A suspended Job whose workers keep one per node, resumed against a real control plane (stop 52).

Two kwok nodes of a GPU product no other test selects (8 GPUs each). The Job "apart" runs 2 pods of 4 GPUs whose
required pod anti-affinity selects the Job's own pods (``batch.kubernetes.io/job-name``, per node): the real
kube-scheduler places them one per node. The actuator suspends it (the real Job controller deletes its pods); an
8-GPU "filler" pod then takes node a. Node b has 8 GPUs free -- enough for both pods by count, and until stop 52 the
capacity arbitration resumed it there. It now reads the pods' labels and terms from the Job's template and keeps
it suspended; the real scheduler agrees: resumed by hand, one pod runs on b and the other stays Unschedulable on
anti-affinity. With the filler gone the arbitration resumes it through the actuator, and both pods run, on two
nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import GuardContext
from autoscaler.adapters.kubernetes import KubeClusterReader
from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.cluster import HOSTNAME_LABEL
from autoscaler.core.model import CapacityState, ResumeWorkload, SuspendWorkload
from autoscaler.core.reasons import Reason
from tests.realkube import manifests
from tests.realkube.control_plane import ControlPlane
from tests.realkube.manifests import gpu_pod_spec
from tests.realkube.test_cpu_memory_real import _delete, _pod, _running_on, _unschedulable_why, two_gpu_nodes
from tests.realkube.test_gang_stop import make_actuator, wait_running

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on every pod it creates


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, str, str]]:
    with two_gpu_nodes(control_plane, "apart", ("onprem", "onprem")) as made:
        yield made


def apart_job(product: str) -> dict[str, Any]:
    """2 pods of 4 GPUs on ``product``, kept one per node by a term selecting the Job's own pods."""
    spec = gpu_pod_spec(4, product, grace_s=0)
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {JOB_NAME_LABEL: "apart"}}, "topologyKey": HOSTNAME_LABEL}
            ]
        }
    }
    return manifests.job("apart", 2, spec)


def arbitration_resumes(api: client.ApiClient, namespace: str, node_names: tuple[str, str]) -> tuple[bool, list[str]]:
    """Whether the capacity arbitration resumes "apart" (no service, nothing short; resume at once), and its notes:
    this test's nodes, pods and workloads only (the session's other tests leave theirs behind)."""
    now = time.time()
    read = KubeClusterReader(api, sleep=lambda s: None).snapshot(now)
    view = dataclasses.replace(
        read,
        nodes=tuple(n for n in read.nodes if n.name in node_names),
        pods=tuple(p for p in read.pods if p.namespace == namespace),
        deployments=(),
        workloads=tuple(w for w in read.workloads if w.namespace == namespace),
    )
    (workload,) = view.workloads
    assert workload.suspended_by_us_at is not None
    assert workload.pod_labels.get(JOB_NAME_LABEL) == "apart" and len(workload.pod_anti_affinity) == 1
    arb = ArbitrationInput(now, view, {}, [])
    config = CapacityConfig(pools=(), resume_after_s=0.0)
    actions, report, _ = arbitrate(arb, CapacityState(free_since=now - 999), config)
    return any(isinstance(a, ResumeWorkload) and a.name == "apart" for a in actions), list(report.notes)


def suspend(api: client.ApiClient, cp: ControlPlane, namespace: str) -> None:
    action = SuspendWorkload("Job", namespace, "apart", Reason.PREEMPT_FOR_INFERENCE, "test")
    results = make_actuator(api).apply([action], GuardContext(time.time(), {}))
    assert [r.result for r in results] == ["applied"], results
    cp.wait("the Job controller deleted its pods", lambda: cp.pods(namespace, "job=apart") == [] or None)


def test_a_job_whose_workers_keep_apart_is_resumed_only_where_they_can_run(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient, nodes: tuple[str, str, str]
) -> None:
    cp, ns = control_plane, namespace
    product, node_a, node_b = nodes
    cp.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", apart_job(product))
    running = wait_running(cp, ns, "job=apart", 2)
    assert sorted(p["spec"]["nodeName"] for p in running) == sorted((node_a, node_b))  # the scheduler keeps them apart
    suspend(api_client, cp, ns)
    filler = _pod("filler-0", node_a, product, 8, "100m", "128Mi", {"role": "filler"})
    cp.request("POST", f"/api/v1/namespaces/{ns}/pods", filler)
    cp.wait("filler running", functools.partial(_running_on, cp, ns, "filler-0"), timeout_s=60)

    resumed, notes = arbitration_resumes(api_client, ns, (node_a, node_b))
    assert not resumed, notes
    assert any("Job " + ns + "/apart" in n and "do not fit" in n for n in notes), notes

    # The real scheduler's side: resumed by hand with 8 GPUs free on node b alone, one pod runs there and the other
    # is left Unschedulable on anti-affinity.
    cp.request("PATCH", f"/apis/batch/v1/namespaces/{ns}/jobs/apart", {"spec": {"suspend": False}},
               content_type="application/merge-patch+json")  # fmt: skip
    pods = cp.wait("both pods of the resumed Job", lambda: (p := cp.pods(ns, "job=apart")) and len(p) == 2 and p)
    names = sorted(p["metadata"]["name"] for p in pods)
    placed = cp.wait(
        "one pod running and one refused",
        lambda: (
            (ran := [n for n in names if _running_on(cp, ns, n)])
            and (refused := [_unschedulable_why(cp, ns, n) for n in names if n not in ran])
            and refused[0]
            and (ran, refused[0])
        ),
        timeout_s=60,
    )
    ran, why = placed
    assert len(ran) == 1 and _running_on(cp, ns, ran[0]) == node_b
    assert "anti-affinity" in why, why
    suspend(api_client, cp, ns)

    # With the filler gone there is room on two nodes: the arbitration resumes it and both pods run, one per node.
    _delete(cp, ns, "filler-0")
    resumed, notes = arbitration_resumes(api_client, ns, (node_a, node_b))
    assert resumed, notes
    action = ResumeWorkload("Job", ns, "apart", Reason.RESUME_TRAINING, "test")
    results = make_actuator(api_client).apply([action], GuardContext(time.time(), {}))
    assert [r.result for r in results] == ["applied"], results
    running = wait_running(cp, ns, "job=apart", 2)
    assert sorted(p["spec"]["nodeName"] for p in running) == sorted((node_a, node_b))
