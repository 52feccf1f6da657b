"""Review of e0e5bc6: a burst node registered longer ago than its pool's provision limit and still not ready is no
capacity on its way (``arbitrate._stuck_booting``), and the controller's reader counts burst-pool nodes as GPU nodes
(``ReaderConfig.gpu_pools``).

The tests under "defects" were strict xfails on the change as landed (all four now fixed: a stuck node's pool is not
grown and backs off, a stuck node is given back first, its age runs from its Ready condition's last change); the
plain tests pin what was checked and found right."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.core.arbitrate import ArbitrationInput, CapacityConfig, arbitrate
from autoscaler.core.burst import BurstPool
from autoscaler.core.cluster import ClusterSnapshot, NodeInfo, PodInfo, WorkloadInfo
from autoscaler.core.model import CapacityState, ResumeWorkload, ScaleDecision, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
CHAT = ServicePolicy("inference", "chat", max_replicas=40, priority=1000)
POOL = BurstPool("burst", 8, "A100", boot_s=300.0, price_per_gpu_hour=0.5, nodes=0, min_nodes=0, max_nodes=8)
CONFIG = CapacityConfig(pools=(POOL,), assumed_shortfall_s=8 * 3600)  # provision limit: max(900, 2 x 300) = 900 s


def replica(index: int, node: str | None) -> PodInfo:
    return PodInfo(
        "inference", f"chat-{index}", node, 1, 1000, "Running", True, "Deployment", "chat", created_at=NOW - 3600
    )


def cluster(*extra_nodes: NodeInfo, workloads: tuple[WorkloadInfo, ...] = ()) -> ClusterSnapshot:
    """chat holds every GPU of the on-prem n1 (8 replicas)."""
    nodes = (NodeInfo("n1", 8, "A100", "onprem", True), *extra_nodes)
    return ClusterSnapshot(NOW, pods=tuple(replica(i, "n1") for i in range(8)), nodes=nodes, workloads=workloads)


def tick(
    snapshot: ClusterSnapshot,
    pool_nodes: dict[str, int],
    *,
    wanted: int = 12,
    state: CapacityState | None = None,
    now: float = NOW,
):  # type: ignore[no-untyped-def]
    decision = ScaleDecision(CHAT.key, 8, wanted, Reason.METRIC_ABOVE_TARGET, "")
    arb = ArbitrationInput(now, replace(snapshot, time=now), {CHAT.key: CHAT}, [decision], {}, pool_nodes=pool_nodes)
    return arbitrate(arb, state or CapacityState(), CONFIG)


def ups(actions) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.reason is Reason.BURST_SCALE_UP]


def downs(actions) -> list[ScaleNodePool]:  # type: ignore[no-untyped-def]
    return [a for a in actions if isinstance(a, ScaleNodePool) and a.nodes < a.previous_nodes]


def stuck(name: str, registered_s_ago: float) -> NodeInfo:
    """A burst node that registered and never became ready: no GPUs reported, kubelet NotReady."""
    return NodeInfo(name, 0, None, "burst", False, state_since=NOW - registered_s_ago)


def ready_burst(name: str) -> NodeInfo:
    return NodeInfo(name, 8, "A100", "burst", True, state_since=NOW - 7200)


def reader() -> KubeClusterReader:
    """The controller's reader as app.py configures it; only its conversion is used (no request is made)."""
    return KubeClusterReader(client.ApiClient(), ReaderConfig(gpu_pools=frozenset({"burst"})), sleep=lambda s: None)


def iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def raw_node(name: str, *, created: float, ready: str, ready_since: float, gpus: int | None) -> dict[str, Any]:
    resources: dict[str, str] = {"cpu": "96", "memory": "1Ti"}
    if gpus is not None:
        resources["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {
            "name": name,
            "labels": {"gpuautoscaler.dev/node-pool": "burst"},
            "creationTimestamp": iso(created),
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {"type": "Ready", "status": ready, "reason": "KubeletNotReady", "lastTransitionTime": iso(ready_since)}
            ],
        },
    }


# -- defects ---------------------------------------------------------------------------------------------------------


