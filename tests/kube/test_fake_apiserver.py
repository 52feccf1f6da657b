"""The fake API server answers like the real one for what the adapter uses (checked through the official client).

If these semantics drifted, the adapter tests would pass against a server that no real cluster resembles.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer, validate_structural


def _status(exc: pytest.ExceptionInfo[ApiException]) -> dict:
    return json.loads(exc.value.body)


def test_list_pagination_is_a_consistent_snapshot(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    apiserver.seed([o.pod(f"p{i:02d}") for i in range(10)])
    first = core.list_namespaced_pod("default", limit=4)
    assert [p.metadata.name for p in first.items] == ["p00", "p01", "p02", "p03"]
    assert first.metadata.remaining_item_count == 6
    apiserver.seed(o.pod("p05a"))  # created after the list started: not in this list
    apiserver.delete_object("v1", "Pod", "p09")  # deleted after: still in it
    second = core.list_namespaced_pod("default", limit=4, _continue=first.metadata._continue)
    third = core.list_namespaced_pod("default", limit=4, _continue=second.metadata._continue)
    names = [p.metadata.name for p in second.items + third.items]
    assert names == ["p04", "p05", "p06", "p07", "p08", "p09"]
    assert third.metadata._continue is None
    assert first.metadata.resource_version == second.metadata.resource_version == third.metadata.resource_version


def test_expired_continue_token_is_410(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    apiserver.seed([o.pod(f"p{i}") for i in range(3)])
    apiserver.max_list_snapshots = 1  # as after an etcd compaction: only the newest paginated list continues
    first = core.list_namespaced_pod("default", limit=2)
    core.list_namespaced_pod("default", limit=1)
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert exc.value.status == 410
    assert _status(exc)["reason"] == "Expired"


def test_label_and_field_selectors(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    apiserver.seed(
        o.pod("a", labels={"app": "x", "tier": "gpu"}, node_name="n1"),
        o.pod("b", labels={"app": "y"}, node_name="n2", phase="Succeeded"),
        o.pod("c", labels={"app": "z", "tier": "cpu"}, node_name="n1"),
    )

    def names(**kw: str) -> list[str]:
        return [p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items]

    assert names(label_selector="app=x") == ["a"]
    assert names(label_selector="app in (x,z),tier!=cpu") == ["a"]
    assert names(label_selector="tier") == ["a", "c"]
    assert names(label_selector="!tier") == ["b"]
    assert names(label_selector="app notin (x)") == ["b", "c"]
    assert names(field_selector="spec.nodeName=n1") == ["a", "c"]
    assert names(field_selector="status.phase!=Succeeded,status.phase!=Failed") == ["a", "c"]
    with pytest.raises(ApiException) as exc:
        names(field_selector="spec.containers=x")
    assert exc.value.status == 400  # the real server only supports a few field labels per kind


def test_create_get_conflicts_and_404(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apps = client.AppsV1Api(api_client)
    created = apps.create_namespaced_deployment("ml", o.deployment("chat", "ml"))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.generation == 1
    assert created.status is None or created.status.replicas is None  # status is reset on create
    with pytest.raises(ApiException) as exc:
        apps.create_namespaced_deployment("ml", o.deployment("chat", "ml"))
    assert exc.value.status == 409 and _status(exc)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as exc:
        apps.read_namespaced_deployment("nope", "ml")
    assert exc.value.status == 404 and _status(exc)["details"]["name"] == "nope"
    stale = created.metadata.resource_version
    created.spec.replicas = 5
    updated = apps.replace_namespaced_deployment("chat", "ml", created)
    assert updated.metadata.generation == 2 and updated.metadata.resource_version != stale
    created.metadata.resource_version = stale
    with pytest.raises(ApiException) as exc:
        apps.replace_namespaced_deployment("chat", "ml", created)
    assert exc.value.status == 409 and _status(exc)["reason"] == "Conflict"


def test_patch_types_and_no_op_writes(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apps = client.AppsV1Api(api_client)
    apiserver.seed(o.deployment("chat"))
    # merge patch, the adapters' only patch type, is served; the others are 415 (the real apiserver's, in realkube)
    apps.patch_namespaced_deployment(
        "chat", "default", {"spec": {"replicas": 3}}, _content_type="application/merge-patch+json"
    )
    assert apiserver.get("apps/v1", "Deployment", "chat")["spec"]["replicas"] == 3
    for body in ({"spec": {"replicas": 4}}, [{"op": "replace", "path": "/spec/replicas", "value": 4}]):
        with pytest.raises(ApiException) as exc:  # strategic merge (a dict's default), JSON patch (a list)
            apps.patch_namespaced_deployment("chat", "default", body)
        assert exc.value.status == 415
    # a no-op merge patch stores nothing: same resourceVersion, same generation
    before = apiserver.get("apps/v1", "Deployment", "chat")["metadata"]
    apps.patch_namespaced_deployment(
        "chat", "default", {"spec": {"replicas": 3}}, _content_type="application/merge-patch+json"
    )
    after = apiserver.get("apps/v1", "Deployment", "chat")["metadata"]
    assert after["resourceVersion"] == before["resourceVersion"] and after["generation"] == before["generation"]
    # a resourceVersion inside a patch is a precondition
    with pytest.raises(ApiException) as exc:
        apps.patch_namespaced_deployment(
            "chat",
            "default",
            {"metadata": {"resourceVersion": "1"}, "spec": {}},
            _content_type="application/merge-patch+json",
        )
    assert exc.value.status == 409


def test_put_without_content_type_is_accepted(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apps = client.AppsV1Api(api_client)
    apiserver.seed(o.deployment("chat"))
    scale = apps.read_namespaced_deployment_scale("chat", "default")
    scale.spec.replicas = 4
    apps.replace_namespaced_deployment_scale("chat", "default", scale)
    put = [r for r in apiserver.requests if r.method == "PUT"]
    assert put and put[0].content_type is None  # what the client sends; a real server defaults to JSON
    assert apiserver.get("apps/v1", "Deployment", "chat")["spec"]["replicas"] == 4


def test_scale_subresource_validation_and_status_kept(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apps = client.AppsV1Api(api_client)
    apiserver.seed(o.deployment("chat", replicas=2))
    scale = apps.read_namespaced_deployment_scale("chat", "default")
    assert scale.spec.replicas == 2 and scale.status.selector == "app=chat"
    assert scale.metadata.uid == apiserver.get("apps/v1", "Deployment", "chat")["metadata"]["uid"]
    with pytest.raises(ApiException) as exc:
        apps.patch_namespaced_deployment_scale(
            "chat", "default", {"spec": {"replicas": -1}}, _content_type="application/merge-patch+json"
        )
    assert exc.value.status == 422
    apps.patch_namespaced_deployment_scale(
        "chat", "default", {"spec": {"replicas": 6}}, _content_type="application/merge-patch+json"
    )
    dep = apiserver.get("apps/v1", "Deployment", "chat")
    assert dep["spec"]["replicas"] == 6 and dep["status"]["readyReplicas"] == 2  # no controller moved status


def test_custom_resources_schema_status_and_patch_rules(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api_client)
    apiserver.seed(o.policy_crd())
    args = ("gpuautoscaler.dev", "v1alpha1", "default", "gpuscalingpolicies")
    bad = o.gpu_policy("chat", maxReplicas=0)
    with pytest.raises(ApiException) as exc:
        custom.create_namespaced_custom_object(*args, bad)
    assert exc.value.status == 422
    assert _status(exc)["details"]["causes"][0]["field"] == "spec.maxReplicas"
    created = custom.create_namespaced_custom_object(*args, o.gpu_policy("chat", unknownField=1))
    assert "unknownField" not in created["spec"]  # pruned, like a structural schema does
    assert created["spec"]["mode"] == "active"  # defaulted from the schema
    # strategic merge patch does not exist for custom resources
    with pytest.raises(ApiException) as exc:
        custom.patch_namespaced_custom_object(
            *args, "chat", {"spec": {"maxReplicas": 3}}, _content_type="application/strategic-merge-patch+json"
        )
    assert exc.value.status == 415
    # PUT without resourceVersion is refused for custom resources
    body = dict(created)
    body["metadata"] = {k: v for k, v in created["metadata"].items() if k != "resourceVersion"}
    with pytest.raises(ApiException) as exc:
        custom.replace_namespaced_custom_object(*args, "chat", body)
    assert exc.value.status == 422
    # the main resource ignores status; the status subresource ignores everything else
    main = dict(created, status={"currentReplicas": 9})
    after_main = custom.replace_namespaced_custom_object(*args, "chat", main)
    assert "status" not in after_main
    status_body = dict(after_main, spec=dict(after_main["spec"], maxReplicas=99), status={"currentReplicas": 3})
    after_status = custom.replace_namespaced_custom_object_status(*args, "chat", status_body)
    assert after_status["status"] == {"currentReplicas": 3}
    assert after_status["spec"]["maxReplicas"] == 10
    assert after_status["metadata"]["generation"] == 1  # status writes never bump the generation


def test_crd_scale_subresource(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api_client)
    apiserver.seed(o.machine_deployment_crd(), o.machine_deployment("burst", replicas=2))
    args = ("cluster.x-k8s.io", "v1beta1", "capi-system", "machinedeployments", "burst")
    scale = custom.get_namespaced_custom_object_scale(*args)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2
    assert scale["status"]["selector"] == "cluster.x-k8s.io/deployment-name=burst"
    custom.patch_namespaced_custom_object_scale(
        *args, {"spec": {"replicas": 5}}, _content_type="application/merge-patch+json"
    )
    assert (
        apiserver.get("cluster.x-k8s.io/v1beta1", "MachineDeployment", "burst", "capi-system")["spec"]["replicas"] == 5
    )


def test_eviction_honours_pod_disruption_budgets(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    apiserver.seed(
        [o.pod(f"w{i}", labels={"app": "w"}) for i in range(3)],
        o.pod("pending", labels={"app": "w"}, phase="Pending", node_name=None),
        o.pdb("w", selector={"app": "w"}, min_available=2),  # no status: computed like the disruption controller
    )

    def evict(name: str) -> None:
        core.create_namespaced_pod_eviction(
            name, "default", {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        )

    evict("w0")  # 3 healthy, 2 needed: one disruption allowed
    with pytest.raises(ApiException) as exc:
        evict("w1")
    assert exc.value.status == 429
    body = _status(exc)
    assert body["reason"] == "TooManyRequests" and body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    evict("pending")  # a pending pod is deleted without a budget check
    with pytest.raises(ApiException) as exc:
        evict("w0")
    assert exc.value.status == 404
    pdb = apiserver.get("policy/v1", "PodDisruptionBudget", "w")
    assert pdb["status"]["disruptionsAllowed"] == 0 and "w0" in pdb["status"]["disruptedPods"]
    apiserver.seed(o.pdb("w2", selector={"app": "w"}, disruptions_allowed=5))
    with pytest.raises(ApiException) as exc:
        evict("w2")
    assert exc.value.status == 500  # two budgets on one pod are not supported by the eviction subresource


def test_lease_semantics(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    coord = client.CoordinationV1Api(api_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader", namespace="default"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )
    created = coord.create_namespaced_lease("default", lease)
    with pytest.raises(ApiException) as exc:
        coord.create_namespaced_lease("default", lease)
    assert exc.value.status == 409
    created.spec.holder_identity = "b"
    coord.replace_namespaced_lease("leader", "default", created)
    created.spec.holder_identity = "c"  # still carries the resourceVersion read before b's write
    with pytest.raises(ApiException) as exc:
        coord.replace_namespaced_lease("leader", "default", created)
    assert exc.value.status == 409
    assert apiserver.get("coordination.k8s.io/v1", "Lease", "leader")["spec"]["holderIdentity"] == "b"


def _raw(server: FakeApiServer, method: str, path: str, body: object) -> tuple[int, dict]:
    """Bypass the client (it validates some bodies itself) to see what the server says."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_events_are_validated(apiserver: FakeApiServer) -> None:
    code, body = _raw(
        apiserver,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        {"metadata": {"name": "e1"}, "reason": "X", "type": "Normal", "note": "n"},
    )
    assert code == 422
    fields = {c["field"] for c in body["details"]["causes"]}
    assert {"eventTime", "reportingController", "reportingInstance", "action"} <= fields


def test_structural_validation_helper() -> None:
    schema = {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": "integer", "minimum": 1},
            "b": {"type": "string", "enum": ["x"], "default": "x"},
            "c": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "nullable": True},
        },
    }
    value, errors = validate_structural({"a": 1, "junk": True}, schema)
    assert value == {"a": 1, "b": "x"} and errors == []
    _, errors = validate_structural({"a": 0, "b": "y", "c": 0}, schema)
    assert [f for f, _ in errors] == ["a", "b", "c"]
    _, errors = validate_structural({"c": None}, schema)
    assert errors == [("a", "Required value")]
