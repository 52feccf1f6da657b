"""Review 39 of the simulated cluster (``autoscaler/sim/cluster.py``: ``SimCluster``), against real Kubernetes.

Defects found (each reproduced by an ``xfail(strict=True)`` test below, whose docstring says WRONG / RIGHT; 4 was fixed
in the same stop, 1-3 at stop 40, which re-ran the benchmarks they could move):

1. The scheduler's preemption (``SimCluster._preempt_for``, the baselines' kube-scheduler DefaultPreemption) ignores
   PodDisruptionBudgets. The kube-scheduler honours them as best effort: its first criterion when it picks the node
   is the fewest victims whose eviction would break a budget, and on a node it reprieves the budget-protected
   candidates first. The simulator instead evicts a pod whose budget allows no disruption while an unprotected
   victim was available (on another node, or on the same node).
2. A Deployment scale-down (``SimCluster._reconcile``) deletes the newest ready replica, where the ReplicaSet
   controller (``controller.ActivePodsWithRanks``) first deletes a replica "doubled up" on a node with more replicas
   of the same Deployment: with bin-packed replicas the simulator empties the node of the lone newest replica (which
   can then be given back) where Kubernetes would take one from the crowded node and keep both nodes busy.
3. Preemption ranks victims by their creation time (``SimPod.created_at``), where the kube-scheduler uses their
   start time (``status.startTime``, from when the pod was bound): between two otherwise equal nodes, it evicts the
   victim that started most recently (the least work lost), but the simulator evicts the one created most recently,
   which may have been running far longer if the other waited pending.
4. The ``ClusterWriter`` port says a write to an object that does not exist answers ``GONE``; the simulated cluster
   raises ``PortError`` on a missing Deployment (``scale_deployment``) or Job (``resume_workload``) and answers
   ``ALREADY`` ("already suspended") when suspending a Job that does not exist (``suspend_workload``).

The plain tests pin right behaviour checked in this review that no other test pins: dry-run evictions change
nothing, the budget the snapshot shows agrees with what the Eviction API decides, preemption takes strictly lower
priority pods only and never evicts for nothing, booting nodes are never preempted onto, node give-back removes the
named node and its pods go pending, and a seeded random walk over every write keeps the cluster's invariants (no
GPU booked twice, no gang half placed, no pod on a booting node, every training GPU-second either kept or lost) and
is deterministic.
"""

from __future__ import annotations

import random

import pytest

from autoscaler.ports import EvictionOutcome, PortError, WriteOutcome
from autoscaler.sim.cluster import Scoring, SimCluster, SimDeployment, SimJob, SimPdb, SimPool


def _nodes_of(cluster: SimCluster, owner: str) -> list[str | None]:
    return sorted((p.node for p in cluster.pods.values() if p.owner == owner), key=str)


# ---- defect 1: preemption and PodDisruptionBudgets ----------------------------------------------------------------


def _two_node_preemption(protect: bool) -> SimCluster:
    """Node a holds ``low`` (priority 10), node b holds ``mid`` (priority 20), 4 GPUs each; then a 4-GPU pod of
    priority 1000 arrives. ``protect``: ``low`` is under a budget that allows no disruption. ``mid`` selects b's GPU
    type: its replacement cannot preempt ``low`` on a in turn (as it would, budget or not, on a node of its type)."""
    cluster = SimCluster(preemption=True)
    cluster.add_node("a", 4, gpu_product="A100")
    cluster.add_node("b", 4, gpu_product="H100")
    cluster.add_deployment(SimDeployment("ml", "low", 1, 4, 0.0, priority=10, gpu_product="A100"))
    cluster.add_deployment(SimDeployment("ml", "mid", 1, 4, 0.0, priority=20, gpu_product="H100"))
    assert _nodes_of(cluster, "ml/low") == ["a"] and _nodes_of(cluster, "ml/mid") == ["b"]
    if protect:
        cluster.add_pdb(SimPdb("ml", "low", {"app": "low"}, min_available=1))
    cluster.advance(10.0)
    if protect:
        assert cluster.snapshot(10.0).pdbs[0].disruptions_allowed == 0
    cluster.add_deployment(SimDeployment("ml", "high", 1, 4, 0.0, priority=1000))
    return cluster


