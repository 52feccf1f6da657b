"""Review 46b: a pool's size and provider bounds read in one request (``size_and_bounds``, stop 46).

Findings as tests (strict xfails until fixed) and pins of the edges checked and found right: the Cluster API
adapter's one GET against its two separate reads (a pools mapping, an unknown pool, a MachineDeployment without
``spec.replicas`` or being deleted, ``api_calls``), and the controller's use of it (telemetry, a first read that
fails, the ``autoscaler plan`` command's read-only wrapper).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.adapters.kubernetes import MachineDeploymentNodePools
from autoscaler.adapters.kubernetes.config import load_api_client
from autoscaler.adapters.kubernetes.nodepool import UnknownPoolError
from autoscaler.commands.plan import ReadOnlyNodePools
from autoscaler.core.model import ScaleNodePool
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.runtime.test_provider_pool_bounds import T0, OneRead, stops, world

MD_PATH = "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi-system/machinedeployments"


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="autoscaler")


@pytest.fixture
def capi(tmp_path: Path) -> Iterator[tuple[FakeApiServer, object]]:
    server = FakeApiServer().start()
    api = load_api_client("kubeconfig", server.write_kubeconfig(tmp_path / "kubeconfig.yaml"))
    try:
        yield server, api
    finally:
        api.close()
        server.stop()


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


# ---- pins: the adapter -----------------------------------------------------------------------------------------


def test_pin_size_and_bounds_reads_the_mapped_machine_deployment_with_one_call(capi) -> None:  # type: ignore[no-untyped-def]
    """With ``pools={...}`` the pool name is mapped to its MachineDeployment as ``node_count`` and ``bounds`` map
    it; ``api_calls`` counts the one request."""
    server, api = capi
    server.seed(o.machine_deployment_crd(), o.machine_deployment("md-burst", replicas=3, min_size=1, max_size=5))
    pools = MachineDeploymentNodePools(api, "capi-system", {"burst": "md-burst"}, sleep=lambda s: None)
    before, calls = len(server.requests), pools.api_calls
    assert pools.size_and_bounds("burst") == (3, (1, 5))
    assert pools.api_calls == calls + 1
    assert [(r.method, r.path) for r in server.requests[before:]] == [("GET", f"{MD_PATH}/md-burst")]
    assert pools.size_and_bounds("burst") == (pools.node_count("burst"), pools.bounds("burst"))


def test_pin_size_and_bounds_of_an_unknown_pool_raises_and_sends_nothing(capi) -> None:  # type: ignore[no-untyped-def]
    server, api = capi
    server.seed(o.machine_deployment_crd(), o.machine_deployment("md-burst", replicas=3))
    pools = MachineDeploymentNodePools(api, "capi-system", {"burst": "md-burst"}, sleep=lambda s: None)
    before, calls = len(server.requests), pools.api_calls
    with pytest.raises(UnknownPoolError, match="'other'"):
        pools.size_and_bounds("other")
    assert len(server.requests) == before and pools.api_calls == calls


@pytest.mark.parametrize("case", ["spec.replicas absent", "being deleted"])
def test_pin_size_and_bounds_agrees_with_node_count(capi, case: str) -> None:  # type: ignore[no-untyped-def]
    """The scale subresource of a custom resource reads a missing ``spec.replicas`` as 0, as the one GET does; a
    MachineDeployment being deleted still reports its ``spec.replicas`` through both (the resize refuses it)."""
    server, api = capi
    md = o.machine_deployment("b", replicas=2, min_size=0, max_size=4)
    if case == "spec.replicas absent":
        del md["spec"]["replicas"]
    else:
        md["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        md["metadata"]["finalizers"] = ["machinedeployment.cluster.x-k8s.io"]
    server.seed(o.machine_deployment_crd(), md)
    pools = MachineDeploymentNodePools(api, "capi-system", sleep=lambda s: None)
    assert pools.size_and_bounds("b") == (pools.node_count("b"), pools.bounds("b"))


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
