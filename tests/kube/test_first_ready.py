"""A readiness probe that fails under load and passes again moves the Ready condition's lastTransitionTime without a
container restart; the measured cold start (``cold_starts_by_service``, the predictive lead's p95) must stay that of
the pod's start, not grow to its latest recovery. The reader remembers the first Ready it read per pod uid
(``PodInfo.first_ready_at``). Through the REST-faithful fake API server."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.cluster import cold_starts_by_service
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
BOUND = "2026-01-01T00:00:10Z"


def _replica(index: int, ready_time: str, ready: bool = True) -> dict[str, Any]:
    pod = o.deployment_pod(
        "chat", index, "inference", gpus=1, scheduled_time=BOUND, ready_time=ready_time, ready=ready, priority=1000
    )
    pod["status"]["containerStatuses"] = [
        {"name": "main", "ready": ready, "restartCount": 0, "state": {"running": {"startedAt": BOUND}}}
    ]
    return pod


def _reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def _flap(apiserver: FakeApiServer, index: int, ready_time: str, ready: bool = True) -> None:
    name = _replica(index, ready_time)["metadata"]["name"]
    current = apiserver.get("v1", "Pod", name, "inference")
    assert current is not None
    flapped = copy.deepcopy(current)
    flapped["status"] = _replica(index, ready_time, ready)["status"]
    apiserver.update_object(flapped)


def test_a_readiness_flap_keeps_the_first_cold_start(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.node("gpu-0"), o.deployment("chat", "inference", replicas=2),
                   _replica(0, "2026-01-01T00:01:30Z"), _replica(1, "2026-01-01T00:01:40Z"))  # fmt: skip
    reader = _reader(api_client)
    assert sorted(cold_starts_by_service(reader.snapshot(NOW))["inference/chat"]) == [80.0, 90.0]
    # replica 0's probe fails for a while under load: not Ready now -- its start is still the 80 s it took
    _flap(apiserver, 0, "2026-01-03T12:00:00Z", ready=False)
    assert sorted(cold_starts_by_service(reader.snapshot(NOW))["inference/chat"]) == [80.0, 90.0]
    # and Ready again two days after its start: still 80 s, not two days
    _flap(apiserver, 0, "2026-01-03T12:05:00Z")
    snap = reader.snapshot(NOW)
    assert sorted(cold_starts_by_service(snap)["inference/chat"]) == [80.0, 90.0]
    flapped = next(p for p in snap.pods if p.name.endswith("00000"))
    assert flapped.ready_at is not None and flapped.first_ready_at is not None
    assert flapped.ready_at - flapped.first_ready_at > 86_400  # the Ready time stays the condition's (ReplicaSet order)


def test_a_new_reader_knows_only_the_current_ready_time(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Pinned: the memory is the process's; a restarted controller reads the flapped pod's current Ready time (as
    before this change), and a pod gone from the list is forgotten."""
    apiserver.seed(o.node("gpu-0"), o.deployment("chat", "inference", replicas=1), _replica(0, "2026-01-01T00:01:30Z"))
    first = _reader(api_client)
    first.snapshot(NOW)
    _flap(apiserver, 0, "2026-01-01T01:00:10Z")
    assert cold_starts_by_service(_reader(api_client).snapshot(NOW))["inference/chat"] == [3600.0]
    assert cold_starts_by_service(first.snapshot(NOW))["inference/chat"] == [80.0]
    apiserver.delete_object("v1", "Pod", _replica(0, "x")["metadata"]["name"], "inference")
    first.snapshot(NOW)
    assert first._first_ready == {}


def test_the_core_measures_to_the_first_ready_when_it_is_known() -> None:
    from autoscaler.core.cluster import ClusterSnapshot, PodInfo

    def pod(name: str, ready: bool = True, **kw: Any) -> PodInfo:
        return PodInfo("inference", name, "gpu-0", 1, 1000, "Running", ready, owner_kind="Deployment",
                       owner_name="chat", scheduled_at=100.0, **kw)  # fmt: skip

    snap = ClusterSnapshot(NOW, pods=(
        pod("a", ready_at=190.0),  # no flap seen
        pod("b", ready_at=9_000.0, first_ready_at=180.0),  # flapped since its start
        pod("c", ready=False, first_ready_at=170.0),  # failing its probe now: it did start
        pod("d", ready_at=9_000.0, first_ready_at=175.0, restarts=1),  # a restart: no cold start at all
    ))  # fmt: skip
    assert sorted(cold_starts_by_service(snap)["inference/chat"]) == [70.0, 80.0, 90.0]
