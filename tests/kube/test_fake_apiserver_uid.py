"""The fake API server answers a ``metadata.uid`` in a write's body as kube-apiserver does.

What the real apiserver answered (tests/realkube/test_review32_real.py sends the same requests to both servers and
compares the answers):

- a PUT (main resource, status or scale subresource) whose ``metadata.uid`` is not the stored object's: 409
  Conflict, ``Operation cannot be fulfilled on <resource>.<group> "<name>": StorageError: invalid object, Code: 4,
  Key: /registry/..., ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: <sent>, UID
  in object meta: <stored>``; the uid is checked before the resourceVersion (a stale one, or a custom resource's
  missing one);
- a merge patch of the main resource that changes the uid: 422 Invalid, ``metadata.uid: ... field is immutable``
  (the cause listed twice for a custom resource, once for a built-in kind): a patch carries no uid precondition;
- a merge patch of the status or the scale subresource: the uid is ignored, the patch applied.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterWriter, StatusUpdate, WriterConfig
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

API = "gpuautoscaler.dev/v1alpha1"
KIND = "GPUScalingPolicy"
POLICY = "/apis/gpuautoscaler.dev/v1alpha1/namespaces/ml/gpuscalingpolicies/chat"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/ml/leases/l"
CONFIGMAP = "/api/v1/namespaces/ml/configmaps/c"
MD = "/apis/cluster.x-k8s.io/v1beta1/namespaces/ml/machinedeployments/md"
MERGE = "application/merge-patch+json"
OTHER = "00000000-0000-0000-0000-000000000000"


def send(server: FakeApiServer, method: str, path: str, body: Any, ctype: str = "application/json") -> Any:
    req = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": ctype}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def seeded(server: FakeApiServer) -> dict[str, dict[str, Any]]:
    """A policy, a Lease, a ConfigMap and a MachineDeployment (with a scale subresource); their stored objects."""
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l", "namespace": "ml"},
             "spec": {"holderIdentity": "a"}}  # fmt: skip
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}}
    md = o.machine_deployment("md", "ml", replicas=2)
    server.seed(o.policy_crd(), o.machine_deployment_crd(), o.gpu_policy("chat", "ml"), lease, configmap, md)
    out = {
        "policy": server.get(API, KIND, "chat", "ml"),
        "lease": server.get("coordination.k8s.io/v1", "Lease", "l", "ml"),
        "configmap": server.get("v1", "ConfigMap", "c", "ml"),
        "md": server.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", "md", "ml"),
    }
    assert all(obj is not None for obj in out.values())
    return out  # type: ignore[return-value]


def with_uid(obj: dict[str, Any], uid: str = OTHER, **meta: Any) -> dict[str, Any]:
    return dict(obj, metadata=dict(obj["metadata"], uid=uid, **meta))


def conflict(resource: str, name: str, key: str, stored: str, group: str | None) -> dict[str, Any]:
    details = {"name": name, "kind": resource.split(".")[0]}
    if group:
        details["group"] = group
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            f'Operation cannot be fulfilled on {resource} "{name}": StorageError: invalid object, Code: 4, Key: {key}, '
            f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {OTHER}, "
            f"UID in object meta: {stored}"
        ),
        "reason": "Conflict",
        "details": details,
        "code": 409,
    }


def test_a_put_carrying_another_uid_is_409_before_any_resource_version_check(apiserver: FakeApiServer) -> None:
    objs = seeded(apiserver)
    policy = objs["policy"]
    uid, rv = policy["metadata"]["uid"], policy["metadata"]["resourceVersion"]
    expected = conflict(
        "gpuscalingpolicies.gpuautoscaler.dev", "chat", "/registry/gpuautoscaler.dev/gpuscalingpolicies/ml/chat",
        uid, "gpuautoscaler.dev",
    )  # fmt: skip
    status_body = dict(with_uid(policy), status={"currentReplicas": 1})
    assert send(apiserver, "PUT", f"{POLICY}/status", status_body) == (409, expected)
    assert send(apiserver, "PUT", POLICY, with_uid(policy)) == (409, expected)
    stale = dict(with_uid(policy, resourceVersion="1"), status={"currentReplicas": 1})
    assert send(apiserver, "PUT", f"{POLICY}/status", stale) == (409, expected)  # the uid is checked first
    no_rv = with_uid(policy)
    del no_rv["metadata"]["resourceVersion"]
    assert send(apiserver, "PUT", f"{POLICY}/status", no_rv) == (409, expected)  # before the 422 for a missing rv
    stored = apiserver.get(API, KIND, "chat", "ml")
    assert stored is not None and stored["metadata"]["resourceVersion"] == rv and "status" not in stored

    own = dict(with_uid(policy, uid), status={"currentReplicas": 1})
    code, written = send(apiserver, "PUT", f"{POLICY}/status", own)
    assert code == 200 and written["status"] == {"currentReplicas": 1} and written["metadata"]["uid"] == uid


def test_built_in_kinds_and_the_scale_subresource_check_the_uid_of_a_put_too(apiserver: FakeApiServer) -> None:
    objs = seeded(apiserver)
    lease, configmap, md = objs["lease"], objs["configmap"], objs["md"]
    assert send(apiserver, "PUT", LEASE, with_uid(lease)) == (
        409,
        conflict("leases.coordination.k8s.io", "l", "/registry/leases/ml/l", lease["metadata"]["uid"],
                 "coordination.k8s.io"),
    )  # fmt: skip
    # the core group: StatusDetails.group is omitempty
    assert send(apiserver, "PUT", CONFIGMAP, with_uid(configmap)) == (
        409,
        conflict("configmaps", "c", "/registry/configmaps/ml/c", configmap["metadata"]["uid"], None),
    )
    rv = md["metadata"]["resourceVersion"]
    scale = {
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "md", "namespace": "ml", "uid": OTHER, "resourceVersion": rv},
        "spec": {"replicas": 4},
    }
    assert send(apiserver, "PUT", f"{MD}/scale", scale) == (
        409,
        conflict("machinedeployments.cluster.x-k8s.io", "md", "/registry/cluster.x-k8s.io/machinedeployments/ml/md",
                 md["metadata"]["uid"], "cluster.x-k8s.io"),
    )  # fmt: skip
    stored = apiserver.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", "md", "ml")
    assert stored is not None and stored["spec"]["replicas"] == 2


def test_a_merge_patch_changing_the_uid_is_422_and_a_subresource_patch_ignores_it(apiserver: FakeApiServer) -> None:
    objs = seeded(apiserver)
    immutable = f'Invalid value: "{OTHER}": field is immutable'
    cause = {"reason": "FieldValueInvalid", "message": immutable, "field": "metadata.uid"}
    code, body = send(apiserver, "PATCH", POLICY, {"metadata": {"uid": OTHER}}, MERGE)
    assert (code, body) == (
        422,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'GPUScalingPolicy.gpuautoscaler.dev "chat" is invalid: metadata.uid: {immutable}',
            "reason": "Invalid",
            "details": {"name": "chat", "group": "gpuautoscaler.dev", "kind": "GPUScalingPolicy",
                        "causes": [cause, cause]},
            "code": 422,
        },
    )  # fmt: skip
    code, body = send(apiserver, "PATCH", LEASE, {"metadata": {"uid": OTHER}}, MERGE)
    assert (code, body["message"], body["details"]["causes"]) == (
        422, f'Lease.coordination.k8s.io "l" is invalid: metadata.uid: {immutable}', [cause],
    )  # fmt: skip
    code, body = send(apiserver, "PATCH", CONFIGMAP, {"metadata": {"uid": OTHER}}, MERGE)
    assert (code, body["message"]) == (422, f'ConfigMap "c" is invalid: metadata.uid: {immutable}')
    assert "group" not in body["details"]

    # the uid it has is no change: applied
    uid = objs["policy"]["metadata"]["uid"]
    code, body = send(apiserver, "PATCH", POLICY, {"metadata": {"uid": uid, "labels": {"a": "b"}}}, MERGE)
    assert code == 200 and body["metadata"]["labels"] == {"a": "b"}
    # the status and scale subresources keep the stored metadata: the uid in the patch is ignored
    code, body = send(
        apiserver, "PATCH", f"{POLICY}/status", {"metadata": {"uid": OTHER}, "status": {"currentReplicas": 2}}, MERGE
    )
    assert code == 200 and body["metadata"]["uid"] == uid and body["status"] == {"currentReplicas": 2}
    code, body = send(apiserver, "PATCH", f"{MD}/scale", {"metadata": {"uid": OTHER}, "spec": {"replicas": 3}}, MERGE)
    assert code == 200 and body["metadata"]["uid"] == objs["md"]["metadata"]["uid"] and body["spec"]["replicas"] == 3


def test_the_writer_skips_a_policy_recreated_right_before_its_put(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """As on the real apiserver: re-created in the write guard (after the writer's read, before its PUT), the PUT is
    refused on the uid it carries, the retry's read sees the new uid, nothing is written, no error."""
    old_uid = seeded(apiserver)["policy"]["metadata"]["uid"]
    recreated: list[str] = []

    def recreate_before_the_first_put() -> bool:
        if not recreated:
            apiserver.delete_object(API, KIND, "chat", "ml")
            apiserver.seed(o.gpu_policy("chat", "ml", minReplicas=2, maxReplicas=4))
            new = apiserver.get(API, KIND, "chat", "ml")
            assert new is not None
            recreated.append(new["metadata"]["uid"])
        return True

    w = KubeClusterWriter(api_client, WriterConfig(reporting_instance="test-0"), sleep=lambda s: None)
    update = StatusUpdate(current_replicas=3, desired_replicas=5)
    assert w.update_policy_status("ml", "chat", update, now=1e9, uid=old_uid, can_write=recreate_before_the_first_put) \
        is False  # fmt: skip
    puts = [r for r in apiserver.requests if r.method == "PUT"]
    assert [(r.status, r.body["metadata"]["uid"]) for r in puts] == [(409, old_uid)]
    stored = apiserver.get(API, KIND, "chat", "ml")
    assert stored is not None and stored["metadata"]["uid"] == recreated[0] and "status" not in stored
