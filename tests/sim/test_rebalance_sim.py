"""The rebalancer in the simulator (issue 15): its moves through the actuator onto the simulated cluster, its bounds
over many passes, what it must never move, the burst node it empties, and the scenario's ``rebalance`` block."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.core.rebalance import HOUR_S, RebalanceConfig, RebalanceState, plan_rebalance, stranded_gpus
from autoscaler.ports import EvictionOutcome
from autoscaler.sim.cluster import Scoring, SimCluster, SimDeployment, SimJob, SimPdb
from autoscaler.sim.engine import PolicyRun, simulate
from autoscaler.sim.policies import CorePolicy, SimService
from autoscaler.sim.scenario import NodePool, ScenarioError, parse_scenario
from autoscaler.sim.training import rebalance_config
from tests.sim.conftest import scenario_dict


def _job(name: str, pods: int = 1, gpus: int = 8, work: float = 100 * 3600.0) -> SimJob:
    return SimJob("training", name, pods, gpus, 100, work, 600.0, 0.0, min_runtime_s=600.0, restart_s=0.0)


def _fragmented(scoring: Scoring = Scoring.MOST_ALLOCATED) -> SimCluster:
    """Two 8-GPU nodes, one 1-GPU replica of ``chat`` on each (ready), an 8-GPU training pod pending: 14 GPUs free,
    none of them usable by the pod."""
    cluster = SimCluster(Scoring.LEAST_ALLOCATED)  # spread the two replicas, as a default scheduler would
    cluster.add_node("n1", 8)
    cluster.add_node("n2", 8)
    cluster.add_deployment(SimDeployment("inference", "chat", 2, cold_start_s=60.0), warm=True)
    cluster.scoring = scoring
    cluster.add_job(_job("big"))
    cluster.advance(0.0)
    assert sorted(p.node or "" for p in cluster.pods.values() if p.owner) == ["n1", "n2"]
    return cluster


def _passes(cluster: SimCluster, config: RebalanceConfig, times: Sequence[float]) -> list[int]:
    """The engine's rebalance job by hand: at each time the cluster advances, the planner plans on its snapshot and
    the controller's actuator applies the moves. Returns the evictions applied at each pass."""
    actuator = Actuator(cluster, cluster)
    state = RebalanceState()
    applied = []
    for now in times:
        plan, state = plan_rebalance(cluster.snapshot(now), now, config, state)
        results = actuator.apply(plan.actions, GuardContext(now, {})) if plan.actions else []
        applied.append(sum(1 for r in results if r.result == "applied"))
    return applied


def _training_node(cluster: SimCluster) -> str | None:
    nodes = {p.node for p in cluster.pods.values() if p.gang is not None}
    return next(iter(nodes)) if nodes and None not in nodes else None


def test_a_pending_8_gpu_pod_runs_after_one_replica_is_moved() -> None:
    cluster = _fragmented()
    snapshot = cluster.snapshot(0.0)
    assert stranded_gpus(snapshot) == 14
    assert _training_node(cluster) is None
    assert _passes(cluster, RebalanceConfig(), [0.0]) == [1]
    cluster.advance(15.0)
    # the replica's replacement went to the fullest node that fits (MostAllocated), the gang took the emptied node
    replicas = [p for p in cluster.pods.values() if p.owner]
    assert len(replicas) == 2 and len({p.node for p in replicas}) == 1
    assert _training_node(cluster) not in (None, replicas[0].node)
    assert stranded_gpus(cluster.snapshot(15.0)) == 0
    moved = [p for p in replicas if not p.ready(15.0)]
    assert len(moved) == 1 and moved[0].ready_at == 60.0  # the moved replica cold-starts again
    ops = [op for _, op, _ in cluster.writes]
    assert ops.count("evict_pod") == 1


def test_without_the_pass_the_8_gpu_pod_waits() -> None:
    cluster = _fragmented()
    cluster.advance(3600.0)
    assert _training_node(cluster) is None


def test_least_allocated_scoring_puts_the_moved_replica_back_where_it_was() -> None:
    # Why a bin-packing (or the project's fragmentation-aware) score must run beside the rebalancer: spreading
    # undoes its move.
    cluster = _fragmented(Scoring.LEAST_ALLOCATED)
    assert _passes(cluster, RebalanceConfig(), [0.0]) == [1]
    cluster.advance(15.0)
    assert sorted(p.node or "" for p in cluster.pods.values() if p.owner) == ["n1", "n2"]
    assert _training_node(cluster) is None