def test_a_pool_whose_registered_nodes_keep_failing_to_become_ready_is_not_grown_again_and_again() -> None:
    """Fixed (was a strict xfail).

    Wrong before: a stuck node's pool is neither left out of the scale-up (as an overdue pool is) nor backed off
    (``_provision_backoff`` only knows nodes that never registered). A broken image or driver in the pool makes
    every node it boots stuck: each one found stuck buys another node of the same pool, and none is given back, so
    the pool climbs to max_nodes of billed GPU nodes that never serve. Here the first stuck node already bought a
    second (the change's own test accepts that); that one is stuck too, and a third is bought.

    Right: a pool whose registered nodes go past the provision limit without becoming ready counts a provisioning
    failure like a node that never registered (not grown while such nodes are counted, then the doubling back-off),
    or at least not grown while all its registered nodes are stuck (Cluster Autoscaler holds a node group whose
    nodes are mostly unready: ``--ok-total-unready-count`` / ``--max-total-unready-percentage``)."""
    # tick 1: burst-a stuck -> before the fix the pool was grown 1 -> 2; now it is not (and burst-a is given back)
    actions, _, state = tick(cluster(stuck("burst-a", 900.0)), {"burst": 1})
    assert ups(actions) == []
    # tick 2, 20 minutes later: burst-b, the node it bought, registered 16 minutes ago and is just as stuck
    later = NOW + 1200.0
    snapshot = cluster(
        NodeInfo("burst-a", 0, None, "burst", False, state_since=NOW - 900.0),
        NodeInfo("burst-b", 0, None, "burst", False, state_since=later - 960.0),
    )
    actions, report, _ = tick(snapshot, {"burst": 2}, state=state, now=later)
    assert sum("not ready for" in n for n in report.notes) == 2
    assert ups(actions) == []  # fails: grown 2 -> 3, then 3 -> 4 ... up to max_nodes


def test_a_spare_pool_gives_back_its_stuck_node_not_its_working_one() -> None:
    """Fixed (was a strict xfail).

    Wrong before: the give-back only weighs the pool's ready nodes (``free``): with one spare ready node and one stuck
    node it removes the ready one (``remove_node``) and keeps the stuck one -- a billed GPU node that hosts nothing
    and now never goes (the pool is left with only it, which ``_give_back`` reads as a node 'in use').

    Right: a stuck node (no capacity, nothing on it) is the first one a spare pool gives back (Cluster Autoscaler
    removes an unready node after ``--scale-down-unready-time``), or at least the working node is not removed in its
    place."""
    snapshot = cluster(ready_burst("burst-ok"), stuck("burst-stuck", 7200.0))
    state = CapacityState(burst_unneeded_since={"burst": NOW - 3600.0})
    actions, _, _ = tick(snapshot, {"burst": 2}, wanted=8, state=state)
    removed = [a.remove_node for a in downs(actions)]
    assert removed == ["burst-stuck"]  # fails: ["burst-ok"]


def test_a_stuck_burst_node_is_given_back_and_does_not_hold_training_suspended_for_ever() -> None:
    """Fixed (was a strict xfail).

    Wrong before: a pool whose only node above its minimum is stuck keeps it for ever (billed, hosting nothing): the
    give-back reads the pool as 'no node spare (8 of 8 GPUs in use)', and because a burst node is left, training this
    controller suspended is never resumed ('burst nodes are given back first') although its GPUs are free.

    Right: a node known stuck past the provision limit, with no pod on it, is given back after the idle cooldown (it
    is registered: named in ``remove_node``), and the training then resumes on the cluster's own free GPUs."""
    n2 = NodeInfo("n2", 8, "A100", "onprem", True)
    job = WorkloadInfo("Job", "ml", "train", "job/ml/train", True, 0, (4,), None, suspended_by_us_at=NOW - 7200.0)
    snapshot = cluster(n2, stuck("burst-stuck", 7200.0), workloads=(job,))
    state = CapacityState(burst_unneeded_since={"burst": NOW - 3600.0}, resumable_since={"Job/ml/train": NOW - 3600})
    actions, report, _ = tick(snapshot, {"burst": 1}, wanted=8, state=state)
    given_back = [a.remove_node for a in downs(actions)]
    resumed = [a for a in actions if isinstance(a, ResumeWorkload)]
    assert given_back == ["burst-stuck"] or resumed, report.notes  # fails: neither, for as long as it stays


