"""Review 32 of the Kubernetes write side: each test reproduces a defect found in review (it failed on the code before
the fix), against the fake API server."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kubernetes import KubeClusterWriter, StatusUpdate, WriterConfig
from autoscaler.adapters.kubernetes._api import KubeApiError, with_read_retries
from tests.kube import objects as o
from tests.kube.fake_apiserver import _DNS_SUBDOMAIN, FakeApiServer

NOW = 1_800_000_000.0


def writer(api: client.ApiClient, **kw: Any) -> KubeClusterWriter:
    cfg = WriterConfig(reporting_instance="test-0", **kw)
    return KubeClusterWriter(api, cfg, clock=lambda: NOW, sleep=lambda s: None)


# ---- Event names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("event_api", ["events.k8s.io/v1", "v1"])
@pytest.mark.parametrize("at_the_cut", ["-", "."])
def test_an_event_on_an_object_with_a_long_name_gets_a_valid_name(
    apiserver: FakeApiServer, api_client: client.ApiClient, event_api: str, at_the_cut: str
) -> None:
    """The Event's name was the object's name cut at 200 characters + "." + a digest. A cut that ends in "-" or "."
    gives "...-.digest" or "...\\.\\.digest", not an RFC 1123 subdomain: the API server refused every Event on
    such an object (422), e.g. a pod of a long-named Job or a custom resource with a 250-character name."""
    name = "a" * (200 - len(at_the_cut)) + at_the_cut + "b" * 40  # the cut at 200 ends with at_the_cut
    assert len(name) <= 253 and _DNS_SUBDOMAIN.match(name)
    w = writer(api_client, event_api=event_api)
    w.emit_event("Pod", "ml", name, "PreemptForInference", "for inference")
    w.emit_event("Pod", "ml", name, "PreemptForInference", "for inference")  # the dedup path finds it again
    (event,) = apiserver.objects(event_api, "Event")
    assert _DNS_SUBDOMAIN.match(event["metadata"]["name"]) and len(event["metadata"]["name"]) <= 253
    ref = event["regarding"] if event_api == "events.k8s.io/v1" else event["involvedObject"]
    assert ref["name"] == name
    count = event["series"]["count"] if event_api == "events.k8s.io/v1" else event["count"]
    assert count == 2


# ---- Event series when the Event went away -----------------------------------------------------------------------


@pytest.mark.parametrize("event_api", ["events.k8s.io/v1", "v1"])
def test_an_event_that_expires_between_the_conflict_and_the_bump_is_created_again(
    apiserver: FakeApiServer, api_client: client.ApiClient, event_api: str
) -> None:
    """create -> 409 AlreadyExists -> GET to bump its count -> 404: the Event was deleted in between (the API
    server's Event TTL, 1 h by default, or somebody's cleanup). The occurrence was lost and a PortError counted
    as a failed event write; it is now created again."""
    w = writer(api_client, event_api=event_api)
    w.emit_event("Pod", "ml", "p0", "PreemptForInference", "for inference")
    (first,) = apiserver.objects(event_api, "Event")
    api = w._events if event_api == "events.k8s.io/v1" else w._core
    original = api.read_namespaced_event
    calls = {"n": 0}

    def expires_first(name: str, namespace: str, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            apiserver.delete_object(event_api, "Event", name, namespace)
        return original(name, namespace, **kwargs)

    api.read_namespaced_event = expires_first  # type: ignore[method-assign,assignment]
    w.emit_event("Pod", "ml", "p0", "PreemptForInference", "for inference")
    (event,) = apiserver.objects(event_api, "Event")
    assert event["metadata"]["name"] == first["metadata"]["name"]
    assert event["metadata"]["uid"] != first["metadata"]["uid"]  # a new Event, first of its series
    assert [r.status for r in apiserver.requests if r.method == "POST"] == [201, 409, 201]


# ---- status of a policy deleted meanwhile ------------------------------------------------------------------------


def test_a_status_write_to_a_policy_deleted_before_the_read_is_not_an_error(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The tick listed the policy; it was deleted before its status write. There is no status left to write: the
    write raised a PortError (an ``errors_total{component="status_write"}`` and a warning every time a policy is
    deleted), where the workload writes already count a 404 as done."""
    apiserver.seed(o.policy_crd())
    w = writer(api_client)
    assert w.update_policy_status("ml", "gone", StatusUpdate(current_replicas=3), generation=1) is False
    assert apiserver.request_count("PUT") == 0


def test_a_status_write_to_a_policy_deleted_between_the_read_and_the_put_is_not_an_error(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.policy_crd(), o.gpu_policy("chat", "ml"))
    w = writer(api_client)
    original = w._custom.get_namespaced_custom_object

    def deleted_after_the_read(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        apiserver.delete_object("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml")
        return result

    w._custom.get_namespaced_custom_object = deleted_after_the_read  # type: ignore[method-assign]
    assert w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=3), generation=1) is False
    assert [r.status for r in apiserver.requests if r.method == "PUT"] == [404]
    assert apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml") is None  # not re-created


def test_other_status_write_failures_still_raise(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(o.policy_crd(), o.gpu_policy("chat", "ml"))
    w = writer(api_client)
    with pytest.raises(KubeApiError) as err:
        w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=-1))  # refused by the schema: 422
    assert err.value.status == 422


# ---- Retry-After -------------------------------------------------------------------------------------------------


def _throttled(retry_after: str) -> KubeApiError:
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers = {"Retry-After": retry_after}
    exc.body = '{"kind":"Status","reason":"TooManyRequests","message":"slow down"}'
    return KubeApiError.from_exception("list pods", exc)


@pytest.mark.parametrize("header", ["-5", "nan", "inf", "-inf"])
def test_a_retry_after_that_is_no_duration_does_not_break_the_retry(header: str) -> None:
    """``Retry-After: -5`` (or nan) from a proxy in front of the API server became the sleep's argument:
    ``time.sleep`` raised ValueError, which is no PortError, out of a read that should have been retried."""
    error = _throttled(header)
    assert error.retry_after_s is None or (math.isfinite(error.retry_after_s) and error.retry_after_s >= 0)
    calls = {"n": 0}

    def op() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return "ok"

    assert with_read_retries("list pods", op, retries=2, backoff_s=0.0, max_backoff_s=0.0, sleep=time.sleep) == "ok"


def test_a_valid_retry_after_is_still_honoured() -> None:
    assert _throttled("3").retry_after_s == 3.0
    assert _throttled("0").retry_after_s == 0.0
    assert _throttled("Wed, 21 Oct 2015 07:28:00 GMT").retry_after_s is None


def test_a_404_of_the_status_subresource_of_a_live_policy_still_raises(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """A CRD installed without ``subresources.status`` answers 404 to every status PUT while the object exists:
    that stays an error (counted, warned), not a silent "deleted"."""
    crd = o.policy_crd()
    for version in crd["spec"]["versions"]:
        version.pop("subresources", None)
    apiserver.seed(crd, o.gpu_policy("chat", "ml"))
    w = writer(api_client)
    with pytest.raises(KubeApiError) as err:
        w.update_policy_status("ml", "chat", StatusUpdate(current_replicas=3), generation=1)
    assert err.value.status == 404
    assert apiserver.get("gpuautoscaler.dev/v1alpha1", "GPUScalingPolicy", "chat", "ml") is not None