def test_the_fragmentation_score_keeps_the_moved_replica_off_the_emptied_node() -> None:
    # LeastAllocated plus the project's extender (FGD for the live mix of 1- and 8-GPU pods): the emptied node is
    # worth more whole, so the replica joins the other one although the default plugin prefers the empty node
    cluster = _fragmented(Scoring.FRAGMENTATION)
    assert _passes(cluster, RebalanceConfig(), [0.0]) == [1]
    cluster.advance(15.0)
    replicas = [p for p in cluster.pods.values() if p.owner]
    assert len({p.node for p in replicas}) == 1
    assert _training_node(cluster) not in (None, replicas[0].node)


def test_the_fragmentation_score_spreads_until_a_larger_pod_is_seen_then_packs() -> None:
    cluster = SimCluster(Scoring.FRAGMENTATION)
    cluster.add_node("n1", 8)
    cluster.add_node("n2", 8)
    cluster.add_deployment(SimDeployment("inference", "chat", 2))
    # only 1-GPU pods in the mix: no placement fragments anything, the default plugin spreads
    assert sorted(p.node or "" for p in cluster.pods.values()) == ["n1", "n2"]
    packed = SimCluster(Scoring.FRAGMENTATION)
    for name in ("n1", "n2", "n3"):
        packed.add_node(name, 8)
    packed.add_job(_job("big"))
    packed.advance(0.0)
    assert _training_node(packed) == "n1"
    packed.add_deployment(SimDeployment("inference", "chat", 2))
    # an 8-GPU pod is in the mix: the second replica joins the first instead of breaking the whole node n3
    assert sorted(p.node or "" for p in packed.pods.values() if p.owner) == ["n2", "n2"]
    spread_out = SimCluster(Scoring.LEAST_ALLOCATED)
    for name in ("n1", "n2", "n3"):
        spread_out.add_node(name, 8)
    spread_out.add_job(_job("big"))
    spread_out.advance(0.0)
    spread_out.add_deployment(SimDeployment("inference", "chat", 2))
    assert sorted(p.node or "" for p in spread_out.pods.values() if p.owner) == ["n2", "n3"]


def test_a_replica_under_a_pdb_allowing_no_disruption_is_never_moved() -> None:
    cluster = _fragmented()
    cluster.add_pdb(SimPdb("inference", "chat", {"app": "chat"}, min_available=2))
    assert cluster.snapshot(0.0).pdbs[0].disruptions_allowed == 0
    assert _passes(cluster, RebalanceConfig(interval_s=60.0), [60.0 * k for k in range(60)]) == [0] * 60
    assert not [op for _, op, _ in cluster.writes if op.startswith("evict_pod")]  # not even asked
    assert _training_node(cluster) is None
    # and the simulated Eviction API refuses it too, whoever asks
    replica = next(p for p in cluster.pods.values() if p.owner)
    assert cluster.evict_pod(replica.namespace, replica.name) is EvictionOutcome.BLOCKED
    assert replica.node is not None


def test_a_pdb_with_one_disruption_allows_one_move() -> None:
    cluster = _fragmented()
    cluster.add_pdb(SimPdb("inference", "chat", {"app": "chat"}, max_unavailable=1))
    assert _passes(cluster, RebalanceConfig(), [0.0]) == [1]
    cluster.advance(15.0)
    assert _training_node(cluster) is not None
    # its replacement is not ready yet: the budget allows no second eviction now
    assert cluster.snapshot(15.0).pdbs[0].disruptions_allowed == 0


def test_a_bare_pod_is_never_evicted() -> None:
    cluster = SimCluster(Scoring.MOST_ALLOCATED)
    cluster.add_node("n1", 8)
    cluster.add_node("n2", 8)
    cluster.add_training_pod("tools", "bare-1", 1, 0, node="n1")  # no owner: nothing would recreate it
    cluster.add_training_pod("tools", "bare-2", 1, 0, node="n2")
    cluster.add_job(_job("big"))
    cluster.advance(0.0)
    assert stranded_gpus(cluster.snapshot(0.0)) == 14
    assert _passes(cluster, RebalanceConfig(interval_s=60.0), [60.0 * k for k in range(30)]) == [0] * 30
    assert "evict_pod" not in {op for _, op, _ in cluster.writes}
    assert {("tools", "bare-1"), ("tools", "bare-2")} <= set(cluster.pods)


