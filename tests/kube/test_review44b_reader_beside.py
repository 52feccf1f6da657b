"""Review 44b: the reader's CPU and memory beside the GPUs (``NodeInfo.free_beside_gpus``).

A pod list whose continue token expires is listed again from scratch (``Pager.converted``): the pods of the pages
already read must not be counted twice on their nodes."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
GI = 1 << 30


def _cpu_pod(name: str, node: str, cpu: str) -> dict:
    raw = o.pod(name, "ml", gpus=1, node_name=node)
    raw["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
    return raw


def test_an_expired_pod_list_restarted_counts_each_pod_once(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.continue_ttl_s = -1.0  # every continue token expired: two paged restarts, then one whole list
    apiserver.seed(o.node("gpu-0"), *(_cpu_pod(f"p{i}", "gpu-0", "1") for i in range(7)))
    reader = KubeClusterReader(api_client, ReaderConfig(page_size=3), sleep=lambda s: None)
    snapshot = reader.snapshot(NOW)
    assert len(snapshot.pods) == 7
    # o.node: 96 CPUs allocatable; seven pods of one CPU each
    assert snapshot.nodes[0].free_beside_gpus is not None
    assert snapshot.nodes[0].free_beside_gpus[0] == 96_000 - 7_000


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # kube-scheduler's PodRequests: a pod-level request of CPU or memory replaces the containers' aggregate
        ({"resources": {"requests": {"cpu": "4", "memory": "8Gi"}},
          "containers": [{"resources": {"requests": {"cpu": "1"}}}, {}]}, (4000, 8 * GI)),
        # per resource: memory from the pod, CPU from the containers (sidecar included); the overhead on top
        ({"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "4Gi"}},
          "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}],
          "containers": [{"resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}],
          "overhead": {"cpu": "100m", "memory": "1Mi"}}, (1600, 2 * GI + (1 << 20))),
    ],
)  # fmt: skip
def test_pod_level_requests_count_as_the_scheduler_counts_them(spec: dict, expected: tuple[int, int]) -> None:
    from autoscaler.adapters.kubernetes.reader import requests_beside_gpus

    assert requests_beside_gpus(spec) == expected


@pytest.mark.parametrize("value", ["1e400000", "1e2147483647"])
def test_a_huge_quantity_is_read_at_once_and_counts_more_than_any_node_has(value: str) -> None:
    """The API server keeps a decimal-exponent quantity uncapped (a typo'd template); the reader reads it as more
    than any node has (no replica fits beside it), in no time -- not as an integer of 1.3 million bits built in
    seconds ("1e400000": 3.5 s, "1e999990": 22 s, each distinct value once per process), nor as 0 (room for it
    anywhere) when the exponent overflows the decimal context."""
    import time

    from autoscaler.adapters.kubernetes.reader import _scaled_quantity, requests_beside_gpus

    start = time.perf_counter()
    cpu, memory = requests_beside_gpus({"containers": [{"resources": {"requests": {"cpu": value, "memory": value}}}]})
    assert time.perf_counter() - start < 1.0
    assert cpu >= 1 << 62 and memory >= 1 << 62
    assert _scaled_quantity("64Gi", 1) == 64 * GI and _scaled_quantity("1.5", 1000) == 1500  # as before


def test_each_pods_requests_are_read_once_a_snapshot(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pod of the cluster is listed each tick (20,000 in the benchmark): its requests are read once, for its
    node's sum and its PodInfo alike."""
    from autoscaler.adapters.kubernetes import reader as module

    calls: list[object] = []
    real = module.requests_beside_gpus

    def counting(spec: object) -> tuple[int, int]:
        calls.append(spec)
        return real(spec)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "requests_beside_gpus", counting)
    cpu_only = [o.pod(f"c{i}", "ml", gpus=0, node_name="gpu-0") for i in range(2)]
    apiserver.seed(o.node("gpu-0"), *(_cpu_pod(f"p{i}", "gpu-0", "1") for i in range(3)), *cpu_only)
    snapshot = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW)
    assert len(snapshot.pods) == 3 and snapshot.nodes[0].free_beside_gpus == (96_000 - 3_000, 1024 * GI)
    assert len(calls) == 5
