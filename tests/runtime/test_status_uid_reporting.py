"""The status a tick decided is written only to the GPUScalingPolicy object the tick read (its metadata.uid).

Before the fix, a policy deleted and created again under the same name between the tick's policy read and its
status write got the status decided for the deleted one: its observedGeneration (3 on a new object at generation 1),
its conditions and replicas, so the new object looked as if the controller had already processed its spec. The
reporter now hands the uid the tick read to the status writer, which skips a write meant for another incarnation
(no error: the next tick reads the new object and writes its own status).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from runtime_fakes import FakeCluster, FakeMetrics, FakePolicies, FakeStatus, policy_object

from autoscaler.controller import Controller
from autoscaler.core.model import ServicePolicy
from autoscaler.ports import PolicyObject
from autoscaler.telemetry import Telemetry

T0 = 1_800_000_000.0
KEY = "ml/chat"
IDENT = ("ml", "chat-policy")
POLICY = ServicePolicy("ml", "chat", min_replicas=1, max_replicas=20, target=70.0)


class RecreatedAfterTheRead(FakePolicies):
    """Lists the objects, then (once, when armed) the object is deleted and created again under its name."""

    def __init__(self, objects: Sequence[PolicyObject], status: FakeStatus) -> None:
        super().__init__(objects)
        self.status = status
        self.recreate_as: str | None = None

    def list_policies(self) -> Sequence[PolicyObject]:
        listed = super().list_policies()
        if self.recreate_as is not None:
            self.status.recreate(*IDENT, self.recreate_as)
            self.recreate_as = None
        return listed


def make() -> tuple[Controller, RecreatedAfterTheRead, FakeStatus]:
    cluster = FakeCluster(deployments={KEY: [2, 2]})
    metrics = FakeMetrics(cluster)
    metrics.util[KEY] = 70.0
    status = FakeStatus()
    old = dataclasses.replace(policy_object(POLICY), uid="uid-old", generation=3)  # its spec edited twice
    status.uids[IDENT] = "uid-old"
    policies = RecreatedAfterTheRead([old], status)
    controller = Controller(
        metrics=metrics,
        cluster=cluster,
        writer=cluster,
        policies=policies,
        status_writer=status,
        telemetry=Telemetry(identity="test"),
    )
    return controller, policies, status


def status_errors(c: Controller) -> float:
    value = c.telemetry.registry.get_sample_value("gpu_autoscaler_errors_total", {"component": "status_write"})
    return value or 0.0


def test_a_policy_recreated_between_the_read_and_the_status_write_does_not_get_the_old_status() -> None:
    c, policies, status = make()
    c.run_once(T0)
    assert status.status[IDENT]["observedGeneration"] == 3  # the old object's own status
    c.metrics.util[KEY] = 140.0  # type: ignore[attr-defined]  # a new status to write (desiredReplicas 4)
    policies.recreate_as = "uid-new"  # deleted and re-created (generation 1, empty status) right after the read
    c.run_once(T0 + 15)
    assert IDENT not in status.status  # before the fix: observedGeneration 3, desiredReplicas 4, conditions...
    assert status.skipped == 1
    assert status_errors(c) == 0  # skipped, not an error
    # the next tick reads the new object and writes its own status
    policies.objects = [dataclasses.replace(policy_object(POLICY), uid="uid-new", generation=1)]
    c.run_once(T0 + 30)
    assert status.status[IDENT]["observedGeneration"] == 1
    assert {cond["type"] for cond in status.status[IDENT]["conditions"]} >= {"Ready", "MetricsStale"}


def test_the_first_status_of_a_policy_recreated_before_its_write_is_not_written_to_the_new_one() -> None:
    c, policies, status = make()
    policies.recreate_as = "uid-new"
    c.run_once(T0)
    assert IDENT not in status.status
    assert status.skipped == 1 and status.writes == 0
    assert status_errors(c) == 0


def test_the_same_object_is_written_as_before() -> None:
    c, _, status = make()
    c.run_once(T0)
    assert status.writes == 1 and status.skipped == 0
    assert status.status[IDENT]["currentReplicas"] == 2


def test_a_policy_without_a_uid_is_written_as_before() -> None:
    """Objects without a uid (older sources, the simulator) and writers that know none: no check."""
    c, policies, status = make()
    policies.objects = [policy_object(POLICY)]  # uid None
    policies.recreate_as = "uid-new"
    c.run_once(T0)
    assert status.writes == 1 and status.skipped == 0
    assert status.status[IDENT]["observedGeneration"] == 1
