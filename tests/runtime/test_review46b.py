"""Review 46b: a pool's size and provider bounds read in one request (``size_and_bounds``, stop 46).

Findings as tests (strict xfails until fixed) and pins of the edges checked and found right: the Cluster API
adapter's one GET against its two separate reads (a pools mapping, an unknown pool, a MachineDeployment without
``spec.replicas`` or being deleted, ``api_calls``), and the controller's use of it (telemetry, a first read that
fails, the ``autoscaler plan`` command's read-only wrapper).
"""

from __future__ import annotations

import logging

import pytest

from autoscaler.commands.plan import ReadOnlyNodePools
from autoscaler.core.model import ScaleNodePool
from tests.runtime.test_provider_pool_bounds import T0, OneRead, stops, world

MD_PATH = "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi-system/machinedeployments"


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


# ---- findings --------------------------------------------------------------------------------------------------


def test_plan_command_reads_size_and_bounds_in_one_request_as_the_controller_does() -> None:
    """Fixed (was a strict xfail). ``autoscaler plan`` "reads exactly what autoscaler run reads": its node pools are
    the provider's wrapped read-only (``ReadOnlyNodePools``), which passed ``node_count`` and ``bounds`` on but not
    ``size_and_bounds``.

    WRONG: the plan read a Cluster API pool with two GETs (the scale subresource, then the MachineDeployment), where
    ``autoscaler run`` reads it with one -- and on a failed read it planned differently (a size read and a failed
    bounds read: the provider's size with the configured bounds; the controller leaves the pool to the snapshot).
    RIGHT: the wrapper offers the provider's ``size_and_bounds`` when it has one: one read per pool, as ``run``."""
    controller, cluster = world(provider_max=1)
    provider = OneRead(cluster)  # node_count or bounds beside size_and_bounds raise
    controller.node_pools = ReadOnlyNodePools(provider)
    plan = controller.run_once(T0)
    assert provider.reads == 1
    assert [a for a in plan.actions if isinstance(a, ScaleNodePool)] == []  # the provider's max of 1 is known
    assert stops(plan) >= 1
    assert any("provider allows at most 1" in n for n in plan.capacity.notes)


# ---- pins: the controller --------------------------------------------------------------------------------------


def test_pin_a_failed_one_read_counts_one_node_pool_error_per_pool_and_tick() -> None:
    controller, cluster = world(provider_max=1)
    controller.node_pools = OneRead(cluster, fail=True)
    controller.run_once(T0)
    assert controller.last_report is not None and controller.last_report.result == "ok"
    assert controller.telemetry.errors.labels(component="node_pool")._value.get() == 1


def test_pin_a_one_read_failing_before_any_bounds_were_read_leaves_the_pool_to_the_snapshot() -> None:
    """No bounds read yet: the pool is left out of the provider's sizes and planned within its configured bounds
    (nothing better is known), as with the two reads."""
    controller, cluster = world(provider_max=1)
    controller.node_pools = OneRead(cluster, fail=True)
    assert controller._pool_nodes() == ({}, None)


def test_pin_a_provider_without_size_and_bounds_is_read_as_before() -> None:
    """The fake cluster has ``node_count`` and ``bounds`` only: two reads, the same plan (the provider's max)."""
    controller, cluster = world(provider_max=1)
    assert not hasattr(cluster, "size_and_bounds")
    plan = controller.run_once(T0)
    assert [a for a in plan.actions if isinstance(a, ScaleNodePool)] == [] and stops(plan) >= 1
