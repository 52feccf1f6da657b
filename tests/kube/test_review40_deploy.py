"""Review 40 of deploy/ (the kustomize base and overlays) against what the adapters actually send, replayed on the
REST-faithful fake API server with the rendered RBAC enforced: a request no rule of the rendered ClusterRole (or the
namespaced Roles) allows is answered 403, as the real authorizer does.

Defects found (each a strict xfail first, WRONG/RIGHT below):

1. The ClusterRole grants Cluster API Machines ``list`` and ``patch`` but not ``get``. WRONG: after a burst
   scale-down whose size write was refused, the node pool takes its ``cluster.x-k8s.io/delete-machine`` mark back with
   a resourceVersion precondition; on a conflict (the Machine controller updates its Machines all the time) it reads
   the Machine again by name (``nodepool.py _unmark_if_ours``: GET machines/<name>), which is refused (403). The mark
   stays on a busy node (``unmark_failed``), and the next scale-down of that MachineDeployment by anyone (the Cluster
   Autoscaler, a person) deletes that node. RIGHT: ``get`` on machines is granted, the re-read succeeds, the mark is
   taken back. Left as a strict xfail: granting it makes ``tests/kube/test_deploy.py::
   test_rbac_allows_exactly_what_a_full_tick_does`` fail ("granted but never used"), since its replay never takes
   the conflict path; that replay (not an assigned file) must add the conflicting take-back before rbac.yaml can
   grant ``get``.
2. The dry-run overlay's ClusterRole grants the training workloads (Jobs, JobSets, PyTorchJobs, TFJobs, Kueue
   Workloads) only ``list``/``watch``. WRONG: a dry run's whole output is its Events ("[dry-run] would suspend Job
   ml/train"), and the writer looks up the uid of the object an Event is about by name (``writer.py _uid``: GET);
   refused, the Event is written without ``regarding.uid``, and ``kubectl describe job`` (which lists the Events of
   the object's uid) never shows what the controller would do to that workload. Every other Event target (Pods,
   Nodes, Deployments, GPUScalingPolicies, MachineDeployments) keeps ``get`` in the dry-run role. RIGHT: ``get`` on
   the five workload kinds, a read like the ``list`` already granted (the acting ClusterRole grants it too). Fixed
   in deploy/overlays/dry-run/clusterrole-read-only.yaml.

Pinned right behaviour (passing, not pinned elsewhere): with the shipped RBAC enforced, a take-back without a
conflict removes the mark (the common path needs no ``get``); a dry run's Events on Pods, Deployments and
GPUScalingPolicies carry their uid; the dry-run role can never write a workload (the extra reads add no write).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterWriter, MachineDeploymentNodePools, WriterConfig
from autoscaler.adapters.kubernetes._api import JSON
from autoscaler.adapters.kubernetes.nodepool import DELETE_MACHINE_ANNOTATION
from autoscaler.ports import PortError
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_deploy import DEPLOY, find, kustomize

MD = "cluster.x-k8s.io/v1beta1"
NS = "capi-system"
NOW = 1_800_000_000.0
Rules = list[dict[str, Any]]
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: kustomize(DEPLOY / overlay) for overlay in ("base", "overlays/dry-run")}


def permission(method: str, target: str) -> tuple[str, str, str, str | None] | None:
    """(apiGroup, resource[/subresource], verb, namespace) of a resource request; None for discovery."""
    parts = target.split("?")[0].strip("/").split("/")
    if parts[0] == "api" and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verb = VERBS.get(method) or ("get" if len(rest) > 1 else "list")
    return group, resource, verb, namespace


def allows(rules: Rules, group: str, resource: str, verb: str, name: str | None = None) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and (name is None or "resourceNames" not in r or name in r["resourceNames"])
        for r in rules
    )


def enforce_rbac(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch, docs: list[dict[str, Any]]
) -> list[tuple[str, str, str]]:
    """Answer 403 to every request the rendered ClusterRole (cluster-wide) and Roles (their namespace) refuse, as the
    real authorizer would; returns the refused (group, resource, verb), in order."""
    cluster_rules: Rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    namespaced: dict[str, Rules] = {}
    for doc in docs:
        if doc["kind"] == "Role":
            namespaced.setdefault(doc["metadata"]["namespace"], []).extend(doc["rules"])
    refused: list[tuple[str, str, str]] = []
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        seen = permission(method, target)
        if seen is not None:
            group, resource, verb, namespace = seen
            name = target.split("?")[0].rstrip("/").split("/")[-1] if verb in ("get", "update", "patch") else None
            if not allows(cluster_rules, group, resource, verb) and not (
                namespace is not None and allows(namespaced.get(namespace, []), group, resource, verb, name)
            ):
                refused.append((group, resource, verb))
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden"}
                return 403, {}, status
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    return refused


# ---- 1. the delete-machine mark's take-back after a conflict ------------------------------------------------------


def machines_marked(apiserver: FakeApiServer) -> set[str]:
    return {
        m["metadata"]["name"]
        for m in apiserver.objects(MD, "Machine", NS)
        if DELETE_MACHINE_ANNOTATION in (m["metadata"].get("annotations") or {})
    }


def refused_scale_down(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    docs: list[dict[str, Any]],
    conflicts: int,
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """A named-node scale-down of a 2-Machine pool whose size write is refused (422), its take-back meeting
    ``conflicts`` 409s first (the Machine controller wrote the Machine meanwhile), with the RBAC of ``docs`` in
    front of everything; returns the marks reported left behind and the requests RBAC refused."""
    md = o.machine_deployment("burst", NS, replicas=3)
    md["status"]["replicas"] = 3
    md["status"]["observedGeneration"] = 1
    apiserver.seed(
        o.machine_deployment_crd(),
        o.machine_crd(),
        md,
        o.machine("burst-a", "burst", "node-a", NS),
        o.machine("burst-b", "burst", "node-b", NS),
        o.machine("burst-c", "burst", "node-c", NS),
    )
    serve = apiserver.handle
    unmarks: list[str] = []

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        path = target.split("?")[0]
        if method == "PATCH" and path.endswith("/scale"):
            return 422, {}, {"kind": "Status", "apiVersion": "v1", "code": 422, "reason": "Invalid"}
        if method == "PATCH" and path.endswith("/machines/burst-b"):
            annotations = (json.loads(body or b"{}").get("metadata") or {}).get("annotations") or {}
            if DELETE_MACHINE_ANNOTATION in annotations and annotations[DELETE_MACHINE_ANNOTATION] is None:
                unmarks.append(path)
                if len(unmarks) <= conflicts:
                    return 409, {}, {"kind": "Status", "apiVersion": "v1", "code": 409, "reason": "Conflict"}
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    refused = enforce_rbac(apiserver, monkeypatch, docs)
    left: list[tuple[str, str]] = []
    report: Callable[[str, str], None] = lambda name, why: left.append((name, why))  # noqa: E731
    pools = MachineDeploymentNodePools(api_client, NS, sleep=lambda s: None, clock=lambda: NOW, on_mark_left=report)
    with pytest.raises(PortError):
        pools.scale("burst", 2, expected=3, remove_node="node-b")
    return left, refused


def test_the_take_back_after_a_conflict_is_allowed_by_the_shipped_rbac(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Fixed (was a strict xfail; test_deploy's RBAC replay now takes the same path).

    WRONG: the re-read after the conflict (GET machines/burst-b) is refused: the mark stays on node-b, reported
    ``unmark_failed``. RIGHT: the mark is taken back and nothing is refused."""
    left, refused = refused_scale_down(apiserver, api_client, monkeypatch, rendered["base"], conflicts=1)
    assert refused == []
    assert left == []
    assert machines_marked(apiserver) == set()