def test_without_budgets_preemption_takes_the_lowest_priority_victim() -> None:
    """The control case of the next test: no budget, the node whose victim has the lowest priority (a) is chosen."""
    cluster = _two_node_preemption(protect=False)
    assert _nodes_of(cluster, "ml/high") == ["a"]
    assert _nodes_of(cluster, "ml/mid") == ["b"]
    assert cluster.scheduler_preemptions == 1


def test_preemption_prefers_a_node_whose_victims_break_no_budget() -> None:
    """Fixed (was a strict xfail).

    WRONG: a high-priority pod that fits nowhere preempts ``low`` on node a although ``low``'s budget allows no
    disruption (minAvailable 1, one replica), because ``low`` has the lowest priority; an unprotected victim
    (``mid`` on node b) was available. RIGHT: the kube-scheduler's DefaultPreemption (``pickOneNodeForPreemption``)
    first minimises the number of victims that violate a PodDisruptionBudget, before the highest victim priority:
    it preempts ``mid`` on b and leaves the protected replica running."""
    cluster = _two_node_preemption(protect=True)
    assert _nodes_of(cluster, "ml/high") == ["b"]
    assert _nodes_of(cluster, "ml/low") == ["a"]  # still the original replica, still running
    assert cluster.scheduler_preemptions == 1


def test_preemption_on_a_node_reprieves_the_budget_protected_candidate_first() -> None:
    """Fixed (was a strict xfail).

    WRONG: on one 8-GPU node holding ``low`` (priority 10, under a budget allowing no disruption) and ``mid``
    (priority 20, no budget), 4 GPUs each, a 4-GPU pod of priority 1000 evicts ``low``: the simulator reprieves the
    candidates by priority alone. RIGHT: the kube-scheduler's ``selectVictimsOnNode`` reprieves the candidates whose
    eviction would violate a PodDisruptionBudget first, then the others; one victim is enough, so ``mid`` goes and
    the protected ``low`` stays."""
    cluster = SimCluster(preemption=True)
    cluster.add_node("n", 8)
    cluster.add_deployment(SimDeployment("ml", "low", 1, 4, 0.0, priority=10))
    # a bare pod: nothing replaces it (a replaced ``mid`` would preempt ``low`` in turn, budget or not)
    cluster.add_training_pod("ml", "mid-0", 4, 20, node="n")
    cluster.add_pdb(SimPdb("ml", "low", {"app": "low"}, min_available=1))
    cluster.advance(10.0)
    low_before = {name for (_, name), p in cluster.pods.items() if p.owner == "ml/low"}
    cluster.add_deployment(SimDeployment("ml", "high", 1, 4, 0.0, priority=1000))
    assert _nodes_of(cluster, "ml/high") == ["n"]
    assert cluster.scheduler_preemptions == 1
    assert {name for (_, name), p in cluster.pods.items() if p.owner == "ml/low"} == low_before


# ---- defect 2: the ReplicaSet's scale-down ranking ----------------------------------------------------------------


