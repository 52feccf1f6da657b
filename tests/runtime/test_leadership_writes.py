"""Every write asks first whether this replica still leads: Events and policy status included, not only the actions.

Before the fix the actuator asked ``can_act`` before each action's write, but an Event (the one following an
applied action, the InvalidSpec / MetricsStale / HPA warnings) was written without asking, and the policy statuses
were written after one question for all of them: a replica whose Lease could not be renewed mid-tick (a slow or
restarting apiserver: the renew deadline passes while the tick waits on a read) kept writing Events and statuses
that the new leader writes too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object

from autoscaler.adapters.kubernetes import KubeClusterWriter, WriterConfig
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.core.status import StatusUpdate
from autoscaler.ports import PolicyObject
from autoscaler.telemetry import Telemetry
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

T0 = 1_800_000_000.0


def make(
    objects: list[PolicyObject], util: dict[str, float], leader: dict[str, bool]
) -> tuple[Controller, FakeCluster, FakeStatus]:
    cluster = FakeCluster(deployments={key: [2, 2] for key in util})
    metrics = FakeMetrics(cluster)
    metrics.util.update(util)
    status = FakeStatus()
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=FakePolicies(objects),
        status_writer=status,
        telemetry=Telemetry(identity="test"),
        can_act=lambda: leader["value"],
    )
    return controller, cluster, status


def test_no_event_or_status_after_the_lease_is_lost_during_the_write() -> None:
    leader = {"value": True}
    c, cluster, status = make([policy_object(ServicePolicy("ml", "a", max_replicas=20))], {"ml/a": 140.0}, leader)
    original = cluster.scale_deployment

    def scale_then_lose_lease(namespace: str, name: str, replicas: int, **guards: object) -> None:
        original(namespace, name, replicas)
        leader["value"] = False  # the renew deadline passed while the write was in flight

    cluster.scale_deployment = scale_then_lose_lease  # type: ignore[method-assign]
    c.run_once(T0)
    assert [w.args for w in cluster.writes] == [("ml", "a", 4)]
    assert cluster.events == []  # the scale's Event would be a write by a replica that no longer leads
    assert status.writes == 0


def test_a_replica_that_does_not_lead_writes_no_warning_event() -> None:
    bad = PolicyObject("ml", "bad-policy", None, error="spec.maxReplicas: must be >= minReplicas", generation=1)
    c, cluster, status = make([bad], {}, {"value": False})
    c.run_once(T0)
    assert cluster.events == [] and status.writes == 0
    # leading again: the warning is written then (it was not remembered as written)
    c.can_act = lambda: True
    c.run_once(T0 + 15)
    assert [e["reason"] for e in cluster.events] == ["InvalidSpec"]
    assert status.writes == 1


def test_status_writes_stop_when_the_lease_is_lost_between_them() -> None:
    leader = {"value": True}
    objects = [policy_object(ServicePolicy("ml", n, max_replicas=20)) for n in ("a", "b")]
    c, _, status = make(objects, {"ml/a": 70.0, "ml/b": 70.0}, leader)
    original = status.update_policy_status

    def write_then_lose_lease(namespace: str, name: str, update: StatusUpdate, *, now: float, **guards: Any) -> None:
        original(namespace, name, update, now=now, **guards)
        leader["value"] = False

    status.update_policy_status = write_then_lose_lease  # type: ignore[method-assign]
    c.run_once(T0)
    assert status.writes == 1


def test_the_status_writer_asks_the_guard_right_before_its_write() -> None:
    """The writer reads the object before its PUT (with retries): a Lease lost during that read must stop the PUT.
    Before the fix the reporter handed the writer no guard, so the PUT went out anyway."""
    leader = {"value": True}
    c, _, status = make([policy_object(ServicePolicy("ml", "a", max_replicas=20))], {"ml/a": 70.0}, leader)
    original = status.update_policy_status

    def read_then_write(namespace: str, name: str, update: StatusUpdate, *, now: float, **guards: Any) -> None:
        leader["value"] = False  # the writer's GET retried past the renew deadline
        original(namespace, name, update, now=now, **guards)

    status.update_policy_status = read_then_write  # type: ignore[method-assign]
    c.run_once(T0)
    assert status.writes == 0 and status.refused == 1
    errors = c.telemetry.registry.get_sample_value("gpu_autoscaler_errors_total", {"component": "status_write"})
    assert not errors  # logged, not counted as an error: the leader writes it
    status.update_policy_status = original  # type: ignore[method-assign]
    leader["value"] = True
    c.run_once(T0 + 15)  # not remembered as written: the next tick that leads writes it
    assert status.writes == 1


def test_status_reports_the_generation_the_tick_decided_on() -> None:
    obj = dataclasses.replace(policy_object(ServicePolicy("ml", "a", max_replicas=20)), generation=3)
    c, _, status = make([obj], {"ml/a": 70.0}, {"value": True})
    c.run_once(T0)
    assert status.status[("ml", "a-policy")]["observedGeneration"] == 3


def test_no_status_put_after_the_lease_is_lost_during_the_real_writers_read(tmp_path: Path) -> None:
    """The same over the real KubeClusterWriter and the fake API server: its GET, then no PUT."""
    server = FakeApiServer().start()
    api = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        server.seed(o.policy_crd(), o.gpu_policy("chat-policy", "ml", target="chat"))
        writer = KubeClusterWriter(api, WriterConfig(reporting_instance="t"), clock=lambda: T0, sleep=lambda s: None)
        leader = {"value": True}
        get = writer._custom.get_namespaced_custom_object

        def get_then_lose_lease(*args: Any, **kwargs: Any) -> Any:
            out = get(*args, **kwargs)
            leader["value"] = False
            return out

        writer._custom.get_namespaced_custom_object = get_then_lose_lease  # type: ignore[method-assign]
        cluster = FakeCluster(deployments={"ml/chat": [2, 2]})
        metrics = FakeMetrics(cluster)
        metrics.util["ml/chat"] = 70.0
        c = Controller(
            metrics=metrics,
            cluster=cluster,
            writer=cluster,
            policies=FakePolicies([policy_object(ServicePolicy("ml", "chat", max_replicas=8))]),
            status_writer=writer,
            telemetry=Telemetry(identity="t"),
            can_act=lambda: leader["value"],
        )
        c.run_once(T0)
        assert [r.method for r in server.requests if r.method == "GET"]  # it did read
        assert [(r.method, r.path) for r in server.requests if r.method in ("PUT", "PATCH", "POST")] == []
    finally:
        api.close()
        server.stop()
