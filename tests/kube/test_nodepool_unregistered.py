"""A scale-down that gives back a Machine that never registered a Node (``remove_unregistered``).

The capacity arbitration gives back a node the provider counts but that never joined past its provision timeout.
Lowering the size alone lets the MachineSet delete a Machine of its own choosing (Random by default): possibly a
running, busy node, while the stuck Machine stays. So the adapter names it, as the Cluster Autoscaler removes its
unregistered nodes: the oldest Machine of the pool without ``status.nodeRef`` and not being deleted is marked with
``cluster.x-k8s.io/delete-machine``, then the size lowered; none: ``NoUnregisteredMachineError``, nothing written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes._api import JSON
from autoscaler.adapters.kubernetes.nodepool import (
    MIN_SIZE_ANNOTATION,
    MachineNotFoundError,
    NoUnregisteredMachineError,
    OtherMachinesMarkedError,
)
from autoscaler.ports import PortError, WriteNotAllowed, WriteOutcome
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_nodepool_marks import (
    CA,
    NOW,
    NS,
    annotations_of,
    deployment,
    machine,
    marked,
    ours,
    patched,
    pools,
    refusing_crd,
    seed,
    size,
)

MD = "cluster.x-k8s.io/v1beta1"


def created(m: JSON, at: str) -> JSON:
    m["metadata"]["creationTimestamp"] = at
    return m


def pool_of(*extra: JSON) -> tuple[JSON, ...]:
    """burst-a, burst-b: registered (node-a, node-b); burst-old: no Node since 09:00; burst-new: created at 10:00 by
    a scale-up, no Node yet either (deliberately sorting before burst-old by name); then ``extra``."""
    return (
        created(machine("burst-a", "node-a"), "2026-01-01T08:00:00Z"),
        created(machine("burst-b", "node-b"), "2026-01-01T08:00:00Z"),
        created(machine("burst-old", None), "2026-01-01T09:00:00Z"),
        created(machine("burst-anew", None), "2026-01-01T10:00:00Z"),
        *extra,
    )


def test_the_oldest_machine_without_a_node_is_marked_then_the_size_lowered(
    apiserver: FakeApiServer, api_client: client.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    seed(apiserver, deployment(4), *pool_of())
    caplog.set_level("INFO", logger="autoscaler.adapters.kubernetes.nodepool")
    outcome = pools(api_client).scale("burst", 3, expected=4, remove_unregistered=True)
    assert outcome is WriteOutcome.WROTE
    assert size(apiserver) == 3
    assert marked(apiserver) == {"burst-old"}  # not the younger burst-anew, never a registered node
    assert annotations_of(apiserver)["burst-old"] == ours(NOW)
    assert patched(apiserver) == ["machines/burst-old", "burst/scale"]  # the mark precedes the size
    assert f"removing unregistered Machine {NS}/burst-old" in caplog.text


def test_ties_on_the_creation_time_go_by_name(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    at = "2026-01-01T09:00:00Z"
    seed(apiserver, deployment(3), created(machine("burst-y", None), at), created(machine("burst-x", None), at),
         created(machine("burst-a", "node-a"), at))  # fmt: skip
    pools(api_client).scale("burst", 2, expected=3, remove_unregistered=True)
    assert marked(apiserver) == {"burst-x"}
    assert size(apiserver) == 2


def test_a_machine_without_a_node_that_is_being_deleted_is_not_picked(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Already going (a MachineHealthCheck remediation), it is deleted anyway: marking it would not make the size
    fall by one more Machine. The oldest of those not going is picked."""
    going = created(machine("burst-older", None, deleting=True), "2026-01-01T07:00:00Z")
    seed(apiserver, deployment(4), *pool_of()[:3], going)
    # 4 Machines counted, burst-older deleted first: lowered by two, burst-old goes too
    pools(api_client).scale("burst", 2, expected=4, remove_unregistered=True)
    assert marked(apiserver) == {"burst-old"}
    assert size(apiserver) == 2


@pytest.mark.parametrize(
    "machines",
    [
        pytest.param(
            (machine("burst-a", "node-a"), machine("burst-b", "node-b"), machine("burst-c", "node-c")),
            id="every Machine registered",
        ),
        pytest.param(
            (machine("burst-a", "node-a"), machine("burst-b", "node-b"), machine("burst-c", None, deleting=True)),
            id="the only one without a Node already going",
        ),
        pytest.param(
            (machine("burst-a", "node-a"), machine("burst-b", "node-b"), machine("other-x", None, deployment="o")),
            id="one without a Node in another MachineDeployment",
        ),
    ],
)
def test_no_machine_without_a_node_writes_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient, machines: tuple[JSON, ...]
) -> None:
    """Lowering the size anyway would let the MachineSet delete a Machine of its own choosing: a running node."""
    seed(apiserver, deployment(3), *machines)
    with pytest.raises(NoUnregisteredMachineError, match=f"MachineDeployment {NS}/burst has no Machine without a Node"):
        pools(api_client).scale("burst", 2, expected=3, remove_unregistered=True)
    assert issubclass(NoUnregisteredMachineError, MachineNotFoundError)
    assert issubclass(NoUnregisteredMachineError, PortError)
    assert size(apiserver) == 3
    assert marked(apiserver) == set()
    assert not patched(apiserver)