def test_scale_down_deletes_a_doubled_up_replica_before_a_lone_one() -> None:
    """Fixed (was a strict xfail).

    WRONG: three ready replicas, two bin-packed on node a (created at 0) and one alone on node b (created at
    100); scaled to two, the simulator deletes the newest, b's, and empties b. RIGHT: the ReplicaSet controller
    ranks the pods to delete (``ActivePodsWithRanks.Less``): unassigned, Pending/Unknown/Running, not ready,
    pod-deletion-cost, then *doubled up* -- a pod on a node with more active pods of the same Deployment goes
    first -- and only then the ready time and the creation time. One of a's replicas is deleted and both nodes keep
    a replica (so a node give-back planned on the simulator's emptier picture would not find b empty)."""
    cluster = SimCluster(Scoring.MOST_ALLOCATED)
    cluster.add_node("a", 2)
    cluster.add_node("b", 2)
    cluster.add_deployment(SimDeployment("ml", "chat", 2, 1, 10.0))
    cluster.advance(100.0)
    cluster.scale_deployment("ml", "chat", 3)
    cluster.advance(200.0)
    assert _nodes_of(cluster, "ml/chat") == ["a", "a", "b"]
    assert all(p.ready(200.0) for p in cluster.pods.values())
    cluster.scale_deployment("ml", "chat", 2)
    assert _nodes_of(cluster, "ml/chat") == ["a", "b"]


def test_scale_down_without_doubled_up_replicas_deletes_the_newest_ready_one() -> None:
    """The ranking the simulator does follow: with one replica per node, the newest ready replica goes."""
    cluster = SimCluster()
    for name in ("a", "b", "c"):
        cluster.add_node(name, 1)
    cluster.add_deployment(SimDeployment("ml", "chat", 2, 1, 10.0))
    cluster.advance(100.0)
    cluster.scale_deployment("ml", "chat", 3)
    cluster.advance(200.0)
    newest = max(cluster.pods.values(), key=lambda p: p.created_at)
    assert newest.created_at == 100.0
    cluster.scale_deployment("ml", "chat", 2)
    assert ("ml", newest.name) not in cluster.pods
    assert sorted(p.created_at for p in cluster.pods.values()) == [0.0, 0.0]


# ---- defect 3: preemption's victim start time -----------------------------------------------------------------


def test_preemption_between_equal_nodes_takes_the_victim_that_started_last() -> None:
    """Fixed (was a strict xfail).

    WRONG: victim ``p`` (priority 10, 4 GPUs) was created at 0 but waited for an A100 node until 100 (started at
    100); victim ``q`` (same priority and size) was created at 50 and started at once on node b. A 4-GPU pod of
    priority 1000 that fits either node evicts ``q`` -- created last -- which has run 50 s longer. RIGHT: the
    kube-scheduler's last criterion picks the node whose highest-priority victims have the *latest start time*
    (``GetEarliestPodStartTime``: ``status.startTime``, set when the kubelet takes the bound pod), to lose the
    least work: it evicts ``p`` on node a. (``selectVictimsOnNode``'s reprieve order, ``MoreImportantPod``, uses
    the start time too.)"""
    cluster = SimCluster(preemption=True)
    cluster.add_deployment(SimDeployment("ml", "p", 1, 4, 0.0, priority=10, gpu_product="A100"))
    cluster.advance(50.0)
    cluster.add_node("b", 4, gpu_product="H100")
    cluster.add_deployment(SimDeployment("ml", "q", 1, 4, 0.0, priority=10))
    cluster.advance(100.0)
    cluster.add_node("a", 4, gpu_product="A100")
    cluster.advance(100.0)  # the scheduler's pass: p is bound now
    cluster.advance(200.0)
    (p,) = [pod for pod in cluster.pods.values() if pod.owner == "ml/p"]
    (q,) = [pod for pod in cluster.pods.values() if pod.owner == "ml/q"]
    assert (p.node, p.created_at, p.bound_at) == ("a", 0.0, 100.0)
    assert (q.node, q.created_at, q.bound_at) == ("b", 50.0, 50.0)
    cluster.add_deployment(SimDeployment("ml", "high", 1, 4, 0.0, priority=1000))
    assert _nodes_of(cluster, "ml/high") == ["a"]
    assert ("ml", q.name) in cluster.pods


# ---- defect 4: the port's GONE ------------------------------------------------------------------------------------