def test_a_take_back_without_a_conflict_needs_no_more_than_the_shipped_rbac(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The common path: mark, size write refused, mark taken back by one PATCH; every request is allowed."""
    left, refused = refused_scale_down(apiserver, api_client, monkeypatch, rendered["base"], conflicts=0)
    assert refused == []
    assert left == []
    assert machines_marked(apiserver) == set()


# ---- 2. a dry run's Events on the workloads it would suspend ------------------------------------------------------

WORKLOADS: dict[str, Callable[[], list[JSON]]] = {
    "Job": lambda: [o.job("train", "ml")],
    "JobSet": lambda: [o.jobset_crd(), o.jobset("train", "ml")],
    "PyTorchJob": lambda: [
        o.simple_crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train", "namespace": "ml"}},
    ],
    "TFJob": lambda: [
        o.simple_crd("kubeflow.org", "v1", "TFJob", "tfjobs"),
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "train", "namespace": "ml"}},
    ],
    "Workload": lambda: [o.workload_crd(), o.workload("train", "ml")],
}


def event_uids(apiserver: FakeApiServer) -> list[str | None]:
    return [(e.get("regarding") or {}).get("uid") for e in apiserver.objects("events.k8s.io/v1", "Event", "ml")]


def dry_run_event(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    docs: list[dict[str, Any]],
    kind: str,
    objects: list[JSON],
) -> tuple[str, list[tuple[str, str, str]]]:
    """Seed ``objects``, then emit the Event a dry run writes for ``kind`` ml/train with the RBAC of ``docs``
    enforced; returns the object's uid and the refused requests."""
    apiserver.seed(*objects)
    target = objects[-1]
    stored = apiserver.get(target["apiVersion"], target["kind"], "train", "ml")
    assert stored is not None
    refused = enforce_rbac(apiserver, monkeypatch, docs)
    writer = KubeClusterWriter(api_client, WriterConfig(reporting_instance="gpu-autoscaler-0"))
    writer.emit_event(kind, "ml", "train", "Preempted", "[dry-run] would suspend for inference")
    return str(stored["metadata"]["uid"]), refused


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_a_dry_runs_event_on_a_workload_carries_its_uid(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    rendered: dict[str, list[dict[str, Any]]],
    kind: str,
) -> None:
    """Fixed (was a strict xfail). WRONG: the uid look-up (GET) is refused by the dry-run ClusterRole, and the
    Event lands without ``regarding.uid``: ``kubectl describe`` of the workload does not show it. RIGHT: the
    dry-run role may read a workload by name, as it may list it."""
    uid, refused = dry_run_event(
        apiserver, api_client, monkeypatch, rendered["overlays/dry-run"], kind, WORKLOADS[kind]()
    )
    assert refused == []
    assert event_uids(apiserver) == [uid]


@pytest.mark.parametrize(
    ("kind", "objects"),
    [
        ("Pod", lambda: [o.pod("train", "ml")]),
        ("Deployment", lambda: [o.deployment("train", "ml")]),
        ("GPUScalingPolicy", lambda: [o.policy_crd(), o.gpu_policy("train", "ml")]),
    ],
)
def test_a_dry_runs_other_events_carry_their_uid(
    apiserver: FakeApiServer,
    api_client: client.ApiClient,
    monkeypatch: pytest.MonkeyPatch,
    rendered: dict[str, list[dict[str, Any]]],
    kind: str,
    objects: Callable[[], list[JSON]],
) -> None:
    uid, refused = dry_run_event(apiserver, api_client, monkeypatch, rendered["overlays/dry-run"], kind, objects())
    assert refused == []
    assert event_uids(apiserver) == [uid]


def test_the_dry_run_role_still_writes_no_workload(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rules = find(rendered["overlays/dry-run"], "ClusterRole", "gpu-autoscaler")["rules"]
    for kind, objects in WORKLOADS.items():
        target = objects()[-1]
        group = target["apiVersion"].rpartition("/")[0]
        plural = {"Job": "jobs", "JobSet": "jobsets", "PyTorchJob": "pytorchjobs", "TFJob": "tfjobs"}.get(
            kind, "workloads"
        )
        assert allows(rules, group, plural, "list")
        for verb in ("create", "update", "patch", "delete", "deletecollection"):
            assert not allows(rules, group, plural, verb), f"the dry-run role may {verb} {kind}s"
