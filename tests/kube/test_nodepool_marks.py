"""Delete-machine marks on OTHER Machines of the pool's MachineDeployment, and our own marks left behind.

A MachineSet scaling down deletes every Machine that carries ``cluster.x-k8s.io/delete-machine`` before any other
(CAPI's deletion priority: the annotation means "must delete"), whatever its delete policy. A scale-down that marks
the node the plan emptied and lowers the size by one therefore removes the emptied node only when no other
Machine that is not already going carries the mark: a stale mark (the Cluster Autoscaler's, a person's, ours after a
size write whose outcome was unknown) could make the MachineSet delete a busy node instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes._api import JSON, format_time
from autoscaler.adapters.kubernetes.nodepool import (
    DELETE_MACHINE_ANNOTATION,
    MARKED_BY_ANNOTATION,
    OtherMachinesMarkedError,
)
from autoscaler.ports import PortError
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

MD = "cluster.x-k8s.io/v1beta1"
NS = "capi-system"
NOW = 1_800_000_000.0  # the adapter's clock in these tests
OLD = NOW - 3600  # a mark an hour old: well past the grace an in-flight size write could still land in
YOUNG = NOW - 10  # a mark of a size write that may still be in flight
CA_MARK = "2026-01-01 00:00:00.000000001 +0000 UTC"  # what the Cluster Autoscaler writes (time.Now().String())
CA = {DELETE_MACHINE_ANNOTATION: CA_MARK}
LEGACY = {DELETE_MACHINE_ANNOTATION: f"gpu-autoscaler {format_time(OLD)}"}  # ours, before the record annotation


def ours(at: float) -> dict[str, str]:
    value = f"gpu-autoscaler {format_time(at)}"
    return {DELETE_MACHINE_ANNOTATION: value, MARKED_BY_ANNOTATION: value}


def machine(name: str, node: str | None, annotations: Mapping[str, str] | None = None, **kw: Any) -> JSON:
    m = o.machine(name, kw.pop("deployment", "burst"), node, NS, **kw)
    if annotations:
        m["metadata"]["annotations"] = dict(annotations)
    return m


def deployment(replicas: int = 3, status_replicas: int | None = None, observed: int = 1) -> JSON:
    md = o.machine_deployment("burst", NS, replicas=replicas)
    md["status"]["replicas"] = replicas if status_replicas is None else status_replicas
    md["status"]["observedGeneration"] = observed
    return md


def seed(apiserver: FakeApiServer, md: JSON, *machines: JSON, crd: JSON | None = None) -> None:
    apiserver.seed(crd or o.machine_deployment_crd(), o.machine_crd(), md, *machines)


def pools(api: client.ApiClient, **kw: Any) -> MachineDeploymentNodePools:
    return MachineDeploymentNodePools(api, NS, sleep=lambda s: None, clock=lambda: NOW, **kw)


def annotations_of(apiserver: FakeApiServer) -> dict[str, dict[str, str]]:
    return {
        m["metadata"]["name"]: m["metadata"].get("annotations") or {} for m in apiserver.objects(MD, "Machine", NS)
    }


def marked(apiserver: FakeApiServer) -> set[str]:
    return {name for name, a in annotations_of(apiserver).items() if DELETE_MACHINE_ANNOTATION in a}


def size(apiserver: FakeApiServer) -> int:
    md = apiserver.get(MD, "MachineDeployment", "burst", NS)
    assert md is not None
    return int(md["spec"]["replicas"])


def patched(apiserver: FakeApiServer) -> list[str]:
    return ["/".join(r.path.rsplit("/", 2)[-2:]) for r in apiserver.requests if r.method == "PATCH"]


def running(*extra: JSON) -> tuple[JSON, ...]:
    """burst-a (node-a), burst-b (node-b, the node the plan emptied), burst-c (provisioning), then ``extra``."""
    return (machine("burst-a", "node-a"), machine("burst-b", "node-b"), machine("burst-c", None), *extra)


def replace(machines: tuple[JSON, ...], *new: JSON) -> tuple[JSON, ...]:
    names = {m["metadata"]["name"] for m in new}
    return tuple(m for m in machines if m["metadata"]["name"] not in names) + new


# ---- 1. other marked Machines: the size is not lowered when more are marked than it falls by ---------------------

REFUSED = "refused"


@pytest.mark.parametrize(
    ("md", "machines", "nodes", "outcome", "still_marked"),
    [
        pytest.param(
            deployment(), replace(running(), machine("burst-a", "node-a", CA)), 2,
            REFUSED, {"burst-a"}, id="a Cluster Autoscaler mark on a running node",
        ),
        pytest.param(
            deployment(), replace(running(), machine("burst-c", None, {DELETE_MACHINE_ANNOTATION: "yes"})), 2,
            REFUSED, {"burst-c"}, id="a person's mark on a Machine still provisioning",
        ),
        pytest.param(
            deployment(), replace(running(), machine("burst-a", "node-a", ours(YOUNG))), 2,
            REFUSED, {"burst-a"}, id="our own mark, young: its size write may still land",
        ),
        pytest.param(
            deployment(status_replicas=2), replace(running(), machine("burst-a", "node-a", ours(OLD))), 2,
            REFUSED, {"burst-a"}, id="our own old mark, the MachineDeployment not settled (replicas)",
        ),
        pytest.param(
            deployment(observed=0), replace(running(), machine("burst-a", "node-a", ours(OLD))), 2,
            REFUSED, {"burst-a"}, id="our own old mark, the MachineDeployment not settled (generation)",
        ),
        pytest.param(
            deployment(),
            replace(running(), machine("burst-a", "node-a", {**ours(OLD), DELETE_MACHINE_ANNOTATION: CA_MARK})), 2,
            REFUSED, {"burst-a"}, id="our record, but the mark was rewritten by someone else since: not ours",
        ),
        pytest.param(
            deployment(4),
            replace(running(), machine("burst-c", None, CA), machine("burst-d", None, CA)),
            2, REFUSED, {"burst-c", "burst-d"}, id="two other marks, the size falls by two: three would be marked",
        ),
        # proceeds: the named node is removed
        pytest.param(
            deployment(), running(machine("burst-d", "node-d", CA, deleting=True)),
            2, 2, {"burst-b", "burst-d"}, id="a marked Machine already being deleted does not count",
        ),
        pytest.param(
            deployment(), running(machine("other-x", "node-x", CA, deployment="o")),
            2, 2, {"burst-b", "other-x"}, id="a mark in another MachineDeployment does not count",
        ),
        pytest.param(
            deployment(4), running(machine("burst-d", None, CA)), 2,
            2, {"burst-b", "burst-d"}, id="one other mark, the size falls by two",
        ),
        pytest.param(
            deployment(), replace(running(), machine("burst-a", "node-a", ours(OLD))), 2,
            2, {"burst-b"}, id="our own old mark on a settled MachineDeployment is cleared first",
        ),
        pytest.param(
            deployment(),
            replace(running(), machine("burst-a", "node-a", LEGACY)),
            2, 2, {"burst-b"}, id="so is one written before the record annotation existed",
        ),
        pytest.param(
            deployment(), replace(running(), machine("burst-b", "node-b", CA)), 2,
            2, {"burst-b"}, id="the named node's own Machine already marked",
        ),
    ],
)  # fmt: skip
def test_other_marked_machines(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    md: JSON,
    machines: tuple[JSON, ...],
    nodes: int,
    outcome: int | str,
    still_marked: set[str],
) -> None:
    seed(apiserver, md, *machines)
    before = int(md["spec"]["replicas"])
    if outcome == REFUSED:
        others = tuple(f"{NS}/{n}" for n in sorted(still_marked))
        with pytest.raises(OtherMachinesMarkedError, match=", ".join(others)) as info:
            pools(api_client).scale("burst", nodes, expected=before, remove_node="node-b")
        assert info.value.machines == others
        assert isinstance(info.value, PortError)  # the actuator reports it as a failed node-pool write
        assert size(apiserver) == before
        assert not patched(apiserver)  # nothing written: neither our mark nor the size
    else:
        pools(api_client).scale("burst", nodes, expected=before, remove_node="node-b")
        assert size(apiserver) == outcome
    assert marked(apiserver) == still_marked


@pytest.mark.parametrize("found", [ours(YOUNG), CA])
def test_a_mark_already_on_the_named_machine_is_left_as_found(
    apiserver: FakeApiServer, api_client: client.ApiClient, found: dict[str, str]
) -> None:
    """Marked already (by us earlier, by the Cluster Autoscaler): the MachineSet deletes it first as it is; this call
    neither rewrites the mark nor (on a failed size write) takes back a mark it did not place."""
    seed(apiserver, deployment(), *replace(running(), machine("burst-b", "node-b", found)))
    pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 2
    assert annotations_of(apiserver)["burst-b"] == found
    assert patched(apiserver) == ["burst/scale"]


def test_a_mark_placed_while_we_mark_ours_stops_the_scale_down(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Cluster Autoscaler marks burst-a between our list of the Machines and our mark: the size is not lowered,
    our fresh mark is taken back, theirs is left alone."""
    seed(apiserver, deployment(), *running())
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.endswith("/machines/burst-b") and not marked(apiserver):
            other = apiserver.get(MD, "Machine", "burst-a", NS)
            assert other is not None
            other["metadata"]["annotations"] = CA
            apiserver.update_object(other)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    with pytest.raises(OtherMachinesMarkedError, match=f"{NS}/burst-a"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 3
    assert marked(apiserver) == {"burst-a"}
    assert annotations_of(apiserver)["burst-a"] == CA
    assert patched(apiserver) == ["machines/burst-b", "machines/burst-b"]  # marked, then taken back


# ---- 2. a mark this call did not place is never taken back by it -------------------------------------------------


def refusing_crd(minimum: int) -> JSON:
    """The MachineDeployment CRD with a schema that refuses fewer than ``minimum`` replicas: a 422 on the size."""
    crd = o.machine_deployment_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"replicas": {"type": "integer", "minimum": minimum}},
            }
        },
    }
    return crd


