"""Review of ``MachineDeploymentNodePools.scale(..., remove_unregistered=True)`` (commit 5b4a9b2): adapter defects.

Each test was a strict xfail on that code, saying what was wrong and what the right behaviour is. Both are fixed: a
Machine whose provider ID a registered Node carries is never a candidate, and (stop 38) only a Machine that has
itself existed the provision limit is (the core's timer is the pool's: a MachineHealthCheck's fresh replacement of
the stuck Machine was given back with the pool's failure)."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes._api import JSON, format_time
from autoscaler.adapters.kubernetes.nodepool import NoUnregisteredMachineError
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.test_nodepool_marks import NOW, deployment, machine, marked, patched, pools, seed, size


def created(m: JSON, at: str) -> JSON:
    m["metadata"]["creationTimestamp"] = at
    return m


def with_provider_id(obj: JSON, provider_id: str) -> JSON:
    obj.setdefault("spec", {})["providerID"] = provider_id
    return obj


def test_a_machine_whose_node_registered_but_whose_node_ref_lags_is_not_given_back(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed (was a strict xfail).

    WRONG before: "never registered" is read from the Machine alone: no ``status.nodeRef``. The Machine controller sets
    nodeRef only once it reconciles the Machine against the workload cluster; while Cluster API's controllers are
    down or slow (an upgrade, a crash loop, the cluster cache tracker unable to reach the apiserver) a Machine whose
    Node joined long ago -- Ready, running replicas -- has no nodeRef. The core counts that node as registered (the
    pool's count beyond its registered nodes is another, really stuck Machine), but the adapter picks the OLDEST
    Machine without nodeRef: here the running one, which is marked and deleted with its busy node. A registered,
    busy node given back: exactly what ``remove_unregistered`` promises never to do.
    RIGHT: a Machine whose ``spec.providerID`` is a registered Node's (the Nodes are on the same apiserver the adapter
    talks to, as the Cluster Autoscaler matches its unregistered nodes by provider ID) is not a candidate; the
    really stuck one (burst-old) is given back, or nothing when unsure."""
    lagging = with_provider_id(created(machine("burst-lag", None), "2026-01-01T08:00:00Z"), "aws:///us-east-1a/i-lag")
    stuck = with_provider_id(created(machine("burst-old", None), "2026-01-01T09:00:00Z"), "aws:///us-east-1a/i-old")
    running = with_provider_id(o.node("node-lag", pool="burst"), "aws:///us-east-1a/i-lag")
    seed(apiserver, deployment(3), created(machine("burst-a", "node-a"), "2026-01-01T07:00:00Z"), lagging, stuck)
    apiserver.seed(running)
    pools(api_client).scale("burst", 2, expected=3, remove_unregistered=True)
    assert "burst-lag" not in marked(apiserver)
    assert marked(apiserver) == {"burst-old"}


def test_a_machine_created_moments_ago_is_not_given_back_as_never_registered(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """Fixed at stop 38 (was a strict xfail): the core passes ``unregistered_min_age_s``, its provision limit.

    WRONG before: the core's decision is per pool (its count beyond the registered nodes has stood past the timeout),
    the adapter's pick is "the oldest Machine without a Node", whatever its age. When the stuck Machine is gone or
    going (a MachineHealthCheck's nodeStartupTimeout -- 10 min by default, shorter than the 15 min provision timeout
    -- deleted it and the MachineSet created a replacement; the pool's count did not rise, so the core's timer
    stands), the only candidate is a Machine created a minute ago, still booting, and it is removed as "never
    registered" and the pool shrinks. The Cluster Autoscaler removes an unregistered node only once that node itself
    has waited past --max-node-provision-time.
    RIGHT: only a Machine that has itself existed at least the provision timeout (``metadata.creationTimestamp``,
    e.g. a ``min_age_s``/``older_than`` the core passes) is given back; none: ``NoUnregisteredMachineError``,
    nothing written."""
    going = created(machine("burst-old", None, deleting=True), "2026-01-01T09:00:00Z")
    fresh = created(machine("burst-replacement", None), format_time(NOW - 60.0))
    seed(apiserver, deployment(3), created(machine("burst-a", "node-a"), "2026-01-01T07:00:00Z"),
         created(machine("burst-b", "node-b"), "2026-01-01T07:00:00Z"), going, fresh)  # fmt: skip
    with pytest.raises(NoUnregisteredMachineError, match=r"1 created less than 900s ago, still booting"):
        pools(api_client).scale("burst", 2, expected=3, remove_unregistered=True, unregistered_min_age_s=900.0)
    assert size(apiserver) == 3
    assert marked(apiserver) == set()
    assert not patched(apiserver)


def test_the_oldest_machine_past_the_minimum_age_is_given_back_and_a_younger_one_stays(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    """With a minimum age, a Machine that has waited that long is still given back (the oldest of them), and one
    younger than the limit is never picked, even where it is the only other one without a Node."""
    old = created(machine("burst-old", None), format_time(NOW - 901.0))
    fresh = created(machine("burst-fresh", None), format_time(NOW - 780.0))  # younger than 900 s less the allowance
    seed(apiserver, deployment(3), created(machine("burst-a", "node-a"), "2026-01-01T07:00:00Z"), old, fresh)
    pools(api_client).scale("burst", 2, expected=3, remove_unregistered=True, unregistered_min_age_s=900.0)
    assert marked(apiserver) == {"burst-old"}
    assert size(apiserver) == 2


def test_a_failing_node_list_writes_nothing(
    apiserver: FakeApiServer, api_client: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Nodes cannot be listed (a 500): whether the Machine without a nodeRef has its Node is unknown, so nothing
    is marked and the size stays (an API error never shrinks a pool)."""
    from collections.abc import Mapping
    from typing import Any

    from autoscaler.ports import PortError
    from tests.kube.test_nodepool_marks import error

    stuck = with_provider_id(created(machine("burst-old", None), "2026-01-01T09:00:00Z"), "aws:///us-east-1a/i-old")
    seed(apiserver, deployment(2), created(machine("burst-a", "node-a"), "2026-01-01T07:00:00Z"), stuck)
    serve = apiserver.handle

    def handle(method: str, target: str, headers: Mapping[str, str], body: bytes) -> Any:
        if method == "GET" and target.split("?")[0] == "/api/v1/nodes":
            return error(500)
        return serve(method, target, headers, body)

    monkeypatch.setattr(apiserver, "handle", handle)
    with pytest.raises(PortError, match="500"):
        pools(api_client).scale("burst", 1, expected=2, remove_unregistered=True)
    assert size(apiserver) == 2
    assert marked(apiserver) == set()
    assert not patched(apiserver)
