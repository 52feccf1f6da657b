"""``KubeClusterWriter.set_pod_deletion_cost`` through the REST-faithful fake API server: one JSON merge patch of the
pod's metadata setting ``controller.kubernetes.io/pod-deletion-cost`` and our mark
(``gpuautoscaler.dev/deletion-cost-by``), or removing both; the uid and the resourceVersion just read as
preconditions; a cost somebody else set never touched; the write guard asked before the PATCH; and the reader reading
it all back into ``PodInfo``."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter, ReaderConfig, WriterConfig
from autoscaler.adapters.kubernetes.reader import DELETION_COST_BY_ANNOTATION, POD_DELETION_COST_ANNOTATION
from autoscaler.core.cluster import DELETION_COST_BY_US
from autoscaler.ports import ChangedSinceRead, WriteNotAllowed, WriteOutcome
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NAME = o.deployment_pod("chat", 0, "ml")["metadata"]["name"]


def _writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), sleep=lambda s: None)


def _seed(server: FakeApiServer, annotations: dict[str, str] | None = None) -> str:
    pod = o.deployment_pod("chat", 0, "ml")
    if annotations:
        pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
    server.seed(o.node("gpu-0"), o.deployment("chat", "ml"), pod)
    return str(_live(server)["metadata"]["uid"])


def _live(server: FakeApiServer) -> dict[str, Any]:
    pod = server.get("v1", "Pod", NAME, "ml")
    assert pod is not None
    return pod


def _annotations(server: FakeApiServer) -> dict[str, str]:
    return dict(_live(server)["metadata"].get("annotations") or {})


def _patches(server: FakeApiServer) -> list[Any]:
    return [r for r in server.requests if r.method == "PATCH" and r.path.endswith(f"/pods/{NAME}")]


def test_mark_then_clear(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    uid = _seed(apiserver, {"note": "kept"})
    writer = _writer(api_client)
    assert writer.set_pod_deletion_cost("ml", NAME, -1, uid=uid) is WriteOutcome.WROTE
    assert _annotations(apiserver) == {
        "note": "kept", POD_DELETION_COST_ANNOTATION: "-1", DELETION_COST_BY_ANNOTATION: DELETION_COST_BY_US
    }  # fmt: skip
    [patch] = _patches(apiserver)
    assert patch.content_type == "application/merge-patch+json"
    assert set(patch.body) == {"metadata"} and patch.body["metadata"]["uid"] == uid
    assert set(patch.body["metadata"]) == {"uid", "resourceVersion", "annotations"}
    # the reader reads it back as ours
    [info] = [p for p in KubeClusterReader(api_client, ReaderConfig()).snapshot(0).pods if p.name == NAME]
    assert (info.deletion_cost, info.deletion_cost_by) == (-1, DELETION_COST_BY_US)
    # again: nothing written
    assert writer.set_pod_deletion_cost("ml", NAME, -1, uid=uid) is WriteOutcome.ALREADY
    assert len(_patches(apiserver)) == 1
    # cleared: both keys gone (merge patch null), the rest kept
    assert writer.set_pod_deletion_cost("ml", NAME, None, uid=uid) is WriteOutcome.WROTE
    assert _annotations(apiserver) == {"note": "kept"}
    assert writer.set_pod_deletion_cost("ml", NAME, None, uid=uid) is WriteOutcome.ALREADY
    [info] = [p for p in KubeClusterReader(api_client, ReaderConfig()).snapshot(0).pods if p.name == NAME]
    assert (info.deletion_cost, info.deletion_cost_by) == (0, None)


@pytest.mark.parametrize("cost", [-1, None])
def test_a_successor_of_the_same_name_is_not_marked(
    apiserver: FakeApiServer, api_client: client.ApiClient, cost: int | None
) -> None:
    _seed(apiserver, {POD_DELETION_COST_ANNOTATION: "-1", DELETION_COST_BY_ANNOTATION: DELETION_COST_BY_US})
    before = _annotations(apiserver)
    assert _writer(api_client).set_pod_deletion_cost("ml", NAME, cost, uid="the-pod-the-plan-saw") is WriteOutcome.GONE
    assert _patches(apiserver) == [] and _annotations(apiserver) == before


def test_no_such_pod(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    assert _writer(api_client).set_pod_deletion_cost("ml", "nobody", -1, uid="u") is WriteOutcome.GONE


@pytest.mark.parametrize("cost", [-1, None])
@pytest.mark.parametrize("theirs", ["5", "0"])
def test_a_cost_somebody_else_set_is_never_touched(
    apiserver: FakeApiServer, api_client: client.ApiClient, cost: int | None, theirs: str
) -> None:
    uid = _seed(apiserver, {POD_DELETION_COST_ANNOTATION: theirs})
    with pytest.raises(ChangedSinceRead):
        _writer(api_client).set_pod_deletion_cost("ml", NAME, cost, uid=uid)
    assert _patches(apiserver) == [] and _annotations(apiserver)[POD_DELETION_COST_ANNOTATION] == theirs
    [info] = [p for p in KubeClusterReader(api_client, ReaderConfig()).snapshot(0).pods if p.name == NAME]
    assert info.deletion_cost_by == ""  # somebody else's: the chooser leaves the Deployment alone


def test_the_write_guard_is_asked_before_the_patch(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    uid = _seed(apiserver)
    with pytest.raises(WriteNotAllowed):
        _writer(api_client).set_pod_deletion_cost("ml", NAME, -1, uid=uid, can_write=lambda: False)
    assert _patches(apiserver) == [] and POD_DELETION_COST_ANNOTATION not in _annotations(apiserver)


def test_a_write_in_between_is_read_again(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """Another client changes the pod between our read and our patch: the resourceVersion precondition answers 409,
    the writer reads and decides again (here: somebody else's cost arrived, so nothing is written)."""
    uid = _seed(apiserver)
    serve, raced = apiserver.handle, []

    def race(method: str, target: str, headers: Any, body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith(f"/pods/{NAME}") and not raced:
            raced.append(target)
            pod = _live(apiserver)
            pod["metadata"].setdefault("annotations", {})[POD_DELETION_COST_ANNOTATION] = "3"
            apiserver.update_object(pod)
        return serve(method, target, headers, body)

    apiserver.handle = race  # type: ignore[method-assign]
    try:
        with pytest.raises(ChangedSinceRead):
            _writer(api_client).set_pod_deletion_cost("ml", NAME, -1, uid=uid)
    finally:
        apiserver.handle = serve  # type: ignore[method-assign]
    assert raced and _annotations(apiserver)[POD_DELETION_COST_ANNOTATION] == "3"
    assert DELETION_COST_BY_ANNOTATION not in _annotations(apiserver)
