"""A GPUScalingPolicy's status is written only to the incarnation of the object it was decided for (metadata.uid).

Before the fix, a policy deleted and created again under the same name between the tick's policy read and the status
write (or between the writer's own read and its PUT retry after a 409) got the old object's status: its
observedGeneration (3 on an object at generation 1), conditions, replicas and lastAction, as if the controller had
already processed the new spec. The writer now takes the uid the tick read: it writes only when the object it reads
has that uid, carries the uid in the PUT's metadata (a precondition for the real apiserver: 409 "Precondition failed:
UID in precondition" when it differs), and otherwise skips the write without an error.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator
from autoscaler.adapters.kubernetes import KubeClusterWriter, PolicyLoader, StatusUpdate, WriterConfig
from autoscaler.adapters.kubernetes._api import KubeApiError
from autoscaler.app import KubePolicySource
from autoscaler.core.model import Plan
from autoscaler.reporting import TickReport, TickReporter
from autoscaler.telemetry import Telemetry
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
API = "gpuautoscaler.dev/v1alpha1"
KIND = "GPUScalingPolicy"


def writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), clock=lambda: NOW, sleep=lambda s: None)


def seed_old(apiserver: FakeApiServer) -> str:
    """The policy as the tick read it: its spec edited twice (generation 3). Returns its uid."""
    old = o.gpu_policy("chat", "ml", minReplicas=1, maxReplicas=8)
    old["metadata"]["generation"] = 3
    apiserver.seed(o.policy_crd(), old)
    stored = apiserver.get(API, KIND, "chat", "ml")
    assert stored is not None
    return str(stored["metadata"]["uid"])


def recreate(apiserver: FakeApiServer) -> str:
    """kubectl delete + kubectl apply: a new object under the same name (new uid, generation 1, no status)."""
    apiserver.delete_object(API, KIND, "chat", "ml")
    apiserver.seed(o.gpu_policy("chat", "ml", minReplicas=2, maxReplicas=4))
    stored = apiserver.get(API, KIND, "chat", "ml")
    assert stored is not None and stored["metadata"]["generation"] == 1
    return str(stored["metadata"]["uid"])


def current(apiserver: FakeApiServer) -> dict[str, Any]:
    stored = apiserver.get(API, KIND, "chat", "ml")
    assert stored is not None
    return stored


def put_bodies(apiserver: FakeApiServer) -> list[Any]:
    return [r.body for r in apiserver.requests if r.method == "PUT"]


UPDATE = StatusUpdate(current_replicas=3, desired_replicas=5)


# ---- through the reporter: what one tick does ---------------------------------------------------------------------


def test_a_policy_recreated_between_the_ticks_read_and_its_status_write_keeps_an_empty_status(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    seed_old(apiserver)
    source = KubePolicySource(PolicyLoader(api_client, ["ml"]))
    (listed,) = source.list_policies()  # the tick's read
    assert listed.policy is not None and listed.generation == 3 and listed.uid
    new_uid = recreate(apiserver)
    w = writer(api_client)
    telemetry = Telemetry(identity="test")
    reporter = TickReporter(telemetry, Actuator(w), status_writer=w)
    plan = Plan(NOW)
    reporter.statuses([listed], {listed.policy.key: listed.policy}, plan, TickReport(NOW, plan), NOW)
    new = current(apiserver)
    assert new["metadata"]["uid"] == new_uid
    # before the fix: status.observedGeneration 3 (and conditions at generation 3) on an object at generation 1
    assert not new.get("status"), new.get("status")
    assert apiserver.request_count("PUT") == 0
    errors = telemetry.registry.get_sample_value("gpu_autoscaler_errors_total", {"component": "status_write"})
    assert not errors  # skipped, not an error

    # the next tick reads the new object and writes its own status
    objects = source.list_policies()
    (relisted,) = objects
    assert relisted.uid == new_uid and relisted.policy is not None
    reporter.forget_unlisted(objects)
    reporter.statuses(objects, {relisted.policy.key: relisted.policy}, plan, TickReport(NOW, plan), NOW)
    status = current(apiserver)["status"]
    assert status["observedGeneration"] == 1
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])


# ---- the writer ---------------------------------------------------------------------------------------------------


def test_a_write_for_a_deleted_incarnation_is_skipped(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    old_uid = seed_old(apiserver)
    recreate(apiserver)
    w = writer(api_client)
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is False
    assert apiserver.request_count("PUT") == 0
    assert not current(apiserver).get("status")


def test_a_recreation_between_the_writers_read_and_its_put_is_refused_and_skipped(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The PUT carries the resourceVersion and the uid read: the server refuses it (409), and the fresh read of the
    conflict retry finds another uid: nothing is written, no error."""
    old_uid = seed_old(apiserver)
    w = writer(api_client)
    original = w._custom.get_namespaced_custom_object
    reads = {"n": 0}

    def recreated_after_the_first_read(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        reads["n"] += 1
        if reads["n"] == 1:
            recreate(apiserver)
        return result

    w._custom.get_namespaced_custom_object = recreated_after_the_first_read  # type: ignore[method-assign]
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is False
    assert [r.status for r in apiserver.requests if r.method == "PUT"] == [409]
    (body,) = put_bodies(apiserver)
    assert body["metadata"]["uid"] == old_uid  # the precondition the real apiserver checks
    assert not current(apiserver).get("status")


def test_a_recreation_between_a_404_put_and_the_check_read_is_skipped(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Deleted before the PUT (404) and created again before the writer's read that tells "gone" from "no status
    subresource": the object meant is gone, which is no error."""
    old_uid = seed_old(apiserver)
    w = writer(api_client)
    original = w._custom.replace_namespaced_custom_object_status

    def deleted_then_recreated(*args: Any, **kwargs: Any) -> Any:
        apiserver.delete_object(API, KIND, "chat", "ml")
        try:
            return original(*args, **kwargs)
        finally:
            recreate_without_delete(apiserver)

    w._custom.replace_namespaced_custom_object_status = deleted_then_recreated  # type: ignore[method-assign]
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is False
    assert [r.status for r in apiserver.requests if r.method == "PUT"] == [404]
    assert not current(apiserver).get("status")


def recreate_without_delete(apiserver: FakeApiServer) -> None:
    apiserver.seed(o.gpu_policy("chat", "ml", minReplicas=2, maxReplicas=4))


def test_the_same_incarnation_is_written_with_its_uid_in_the_put(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    old_uid = seed_old(apiserver)
    w = writer(api_client)
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is True
    status = current(apiserver)["status"]
    assert status["observedGeneration"] == 3 and status["desiredReplicas"] == 5
    (body,) = put_bodies(apiserver)
    assert body["metadata"]["uid"] == old_uid
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is False  # no change


def test_a_conflict_on_the_same_incarnation_is_still_retried(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Another client's write between the read and the PUT (same uid): 409, fresh read, written."""
    old_uid = seed_old(apiserver)
    w = writer(api_client)
    original = w._custom.get_namespaced_custom_object
    reads = {"n": 0}

    def changed_after_the_first_read(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        reads["n"] += 1
        if reads["n"] == 1:
            apiserver.update_object(dict(current(apiserver), metadata=dict(current(apiserver)["metadata"])))
        return result

    w._custom.get_namespaced_custom_object = changed_after_the_first_read  # type: ignore[method-assign]
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is True
    assert [r.status for r in apiserver.requests if r.method == "PUT"] == [409, 200]
    assert current(apiserver)["status"]["desiredReplicas"] == 5


def test_without_a_uid_the_writer_behaves_as_before(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    """A caller that passes no uid (a status port plug-in written before it): whatever object has the name is
    written."""
    seed_old(apiserver)
    new_uid = recreate(apiserver)
    w = writer(api_client)
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW) is True
    new = current(apiserver)
    assert new["metadata"]["uid"] == new_uid and new["status"]["observedGeneration"] == 1


def test_a_policy_deleted_and_not_recreated_is_still_no_error(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    old_uid = seed_old(apiserver)
    apiserver.delete_object(API, KIND, "chat", "ml")
    w = writer(api_client)
    assert w.update_policy_status("ml", "chat", UPDATE, now=NOW, generation=3, uid=old_uid) is False
    assert apiserver.request_count("PUT") == 0


def test_other_failures_with_a_uid_still_raise(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    old_uid = seed_old(apiserver)
    w = writer(api_client)
    with pytest.raises(KubeApiError) as err:
        w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=-1), now=NOW, uid=old_uid)  # 422
    assert err.value.status == 422
