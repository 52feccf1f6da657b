"""Review 35: the Cluster API burst node-pool adapter against how Cluster API really deletes Machines.

Each of the first four tests is a defect found in ``autoscaler/adapters/kubernetes/nodepool.py``, fixed; the tests
after them guard the fixes against over-blocking and cover their edges. The Cluster API facts the tests rely on
(cluster-api ``core/reconcilers``):

- a MachineSet scaling down deletes ``len(machines) - spec.replicas`` Machines picked by priority, and its
  ``machines`` deliberately include the ones already being deleted (cluster-api PR 3434); a Machine with a
  deletionTimestamp ranks ``mustDelete`` (100), *above* one carrying ``cluster.x-k8s.io/delete-machine``
  (``shouldDeleteFirst``, 80): "Deleting machines must go first" (``machineset_deletion_order.go``);
- a MachineDeployment with more than one active MachineSet (a rollout under way) spreads a size change over its
  MachineSets proportionally, largest/oldest first (``machinedeployment_sync.go`` ``scale``): the mark is not looked
  at, so the MachineSet that shrinks need not be the one holding the marked Machine;
- a MachineDeployment annotated ``cluster.x-k8s.io/paused`` is not reconciled: a lowered ``spec.replicas`` reaches
  no MachineSet until the annotation goes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes._api import JSON
from autoscaler.adapters.kubernetes.nodepool import (
    DELETE_MACHINE_ANNOTATION,
    MARKED_BY_ANNOTATION,
    MachinesDeletedFirstError,
    OtherMachinesMarkedError,
    PoolPausedError,
    RolloutInProgressError,
)
from autoscaler.core.model import ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import PortError, WriteOutcome
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

MD = "cluster.x-k8s.io/v1beta1"
NS = "capi-system"
NOW = 1_800_000_000.0
CA_MARK = "2026-01-01 00:00:00.000000001 +0000 UTC"  # what the Cluster Autoscaler writes (time.Now().String())


def pools(api: client.ApiClient, **kw: Any) -> MachineDeploymentNodePools:
    return MachineDeploymentNodePools(api, NS, sleep=lambda s: None, clock=lambda: NOW, **kw)


def deployment(replicas: int = 3, **status: Any) -> JSON:
    md = o.machine_deployment("burst", NS, replicas=replicas)
    md["status"].update({"replicas": replicas, "observedGeneration": 1, **status})
    return md


def machine(name: str, node: str | None, *, machine_set: str | None = None, deleting: bool = False) -> JSON:
    m = o.machine(name, "burst", node, NS, deleting=deleting)
    if machine_set is not None:
        m["metadata"]["labels"]["cluster.x-k8s.io/set-name"] = machine_set
        m["metadata"]["ownerReferences"] = [
            {
                "apiVersion": MD,
                "kind": "MachineSet",
                "name": machine_set,
                "uid": f"uid-{machine_set}",
                "controller": True,
            }
        ]
    return m


def machine_set(name: str, replicas: int) -> JSON:
    return {
        "apiVersion": MD,
        "kind": "MachineSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"cluster.x-k8s.io/deployment-name": "burst", "cluster.x-k8s.io/cluster-name": "gpu"},
            "ownerReferences": [{"apiVersion": MD, "kind": "MachineDeployment", "name": "burst", "controller": True}],
        },
        "spec": {"clusterName": "gpu", "replicas": replicas},
        "status": {"replicas": replicas},
    }


def size(apiserver: FakeApiServer) -> int:
    md = apiserver.get(MD, "MachineDeployment", "burst", NS)
    assert md is not None
    return int(md["spec"]["replicas"])


def marked(apiserver: FakeApiServer) -> set[str]:
    return {
        m["metadata"]["name"]
        for m in apiserver.objects(MD, "Machine", NS)
        if DELETE_MACHINE_ANNOTATION in (m["metadata"].get("annotations") or {})
    }


# ---- 1. a Machine being deleted that its MachineSet still counts takes the scale-down instead of ours -----------


def test_a_deleting_machine_the_machineset_still_counts_absorbs_the_scale_down(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The MachineSet counts Machines already being deleted in len(machines) and deletes them first (mustDelete >
    delete-machine): with a Machine deleted outside a size change (MachineHealthCheck remediation, kubectl delete
    machine) a size lowered by one is absorbed by it, the emptied node stays (paid for, reported 'applied') with our
    mark on it, and the remediation's replacement is never created. Refused: ``MachinesDeletedFirstError``, nothing
    written."""
    # 3 replicas, 3 Machines: burst-d is being remediated (deleted without the size falling; its drain may take
    # hours on a GPU node behind a PodDisruptionBudget). The MachineSet counts it: diff 3 - 3 = 0.
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        deployment(3),
        machine("burst-a", "node-a"),
        machine("burst-b", "node-b"),
        machine("burst-d", "node-d", deleting=True),
    )
    # The plan emptied node-b and gives it back: 3 -> 2. The MachineSet then deletes 3 - 2 = 1 Machine, the
    # mustDelete burst-d (already going): node-b is never removed and keeps a delete-machine mark that makes the
    # next scale-down by anyone (the Cluster Autoscaler, a person) delete it, busy by then.
    with pytest.raises(MachinesDeletedFirstError, match=f"{NS}/burst-d"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 3
    assert marked(apiserver) == set()


# ---- 2. a rollout spreads the size change over two MachineSets: the mark does not steer it ------------------------


def test_no_scale_down_by_mark_while_a_rollout_spreads_it_over_two_machinesets(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """With two active MachineSets the MachineDeployment scales them proportionally (largest/oldest first) without
    looking at delete-machine: lowering the size shrinks the old MachineSet, which deletes a busy Machine of its own
    choosing, while the emptied node (new MachineSet) stays with our mark left on it. Refused:
    ``RolloutInProgressError``, nothing written."""
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        o.simple_crd("cluster.x-k8s.io", "v1beta1", "MachineSet", "machinesets", scale=True),
        # rollout under way (maxSurge 0, maxUnavailable 1): old MachineSet 2, new 1; settled in size
        deployment(3, updatedReplicas=1, readyReplicas=3, availableReplicas=3),
        machine_set("burst-old", 2),
        machine_set("burst-new", 1),
        machine("burst-a", "node-a", machine_set="burst-old"),
        machine("burst-c", "node-c", machine_set="burst-old"),
        machine("burst-b", "node-b", machine_set="burst-new"),  # the node the plan emptied
    )
    with pytest.raises(RolloutInProgressError, match="burst-new, burst-old"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 3
    assert marked(apiserver) == set()


# ---- 3. a paused MachineDeployment: the lowered size waits, the mark stays, the node fills up meanwhile ---------


def test_a_paused_machine_deployment_is_not_scaled_down_by_mark(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """On a paused MachineDeployment the mark and the lowered spec.replicas reach no MachineSet: node_count would say
    2 while node-b keeps running schedulable, pods land on it, and on unpause the MachineSet deletes node-b (marked,
    busy by then). Refused: ``PoolPausedError``, nothing written."""
    md = deployment(3)
    md["metadata"]["annotations"]["cluster.x-k8s.io/paused"] = ""
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        md,
        machine("burst-a", "node-a"),
        machine("burst-b", "node-b"),
        machine("burst-c", "node-c"),
    )
    with pytest.raises(PoolPausedError, match=r"cluster\.x-k8s\.io/paused"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 3
    assert marked(apiserver) == set()


# ---- 4. the take-back after a failed size write removes a mark that is no longer ours ----------------------------


def seed_three_machines(apiserver: FakeApiServer) -> None:
    """The pool at 3 nodes, one Machine each (burst-a..c on node-a..c)."""
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        deployment(3),
        machine("burst-a", "node-a"),
        machine("burst-b", "node-b"),
        machine("burst-c", "node-c"),
    )


def error(status: int) -> tuple[int, dict[str, str], JSON]:
    reason = {403: "Forbidden", 422: "Invalid"}[status]
    return status, {}, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "reason": reason}


def test_the_take_back_leaves_a_mark_someone_else_rewrote_meanwhile(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unconditional take-back would remove a delete-machine mark the Cluster Autoscaler (or a person) re-wrote on
    the same Machine meanwhile, and their size decrease would then make the MachineSet delete a Machine of its own
    choosing (Random: possibly busy). The take-back carries the resourceVersion of our mark's answer; on a 409 the
    Machine is read again and a mark that is not ours any more is left alone."""
    seed_three_machines(apiserver)
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/scale"):
            # The Cluster Autoscaler found node-b empty too: its DeleteNodes re-marks the Machine (only the
            # delete-machine key, its own value; our record annotation now disagrees: not ours any more) and is
            # about to lower the size. Our own size write is refused (a webhook, RBAC...).
            other = apiserver.get(MD, "Machine", "burst-b", NS)
            assert other is not None
            other["metadata"].setdefault("annotations", {})[DELETE_MACHINE_ANNOTATION] = CA_MARK
            apiserver.update_object(other)
            return error(422)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    with pytest.raises(PortError, match="422"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    burst_b = apiserver.get(MD, "Machine", "burst-b", NS)
    assert burst_b is not None
    assert (burst_b["metadata"].get("annotations") or {}).get(DELETE_MACHINE_ANNOTATION) == CA_MARK


# ---- what is fine: a deleting Machine that already stands for an earlier decrease does not block -----------------


def test_a_deleting_machine_beyond_the_size_is_an_earlier_decrease_and_does_not_block(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """4 Machines for 3 replicas: burst-d is going for an earlier scale-down (the MachineSet's diff already covers
    it), so 3 -> 2 deletes burst-d and the marked burst-b. Guards the fix of test 1 against over-blocking."""
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        deployment(3),
        machine("burst-a", "node-a"),
        machine("burst-b", "node-b"),
        machine("burst-c", "node-c"),
        machine("burst-d", "node-d", deleting=True),
    )
    pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 2
    assert marked(apiserver) == {"burst-b"}


# ---- edges of the fixes ---------------------------------------------------------------------------------------


def patched(apiserver: FakeApiServer) -> list[str]:
    return ["/".join(r.path.rsplit("/", 2)[-2:]) for r in apiserver.requests if r.method == "PATCH"]


def test_a_deleting_machine_next_to_an_other_mark_is_named_in_the_refusal(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """5 Machines for 4 replicas (burst-d going for an earlier decrease) and burst-a marked by someone else: 4 -> 3
    deletes 5 - 3 = 2, burst-d and burst-a, not the emptied node-b. Refused as before, burst-d named too."""
    other = machine("burst-a", "node-a")
    other["metadata"]["annotations"] = {DELETE_MACHINE_ANNOTATION: CA_MARK}
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        deployment(4),
        other,
        machine("burst-b", "node-b"),
        machine("burst-c", "node-c"),
        machine("burst-e", "node-e"),
        machine("burst-d", "node-d", deleting=True),
    )
    with pytest.raises(OtherMachinesMarkedError) as info:
        pools(api_client).scale("burst", 3, expected=4, remove_node="node-b")
    assert info.value.machines == (f"{NS}/burst-a",)
    assert info.value.deleting == (f"{NS}/burst-d",)
    assert size(apiserver) == 4
    assert not patched(apiserver)


@pytest.mark.parametrize(
    ("sets", "status", "refused"),
    [
        # Machines naming no MachineSet, but the status says the newest MachineSet holds fewer than all
        ((None, None, None), {"updatedReplicas": 2}, True),
        # one MachineSet, status agreeing: a plain scale-down
        (("burst-new", "burst-new", "burst-new"), {"updatedReplicas": 3}, False),
        # one MachineSet, no updatedReplicas in the status (older fixtures, a status not written yet)
        (("burst-new", "burst-new", "burst-new"), {}, False),
    ],
)
def test_the_rollout_check_reads_the_machines_and_the_status(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    sets: tuple[str | None, str | None, str | None],
    status: dict[str, int],
    refused: bool,
) -> None:
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        deployment(3, **status),
        *(machine(f"burst-{n}", f"node-{n}", machine_set=ms) for n, ms in zip("abc", sets, strict=True)),
    )
    if refused:
        with pytest.raises(RolloutInProgressError, match=r"updatedReplicas 2 < status\.replicas 3"):
            pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
        assert size(apiserver) == 3
        assert not patched(apiserver)
    else:
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
        assert size(apiserver) == 2
        assert marked(apiserver) == {"burst-b"}


def test_a_deleting_machine_of_an_old_machineset_is_no_rollout(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The old MachineSet's last Machine is draining (4 Machines for 3 replicas, the earlier decrease taken by it): the
    Machines still running are all in the new MachineSet, so the size change goes there."""
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        deployment(3),
        machine("burst-a", "node-a", machine_set="burst-new"),
        machine("burst-b", "node-b", machine_set="burst-new"),
        machine("burst-c", "node-c", machine_set="burst-new"),
        machine("burst-d", "node-d", machine_set="burst-old", deleting=True),
    )
    pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 2
    assert marked(apiserver) == {"burst-b"}


def paused_by_cluster(md: JSON) -> JSON:
    """What Cluster API 1.9+ writes on a MachineDeployment whose Cluster has spec.paused (v1beta1 objects)."""
    md["status"]["v1beta2"] = {
        "conditions": [
            {"type": "Available", "status": "True", "reason": "Available"},
            {"type": "Paused", "status": "True", "reason": "Paused", "message": "Cluster spec.paused is set to true"},
        ]
    }
    return md


def paused_by_annotation(md: JSON) -> JSON:
    md["metadata"]["annotations"]["cluster.x-k8s.io/paused"] = ""
    return md


@pytest.mark.parametrize("pause", [paused_by_annotation, paused_by_cluster])
@pytest.mark.parametrize(("nodes", "remove_node"), [(5, None), (2, "node-b")])
def test_a_paused_pool_is_neither_grown_nor_shrunk_and_the_actuator_reports_why(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    pause: Callable[[JSON], JSON],
    nodes: int,
    remove_node: str | None,
) -> None:
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        pause(deployment(3)),
        machine("burst-a", "node-a"),
        machine("burst-b", "node-b"),
        machine("burst-c", "node-c"),
    )
    reason = Reason.BURST_SCALE_UP if nodes > 3 else Reason.BURST_SCALE_DOWN
    action = ScaleNodePool("burst", nodes, 3, reason, "t", remove_node=remove_node)
    (result,) = Actuator(FakeCluster(), node_pools=pools(api_client), can_act=lambda: True).apply(
        [action], GuardContext(NOW, {})
    )
    assert result.result == "failed"
    assert result.message.startswith("PoolPausedError: ") and "paused" in result.message
    assert size(apiserver) == 3
    assert not patched(apiserver)


