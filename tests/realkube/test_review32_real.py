"""Review 32's fixes, checked against the real control plane (they were verified on the fake API server only):

1. A GPUScalingPolicy's status is written only to the incarnation it was decided for: ``update_policy_status(...,
   uid=...)`` skips an object deleted and created again under its name (the read finds another uid), and its PUT
   carries the uid, which kube-apiserver checks as a precondition (409 "Precondition failed: UID in precondition").
   The exact answers of the real server to a uid in a PUT or a PATCH are compared with the fake API server's
   (tests/kube/fake_apiserver.py mirrors them; tests/kube/test_fake_apiserver_uid.py pins them there).
2. ``KubernetesLeaseStore`` carries the metadata it read into its update (a PUT replaces the whole object): a label
   and an annotation somebody else put on the Lease survive renewals, a renewal's 409 caused by such a change, the
   release and the next holder's takeover.
3. ``MachineDeploymentNodePools.scale``: a Machine marked ``cluster.x-k8s.io/delete-machine`` by someone else blocks a
   scale-down that removes another node (``OtherMachinesMarkedError``, nothing written), and a ``can_write`` guard
   that says no sends no write. Requests are counted by the fault proxy (no rule: it only forwards and records).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kubernetes import (
    KubeClusterWriter,
    MachineDeploymentNodePools,
    StatusUpdate,
    WriterConfig,
)
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.nodepool import (
    DELETE_MACHINE_ANNOTATION,
    MARKED_BY_ANNOTATION,
    OtherMachinesMarkedError,
)
from autoscaler.adapters.kubernetes_lease import (
    ElectionTimings,
    KubernetesLeaseStore,
    LeaderElector,
    LeaseRecord,
    LeaseStore,
)
from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from autoscaler.ports import WriteNotAllowed
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.realkube.control_plane import REPO, ControlPlane
from tests.realkube.fault_proxy import FaultProxy
from tests.realkube.test_adapter_faults_real import crd
from tests.realkube.test_faults_real import install_crd

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

NOW = 1_800_000_000.0
MERGE = "application/merge-patch+json"
CRD_FILE = REPO / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"
POLICIES = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{ns}}/{PLURAL}"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
CAPI = "/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}"
UPDATE = StatusUpdate(current_replicas=3, desired_replicas=5)
OTHER_UID = "00000000-0000-0000-0000-000000000000"


def make_writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="realkube-test"), sleep=lambda s: None)


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": name},
        "spec": {"targetRef": {"name": name}, "metric": {"type": "gpu_utilization", "target": 60}, **spec},
    }


def recreate(cp: ControlPlane, ns: str, name: str = "chat") -> dict[str, Any]:
    """kubectl delete + kubectl apply: another object under the same name (new uid, generation 1, no status)."""
    path = POLICIES.format(ns=ns)
    cp.request("DELETE", f"{path}/{name}")
    cp.wait(f"policy {ns}/{name} gone", lambda: not cp.exists(f"{path}/{name}") or None, timeout_s=30)
    return dict(cp.request("POST", path, policy(name, maxReplicas=4)))


def uid_conflict_body(resource: str, name: str, key: str, sent: str, stored: str, group: str) -> dict[str, Any]:
    """kube-apiserver's answer to a PUT whose metadata.uid is not the stored object's (the storage layer's
    precondition error, as a Conflict)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            f'Operation cannot be fulfilled on {resource} "{name}": StorageError: invalid object, Code: 4, Key: {key}, '
            f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {sent}, "
            f"UID in object meta: {stored}"
        ),
        "reason": "Conflict",
        "details": {"name": name, "group": group, "kind": resource.split(".")[0]},
        "code": 409,
    }


# ---- 1. the policy status uid precondition -----------------------------------------------------------------------