@pytest.mark.parametrize(
    ("found", "after"),
    [
        (CA, CA),  # theirs: left as found
        ({}, {}),  # ours, placed by this call: taken back (both annotations)
    ],
)
def test_a_failed_size_write_takes_back_only_the_mark_it_placed(
    apiserver: FakeApiServer, api_client: client.ApiClient, found: dict[str, str], after: dict[str, str]
) -> None:
    seed(apiserver, deployment(), *replace(running(), machine("burst-b", "node-b", found)), crd=refusing_crd(3))
    with pytest.raises(PortError, match="422"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 3
    assert annotations_of(apiserver)["burst-b"] == after


# ---- 3. our mark left after an unknown outcome is recognisable, and cleared once the pool has settled -----------


def error(status: int) -> tuple[int, dict[str, str], JSON]:
    """An apiserver error answer (a Status) with this code."""
    reason = {422: "Invalid", 500: "InternalError", 503: "ServiceUnavailable"}[status]
    return status, {}, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "reason": reason}


def failing_scale_writes(apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch, status: int = 503) -> None:
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/scale"):
            return error(status)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)


def test_a_mark_left_after_an_unknown_outcome_is_ours_and_cleared_once_settled(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(apiserver, deployment(), *running())
    left: list[tuple[str, str]] = []
    with monkeypatch.context() as m:
        failing_scale_writes(apiserver, m)
        with pytest.raises(PortError, match="503"):
            pools(api_client, on_mark_left=lambda name, why: left.append((name, why))).scale(
                "burst", 2, expected=3, remove_node="node-b"
            )
    assert size(apiserver) == 3
    assert annotations_of(apiserver)["burst-b"] == ours(NOW)  # the mark stays, and says it is ours and since when
    assert left == [(f"{NS}/burst-b", "outcome_unknown")]
    # soon after, the next plan empties node-a: the write that marked burst-b may still land, its mark must stay
    apiserver.clear_requests()
    with pytest.raises(OtherMachinesMarkedError, match=f"{NS}/burst-b"):
        MachineDeploymentNodePools(api_client, NS, sleep=lambda s: None, clock=lambda: NOW + 30).scale(
            "burst", 2, expected=3, remove_node="node-a"
        )
    assert not patched(apiserver)
    # past the grace, the pool settled at 3 (the write never landed): our stale mark is cleared, node-a removed
    later = MachineDeploymentNodePools(api_client, NS, sleep=lambda s: None, clock=lambda: NOW + 600)
    later.scale("burst", 2, expected=3, remove_node="node-a")
    assert size(apiserver) == 2
    assert marked(apiserver) == {"burst-a"}
    assert annotations_of(apiserver)["burst-b"] == {}  # both of our annotations gone
    assert patched(apiserver) == ["machines/burst-b", "machines/burst-a", "burst/scale"]


# ---- 4. a mark left behind is reported (the hook a metric / an Event hangs on) ----------------------------------


@pytest.mark.parametrize(
    ("fail", "why"),
    [
        ({"scale": 500}, "outcome_unknown"),  # no definite answer: the size may fall, the mark stays
        ({"scale": 422, "unmark": 500}, "unmark_failed"),
        ({"scale": 422, "size_read": 500}, "size_unreadable"),  # could not tell whether the size fell meanwhile
        ({"scale": 422, "fall": 1}, "size_fell"),  # another writer lowered the size: the MachineSet deletes now
        ({"scale": 422}, None),  # a definite refusal, the size did not fall: taken back, nothing to report
    ],
)
def test_a_mark_left_behind_is_reported(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    fail: dict[str, int],
    why: str | None,
) -> None:
    seed(apiserver, deployment(), *running())
    serve = apiserver.handle
    patches: list[str] = []

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        path = target.split("?")[0]
        sent_size = any(p.endswith("/scale") for p in patches)
        if method == "GET" and path.endswith("/machinedeployments/burst") and sent_size and "size_read" in fail:
            return error(fail["size_read"])
        if method == "PATCH":
            patches.append(path)
            if path.endswith("/scale") and "scale" in fail:
                if "fall" in fail:  # another writer lowers the size just before our write is refused
                    md = apiserver.get(MD, "MachineDeployment", "burst", NS)
                    assert md is not None
                    md["spec"]["replicas"] -= fail["fall"]
                    apiserver.update_object(md)
                return error(fail["scale"])
            if path.endswith("/machines/burst-b") and sent_size and "unmark" in fail:
                return error(fail["unmark"])
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    left: list[tuple[str, str]] = []
    report: Callable[[str, str], None] = lambda name, reason: left.append((name, reason))  # noqa: E731
    with pytest.raises(PortError):
        pools(api_client, on_mark_left=report).scale("burst", 2, expected=3, remove_node="node-b")
    assert left == ([(f"{NS}/burst-b", why)] if why else [])
    assert (marked(apiserver) == {"burst-b"}) == (why is not None)