def test_a_paused_condition_that_is_false_does_not_block(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    md = paused_by_cluster(deployment(1))
    md["status"]["v1beta2"]["conditions"][1].update(status="False", reason="NotPaused", message="")
    apiserver.seed(o.machine_deployment_crd(), o.machine_crd(), md)
    assert pools(api_client).scale("burst", 2, expected=1) == WriteOutcome.WROTE
    assert size(apiserver) == 2


def test_the_take_back_goes_on_when_only_the_machine_status_changed(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Machine controller updates the Machine between our mark and the take-back (a new resourceVersion): the
    precondition fails, the Machine read again still carries our mark, taken back then."""
    seed_three_machines(apiserver)
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/scale"):
            current = apiserver.get(MD, "Machine", "burst-b", NS)
            assert current is not None
            current["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            apiserver.update_object(current)
            return error(422)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    with pytest.raises(PortError, match="422"):
        pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert marked(apiserver) == set()
    burst_b = apiserver.get(MD, "Machine", "burst-b", NS)
    assert burst_b is not None
    assert MARKED_BY_ANNOTATION not in (burst_b["metadata"].get("annotations") or {})
    # mark, the size (refused), the take-back refused by its precondition, then after a read the take-back again
    assert patched(apiserver) == ["machines/burst-b", "burst/scale", "machines/burst-b", "machines/burst-b"]


def test_a_mark_placed_on_our_machine_between_the_list_and_our_mark_is_not_overwritten(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Cluster Autoscaler marks burst-b between our list and our mark: our mark (preconditioned on the Machine as
    listed) is a 409, the next round finds theirs and leaves it as found: it stays theirs, never taken back by us."""
    seed_three_machines(apiserver)
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "PATCH" and target.split("?")[0].endswith("/machines/burst-b") and not marked(apiserver):
            other = apiserver.get(MD, "Machine", "burst-b", NS)
            assert other is not None
            other["metadata"].setdefault("annotations", {})[DELETE_MACHINE_ANNOTATION] = CA_MARK
            apiserver.update_object(other)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    pools(api_client).scale("burst", 2, expected=3, remove_node="node-b")
    assert size(apiserver) == 2
    burst_b = apiserver.get(MD, "Machine", "burst-b", NS)
    assert burst_b is not None
    assert burst_b["metadata"]["annotations"] == {DELETE_MACHINE_ANNOTATION: CA_MARK}
    assert patched(apiserver) == ["machines/burst-b", "burst/scale"]  # our mark refused (409), then the size
