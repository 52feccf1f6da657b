"""The reader's CPU and memory (``NodeInfo.free_beside_gpus``, ``PodInfo.cpu_milli``/``memory_bytes``,
``DeploymentInfo.cpu_milli_per_pod``/``memory_bytes_per_pod``), read through the fake API server: a node's
allocatable less what every pod bound to it requests -- the CPU-only pods the snapshot leaves out too -- as
kube-scheduler counts a pod's requests (a limit alone is the request, sidecar init containers, the pod's overhead)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes.reader import requests_beside_gpus
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_review38_reader import _snapshot

GI = 1 << 30


def _with_resources(raw: dict[str, Any], requests: dict[str, str], limits: dict[str, str] | None = None) -> dict:
    container = raw["spec"]["containers"][0]
    resources = container.setdefault("resources", {})
    resources.setdefault("requests", {}).update(requests)
    if limits:
        resources.setdefault("limits", {}).update(limits)
    return raw


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}, (500, GI)),
        # a limit alone is the request (the API server defaults it so)
        ({"containers": [{"resources": {"limits": {"cpu": "2", "memory": "512Mi"}}}]}, (2000, 512 << 20)),
        # two containers add up; a fractional millicore rounds up
        ({"containers": [{"resources": {"requests": {"cpu": "0.0015"}}}, {"resources": {"requests": {"cpu": "1"}}}]},
         (1002, 0)),
        # a plain init container needs its own request at once (the largest of them), not beside the app's
        ({"initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
          "containers": [{"resources": {"requests": {"cpu": "1"}}}]}, (4000, 0)),
        # a sidecar (restartPolicy Always) runs beside the app containers
        ({"initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "1", "memory": "1G"}}}],
          "containers": [{"resources": {"requests": {"cpu": "1"}}}]}, (2000, 10**9)),
        # the RuntimeClass's overhead on top
        ({"overhead": {"cpu": "250m", "memory": "120Mi"},
          "containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}, (1250, GI + (120 << 20))),
        # what cannot be read counts nothing
        ({"containers": [{"resources": {"requests": {"cpu": "lots", "memory": True}}}]}, (0, 0)),
        ({"containers": ["not an object"]}, (0, 0)),
        ({}, (0, 0)),
    ],
)  # fmt: skip
def test_requests_beside_gpus_as_the_scheduler_counts_them(spec: dict[str, Any], expected: tuple[int, int]) -> None:
    assert requests_beside_gpus(spec) == expected


def test_free_beside_gpus_takes_every_bound_pod_off_the_allocatable(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    # o.node: 96 CPUs and 1 Ti allocatable
    unknown = o.node("no-memory")
    del unknown["status"]["allocatable"]["memory"]
    leaving = _with_resources(o.pod("leaving", "ml", gpus=0, node_name="gpu-0"), {"cpu": "1"})
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    apiserver.seed(
        o.node("gpu-0"),
        o.node("gpu-1"),
        unknown,
        _with_resources(o.pod("trainer", "ml", gpus=8, node_name="gpu-0"), {"cpu": "8", "memory": "32Gi"}),
        # a CPU-only pod (a log shipper): not in the snapshot, but its CPU and memory are taken
        _with_resources(o.pod("shipper", "kube-system", gpus=0, node_name="gpu-0"), {"cpu": "500m", "memory": "1Gi"}),
        # being deleted: still counted, as kube-scheduler counts it until it is gone
        leaving,
        # pending: on no node yet
        _with_resources(o.pod("pending", "ml", gpus=1, node_name=None, phase="Pending"), {"cpu": "64"}),
        _with_resources(o.pod("other", "ml", gpus=1, node_name="gpu-1"), {}, limits={"cpu": "4", "memory": "8Gi"}),
    )
    snapshot = _snapshot(api_client)
    free = {n.name: n.free_beside_gpus for n in snapshot.nodes}
    assert free == {
        "gpu-0": (96_000 - 8_000 - 500 - 1_000, 1024 * GI - 32 * GI - GI),
        "gpu-1": (96_000 - 4_000, 1024 * GI - 8 * GI),
        "no-memory": None,
    }
    pods = {p.name: (p.cpu_milli, p.memory_bytes) for p in snapshot.pods}
    assert pods["trainer"] == (8_000, 32 * GI)
    assert pods["other"] == (4_000, 8 * GI)
    assert "shipper" not in pods


def test_a_deployment_carries_its_template_requests(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    raw = o.deployment("chat", "inference", replicas=2)
    raw["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "12", "memory": "96Gi", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    apiserver.seed(o.node("gpu-0"), raw, o.deployment("plain", "inference"))
    deployments = {d.name: d for d in _snapshot(api_client).deployments}
    assert (deployments["chat"].cpu_milli_per_pod, deployments["chat"].memory_bytes_per_pod) == (12_000, 96 * GI)
    assert (deployments["plain"].cpu_milli_per_pod, deployments["plain"].memory_bytes_per_pod) == (0, 0)


def test_a_second_snapshot_counts_afresh(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """The per-node sums are the last read's alone: a pod gone since gives its CPU back."""
    from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
    from tests.kube.test_review38_reader import NOW

    apiserver.seed(o.node("gpu-0"), _with_resources(o.pod("p", "ml", gpus=1, node_name="gpu-0"), {"cpu": "10"}))
    reader = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None)
    first = reader.snapshot(NOW).nodes[0].free_beside_gpus
    second = reader.snapshot(NOW + 15).nodes[0].free_beside_gpus
    assert first == second == (86_000, 1024 * GI)