def test_a_status_write_for_a_deleted_and_recreated_policy_writes_nothing(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    install_crd(cp)
    path = POLICIES.format(ns=ns)
    cp.request("POST", path, policy("chat", maxReplicas=8))
    read = cp.get(f"{path}/chat")  # what the tick read
    old_uid = read["metadata"]["uid"]
    new = recreate(cp, ns)
    new_uid = new["metadata"]["uid"]
    assert new_uid != old_uid

    w = make_writer(api_client)
    assert w.update_policy_status(ns, "chat", UPDATE, generation=1, now=NOW, uid=old_uid) is False  # no exception
    stored = cp.get(f"{path}/chat")
    assert stored["metadata"]["uid"] == new_uid
    assert "status" not in stored, stored["status"]  # nothing from the old incarnation
    assert stored["metadata"]["resourceVersion"] == new["metadata"]["resourceVersion"]  # nothing written at all

    # The incarnation it was decided for: written.
    assert w.update_policy_status(ns, "chat", UPDATE, now=NOW, uid=new_uid) is True
    status = cp.get(f"{path}/chat")["status"]
    assert (status["currentReplicas"], status["desiredReplicas"], status["observedGeneration"]) == (3, 5, 1)
    assert w.update_policy_status(ns, "chat", UPDATE, now=NOW, uid=new_uid) is False  # nothing changed


def test_a_recreation_between_the_writers_read_and_its_put_meets_the_uid_precondition(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    """The policy is re-created after the writer's read, immediately before its PUT (in the write guard): the real
    apiserver refuses the PUT on the uid it carries (409, the uid checked before the resourceVersion), the conflict
    retry's read finds the new uid, and nothing is written, no error."""
    cp, ns = control_plane, namespace
    install_crd(cp)
    path = POLICIES.format(ns=ns)
    old_uid = cp.request("POST", path, policy("chat", maxReplicas=8))["metadata"]["uid"]
    w = make_writer(api_client)
    put = w._custom.replace_namespaced_custom_object_status
    answers: list[tuple[str | None, int, Any]] = []  # (uid sent, HTTP status, error body)

    def recording_put(*args: Any, **kwargs: Any) -> Any:
        sent = (args[-1].get("metadata") or {}).get("uid")
        try:
            result = put(*args, **kwargs)
        except ApiException as exc:
            answers.append((sent, int(exc.status or 0), json.loads(exc.body or b"null")))
            raise
        answers.append((sent, 200, None))
        return result

    w._custom.replace_namespaced_custom_object_status = recording_put  # type: ignore[method-assign]
    recreated: list[dict[str, Any]] = []

    def recreate_before_the_first_put() -> bool:
        if not recreated:
            recreated.append(recreate(cp, ns))
        return True

    assert w.update_policy_status(ns, "chat", UPDATE, now=NOW, uid=old_uid, can_write=recreate_before_the_first_put) \
        is False  # fmt: skip
    (new,) = recreated
    new_uid = new["metadata"]["uid"]
    assert len(answers) == 1, answers  # one PUT, refused; the retry's read saw the new uid and sent nothing
    sent, status, body = answers[0]
    assert (sent, status) == (old_uid, 409)
    key = f"/registry/{API_GROUP}/{PLURAL}/{ns}/chat"
    assert body == uid_conflict_body(f"{PLURAL}.{API_GROUP}", "chat", key, old_uid, new_uid, API_GROUP), body
    stored = cp.get(f"{path}/chat")
    assert stored["metadata"]["uid"] == new_uid and "status" not in stored
    assert stored["metadata"]["resourceVersion"] == new["metadata"]["resourceVersion"]


Send = Callable[[str, str, Any, str], tuple[int, Any]]


def _call(base: str, method: str, path: str, body: Any, ctype: str, token: str | None, ssl_ctx: Any) -> Any:
    """(status, JSON body) of one request to ``base`` (the fake's plain HTTP or the real apiserver's HTTPS)."""
    headers = {"Content-Type": ctype, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=15, context=ssl_ctx) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def uid_cases(send: Send, ns: str) -> dict[str, tuple[int, Any]]:
    """A policy, a Lease and a MachineDeployment created, then PUTs and merge PATCHes carrying a metadata.uid: every
    answer, an error's body with the stored uids named ``<stored uid N>`` (policy 0, Lease 1, MachineDeployment 2), a
    success as whether the answer still has the stored uid."""
    js = "application/json"
    pol, lease = f"{POLICIES.format(ns=ns)}/chat", f"{LEASES.format(ns=ns)}/l"
    md = f"{CAPI.format(ns=ns)}/machinedeployments/md"
    scale = f"{md}/scale"
    assert send("POST", POLICIES.format(ns=ns), policy("chat"), js)[0] == 201
    lease_body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
                  "spec": {"holderIdentity": "a"}}  # fmt: skip
    assert send("POST", LEASES.format(ns=ns), lease_body, js)[0] == 201
    md_body = o.machine_deployment("md", ns, replicas=2)
    md_body.pop("status")
    assert send("POST", f"{CAPI.format(ns=ns)}/machinedeployments", md_body, js)[0] == 201
    uids = [str(send("GET", path, None, js)[1]["metadata"]["uid"]) for path in (pol, lease, md)]

    def with_uid(path: str, uid: str = OTHER_UID, **meta: Any) -> dict[str, Any]:
        obj = dict(send("GET", path, None, js)[1])
        obj["metadata"] = {**obj["metadata"], "uid": uid, **meta}
        return obj

    no_rv = with_uid(pol)
    no_rv["metadata"].pop("resourceVersion")
    out = {
        "PUT status, another uid": send("PUT", f"{pol}/status", with_uid(pol), js),
        "PUT main, another uid": send("PUT", pol, with_uid(pol), js),
        "PUT status, another uid, stale rv": send("PUT", f"{pol}/status", with_uid(pol, resourceVersion="1"), js),
        "PUT status, another uid, no rv": send("PUT", f"{pol}/status", no_rv, js),
        "PUT status, its own uid": send(
            "PUT", f"{pol}/status", {**with_uid(pol, uids[0]), "status": {"currentReplicas": 1}}, js
        ),
        "merge PATCH main, another uid": send("PATCH", pol, {"metadata": {"uid": OTHER_UID}}, MERGE),
        "merge PATCH main, its own uid": send(
            "PATCH", pol, {"metadata": {"uid": uids[0], "labels": {"a": "b"}}}, MERGE
        ),
        "merge PATCH status, another uid": send(
            "PATCH", f"{pol}/status", {"metadata": {"uid": OTHER_UID}, "status": {"currentReplicas": 2}}, MERGE
        ),
        "PUT Lease, another uid": send("PUT", lease, with_uid(lease), js),
        "merge PATCH Lease, another uid": send("PATCH", lease, {"metadata": {"uid": OTHER_UID}}, MERGE),
        "PUT scale, another uid": send("PUT", scale, {**with_uid(scale), "spec": {"replicas": 4}}, js),
        "merge PATCH scale, another uid": send(
            "PATCH", scale, {"metadata": {"uid": OTHER_UID}, "spec": {"replicas": 3}}, MERGE
        ),
    }
    # what the successes did: the status written, the size written, the uids kept
    assert send("GET", pol, None, js)[1]["status"] == {"currentReplicas": 2}
    assert send("GET", md, None, js)[1]["spec"]["replicas"] == 3
    assert [send("GET", path, None, js)[1]["metadata"]["uid"] for path in (pol, lease, md)] == uids

    def normalised(result: tuple[int, Any]) -> tuple[int, Any]:
        status, body = result
        if status < 300:
            return status, (body.get("metadata") or {}).get("uid") in uids
        text = json.dumps(body)
        for i, uid in enumerate(uids):
            text = text.replace(uid, f"<stored uid {i}>")
        return status, json.loads(text)

    return {case: normalised(result) for case, result in out.items()}


def test_the_fake_answers_a_uid_in_a_put_or_a_patch_as_the_real_apiserver_does(
    control_plane: ControlPlane, namespace: str
) -> None:
    """The same requests to kube-apiserver and to the fake API server (same namespace, names and bodies): the same
    HTTP status and, for the errors, the same Status body once each server's own uid is named the same."""
    cp, ns = control_plane, namespace
    install_crd(cp)
    real_ssl = cp._ssl()
    with crd(cp, o.machine_deployment_crd()), crd(cp, o.machine_crd()):
        real = uid_cases(lambda m, p, b, t: _call(cp.server, m, p, b, t, cp.tokens["admin"], real_ssl), ns)
    with FakeApiServer() as fake:
        for body in (yaml.safe_load(CRD_FILE.read_text()), o.machine_deployment_crd(), o.machine_crd()):
            assert _call(fake.url, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body,
                         "application/json", None, None)[0] == 201  # fmt: skip
        faked = uid_cases(lambda m, p, b, t: _call(fake.url, m, p, b, t, None, None), ns)

    # The real server's answers (the fake mirrors them):
    key = f"/registry/{API_GROUP}/{PLURAL}/{ns}/chat"
    conflict = uid_conflict_body(f"{PLURAL}.{API_GROUP}", "chat", key, OTHER_UID, "<stored uid 0>", API_GROUP)
    assert real["PUT status, another uid"] == (409, conflict)
    assert real["PUT main, another uid"] == (409, conflict)
    assert real["PUT status, another uid, stale rv"] == (409, conflict)  # the uid is checked first
    assert real["PUT status, another uid, no rv"] == (409, conflict)  # before the missing resourceVersion (422)
    assert real["PUT status, its own uid"] == (200, True)
    assert real["merge PATCH main, its own uid"] == (200, True)
    assert real["merge PATCH status, another uid"] == (200, True)  # ignored: the status strategy keeps the metadata
    assert real["merge PATCH scale, another uid"] == (200, True)  # ignored too
    immutable = f'Invalid value: "{OTHER_UID}": field is immutable'
    status, body = real["merge PATCH main, another uid"]  # no precondition for a patch: the uid is immutable
    assert (status, body["reason"], body["message"]) == (
        422, "Invalid", f'GPUScalingPolicy.{API_GROUP} "chat" is invalid: metadata.uid: {immutable}',
    )  # fmt: skip
    cause = {"reason": "FieldValueInvalid", "message": immutable, "field": "metadata.uid"}
    assert body["details"]["causes"] == [cause, cause]  # named twice for a custom resource
    lease_key = f"/registry/leases/{ns}/l"
    assert real["PUT Lease, another uid"] == (
        409,
        uid_conflict_body("leases.coordination.k8s.io", "l", lease_key, OTHER_UID, "<stored uid 1>",
                          "coordination.k8s.io"),
    )  # fmt: skip
    status, body = real["merge PATCH Lease, another uid"]
    assert (status, body["details"]["causes"]) == (422, [cause])  # once for a built-in kind
    md_key = f"/registry/cluster.x-k8s.io/machinedeployments/{ns}/md"
    assert real["PUT scale, another uid"] == (
        409,
        uid_conflict_body("machinedeployments.cluster.x-k8s.io", "md", md_key, OTHER_UID, "<stored uid 2>",
                          "cluster.x-k8s.io"),
    )  # fmt: skip
    assert set(faked) == set(real)
    for case in real:
        assert faked[case] == real[case], (case, faked[case], real[case])


# ---- 2. Lease renewals keep the metadata others wrote ------------------------------------------------------------


class TouchedBeforeUpdate:
    """A ``LeaseStore`` that lets somebody else write the Lease's metadata right before the first update after
    ``armed`` is set: the update meets a 409 on a Lease that is still ours."""

    def __init__(self, inner: LeaseStore, touch: Callable[[], None]) -> None:
        self.inner, self.touch, self.armed, self.updates = inner, touch, False, 0

    def get(self) -> LeaseRecord | None:
        return self.inner.get()

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self.inner.create(record)

    def update(self, record: LeaseRecord) -> LeaseRecord:
        self.updates += 1
        if self.armed:
            self.armed = False
            self.touch()
        return self.inner.update(record)


def test_lease_renewals_and_the_release_keep_labels_and_annotations_added_by_others(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    path = f"{LEASES.format(ns=ns)}/gpu-autoscaler"
    coordination = client.CoordinationV1Api(api_client)
    timings = ElectionTimings(lease_duration_s=15.0, renew_deadline_s=10.0, retry_period_s=2.0)
    label, annotation = ("team.example.com/owner", "ml-platform"), ("example.com/note", "do not delete")

    def touch(key: str, value: str) -> Callable[[], None]:
        return lambda: cp.request("PATCH", path, {"metadata": {"annotations": {key: value}}}, content_type=MERGE)

    store = TouchedBeforeUpdate(KubernetesLeaseStore(coordination, ns, "gpu-autoscaler"), touch("late", "yes"))
    a = LeaderElector(store, "a", timings)
    assert a.try_acquire_or_renew() is True  # created
    cp.request(
        "PATCH",
        path,
        {"metadata": {"labels": dict([label]), "annotations": dict([annotation])}},
        content_type=MERGE,
    )

    def lease() -> dict[str, Any]:
        return dict(cp.get(path))

    def assert_kept(obj: dict[str, Any], *extra: tuple[str, str]) -> None:
        assert (obj["metadata"].get("labels") or {}).get(label[0]) == label[1], obj["metadata"]
        annotations = obj["metadata"].get("annotations") or {}
        for key, value in (annotation, *extra):
            assert annotations.get(key) == value, obj["metadata"]

    before = lease()
    for _ in range(3):
        assert a.try_acquire_or_renew() is True and a.is_leader()
        now = lease()
        assert now["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]  # renewed: written
        assert now["spec"]["renewTime"] != before["spec"]["renewTime"]
        assert (now["spec"]["holderIdentity"], now["spec"]["leaseTransitions"]) == ("a", 0)
        assert now["spec"]["acquireTime"] == before["spec"]["acquireTime"]
        assert_kept(now)
        before = now

    # Somebody annotates the Lease between a renewal's read and its PUT: 409 on a Lease still ours, the fresh read's
    # metadata (theirs included) carried into the retried renewal.
    updates = store.updates
    store.armed = True
    assert a.try_acquire_or_renew() is True and a.is_leader()
    assert store.updates == updates + 2  # the refused PUT and the retried one
    now = lease()
    assert (now["spec"]["holderIdentity"], now["spec"]["leaseTransitions"]) == ("a", 0)
    assert now["spec"]["renewTime"] != before["spec"]["renewTime"]
    assert_kept(now, ("late", "yes"))

    a.release()
    released = lease()
    assert released["spec"]["holderIdentity"] in ("", None) and released["spec"]["leaseTransitions"] == 0
    assert_kept(released, ("late", "yes"))

    b = LeaderElector(KubernetesLeaseStore(coordination, ns, "gpu-autoscaler"), "b", timings)
    assert b.try_acquire_or_renew() is True  # released: taken at once
    assert b.try_acquire_or_renew() is True  # and renewed
    taken = lease()
    assert (taken["spec"]["holderIdentity"], taken["spec"]["leaseTransitions"]) == ("b", 1)
    assert_kept(taken, ("late", "yes"))
    assert a.try_acquire_or_renew() is False and a.holder == "b"


# ---- 3. Cluster API delete-machine marks -------------------------------------------------------------------------


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy.for_control_plane(control_plane) as p:
        yield p


@pytest.fixture
def proxied_api(proxy: FaultProxy, control_plane: ControlPlane, tmp_path: Path) -> Iterator[client.ApiClient]:
    """An ``ApiClient`` built the way the controller builds it, through the proxy (which only forwards and counts)."""
    kubeconfig = proxy.write_kubeconfig(tmp_path / "proxied.kubeconfig", control_plane.tokens["admin"],
                                        control_plane.ca_file)  # fmt: skip
    api = load_api_client("kubeconfig", kubeconfig)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


WRITES = ("POST", "PUT", "PATCH", "DELETE")


def test_a_machine_marked_by_someone_else_blocks_the_scale_down_and_a_refusing_guard_sends_no_write(
    control_plane: ControlPlane, namespace: str, proxy: FaultProxy, proxied_api: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    group = CAPI.format(ns=ns)
    with crd(cp, o.machine_deployment_crd()), crd(cp, o.machine_crd()):
        body = o.machine_deployment("b", ns, replicas=2)
        status = body.pop("status")
        cp.request("POST", f"{group}/machinedeployments", body)
        cp.request("PUT", f"{group}/machinedeployments/b/status", {**cp.get(f"{group}/machinedeployments/b"),
                                                                    "status": status})  # fmt: skip
        for name, node in (("b-1", "burst-1"), ("b-2", "burst-2")):
            machine = o.machine(name, "b", node, ns)
            machine_status = machine.pop("status")
            cp.request("POST", f"{group}/machines", machine)
            cp.request("PUT", f"{group}/machines/{name}/status", {**cp.get(f"{group}/machines/{name}"),
                                                                  "status": machine_status})  # fmt: skip
        # the Cluster Autoscaler (or a person) marked b-1 for deletion: not ours
        cp.request(
            "PATCH",
            f"{group}/machines/b-1",
            {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "2027-01-15T08:00:00Z"}}},
            content_type=MERGE,
        )

        def state() -> dict[str, Any]:
            md = cp.get(f"{group}/machinedeployments/b")
            out: dict[str, Any] = {"replicas": md["spec"]["replicas"], "md": md["metadata"]["resourceVersion"]}
            for name in ("b-1", "b-2"):
                m = cp.get(f"{group}/machines/{name}")["metadata"]
                out[name] = (m["resourceVersion"], m.get("annotations") or {})
            return out

        def writes() -> int:
            return sum(proxy.count(method) for method in WRITES)

        left: list[tuple[str, str]] = []
        pools = MachineDeploymentNodePools(
            proxied_api, ns, sleep=lambda s: None, on_mark_left=lambda m, why: left.append((m, why))
        )
        before = state()
        assert before["replicas"] == 2 and before["b-2"][1] == {}

        with pytest.raises(OtherMachinesMarkedError) as err:
            pools.scale("b", 1, expected=2, remove_node="burst-2")
        assert err.value.machines == (f"{ns}/b-1",)
        assert "marked by someone else" in str(err.value)
        assert proxy.count("GET") >= 2  # it did read through the proxy ...
        assert writes() == 0  # ... and wrote nothing: no mark on b-2 placed and taken back, no size write
        assert state() == before  # spec.replicas 2, every resourceVersion and annotation as it was

        # The guard says no: not one request is sent (the reads of a resize ask it too), nothing changes.
        cp.request("PATCH", f"{group}/machines/b-1", {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: None}}},
                   content_type=MERGE)  # fmt: skip
        before, seen = state(), len(proxy.records)
        asked: list[bool] = []

        def never() -> bool:
            asked.append(False)
            return False

        with pytest.raises(WriteNotAllowed):
            pools.scale("b", 1, expected=2, remove_node="burst-2", can_write=never)
        assert asked and len(proxy.records) == seen and writes() == 0
        assert state() == before and before["replicas"] == 2

        # The guard stops saying yes once this replica's mark is on b-2 (lost its Lease mid-resize): no size write,
        # the mark (ours, recorded) stays, reported as left by a replica that may not write.
        def until_marked() -> bool:
            annotations = cp.get(f"{group}/machines/b-2")["metadata"].get("annotations") or {}
            return DELETE_MACHINE_ANNOTATION not in annotations

        with pytest.raises(WriteNotAllowed):
            pools.scale("b", 1, expected=2, remove_node="burst-2", can_write=until_marked)
        assert proxy.count("PATCH", r"/scale$") == 0 and proxy.count("PATCH", r"/machines/b-2$") == 1
        after = state()
        assert after["replicas"] == 2 and after["md"] == before["md"]
        mark = after["b-2"][1]
        assert mark[DELETE_MACHINE_ANNOTATION].startswith("gpu-autoscaler ") and mark[MARKED_BY_ANNOTATION] == mark[
            DELETE_MACHINE_ANNOTATION
        ]  # fmt: skip
        assert left == [(f"{ns}/b-2", "not_leader")]

        # With a guard that says yes, the same scale-down goes through (the proxy passes writes): one size write.
        pools.scale("b", 1, expected=2, remove_node="burst-2", can_write=lambda: True)
        assert proxy.count("PATCH", r"/machinedeployments/b/scale$") == 1
        assert cp.get(f"{group}/machinedeployments/b")["spec"]["replicas"] == 1