def test_a_mark_left_by_someone_else_refuses_as_for_a_named_node(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    seed(apiserver, deployment(4), *pool_of()[:3], created(machine("burst-anew", None, CA), "2026-01-01T10:00:00Z"))
    with pytest.raises(OtherMachinesMarkedError, match=f"the unregistered Machine {NS}/burst-old would not be") as info:
        pools(api_client).scale("burst", 3, expected=4, remove_unregistered=True)
    assert info.value.machines == (f"{NS}/burst-anew",)
    assert size(apiserver) == 4
    assert marked(apiserver) == {"burst-anew"}
    assert not patched(apiserver)


def test_a_failed_size_write_takes_the_mark_back(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    seed(apiserver, deployment(4), *pool_of(), crd=refusing_crd(4))
    with pytest.raises(PortError, match="422"):
        pools(api_client).scale("burst", 3, expected=4, remove_unregistered=True)
    assert size(apiserver) == 4
    assert marked(apiserver) == set()
    assert annotations_of(apiserver)["burst-old"] == {}
    assert patched(apiserver) == ["machines/burst-old", "burst/scale", "machines/burst-old"]


def test_a_conflict_retry_keeps_the_machine_it_marked(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size write conflicts once (another client touched the MachineDeployment) and, meanwhile, an even older
    Machine without a Node shows up in the list (say an adopted one): the retry lowers the size with the Machine it
    marked, it does not move to another one and leave its own mark behind."""
    seed(apiserver, deployment(4), *pool_of())
    serve = apiserver.handle
    state = {"conflicted": False}

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/scale") and not state["conflicted"]:
            state["conflicted"] = True
            md = apiserver.get(MD, "MachineDeployment", "burst", NS)
            assert md is not None
            apiserver.update_object(md)  # a new resourceVersion: our precondition fails
            apiserver.seed(created(machine("burst-adopted", None), "2026-01-01T06:00:00Z"))
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    pools(api_client).scale("burst", 3, expected=4, remove_unregistered=True)
    assert size(apiserver) == 3
    assert marked(apiserver) == {"burst-old"}
    assert patched(apiserver) == ["machines/burst-old", "burst/scale", "burst/scale"]


def test_a_marked_machine_that_registered_before_the_retry_is_taken_back(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a conflict, the Machine it marked got its Node: the retry removes no other Machine (its own mark would
    be left behind to take a running node later): refused, the mark taken back, the size unchanged."""
    seed(apiserver, deployment(4), *pool_of())
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/scale"):
            md = apiserver.get(MD, "MachineDeployment", "burst", NS)
            old = apiserver.get(MD, "Machine", "burst-old", NS)
            assert md is not None and old is not None
            apiserver.update_object(md)
            old["status"]["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": "node-old"}
            apiserver.update_object(old)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    with pytest.raises(NoUnregisteredMachineError, match=f"Machine {NS}/burst-old, chosen as never registered"):
        pools(api_client).scale("burst", 3, expected=4, remove_unregistered=True)
    assert size(apiserver) == 4
    assert marked(apiserver) == set()


def test_a_refused_guard_after_the_mark_leaves_it(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """Leadership as with ``remove_node``: the guard says no before the size write, the mark placed stays."""
    seed(apiserver, deployment(4), *pool_of())
    left: list[tuple[str, str]] = []

    def can_write() -> bool:
        return not any(r.method == "PATCH" for r in apiserver.requests)  # leads until the mark is placed

    p = pools(api_client, on_mark_left=lambda name, why: left.append((name, why)))
    with pytest.raises(WriteNotAllowed):
        p.scale("burst", 3, expected=4, remove_unregistered=True, can_write=can_write)
    assert size(apiserver) == 4
    assert marked(apiserver) == {"burst-old"}
    assert left == [(f"{NS}/burst-old", "not_leader")]


def test_together_with_remove_node_is_a_programming_error(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    seed(apiserver, deployment(4), *pool_of())
    with pytest.raises(ValueError, match="exclusive"):
        pools(api_client).scale("burst", 3, expected=4, remove_node="node-a", remove_unregistered=True)
    assert not apiserver.requests


@pytest.mark.parametrize(
    ("md", "nodes", "replicas", "outcome"),
    [
        (deployment(4), 5, 5, WriteOutcome.WROTE),  # a scale-up: the flag changes nothing
        (deployment(4), 4, 4, WriteOutcome.ALREADY),  # already there
    ],
)
def test_the_flag_changes_nothing_unless_the_size_goes_down(
    apiserver: FakeApiServer, api_client: client.ApiClient, md: JSON, nodes: int, replicas: int, outcome: WriteOutcome
) -> None:
    seed(apiserver, md, *pool_of())
    assert pools(api_client).scale("burst", nodes, expected=4, remove_unregistered=True) is outcome
    assert size(apiserver) == replicas
    assert marked(apiserver) == set()
    assert not [r for r in apiserver.requests if r.path.endswith("/machines")]  # not even listed


def test_clamped_to_the_min_size_nothing_is_removed(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    md = deployment(4)
    md["metadata"].setdefault("annotations", {})[MIN_SIZE_ANNOTATION] = "4"
    seed(apiserver, md, *pool_of())
    assert pools(api_client).scale("burst", 3, expected=4, remove_unregistered=True) is WriteOutcome.ALREADY
    assert size(apiserver) == 4
    assert not patched(apiserver)
