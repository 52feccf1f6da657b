"""The fault proxy (fault_proxy.py) in front of the real apiserver, through the official client as the controller
builds it: what it does not touch arrives untouched, and each kind of fault reaches the client as the apiserver's
own errors would."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from autoscaler.adapters.kubernetes.config import load_api_client
from tests.realkube.control_plane import ControlPlane
from tests.realkube.fault_proxy import FaultProxy, status_body

pytestmark = [pytest.mark.integration, pytest.mark.realkube]


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy.for_control_plane(control_plane) as p:
        yield p


@pytest.fixture
def core(proxy: FaultProxy, control_plane: ControlPlane, tmp_path: Path) -> Iterator[client.CoreV1Api]:
    kubeconfig = proxy.write_kubeconfig(
        tmp_path / "proxied.kubeconfig", control_plane.tokens["admin"], control_plane.ca_file
    )
    api = load_api_client("kubeconfig", kubeconfig)
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def config_map(name: str, **data: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


CM = r"/api/v1/namespaces/[^/]+/configmaps"


def test_requests_without_a_rule_pass_through_untouched(
    proxy: FaultProxy, core: client.CoreV1Api, control_plane: ControlPlane, namespace: str
) -> None:
    created = core.create_namespaced_config_map(namespace, config_map("a", k="v"))
    direct = control_plane.get(f"/api/v1/namespaces/{namespace}/configmaps/a")
    assert direct["metadata"]["uid"] == created.metadata.uid and direct["data"] == {"k": "v"}
    patched = core.patch_namespaced_config_map("a", namespace, {"data": {"k": "w"}})
    assert patched.data == {"k": "w"}
    # The apiserver's own errors come back as they are.
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("nope", namespace)
    assert missing.value.status == 404 and json.loads(missing.value.body)["reason"] == "NotFound"
    # The bearer token went through: the write is the admin's.
    managers = {m["manager"] for m in direct["metadata"]["managedFields"]}
    assert managers == {"gpu-autoscaler"}, managers
    assert proxy.count("POST", CM, forwarded=True, ok=True) == 1
    assert proxy.count("GET", CM, forwarded=True, ok=False) == 1
    assert proxy.count(faulted=True) == 0


def test_status_faults_for_n_requests_then_through(proxy: FaultProxy, core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(namespace, config_map("a"))
    rule = proxy.inject("PATCH", CM + "/a$", 409, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as conflict:
            core.patch_namespaced_config_map("a", namespace, {"data": {"x": "1"}})
        body = json.loads(conflict.value.body)
        assert conflict.value.status == 409 and body["reason"] == "Conflict" and body["kind"] == "Status"
        assert body["details"] == {"kind": "configmaps", "name": "a"}
    assert core.patch_namespaced_config_map("a", namespace, {"data": {"x": "1"}}).data == {"x": "1"}
    assert rule.hits == 2 and proxy.count("PATCH", forwarded=True) == 1

    proxy.inject("GET", CM + "$", 429, retry_after=3)
    with pytest.raises(ApiException) as throttled:
        core.list_namespaced_config_map(namespace)
    assert throttled.value.status == 429 and throttled.value.headers["Retry-After"] == "3"
    assert json.loads(throttled.value.body)["details"]["retryAfterSeconds"] == 3
    proxy.clear()
    assert [c.metadata.name for c in core.list_namespaced_config_map(namespace).items] == ["a"]


def test_query_rules_and_skip(proxy: FaultProxy, core: client.CoreV1Api, namespace: str) -> None:
    proxy.inject("GET", CM + "$", 500, query=r"labelSelector=", skip=1)
    core.list_namespaced_config_map(namespace, label_selector="x=y")  # skipped
    core.list_namespaced_config_map(namespace)  # no labelSelector: not matched
    with pytest.raises(ApiException) as failed:
        core.list_namespaced_config_map(namespace, label_selector="x=y")
    assert failed.value.status == 500 and json.loads(failed.value.body)["reason"] == "InternalError"


def test_a_delay_longer_than_the_client_timeout_is_a_timeout(
    proxy: FaultProxy, core: client.CoreV1Api, namespace: str, control_plane: ControlPlane
) -> None:
    # The answer comes 5 s late; the client gives up at its 0.5 s timeout, long before (3 s leaves room for a TLS
    # handshake and the scheduling of a loaded machine; with a 2 s delay and a 1.5 s bound a slow moment failed it).
    proxy.inject("POST", CM + "$", delay_s=5.0, times=1)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.create_namespaced_config_map(namespace, config_map("slow"), _request_timeout=0.5)
    assert time.monotonic() - started < 3.0
    # ... and the write still happens once the delay is over (a slow server, not a failed one).
    control_plane.wait(
        "the slow create", lambda: control_plane.exists(f"/api/v1/namespaces/{namespace}/configmaps/slow")
    )


def test_dropped_before_the_answer(proxy: FaultProxy, core: client.CoreV1Api, namespace: str) -> None:
    proxy.inject("GET", CM + "$", drop="before", times=1)
    with pytest.raises(urllib3.exceptions.HTTPError):  # ProtocolError: connection reset, no answer
        core.list_namespaced_config_map(namespace)
    assert proxy.count("GET", CM, forwarded=False) == 1
    core.list_namespaced_config_map(namespace)  # the next one passes


def test_a_list_cut_mid_body(proxy: FaultProxy, core: client.CoreV1Api, namespace: str) -> None:
    for i in range(3):
        core.create_namespaced_config_map(namespace, config_map(f"c{i}", blob="x" * 2000))
    proxy.inject("GET", CM + "$", drop="mid", drop_after_bytes=500, times=1)
    with pytest.raises(urllib3.exceptions.HTTPError):  # IncompleteRead / connection broken
        core.list_namespaced_config_map(namespace)
    assert len(core.list_namespaced_config_map(namespace).items) == 3


def test_a_watch_streams_through_and_a_dropped_watch_breaks_mid_stream(
    proxy: FaultProxy, core: client.CoreV1Api, namespace: str, control_plane: ControlPlane
) -> None:
    core.create_namespaced_config_map(namespace, config_map("first"))
    # Untouched: the existing object, then one created while watching, streamed as they happen.
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_config_map, namespace, timeout_seconds=20, _request_timeout=30):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 1:
            control_plane.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", config_map("second"))
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "first"), ("ADDED", "second")]

    # Dropped: whatever arrived in the first second is relayed, then the connection is cut.
    proxy.inject("GET", CM + "$", query=r"watch=", drop="mid", drop_after_s=1.0)
    got = []
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):  # ProtocolError: the chunked stream broke
        for event in watch.Watch().stream(
            core.list_namespaced_config_map, namespace, timeout_seconds=20, _request_timeout=30
        ):
            got.append(event["object"].metadata.name)
    assert sorted(got) == ["first", "second"] and time.monotonic() - started < 10


def test_status_body_is_the_apiservers_shape() -> None:
    body = json.loads(status_body(503, "/apis/apps/v1/namespaces/ml/deployments/chat/scale", None, None, 1))
    assert body["reason"] == "ServiceUnavailable" and body["code"] == 503
    assert body["details"] == {"kind": "deployments", "group": "apps", "name": "chat", "retryAfterSeconds": 1}