@pytest.mark.parametrize("write", ["scale_deployment", "suspend_workload", "resume_workload"])
def test_a_write_to_an_object_that_does_not_exist_answers_gone(write: str) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``scale_deployment`` of a Deployment that does not exist and ``resume_workload`` of a Job that does
    not exist raise ``PortError`` (the actuator reports a failure and retries every tick); ``suspend_workload`` of a
    Job that does not exist answers ``ALREADY`` (it claims the Job is suspended). RIGHT: ``ports.ClusterWriter``
    says "No such Deployment (deleted since the read): ``GONE``" and "No such workload: ``GONE``", as the
    Kubernetes adapters and the fake cluster answer a 404."""
    cluster = SimCluster()
    cluster.add_node("n", 8)
    calls = {
        "scale_deployment": lambda: cluster.scale_deployment("ml", "nope", 2),
        "suspend_workload": lambda: cluster.suspend_workload("Job", "ml", "nope"),
        "resume_workload": lambda: cluster.resume_workload("Job", "ml", "nope"),
    }
    try:
        outcome = calls[write]()
    except PortError as exc:
        pytest.fail(f"{write}: PortError {exc}")
    assert outcome is WriteOutcome.GONE


# ---- pins: the Eviction API -----------------------------------------------------------------------------------------


def _chat(ready: int, min_available: int | None = None, max_unavailable: int | None = None) -> SimCluster:
    cluster = SimCluster()
    cluster.add_node("n", 8)
    cluster.add_deployment(SimDeployment("ml", "chat", ready, 1, 10.0))
    cluster.add_pdb(SimPdb("ml", "chat", {"app": "chat"}, min_available, max_unavailable))
    cluster.advance(20.0)
    return cluster


@pytest.mark.parametrize(("min_available", "outcome"), [(1, EvictionOutcome.EVICTED), (2, EvictionOutcome.BLOCKED)])
def test_a_dry_run_eviction_answers_as_the_real_one_would_and_changes_nothing(
    min_available: int, outcome: EvictionOutcome
) -> None:
    cluster = _chat(2, min_available=min_available)
    pods = dict(cluster.pods)
    before = cluster.snapshot(20.0)
    name = sorted(pods)[0][1]
    assert cluster.evict_pod("ml", name, dry_run=True) is outcome
    assert cluster.pods == pods and all(p.node == "n" for p in cluster.pods.values())
    assert cluster.writes == [] and cluster.evictions_blocked == 0
    assert cluster.snapshot(20.0) == before
    assert cluster.evict_pod("ml", "nope", dry_run=True) is EvictionOutcome.GONE
    # and the real one does what the dry run said
    assert cluster.evict_pod("ml", name) is outcome
    assert (("ml", name) in cluster.pods) is (outcome is EvictionOutcome.BLOCKED)
    assert cluster.evictions_blocked == (1 if outcome is EvictionOutcome.BLOCKED else 0)


def test_the_budget_the_snapshot_shows_is_what_the_eviction_api_spends() -> None:
    """maxUnavailable 1 over 3 ready replicas: one disruption allowed; after one eviction (its replacement is not
    ready yet) none, and the next eviction of a ready replica is refused, until the replacement is ready."""
    cluster = _chat(3, max_unavailable=1)
    assert cluster.snapshot(20.0).pdbs[0].disruptions_allowed == 1
    first, second = sorted(cluster.pods)[:2]
    assert cluster.evict_pod(*first) is EvictionOutcome.EVICTED
    assert len(cluster.pods) == 3  # replaced at once, starting (cold start 10 s)
    assert cluster.snapshot(20.0).pdbs[0].disruptions_allowed == 0
    assert cluster.evict_pod(*second) is EvictionOutcome.BLOCKED
    assert [op for _, op, _ in cluster.writes] == ["evict_pod", "evict_pod_blocked"]
    assert cluster.snapshot(30.0).pdbs[0].disruptions_allowed == 1  # the replacement is ready 10 s after bind
    assert cluster.evict_pod(*second) is EvictionOutcome.EVICTED


def test_a_scale_up_s_pending_replicas_count_in_a_max_unavailable_budget() -> None:
    """As the disruption controller counts: expected = the Deployment's replicas (pending ones included), so
    maxUnavailable 1 with 2 of 4 replicas ready allows no disruption."""
    cluster = _chat(2, max_unavailable=1)
    cluster.scale_deployment("ml", "chat", 10)  # 8 GPUs: 6 more bound, 2 pending, none of the new ones ready
    assert cluster.snapshot(20.0).pdbs[0].disruptions_allowed == 0
    ready = [p for p in cluster.pods.values() if p.ready(20.0)]
    assert len(ready) == 2
    assert cluster.evict_pod("ml", ready[0].name) is EvictionOutcome.BLOCKED


# ---- pins: scheduler preemption -----------------------------------------------------------------------------------


def test_preemption_never_takes_a_pod_of_equal_priority() -> None:
    cluster = SimCluster(preemption=True)
    cluster.add_node("n", 4)
    cluster.add_deployment(SimDeployment("ml", "a", 1, 4, 0.0, priority=500))
    cluster.add_deployment(SimDeployment("ml", "b", 1, 4, 0.0, priority=500))
    cluster.advance(10.0)
    assert _nodes_of(cluster, "ml/a") == ["n"] and _nodes_of(cluster, "ml/b") == [None]
    assert cluster.scheduler_preemptions == 0


def test_preemption_evicts_nothing_when_the_pod_would_not_fit_even_then() -> None:
    """A 6-GPU pod on 4-GPU nodes, or where the lower-priority pods hold too little: no victim at all."""
    cluster = SimCluster(preemption=True)
    cluster.add_node("n", 4)
    cluster.add_node("m", 8)
    cluster.add_deployment(SimDeployment("ml", "low", 1, 2, 0.0, priority=10))  # on m (LeastAllocated)
    cluster.add_deployment(SimDeployment("ml", "top", 1, 6, 0.0, priority=2000))  # on m as well? 8-2=6: yes
    assert _nodes_of(cluster, "ml/low") == ["m"] and _nodes_of(cluster, "ml/top") == ["m"]
    cluster.add_deployment(SimDeployment("ml", "high", 1, 6, 0.0, priority=1000))
    # m: only ``low`` (2 GPUs) is lower; 0 free + 2 < 6. n: 4 GPUs < 6. Nothing is evicted.
    assert _nodes_of(cluster, "ml/high") == [None]
    assert cluster.scheduler_preemptions == 0 and _nodes_of(cluster, "ml/low") == ["m"]


def test_preemption_never_targets_a_booting_node_and_picks_only_what_is_needed() -> None:
    cluster = SimCluster(preemption=True)
    cluster.add_pool(SimPool("pool", 8, None, 300.0, 0, 4), nodes=1)
    cluster.add_training_pod("batch", "t1", 4, 10, node="pool-0")
    cluster.add_training_pod("batch", "t2", 2, 20, node="pool-0")
    cluster.add_training_pod("batch", "t3", 2, 30, node="pool-0")
    cluster.scale("pool", 2, expected=1)  # pool-1 boots until 300
    cluster.advance(100.0)
    cluster.add_deployment(SimDeployment("ml", "chat", 1, 4, 0.0, priority=1000))
    # pool-1 is empty but booting: not a candidate. On pool-0 the minimal set by the reprieve order is t1 alone
    assert _nodes_of(cluster, "ml/chat") == ["pool-0"]
    assert {name for _, name in cluster.pods if name.startswith("t")} == {"t2", "t3"}
    assert cluster.scheduler_preemptions == 1
    assert cluster.lost_training_gpu_s == pytest.approx(4 * 100.0)


# ---- pins: node pools -----------------------------------------------------------------------------------------------


def test_giving_back_a_named_node_sends_its_pods_pending_and_stops_its_gang() -> None:
    cluster = SimCluster()
    cluster.add_pool(SimPool("pool", 8, None, 0.0, 0, 4), nodes=2)
    cluster.add_job(SimJob("ml", "train", 1, 6, 10, 7200.0, 600.0, 0.0, restart_s=0.0))
    cluster.add_deployment(SimDeployment("ml", "chat", 2, 2, 30.0))
    cluster.advance(0.0)
    job_node = next(p.node for p in cluster.pods.values() if p.gang is not None)
    other = "pool-1" if job_node == "pool-0" else "pool-0"
    cluster.advance(900.0)  # one checkpoint at 600
    with pytest.raises(PortError):
        cluster.scale("pool", 1, expected=2, remove_node="pool-9")
    assert cluster.node_count("pool") == 2 and cluster.writes == []
    assert cluster.scale("pool", 1, expected=2, remove_node=job_node) is WriteOutcome.WROTE
    assert cluster.pools["pool"].nodes == [other]
    assert all(p.node in (None, other) for p in cluster.pods.values())
    job = cluster.jobs["job/ml/train"]
    assert job.stops == 1 and job.progress_s == 600.0
    assert cluster.lost_training_gpu_s == pytest.approx(300.0 * 6)
    assert _nodes_of(cluster, "ml/chat") == [other, other]  # the replaced replica started again beside the other
    # the recreated gang waits: 6 GPUs do not fit beside the two replicas on the remaining node
    cluster.advance(915.0)
    assert [p.node for p in cluster.pods.values() if p.gang is not None] == [None]
    assert cluster.free_gpus(other) == 4


def test_a_scale_down_naming_no_node_gives_back_a_booting_node_first() -> None:
    cluster = SimCluster()
    cluster.add_pool(SimPool("pool", 8, None, 300.0, 0, 4), nodes=1)
    cluster.add_deployment(SimDeployment("ml", "chat", 1, 1, 30.0), warm=True)
    cluster.scale("pool", 2, expected=1)
    cluster.advance(100.0)
    assert cluster.scale("pool", 1, expected=2) is WriteOutcome.WROTE
    assert cluster.pools["pool"].nodes == ["pool-0"]
    assert _nodes_of(cluster, "ml/chat") == ["pool-0"]


# ---- pins: invariants over random writes, and determinism ---------------------------------------------------------


def _random_walk(seed: int) -> tuple[SimCluster, list[object]]:
    """A seeded random sequence of every write on a small cluster with gangs, budgets, pools and preemption; checks
    the invariants after every step and returns the snapshots it saw."""
    r = random.Random(seed)
    cluster = SimCluster(r.choice(list(Scoring)), preemption=r.random() < 0.5)
    cluster.add_pool(SimPool("fixed", 8, None, 0.0, 0, 10), nodes=r.randint(1, 3))
    cluster.add_pool(SimPool("burst", r.choice([4, 8]), None, 60.0, 0, 5))
    if r.random() < 0.5:
        cluster.inference_only_pools = {"burst"}
    for i in range(r.randint(1, 3)):
        cluster.add_deployment(
            SimDeployment("ml", f"d{i}", r.randint(0, 4), r.choice([1, 2, 4]), r.choice([0.0, 30.0, 90.0]),
                          r.choice([10, 100, 1000])),
            warm=r.random() < 0.5,
        )  # fmt: skip
    for i in range(r.randint(0, 3)):
        cluster.add_job(
            SimJob("ml", f"j{i}", r.randint(1, 3), r.choice([1, 2, 4, 8]), r.choice([5, 50, 500]),
                   r.choice([300.0, 3000.0]), r.choice([60.0, 200.0]), r.choice([0.0, 30.0, 120.0]),
                   restart_s=r.choice([0.0, 15.0, 60.0]))
        )  # fmt: skip
    if r.random() < 0.5:
        cluster.add_pdb(SimPdb("ml", "p", {"app": "d0"}, min_available=r.randint(0, 3)))
    trained: dict[str, float] = {}
    seen: list[object] = []
    t = 0.0
    for _ in range(60):
        t += 15.0
        cluster.advance(t)
        _check(cluster)
        op = r.random()
        try:
            if op < 0.25:
                dep = r.choice(list(cluster.deployments.values()))
                cluster.scale_deployment(dep.namespace, dep.name, r.randint(0, 6))
            elif op < 0.4 and cluster.pods:
                pod = r.choice(list(cluster.pods.values()))
                cluster.evict_pod(pod.namespace, pod.name, dry_run=r.random() < 0.3)
            elif op < 0.55:
                pool = r.choice(["fixed", "burst"])
                size = cluster.node_count(pool)
                names = cluster.pools[pool].nodes
                named = r.choice(names) if names and r.random() < 0.5 else None
                cluster.scale(pool, max(0, size + r.choice([-2, -1, 1, 2])), expected=size, remove_node=named)
            elif op < 0.65 and cluster.jobs:
                job = r.choice(list(cluster.jobs.values()))
                cluster.suspend_workload("Job", job.namespace, job.name)
            elif op < 0.75 and cluster.jobs:
                job = r.choice(list(cluster.jobs.values()))
                cluster.resume_workload("Job", job.namespace, job.name)
        except PortError:
            pass
        _check(cluster)
        seen.append(cluster.snapshot(t))
        # steps are 15 s and every restart a multiple of 15 s: a gang training now trains until the next step
        for job in cluster.jobs.values():
            pods = [p for p in cluster.pods.values() if p.gang == job.gang]
            if job.finished_at is None and len(pods) == job.pods and all(p.ready(t) for p in pods):
                trained[job.gang] = trained.get(job.gang, 0.0) + 15.0 * job.gpus
    cluster.advance(t + 15.0)
    cluster.training_gpu_seconds()
    for job in cluster.jobs.values():
        assert job.progress_s <= job.work_s
        if job.finished_at is None:  # every GPU-second the gang trained is either kept or lost
            assert trained.get(job.gang, 0.0) == pytest.approx(job.progress_s * job.gpus + job.lost_gpu_s)
    return cluster, seen


def _check(cluster: SimCluster) -> None:
    used: dict[str, int] = {}
    for pod in cluster.pods.values():
        if pod.node is None:
            continue
        assert pod.node in cluster.nodes, pod
        node = cluster.nodes[pod.node]
        assert pod.bound_at is not None
        assert pod.bound_at < 0 or node.ready_at <= pod.bound_at, (pod, node)  # warm initial replicas: before 0
        used[pod.node] = used.get(pod.node, 0) + pod.gpus
    for name, gpus in used.items():
        assert gpus <= cluster.nodes[name].gpus, name
    for job in cluster.jobs.values():
        pods = [p for p in cluster.pods.values() if p.gang == job.gang]
        if job.admitted and job.finished_at is None:
            assert len(pods) == job.pods
            bound = [p.node is not None for p in pods]
            assert all(bound) or not any(bound), job.name  # a gang is placed whole or not at all
        else:
            assert not pods, job.name
    for key, dep in cluster.deployments.items():
        assert sum(1 for p in cluster.pods.values() if p.owner == key) == dep.replicas


@pytest.mark.parametrize("seed", range(40))
def test_random_writes_keep_the_clusters_invariants(seed: int) -> None:
    _random_walk(seed)


def test_the_same_writes_give_the_same_cluster() -> None:
    for seed in (3, 17):
        first, seen_first = _random_walk(seed)
        second, seen_second = _random_walk(seed)
        assert seen_first == seen_second
        assert first.writes == second.writes
        assert first.training_gpu_seconds() == second.training_gpu_seconds()
