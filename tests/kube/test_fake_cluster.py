"""The in-memory FakeCluster keeps the API server's semantics that the controller relies on."""

from __future__ import annotations

import pytest

from autoscaler.core.cluster import NodeInfo, PodInfo, WorkloadInfo
from autoscaler.fakes.cluster import FakeCluster
from autoscaler.ports import ClusterReader, ClusterWriter, EvictionOutcome, NodePoolScaler, PortError, WriteOutcome


def _pod(name: str, **kw: object) -> PodInfo:
    defaults: dict[str, object] = {
        "namespace": "ml",
        "name": name,
        "node": "n0",
        "gpus": 1,
        "priority": 0,
        "phase": "Running",
        "ready": True,
    }
    defaults.update(kw)
    return PodInfo(**defaults)  # type: ignore[arg-type]


def test_implements_the_ports() -> None:
    cluster: ClusterReader = FakeCluster()
    writer: ClusterWriter = FakeCluster()
    pools: NodePoolScaler = FakeCluster()
    assert cluster and writer and pools


def test_scale_is_idempotent_and_recorded() -> None:
    c = FakeCluster()
    c.add_deployment("ml", "chat", 2)
    c.scale_deployment("ml", "chat", 4)
    c.scale_deployment("ml", "chat", 4)
    assert c.snapshot(0).deployments[0].spec_replicas == 4
    assert [w.outcome for w in c.writes] == ["applied", "unchanged"]
    assert c.scale_deployment("ml", "missing", 1) is WriteOutcome.GONE  # as the real writer's 404


def test_evictions_follow_pod_disruption_budgets() -> None:
    c = FakeCluster(pods=[_pod(f"w{i}", labels={"app": "w"}) for i in range(3)])
    c.add_pod(_pod("pending", labels={"app": "w"}, phase="Pending", node=None))
    c.add_pdb("ml", "w", {"app": "w"}, disruptions_allowed=1)
    assert c.evict_pod("ml", "w0") is EvictionOutcome.EVICTED
    assert c.evict_pod("ml", "w1") is EvictionOutcome.BLOCKED  # the budget is spent
    assert c.evict_pod("ml", "pending") is EvictionOutcome.EVICTED  # pending pods skip the budget
    assert c.evict_pod("ml", "w0") is EvictionOutcome.GONE
    c.add_pdb("ml", "w-too", {"app": "w"}, disruptions_allowed=5)
    with pytest.raises(PortError, match="more than one PodDisruptionBudget"):
        c.evict_pod("ml", "w2")
    c.block_evictions("ml")
    c.add_pod(_pod("free"))
    assert c.evict_pod("ml", "free") is EvictionOutcome.BLOCKED


def test_suspend_removes_the_workloads_pods() -> None:
    c = FakeCluster(
        pods=[
            _pod("j0", owner_kind="Job", owner_name="train"),
            _pod("js0", gang="jobset/ml/llama"),
            _pod("js1", gang="jobset/ml/llama"),
            _pod("other", gang="jobset/ml/other"),
        ]
    )
    c.suspend_workload("Job", "ml", "train")
    c.suspend_workload("JobSet", "ml", "llama")
    c.suspend_workload("JobSet", "ml", "llama")
    assert [p.name for p in c.snapshot(0).pods] == ["other"]
    assert [w.outcome for w in c.writes] == ["applied", "applied", "unchanged"]
    with pytest.raises(PortError):
        c.suspend_workload("VolcanoJob", "ml", "x")


def test_workloads_follow_suspend_and_resume() -> None:
    now = {"t": 500.0}
    train = WorkloadInfo("Job", "ml", "train", "job/ml/train", suspended=False, pod_gpus=(1, 1))
    theirs = WorkloadInfo("JobSet", "ml", "held", "jobset/ml/held", suspended=True, pod_gpus=(8,))
    c = FakeCluster(workloads=[train, theirs], pods=[_pod("t0", gang="job/ml/train")], clock=lambda: now["t"])
    assert c.snapshot(0).workloads == (train, theirs)
    c.suspend_workload("Job", "ml", "train")
    snap = c.snapshot(600)
    assert snap.pods == ()
    assert snap.workloads[0].suspended and snap.workloads[0].suspended_by_us_at == 500.0
    c.suspend_workload("JobSet", "ml", "held")  # suspended by someone else: unchanged, not marked as ours
    assert c.snapshot(600).workloads[1] == theirs
    c.resume_workload("Job", "ml", "train")
    c.resume_workload("Job", "ml", "train")
    c.resume_workload("Job", "ml", "never-suspended")
    assert c.snapshot(700).workloads[0] == train
    assert [(w.op, w.outcome) for w in c.writes] == [
        ("suspend_workload", "applied"),
        ("suspend_workload", "unchanged"),
        ("resume_workload", "applied"),
        ("resume_workload", "unchanged"),
        ("resume_workload", "unchanged"),
    ]
    with pytest.raises(PortError):
        c.resume_workload("VolcanoJob", "ml", "x")
    c.fail("resume_workload")
    with pytest.raises(PortError):
        c.resume_workload("Job", "ml", "train")
    assert c.writes[-1].outcome == "failed"
    # without a clock a suspension is stamped with the last snapshot's time
    c = FakeCluster(workloads=[train])
    c.snapshot(42.0)
    c.suspend_workload("Job", "ml", "train")
    assert c.snapshot(43.0).workloads[0].suspended_by_us_at == 42.0


def test_faults_and_events() -> None:
    c = FakeCluster()
    c.add_deployment("ml", "chat", 1)
    c.fail("scale_deployment", times=2)
    for _ in range(2):
        with pytest.raises(PortError):
            c.scale_deployment("ml", "chat", 3)
    c.scale_deployment("ml", "chat", 3)
    c.fail("snapshot", RuntimeError("boom"), times=None)
    with pytest.raises(RuntimeError):
        c.snapshot(0)
    c.clear_faults()
    c.emit_event("Deployment", "ml", "chat", "ScaledUp", "1 -> 3")
    c.emit_event("Deployment", "ml", "chat", "ScaledUp", "1 -> 3", action="Scale")
    assert len(c.events) == 1 and c.events[0].count == 2
    with pytest.raises(ValueError):
        c.fail("nope")


def test_node_pools_boot_clamp_and_shrink_newest_first() -> None:
    now = {"t": 100.0}
    c = FakeCluster(clock=lambda: now["t"])
    c.add_pool("burst", 1, gpus_per_node=4, boot_s=120, max_size=3)
    c.scale("burst", 5)
    assert c.node_count("burst") == 3
    nodes = {n.name: n for n in c.snapshot(now["t"]).nodes}
    assert nodes["burst-0"].ready and not nodes["burst-1"].ready and nodes["burst-1"].allocatable_gpus == 0
    nodes = {n.name: n for n in c.snapshot(now["t"] + 120).nodes}
    assert all(n.ready and n.allocatable_gpus == 4 for n in nodes.values())
    c.add_pod(_pod("on-new", node="burst-2"))
    c.scale("burst", 2)
    assert sorted(n.name for n in c.snapshot(300).nodes) == ["burst-0", "burst-1"]
    assert c.snapshot(300).pods == ()  # the pod on the removed node went with it
    c.add_node(NodeInfo("static", 8, None, None, True))
    assert len(c.snapshot(300).nodes) == 3
