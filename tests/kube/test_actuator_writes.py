"""The actuator hands the writer what it decided from and who may write (issue: safety review of the scale write).

- A scale carries ``previous_replicas``: a Deployment somebody else scaled between the tick's read and our PATCH is
  not written (``skipped``), in either direction, so a conflict never turns a scale-up into a scale-down.
- ``can_act`` is asked by the writer immediately before every request that changes something: a lease lost while the
  writer was reading (its read retries can outlast the lease) sends nothing (``not_leader``).

Against the fake API server with the real ``KubeClusterWriter`` (exact races between a read and a write), and with
the in-memory ``FakeCluster``. A node-pool resize carries the size the plan counted the same way (``expected``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig
from autoscaler.core.cluster import PodInfo
from autoscaler.core.model import EvictPod, ScaleDeployment, ScaleNodePool
from autoscaler.core.reasons import Reason
from autoscaler.fakes.cluster import FakeCluster
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NS = "ml"


def kube_writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="test-0"), sleep=lambda s: None)


def after_first_scale_read(w: KubeClusterWriter, race: Callable[[], None]) -> None:
    """Run ``race`` right after the writer's first read of the scale subresource (before its PATCH)."""
    original = w._apps.read_namespaced_deployment_scale
    calls = {"n": 0}

    def read(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            race()
        return result

    w._apps.read_namespaced_deployment_scale = read  # type: ignore[method-assign]


def scale_to(apiserver: FakeApiServer, replicas: int) -> Callable[[], None]:
    def someone_else_scales() -> None:
        dep = apiserver.get("apps/v1", "Deployment", "chat", NS)
        dep["spec"]["replicas"] = replicas
        apiserver.update_object(dep)

    return someone_else_scales


def replicas(apiserver: FakeApiServer) -> int:
    return int(apiserver.get("apps/v1", "Deployment", "chat", NS)["spec"]["replicas"])


def writes(apiserver: FakeApiServer) -> list[tuple[str, str, int]]:
    return [(r.method, r.path, r.status) for r in apiserver.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")]


def context() -> GuardContext:
    return GuardContext(time.time(), {})


# (tick saw, decided, somebody else scaled to, between the tick's read and our PATCH)
RACES = [
    pytest.param(4, 5, 10, id="up-raced-higher"),  # the old writer wrote 10 -> 5: a scale-down from a scale-up
    pytest.param(4, 5, 2, id="up-raced-lower"),
    pytest.param(6, 3, 10, id="down-raced-higher"),
    pytest.param(6, 3, 1, id="down-raced-lower"),  # the old writer wrote 1 -> 3: a scale-up from a scale-down
]


@pytest.mark.parametrize(("seen", "target", "raced"), RACES)
def test_a_scale_raced_by_another_writer_is_skipped_not_written(
    apiserver: FakeApiServer, api_client: client.ApiClient, seen: int, target: int, raced: int
) -> None:
    apiserver.seed(o.deployment("chat", NS, replicas=seen))
    w = kube_writer(api_client)
    after_first_scale_read(w, scale_to(apiserver, raced))
    errors: list[str] = []
    actuator = Actuator(w, on_error=errors.append)
    action = ScaleDeployment(NS, "chat", target, seen, Reason.METRIC_ABOVE_TARGET, "test")
    (result,) = actuator.apply([action], context())
    assert replicas(apiserver) == raced  # never lowered for a scale-up, never raised for a scale-down
    assert result.result == "skipped"
    assert f"changed from {seen} to {raced} replicas since the tick read it" in result.message
    assert "the next tick decides on fresh data" in result.message
    assert [(m, s) for m, _, s in writes(apiserver)] == [("PATCH", 409)]  # no Event either: nothing was applied
    assert errors == []  # not an error of ours: somebody else wrote


def test_a_scale_whose_replicas_are_as_the_tick_saw_them_is_written(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.deployment("chat", NS, replicas=4))
    actuator = Actuator(kube_writer(api_client))
    (result,) = actuator.apply([ScaleDeployment(NS, "chat", 5, 4, Reason.METRIC_ABOVE_TARGET, "test")], context())
    assert result.result == "applied" and replicas(apiserver) == 5


def test_a_lease_lost_during_the_writers_read_sends_no_patch(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """The actuator's can_act() said yes; the writer's read then took long enough for the lease to go (here: it is
    lost right after the read). The PATCH is not sent, and neither is the Event."""
    apiserver.seed(o.deployment("chat", NS, replicas=4))
    w = kube_writer(api_client)
    leader = {"value": True}

    def lose_the_lease() -> None:
        leader["value"] = False

    after_first_scale_read(w, lose_the_lease)
    errors: list[str] = []
    actuator = Actuator(w, can_act=lambda: leader["value"], on_error=errors.append)
    (result,) = actuator.apply([ScaleDeployment(NS, "chat", 6, 4, Reason.METRIC_ABOVE_TARGET, "test")], context())
    assert result.result == "not_leader" and "not the leader any more" in result.message
    assert writes(apiserver) == []
    assert replicas(apiserver) == 4
    assert errors == []


def test_a_lease_lost_between_conflict_rounds_sends_no_second_patch(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.deployment("chat", NS, replicas=4))
    w = kube_writer(api_client)
    leader = {"value": True}

    def relabel_and_lose_the_lease() -> None:
        dep = apiserver.get("apps/v1", "Deployment", "chat", NS)
        dep["metadata"].setdefault("labels", {})["touched"] = "yes"  # our PATCH gets 409
        apiserver.update_object(dep)

    after_first_scale_read(w, relabel_and_lose_the_lease)
    original_patch = w._apps.patch_namespaced_deployment_scale

    def patch(*args: Any, **kwargs: Any) -> Any:
        try:
            return original_patch(*args, **kwargs)
        finally:
            leader["value"] = False  # the renew deadline passed while the 409 round trip and the re-read took

    w._apps.patch_namespaced_deployment_scale = patch  # type: ignore[method-assign]
    actuator = Actuator(w, can_act=lambda: leader["value"])
    (result,) = actuator.apply([ScaleDeployment(NS, "chat", 6, 4, Reason.METRIC_ABOVE_TARGET, "test")], context())
    assert result.result == "not_leader"
    assert [(m, s) for m, _, s in writes(apiserver)] == [("PATCH", 409)]
    assert replicas(apiserver) == 4


def test_a_lease_lost_before_a_gangs_dry_runs_evicts_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.pod("w-0", NS), o.pod("w-1", NS))
    answers = iter([True])  # the gang's can_act() says yes; the writer's, before its first dry run, says no
    actuator = Actuator(kube_writer(api_client), can_act=lambda: next(answers, False))
    gang = [EvictPod(NS, n, Reason.PREEMPT_FOR_INFERENCE, "test", gang="g1") for n in ("w-0", "w-1")]
    results = actuator.apply(gang, context())
    assert [r.result for r in results] == ["not_leader", "not_leader"]
    assert writes(apiserver) == []


def test_an_event_refused_by_the_writers_guard_is_not_an_error_and_is_retried(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(o.deployment("chat", NS))
    answers = iter([True])  # the actuator's check says yes, the writer's (just before the POST) no
    errors: list[str] = []
    actuator = Actuator(kube_writer(api_client), can_act=lambda: next(answers, False), on_error=errors.append)
    actuator.event(("Deployment", NS, "chat"), "Recommend", "would scale", "Normal", topic="action")
    assert writes(apiserver) == [] and errors == []
    assert actuator.reported == {}  # not remembered as written: the leader writes it
    actuator.can_act = lambda: True
    actuator.event(("Deployment", NS, "chat"), "Recommend", "would scale", "Normal", topic="action")
    assert [m for m, _, _ in writes(apiserver)] == ["POST"]


# ---- the in-memory fake follows the same contract -------------------------------------------------------------


@pytest.mark.parametrize(("seen", "target", "raced"), RACES)
def test_the_fake_cluster_skips_a_raced_scale_too(seen: int, target: int, raced: int) -> None:
    cluster = FakeCluster()
    cluster.add_deployment(NS, "chat", raced)
    (result,) = Actuator(cluster).apply(
        [ScaleDeployment(NS, "chat", target, seen, Reason.METRIC_ABOVE_TARGET, "t")], context()
    )
    assert result.result == "skipped"
    assert cluster.deployments[f"{NS}/chat"].spec_replicas == raced
    assert [w.outcome for w in cluster.writes] == ["changed"] and cluster.events == []


def test_the_fake_cluster_asks_the_guard_before_changing_anything() -> None:
    cluster = FakeCluster()
    cluster.add_deployment(NS, "chat", 4)
    cluster.add_pod(PodInfo(NS, "w-0", "gpu-0", 1, 0, "Running", True))
    asked = {"n": 0}

    def yes_then_no() -> bool:  # for each action: the actuator's check says yes, the fake's (just before) no
        asked["n"] += 1
        return asked["n"] % 2 == 1

    actuator = Actuator(cluster, can_act=yes_then_no)
    actions = [
        ScaleDeployment(NS, "chat", 5, 4, Reason.METRIC_ABOVE_TARGET, "t"),
        EvictPod(NS, "w-0", Reason.PREEMPT_FOR_INFERENCE, "t"),
    ]
    assert [r.result for r in actuator.apply(actions, context())] == ["not_leader", "not_leader"]
    assert cluster.deployments[f"{NS}/chat"].spec_replicas == 4 and f"{NS}/w-0" in cluster.pods
    assert [w.outcome for w in cluster.writes] == ["not_allowed", "not_allowed"]



@pytest.mark.parametrize(
    ("live", "counted", "planned", "result", "after"),
    [
        # 5 nodes requested, 3 registered, the provider's size unreadable this tick: the plan counted 3 and wants 4;
        # the absolute write would have shrunk the pool 5 -> 4 (a running node deleted for a scale-up)
        (5, 3, 4, "skipped", 5),
        (3, 3, 4, "applied", 4),  # the plan saw the live size
        (6, 4, 3, "skipped", 6),  # a scale-down planned from 4 while another writer (Cluster Autoscaler) grew it
        (4, 5, 4, "unchanged", 4),  # already what the plan wants: nothing to write, not an error
    ],
)
def test_a_pool_resize_from_a_size_the_plan_did_not_see_is_skipped(
    live: int, counted: int, planned: int, result: str, after: int
) -> None:
    cluster = FakeCluster()
    cluster.add_pool("burst", live, gpus_per_node=8)
    reason = Reason.BURST_SCALE_UP if planned > counted else Reason.BURST_SCALE_DOWN
    action = ScaleNodePool("burst", planned, counted, reason, "t")
    (got,) = Actuator(cluster, node_pools=cluster).apply([action], context())
    assert (got.result, cluster.pools["burst"].size) == (result, after)
    if result == "skipped":
        assert f"size is {live}, not the {counted}" in got.message
