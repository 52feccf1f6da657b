"""A gang's pods the reader leaves out for asking no GPU still count towards its minAvailable.

An MPI job's launcher asks for no GPU; Volcano's PodGroup (minMember) and Kueue's pod-group-total-count count it. The
reader leaves it out (``includeNonGpuPods`` off), so the core (``core.cluster.waiting_gpu_work``), which takes a gang
fewer of whose pods exist than its minAvailable as unable to start, would have read the GPU pods one short: the reader
takes the live pods it leaves out off the gang's minAvailable (``PodInfo.gang_min_available``).
"""

from __future__ import annotations

from kubernetes import client

from autoscaler.core.cluster import waiting_gpu_work
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_reader import NOW, reader

GROUP = {"scheduling.k8s.io/group-name": "mpi"}


def _member(name: str, gpus: int, **kw: object) -> dict:
    return o.pod(name, "ml", gpus=gpus, node_name=None, phase="Pending", ready=False, annotations=GROUP, **kw)


def _read(api_client: client.ApiClient, **config: object) -> dict[str, int | None]:
    return {p.name: p.gang_min_available for p in reader(api_client, **config).snapshot(NOW).pods if p.gang}


def test_a_launcher_without_gpus_counts_towards_min_available(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        o.node("gpu-0"),
        o.podgroup_crd(),
        o.podgroup("mpi", "ml", min_member=3),
        _member("worker-0", 8),
        _member("worker-1", 8),
        _member("launcher", 0),
    )
    assert _read(api_client) == {"worker-0": 2, "worker-1": 2}
    snapshot = reader(api_client).snapshot(NOW)
    assert {w.needed_pods for w in waiting_gpu_work(snapshot)} == {2}  # its 2 workers start it
    # read with the pods of no GPU, the launcher is there and the minimum is the PodGroup's
    assert _read(api_client, include_non_gpu_pods=True) == {"worker-0": 3, "worker-1": 3, "launcher": 3}


def test_a_launcher_being_deleted_or_gated_does_not_count(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    deleted = _member("launcher", 0)
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleted["metadata"]["finalizers"] = ["example.com/keep"]
    gated = _member("launcher-2", 0)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/staging"}]
    apiserver.seed(
        o.node("gpu-0"),
        o.podgroup_crd(),
        o.podgroup("mpi", "ml", min_member=3),
        _member("worker-0", 8),
        _member("worker-1", 8),
        deleted,
        gated,
    )
    assert _read(api_client) == {"worker-0": 3, "worker-1": 3}
    snapshot = reader(api_client).snapshot(NOW)
    assert {w.needed_pods for w in waiting_gpu_work(snapshot)} == {3}  # 2 pods of 3: it cannot start


def test_launchers_of_another_gang_or_namespace_do_not_count(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        o.node("gpu-0"),
        o.podgroup_crd(),
        o.podgroup("mpi", "ml", min_member=3),
        _member("worker-0", 8),
        _member("worker-1", 8),
        o.pod(
            "other",
            "ml",
            gpus=0,
            node_name=None,
            phase="Pending",
            annotations={"scheduling.k8s.io/group-name": "other"},
        ),
        o.pod("elsewhere", "dev", gpus=0, node_name=None, phase="Pending", annotations=GROUP),
    )
    assert _read(api_client) == {"worker-0": 3, "worker-1": 3}