def test_the_only_replica_of_a_deployment_is_not_moved() -> None:
    cluster = SimCluster(Scoring.MOST_ALLOCATED)
    cluster.add_node("n1", 8)
    cluster.add_node("n2", 8)
    cluster.add_deployment(SimDeployment("inference", "a", 1), warm=True)
    cluster.add_deployment(SimDeployment("inference", "b", 1), warm=True)
    cluster.place_pod("inference", next(n for (_, n), p in cluster.pods.items() if p.owner == "inference/b"), "n2")
    cluster.add_job(_job("big"))
    assert _passes(cluster, RebalanceConfig(), [0.0]) == [0]


# ---- through the engine ---------------------------------------------------------------------------------------------


def _service(name: str, replicas: int, gpus: int = 1, steps: int = 1200) -> SimService:
    # a constant load that needs exactly ``replicas`` replicas at 3 req/s each
    policy = ServicePolicy("inference", name, min_replicas=replicas, max_replicas=replicas,
                           metric=MetricKind.REQUEST_RATE, target=3.0, cold_start_s=60.0, priority=1000,
                           gpus_per_replica=gpus)
    return SimService(policy, np.full(steps, 2.0 * replicas), throughput=3.5, base_latency_s=1.0, slo_s=3.0,
                      quantile=0.95)


def _evictions(run: PolicyRun) -> list[float]:
    assert run.cluster is not None
    return [t for t, op, _ in run.cluster.writes if op == "evict_pod"]


@pytest.mark.parametrize(("per_pass", "per_hour"), [(1, 3), (2, 5)])
def test_moves_never_exceed_the_bounds_over_a_long_run(per_pass: int, per_hour: int) -> None:
    # Under LeastAllocated the scheduler puts every moved replica back where it was, so the rebalancer wants to move
    # again at every pass (two Deployments: one replica of each may move per pass): only the bounds hold it back.
    services = [_service("a", 2), _service("b", 2)]
    jobs = [_job("t1"), _job("t2")]
    pools = [NodePool(name="onprem", nodes=4, gpusPerNode=8)]
    # retry_after_s=0, put_back_checks=0: no back-off for a target still waiting after its moves, nor the put-back
    # hold, so the bounds alone hold it
    config = RebalanceConfig(interval_s=60.0, max_moves_per_pass=per_pass, max_moves_per_hour=per_hour,
                             retry_after_s=0.0, spare_replicas_only=False, put_back_checks=0)
    run = simulate(CorePolicy("reactive"), services, pools, 0.0, 15.0, 1200, 0.0, scoring=Scoring.LEAST_ALLOCATED,
                   jobs=jobs, rebalance=config)
    times = _evictions(run)
    assert len(times) == run.rebalance_moves >= 3 * per_hour  # five hours: the hourly bound is reached
    per_time = Counter(times)
    assert max(per_time.values()) == per_pass
    for t in times:
        assert sum(1 for u in times if 0 <= t - u < HOUR_S) <= per_hour
    assert run.max_moves_in_an_hour() == per_hour
    assert run.rebalance_passes == 300  # every 60 s over 5 hours


