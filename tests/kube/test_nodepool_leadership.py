"""The Cluster API node-pool adapter asks whether this replica still leads before every request of a resize.

A resize is several requests: the MachineDeployment read, on a scale-down the Machine list, the delete-machine mark,
a re-list, the clearing of our own stale marks, the scale subresource write (with conflict rounds), and the
take-back of the mark when the size write did not go through. The reads retry and can outlast the Lease. Before the
fix ``scale`` took no guard: a replica that lost the Lease after the actuator's one check still grew a burst pool
(money), lowered its size, or marked a Machine for deletion.

A mark already placed when the Lease is lost is LEFT, not taken back: taking it back is a write, and a replica that
may not write sends nothing. The mark is ours (it records when it was placed), it is reported (``on_mark_left``,
``not_leader``), and the leader's next scale-down of the pool clears it once it can no longer matter; a take-back
racing the new leader's own scale-down of that node could instead make the MachineSet delete a Machine of its own
choosing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes._api import JSON
from autoscaler.adapters.kubernetes.nodepool import DELETE_MACHINE_ANNOTATION
from autoscaler.core.model import ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import PortError, WriteNotAllowed
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_nodepool_marks import NOW, annotations_of, ours, refusing_crd

MD = "cluster.x-k8s.io/v1beta1"
NS = "capi-system"

Served = Callable[[str, str], bool]  # (method, path) of a request just served -> lose the Lease after it


def seed(apiserver: FakeApiServer, replicas: int = 3, crd: JSON | None = None) -> None:
    apiserver.seed(
        crd or o.machine_deployment_crd(),
        o.machine_crd(),
        o.machine_deployment("burst", NS, replicas=replicas),
        o.machine("burst-a", "burst", "node-a"),
        o.machine("burst-b", "burst", "node-b"),
        o.machine("burst-c", "burst", None),
    )


def lose_lease_after(apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch, when: Served) -> dict[str, bool]:
    """The Lease (``lease["value"]``) lapses right after the API server served the first request ``when`` picks."""
    lease = {"value": True}
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        try:
            return serve(method, target, headers, body)
        finally:
            if when(method, target.split("?")[0]):
                lease["value"] = False

    monkeypatch.setattr(apiserver, "handle", handle)
    return lease


def is_mark(method: str, path: str) -> bool:
    return method == "PATCH" and "/machines/" in path


def is_size_write(method: str, path: str) -> bool:
    return method == "PATCH" and path.endswith("/scale")


def is_md_read(method: str, path: str) -> bool:
    return method == "GET" and path.endswith("/machinedeployments/burst")


def is_machine_list(method: str, path: str) -> bool:
    return method == "GET" and path.endswith("/machines")


def size(apiserver: FakeApiServer) -> int:
    md = apiserver.get(MD, "MachineDeployment", "burst", NS)
    assert md is not None
    return int(md["spec"]["replicas"])


def sent(apiserver: FakeApiServer) -> list[str]:
    """Every request, ``METHOD last/two`` (``GET machinedeployments/burst``, ``PATCH burst/scale``...)."""
    return [f"{r.method} {'/'.join(r.path.rsplit('/', 2)[-2:])}" for r in apiserver.requests]


def pools(api: client.ApiClient, left: list[tuple[str, str]] | None = None) -> MachineDeploymentNodePools:
    hook = (lambda machine, why: left.append((machine, why))) if left is not None else None
    return MachineDeploymentNodePools(api, NS, sleep=lambda s: None, clock=lambda: NOW, on_mark_left=hook)


def apply(p: MachineDeploymentNodePools, action: ScaleNodePool, lease: dict[str, bool]) -> str:
    (result,) = Actuator(FakeCluster(), node_pools=p, can_act=lambda: lease["value"]).apply(
        [action], GuardContext(NOW, {})
    )
    return result.result


# ---- (a) a scale-up: the Lease lost while the adapter reads the pool ----------------------------------------------


def test_a_lease_lost_during_the_pool_read_grows_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(apiserver, replicas=1)
    lease = lose_lease_after(apiserver, monkeypatch, is_md_read)
    result = apply(pools(api_client), ScaleNodePool("burst", 3, 1, Reason.BURST_SCALE_UP, "t"), lease)
    # before the fix: "applied", and the pool grown to 3 by a replica that no longer leads
    assert result == "not_leader"
    assert size(apiserver) == 1
    assert sent(apiserver) == ["GET machinedeployments/burst"]


def test_a_lease_lost_after_a_conflict_sends_no_second_round(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(apiserver, replicas=1)
    serve = apiserver.handle
    lease = {"value": True}

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if is_size_write(method, target.split("?")[0]):
            lease["value"] = False  # lost while the size write was in flight; it answers 409
            return 409, {}, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
                             "reason": "Conflict"}  # fmt: skip
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    result = apply(pools(api_client), ScaleNodePool("burst", 2, 1, Reason.BURST_SCALE_UP, "t"), lease)
    assert result == "not_leader"
    assert sent(apiserver) == ["GET machinedeployments/burst", "PATCH burst/scale"]


# ---- (b) a scale-down naming its node ------------------------------------------------------------------------


def test_a_lease_lost_after_the_mark_sends_nothing_more_and_leaves_the_mark(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(apiserver)
    lease = lose_lease_after(apiserver, monkeypatch, is_mark)
    left: list[tuple[str, str]] = []
    action = ScaleNodePool("burst", 2, 3, Reason.BURST_SCALE_DOWN, "t", remove_node="node-b")
    result = apply(pools(api_client, left), action, lease)
    # before the fix: "applied": the re-list and the size write went out, the pool shrank to 2
    assert result == "not_leader"
    assert size(apiserver) == 3
    assert sent(apiserver) == ["GET machinedeployments/burst", "GET capi-system/machines", "PATCH machines/burst-b"]
    # the mark stays (taking it back would be a write), recognisable as ours, and reported
    assert annotations_of(apiserver)["burst-b"] == ours(NOW)
    assert left == [(f"{NS}/burst-b", "not_leader")]


def test_a_lease_lost_before_the_mark_marks_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(apiserver)
    lease = lose_lease_after(apiserver, monkeypatch, is_machine_list)
    left: list[tuple[str, str]] = []
    action = ScaleNodePool("burst", 2, 3, Reason.BURST_SCALE_DOWN, "t", remove_node="node-b")
    assert apply(pools(api_client, left), action, lease) == "not_leader"
    assert size(apiserver) == 3
    assert sent(apiserver) == ["GET machinedeployments/burst", "GET capi-system/machines"]
    assert not any(DELETE_MACHINE_ANNOTATION in a for a in annotations_of(apiserver).values())
    assert left == []  # nothing placed, nothing left


def test_a_lease_lost_after_a_refused_size_write_does_not_take_the_mark_back(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size write fails (422: the pool's schema refuses 2); the take-back (a read and a PATCH) would be sent by
    a replica that no longer leads: the mark stays, reported, and the size write's own error is what is raised."""
    seed(apiserver, crd=refusing_crd(3))
    lease = lose_lease_after(apiserver, monkeypatch, is_size_write)
    left: list[tuple[str, str]] = []
    with pytest.raises(PortError, match="422") as raised:
        pools(api_client, left).scale("burst", 2, expected=3, remove_node="node-b", can_write=lambda: lease["value"])
    assert not isinstance(raised.value, WriteNotAllowed)
    assert sent(apiserver) == [  # no read of the size nor PATCH of the mark after the refused size write
        "GET machinedeployments/burst",
        "GET capi-system/machines",
        "PATCH machines/burst-b",
        "GET capi-system/machines",
        "PATCH burst/scale",
    ]
    assert annotations_of(apiserver)["burst-b"] == ours(NOW)
    assert left == [(f"{NS}/burst-b", "not_leader")]


def test_the_guard_is_asked_before_every_request_and_a_leader_scales_down_as_before(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    seed(apiserver)
    asked: list[int] = []

    def guard() -> bool:
        asked.append(len(apiserver.requests))
        return True

    pools(api_client).scale("burst", 2, expected=3, remove_node="node-b", can_write=guard)
    assert size(apiserver) == 2
    assert sent(apiserver) == [
        "GET machinedeployments/burst",
        "GET capi-system/machines",
        "PATCH machines/burst-b",
        "GET capi-system/machines",
        "PATCH burst/scale",
    ]
    # asked once before each request: with 0, 1, 2, 3, 4 requests already sent
    assert asked == [0, 1, 2, 3, 4]


def test_a_refused_guard_raises_write_not_allowed_and_sends_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    seed(apiserver)
    with pytest.raises(WriteNotAllowed, match="not the leader"):
        pools(api_client).scale("burst", 4, expected=3, can_write=lambda: False)
    assert sent(apiserver) == [] and size(apiserver) == 3