def test_a_burst_node_that_registered_again_under_an_old_node_object_is_booting_not_stuck() -> None:
    """Fixed (was a strict xfail).

    Wrong before: the age is ``now - creationTimestamp``: the Node object's age, not how long the node has been trying
    to come up. A VM recreated under the same name (a Spot/preemptible VM recreated by its instance group, a
    reimaged machine) registers again on its old Node object: the kubelet resets its GPU capacity to 0 (no device
    plugin checkpoint on the new disk) and reports NotReady while it boots -- exactly a booting node, but with a
    creationTimestamp days old. It is declared stuck the moment it is seen ('registered 172800s ago and still not
    ready ... check its device plugin'), and the shortfall it was about to cover buys another node (or stops
    training) for nothing.

    Right: the limit runs from when the node last stopped being ready: max(creationTimestamp, the Ready condition's
    lastTransitionTime); booting since 60 s ago, it is capacity on its way for the rest of its provision limit."""
    raw = raw_node("burst-a", created=NOW - 2 * 86400, ready="False", ready_since=NOW - 60.0, gpus=None)
    node = reader()._node(raw)
    assert node is not None and not node.ready and not node.leaving  # read as booting
    actions, report, _ = tick(cluster(node), {"burst": 1})
    assert not any("not ready for" in n for n in report.notes), report.notes  # fails: declared stuck
    assert ups(actions) == []  # its 8 GPUs on their way cover the 4 replicas short


# -- checked and found right -----------------------------------------------------------------------------------------


def test_a_creation_time_in_the_future_clock_skew_is_not_stuck() -> None:
    """The API server's clock ahead of ours: a negative age is never past the limit (booting, capacity on its way)."""
    actions, report, _ = tick(cluster(stuck("burst-a", -600.0)), {"burst": 1})
    assert report.shortfalls == () and ups(actions) == []
    assert not any("not ready for" in n for n in report.notes)


def test_a_not_ready_node_of_a_pool_not_configured_is_never_stuck_nor_booting() -> None:
    other = NodeInfo("x-1", 0, None, "elsewhere", False, state_since=NOW - 86400)
    _, report, _ = tick(cluster(other), {"burst": 0})
    assert not any("x-1" in n for n in report.notes)
    assert [s.covered_by_booting for s in report.shortfalls] == [0]


def test_a_stuck_node_is_registered_not_given_back_as_never_registered() -> None:
    """Counted by ``_registered``: the provider's 1 node is the stuck one, nothing unregistered, no remove_unregistered
    give-back, and no phantom node on its way."""
    actions, report, state = tick(cluster(stuck("burst-a", 7200.0)), {"burst": 1})
    assert not any(a.remove_unregistered for a in actions if isinstance(a, ScaleNodePool))
    assert state.unregistered_since == {}
    assert [s.covered_by_booting for s in report.shortfalls] == [0]


def test_a_leaving_or_out_of_service_not_ready_node_is_not_reported_stuck() -> None:
    gone = NodeInfo("burst-a", 0, None, "burst", False, leaving=True, state_since=NOW - 7200)
    broken = NodeInfo("burst-b", 0, "A100", "burst", False, leaving=True, out_of_service=True, state_since=NOW - 7200)
    _, report, _ = tick(cluster(gone, broken), {"burst": 2})
    assert not any("not ready for" in n for n in report.notes)


def test_the_reader_keeps_a_booting_burst_node_and_its_creation_time() -> None:
    raw = raw_node("burst-a", created=NOW - 100.0, ready="False", ready_since=NOW - 100.0, gpus=None)
    node = reader()._node(raw)
    assert node is not None and node.state_since == NOW - 100.0 and node.pool == "burst"
    bare = KubeClusterReader(client.ApiClient(), ReaderConfig(), sleep=lambda s: None)._node(raw)
    assert bare is None