def test_a_target_whose_moves_were_undone_waits_before_it_is_moved_for_again() -> None:
    # The same run with the default back-off: each waiting gang is moved for at most once per retry_after_s (the
    # put-back hold off: it is the test below).
    services = [_service("a", 2), _service("b", 2)]
    pools = [NodePool(name="onprem", nodes=4, gpusPerNode=8)]
    config = RebalanceConfig(interval_s=60.0, max_moves_per_pass=2, max_moves_per_hour=50, retry_after_s=1800.0,
                             spare_replicas_only=False, put_back_checks=0)
    run = simulate(CorePolicy("reactive"), services, pools, 0.0, 15.0, 1200, 0.0, scoring=Scoring.LEAST_ALLOCATED,
                   jobs=[_job("t1"), _job("t2")], rebalance=config)
    times = sorted(set(_evictions(run)))
    assert times, "the first pass moves"
    # two waiting gangs, a pass a minute for five hours: without the back-off that is up to 300 passes with moves
    assert len(times) <= 2 * (5 * 3600 // 1800 + 1)
    no_backoff = simulate(CorePolicy("reactive"), services, pools, 0.0, 15.0, 1200, 0.0,
                          scoring=Scoring.LEAST_ALLOCATED, jobs=[_job("t1"), _job("t2")],
                          rebalance=RebalanceConfig(interval_s=60.0, max_moves_per_pass=2, max_moves_per_hour=50,
                                                    retry_after_s=0.0, spare_replicas_only=False, put_back_checks=0))
    assert len(_evictions(no_backoff)) > len(_evictions(run))


def test_under_a_spreading_scorer_the_put_back_hold_stops_the_moves_after_three_refilled_rooms() -> None:
    """Stop 48: the same world (LeastAllocated puts each moved replica back on the node it left, both gangs wait on).
    With the put-back hold the passes of moves stop after three judged put back, for 4 hours: over 5 hours at most
    three passes and one probe, against the back-off alone's more; the cluster's figures otherwise alike."""
    services = [_service("a", 2), _service("b", 2)]
    pools = [NodePool(name="onprem", nodes=4, gpusPerNode=8)]

    def run(checks: int) -> PolicyRun:
        config = RebalanceConfig(interval_s=60.0, max_moves_per_pass=2, max_moves_per_hour=50, retry_after_s=1800.0,
                                 spare_replicas_only=False, put_back_checks=checks)
        return simulate(CorePolicy("reactive"), services, pools, 0.0, 15.0, 1200, 0.0,
                        scoring=Scoring.LEAST_ALLOCATED, jobs=[_job("t1"), _job("t2")], rebalance=config)

    held, alone = sorted(set(_evictions(run(3)))), sorted(set(_evictions(run(0))))
    assert len(held) < len(alone), (held, alone)
    assert len(held) <= 4, held
    # after the third pass of moves, nothing for put_back_hold_s (4 h) but the probe
    assert all(b - a >= 4 * HOUR_S - 120.0 for a, b in pairwise(held[2:])), held


def test_the_rebalancer_does_not_run_beside_the_baselines_and_is_off_without_a_config() -> None:
    services = [_service("a", 2), _service("b", 2)]
    pools = [NodePool(name="onprem", nodes=4, gpusPerNode=8)]
    config = RebalanceConfig(interval_s=60.0)
    hpa_like = CorePolicy("hpa")
    assert not hpa_like.rebalances
    run = simulate(hpa_like, services, pools, 0.0, 15.0, 240, 0.0, scoring=Scoring.LEAST_ALLOCATED,
                   jobs=[_job("t1")], rebalance=config)
    assert _evictions(run) == [] and run.rebalance_passes == 0
    assert run.stranded_gpu_seconds is not None and run.stranded_gpu_seconds > 0
    off = simulate(CorePolicy("reactive"), services, pools, 0.0, 15.0, 240, 0.0, scoring=Scoring.LEAST_ALLOCATED,
                   jobs=[_job("t1")])
    assert _evictions(off) == [] and off.stranded_gpu_seconds is None


def test_stranded_gpus_fall_when_the_rebalancer_makes_room_under_bin_packing() -> None:
    services = [_service("a", 2), _service("b", 2)]
    pools = [NodePool(name="onprem", nodes=4, gpusPerNode=8)]
    jobs = [_job("t1"), _job("t2")]

    def spread(cluster: SimCluster) -> None:  # one replica per node, as a spreading scheduler left them
        replicas = sorted(name for (_, name), p in cluster.pods.items() if p.owner)
        for index, name in enumerate(replicas):
            cluster.place_pod("inference", name, f"onprem-{index}")

    # each service needs every replica it runs: the spare-replica rule would move none (tests/core/test_rebalance_spare)
    config = RebalanceConfig(interval_s=60.0, spare_replicas_only=False)
    runs = [
        simulate(CorePolicy("reactive"), services, pools, 0.0, 15.0, 240, 0.0, scoring=Scoring.MOST_ALLOCATED,
                 jobs=jobs, rebalance=config if on else None, fragmentation=config, prepare=spread)
        for on in (False, True)
    ]
    without, with_ = runs
    assert without.rebalance_moves == 0 and with_.rebalance_moves == 2
    assert without.training_gpu_seconds == 0.0 and with_.training_gpu_seconds > 0.0
    assert without.stranded_gpu_seconds is not None and with_.stranded_gpu_seconds is not None
    assert with_.stranded_gpu_seconds < without.stranded_gpu_seconds / 10


def test_a_burst_node_kept_by_one_stray_replica_is_emptied_then_given_back() -> None:
    # One 4-GPU replica on a burst node: half its GPUs in use, so the controller's give-back (spare below half)
    # keeps it all run. The rebalancer (burstEmptyBelow 0.75) moves the replica on-prem; the give-back then removes
    # the empty node after its cooldown.
    pools = [
        NodePool(name="onprem", nodes=1, gpusPerNode=8),
        NodePool(name="burst", nodes=0, gpusPerNode=8, burst=True, maxNodes=1, bootSeconds=0, pricePerGpuHour=4.0),
    ]
    services = [_service("chat", 2, gpus=4, steps=960)]
    capacity = CapacityConfig(pools=(BurstPool("burst", 8, "A100-80GB", 0.0, 4.0, max_nodes=1),))

    def stray(cluster: SimCluster) -> None:
        cluster.scale("burst", 1)
        name = min(name for (_, name), p in cluster.pods.items() if p.owner)
        cluster.place_pod("inference", name, "burst-0")

    # steady demand: the service needs every replica it runs, so the spare-replica rule would keep the stray
    config = RebalanceConfig(interval_s=300.0, burst_pools=frozenset({"burst"}), burst_empty_below=0.75,
                             training_excluded_pools=frozenset({"burst"}), spare_replicas_only=False)
    runs = [
        simulate(CorePolicy("reactive", capacity), services, pools, 0.0, 15.0, 960, 0.0,
                 scoring=Scoring.MOST_ALLOCATED, rebalance=config if on else None, fragmentation=config,
                 prepare=stray)
        for on in (False, True)
    ]
    without, with_ = runs
    assert without.burst_gpu_seconds == pytest.approx(8 * 960 * 15.0)  # the node stays the whole 4 hours
    assert with_.rebalance_moves == 1
    assert with_.cluster is not None and with_.cluster.pools["burst"].nodes == []
    writes = [(t, op) for t, op, _ in with_.cluster.writes if op in ("evict_pod", "scale")]
    assert [op for _, op in writes] == ["scale", "evict_pod", "scale"]  # built, emptied, given back
    assert with_.burst_gpu_seconds < without.burst_gpu_seconds / 4
    assert with_.requests_in_slo_steps / with_.requests > 0.97


# ---- the scenario's block ------------------------------------------------------------------------------------------


def test_the_rebalance_block_maps_onto_the_planner_config() -> None:
    data = scenario_dict("trace.csv", rebalance={
        "enabled": True, "intervalSeconds": 120, "maxMovesPerPass": 3, "maxMovesPerHour": 6, "minGainPerMove": 4,
        "checkpointMaxAgeSeconds": 900, "burstEmptyBelow": 0.25,
    })
    config = rebalance_config(parse_scenario(data))
    assert config == RebalanceConfig(
        interval_s=120.0, max_moves_per_pass=3, max_moves_per_hour=6, min_gain_per_move=4.0,
        checkpoint_max_age_s=900.0, burst_pools=frozenset({"burst"}), burst_empty_below=0.25,
        training_excluded_pools=frozenset({"burst"}),
    )
    assert not parse_scenario(scenario_dict("trace.csv")).rebalance.enabled


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"enabled": "yes"}, "rebalance.enabled: Input should be true or false"),
        ({"intervalSeconds": 0}, "rebalance.intervalSeconds: Input should be greater than 0"),
        ({"intervalSeconds": float("nan")}, "rebalance.intervalSeconds: Input should be a finite number"),
        ({"maxMovesPerPass": -1}, "rebalance.maxMovesPerPass: Input should be greater than or equal to 0"),
        ({"maxMovesPerHour": True}, "rebalance.maxMovesPerHour: Input should be a number, not a boolean"),
        ({"maxMovesPerPass": 10, "maxMovesPerHour": 4}, "rebalance: maxMovesPerPass (10) must be <= maxMovesPerHour"),
        ({"minGainPerMove": -0.5}, "rebalance.minGainPerMove: Input should be greater than or equal to 0"),
        ({"checkpointMaxAgeSeconds": 1e9}, "rebalance.checkpointMaxAgeSeconds: Input should be less than or equal"),
        ({"burstEmptyBelow": 1.5}, "rebalance.burstEmptyBelow: Input should be less than or equal to 1"),
        ({"movesPerPass": 1}, "rebalance.movesPerPass: Extra inputs are not permitted"),
        ({"enabled": True, "maxMovesPerPass": 0, "maxMovesPerHour": 0}, None),
    ],
)
def test_bad_rebalance_blocks_name_the_field_and_the_problem(block: dict[str, object], expected: str | None) -> None:
    data = scenario_dict("trace.csv", rebalance=block)
    if expected is None:
        parse_scenario(data)
        return
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, "bad.yaml")
    assert expected in str(caught.value)
