"""Review 39 of the trace-driven simulator (``autoscaler/sim``): engine, cluster, scenario, report, run, policies.

Defects found (each reproduced by an ``xfail(strict=True)`` test below, whose docstring says WRONG / RIGHT; all nine
fixed in the same stop, the tests now say "Fixed"):

1. ``spec.mode: recommend-only`` is accepted in a scenario, and then the controller's columns *and the HPA baseline*
   never scale (the HPA baseline inherits the GPUScalingPolicy's mode): the comparison shows a flat line at the
   initial replicas while oracle and static scale (``policies.HpaBaseline.policy_for`` / ``CorePolicy.policy_for``,
   ``scenario.ServiceEntry``).
2. The oracle never scales a ``minReplicas: 0`` service below one replica (``policies.SimService.need`` floors the
   bound at 1): at zero demand it pays a GPU the SLO does not need, so another policy's *GPU-hours / oracle* can be
   far below 1.
3. The HPA baseline of a ``minReplicas: 0`` service scales to zero on GPU utilisation and is then stuck there for the
   rest of the run (``metrics_stale``): a Kubernetes HPA on a resource metric cannot have minReplicas 0
   (``policies.HpaBaseline.policy_for``).
4. The Cluster-Autoscaler-like node loop forgets the unneeded-since time of every due burst node but the one it
   removes, so N idle burst nodes go one per ``scaleDownUnneededSeconds`` (+ a step) instead of one per loop, and
   the baselines' burst cost is overstated (``engine.node_autoscaler_plan``).
5. The node loop sizes a scale-up by summed GPUs: it buys burst nodes too small for the pending pods (billed for
   the rest of the run, never used), and too few nodes when pods do not pack (``engine.node_autoscaler_plan``).
6. A training gang that only a burst pool could hold is accepted, although burst pools are tainted for inference
   only: the gang never starts (``scenario.Scenario._placeable`` / ``_gang_problem``).
7. A ``binSeconds`` that does not divide the trace's span makes the run longer than the trace, replaying demand
   past its end (``run._load_demand`` / ``build_services``): a 600 s trace at ``binSeconds: 420`` is a 840 s run
   with 40 % more requests.
8. ``metricsDelaySeconds`` is rounded to whole steps half-to-even (``engine.simulate``: ``round``): at 60 s steps
   the default 30 s delay becomes 0, the policies see the demand of the step that has just ended.
9. ``capacity.expanders: [priority]`` is accepted, but a node pool cannot be given a priority: the expander never
   tells pools apart (``training.capacity_config``, ``scenario.NodePool``).

The plain tests pin right behaviour checked in this review that no other test pins.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from autoscaler.core.cluster import ClusterSnapshot
from autoscaler.core.model import MetricKind, Observation, Plan, ScaleNodePool, ServicePolicy
from autoscaler.core.reasons import Reason
from autoscaler.sim.cluster import SimCluster, SimDeployment, SimJob, SimPool
from autoscaler.sim.engine import PolicyRun, node_autoscaler_plan, simulate
from autoscaler.sim.policies import HpaBaseline, Oracle, SimPolicy, SimService, replica_plan
from autoscaler.sim.registry import make_policy
from autoscaler.sim.report import figures, format_table
from autoscaler.sim.run import run_scenario
from autoscaler.sim.scenario import NodePool, ScenarioError, load_scenario, parse_scenario
from tests.sim.conftest import scenario_dict, write_rate_trace

FIXED = NodePool(name="fixed", nodes=1, gpusPerNode=8)


class Scripted(SimPolicy):
    """Asks for ``script[step]`` replicas of the one service (or keeps the last); records what it saw."""

    name = "scripted"

    def __init__(self, initial: int, script: dict[int, int]) -> None:
        self.initial = initial
        self.script = script
        self.current = initial
        self.seen: list[float | None] = []

    def reset(self, services: Sequence[SimService], step_s: float) -> list[int]:
        super().reset(services, step_s)
        self.current = self.initial
        self.seen = []
        return [self.initial]

    def plan(self, step: int, now: float, observation: Observation, snapshot: ClusterSnapshot) -> Plan:
        self.seen.append(observation.services["ml/chat"].request_rate)
        self.current = self.script.get(step, self.current)
        return replica_plan(now, self.services, observation, [(self.current, Reason.STATIC_PEAK)])


def _service(
    rates: Sequence[float],
    cold_start_s: float = 60.0,
    min_replicas: int = 1,
    max_replicas: int = 100,
    gpus: int = 1,
    metric: MetricKind = MetricKind.GPU_UTILIZATION,
) -> SimService:
    policy = ServicePolicy(
        namespace="ml",
        name="chat",
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        cold_start_s=cold_start_s,
        gpus_per_replica=gpus,
        metric=metric,
        target=8.0 if metric is MetricKind.REQUEST_RATE else 70.0,
    )
    return SimService(
        policy, np.asarray(rates, dtype=float), throughput=10.0, base_latency_s=1.0, slo_s=1.5, quantile=0.95
    )


def _write_scenario(tmp_path: Path, data: dict[str, Any], rates: Sequence[float], step_s: float = 60.0) -> Path:
    write_rate_trace(tmp_path / "trace.csv", list(rates), step_s)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# ==== 1. spec.mode: recommend-only ===================================================================================


def test_recommend_only_mode_is_refused_or_the_baselines_still_scale(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/scenario.py`` ``ServiceEntry`` accepts ``spec.mode: recommend-only`` (a policy copied
    from a cluster where it is being tried out). ``policies.CorePolicy.policy_for`` and ``HpaBaseline.policy_for``
    keep that mode, so ``decide_tick`` writes nothing: ``reactive``, ``predictive`` *and* ``hpa`` (a Kubernetes HPA,
    which has no such mode) stay at their initial replicas while demand goes 10 -> 100 req/s -- 4.8 % of requests
    within the SLO against the oracle's 100 %, with no warning. RIGHT: either the scenario is refused naming
    ``services.0.spec.mode`` (a simulation replays a policy that acts), or the simulated policies run it as
    ``active`` (at the very least the HPA baseline, which is not the GPUScalingPolicy); here: the hpa column scales
    up."""
    data = scenario_dict("trace.csv")
    data["services"][0]["spec"]["mode"] = "recommend-only"
    path = _write_scenario(tmp_path, data, [10.0] * 10 + [100.0] * 20)
    try:
        scenario, base = load_scenario(path)
    except ScenarioError as error:
        # the scenario's own checks name the entry, then the field (as for spec.maxReplicas)
        assert "services.0: spec.mode" in str(error)
        return
    result = run_scenario(scenario, base, ["hpa", "reactive"])
    for name in ("hpa", "reactive"):
        spec = result.runs[name].timelines[0].spec
        assert spec.max() > spec[0], name  # 100 req/s at 10 req/s per replica needs far more than the first 2


def test_active_mode_scales_the_same_scenario(tmp_path: Path) -> None:
    """The control for the test above: the same scenario in the default mode scales both columns up."""
    data = scenario_dict("trace.csv")
    path = _write_scenario(tmp_path, data, [10.0] * 10 + [100.0] * 20)
    scenario, base = load_scenario(path)
    result = run_scenario(scenario, base, ["hpa", "reactive"])
    for name in ("hpa", "reactive"):
        spec = result.runs[name].timelines[0].spec
        assert spec.max() >= result.services[0].need(100.0) > spec[0], name


# ==== 2. the oracle and minReplicas 0 ================================================================================


def test_the_oracle_scales_a_min_zero_service_to_zero_when_nothing_is_asked() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/policies.py`` ``SimService.need`` calls ``replicas_needed`` with
    ``max(self.policy.min_replicas, 1)``, so the oracle (``Oracle.reset``: need per step, then its forward window
    max) keeps one replica through a long stretch of zero demand of a ``minReplicas: 0`` service, although the
    latency model meets the SLO with no replica when no request comes (``latency_and_share(0, 0.0, ...)`` is the base
    latency). The oracle is documented as "the fewest GPU-hours that meet the SLO at every step"; with the floor, a
    scale-to-zero policy shows *GPU-hours / oracle* far below 1 (0.49 for ``reactive`` on 30 idle, 5 busy, 30 idle
    minutes). RIGHT: ``need`` honours ``minReplicas`` 0 (``replicas_needed`` already returns ``min_replicas`` at zero
    demand): the oracle holds 0 replicas where nothing is asked and a cold start ahead, pre-warms."""
    rates = [0.0] * 40 + [10.0] * 8 + [0.0] * 40
    service = _service(rates, cold_start_s=30.0, min_replicas=0, metric=MetricKind.REQUEST_RATE)
    run = simulate(Oracle(), [service], [FIXED], 0.0, 15.0, len(rates), 0.0)
    timeline = run.timelines[0]
    assert timeline.within_slo.all()
    assert timeline.spec[:30].tolist() == [0] * 30  # the demand at step 40 is 3 cold starts away
    assert timeline.spec[60:].tolist() == [0] * 28


def test_the_latency_model_meets_the_slo_with_no_replica_and_no_demand() -> None:
    """What the oracle test above relies on: zero replicas serve zero demand within the SLO."""
    from autoscaler.sim.latency import latency_and_share, replicas_needed

    assert latency_and_share(0, 0.0, 10.0, 1.0, 0.95, 1.5) == (1.0, 1.0)
    assert replicas_needed(0.0, 10.0, 1.0, 1.5, 0.95, min_replicas=0) == 0
    assert replicas_needed(0.1, 10.0, 1.0, 1.5, 0.95, min_replicas=0) == 1


# ==== 3. the HPA baseline and minReplicas 0 ==========================================================================


def test_the_hpa_baseline_never_scales_to_zero_on_gpu_utilisation() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/policies.py`` ``HpaBaseline.policy_for`` swaps the metric for GPU utilisation (a
    per-pod metric) but keeps the service's ``minReplicas: 0``. After 300 s of no demand the HPA scales to 0; with no
    pod left there is no utilisation sample, the core reads it as stale, and the baseline holds at 0 replicas for
    the rest of the run while demand comes back (0 % within SLO on the run below, ``metrics_stale`` on every tick).
    A Kubernetes HPA cannot do this: minReplicas 0 needs the HPAScaleToZero gate *and* an Object or External metric;
    on a resource metric its minimum is 1 (the GPUScalingPolicy validation refuses the same pairing). RIGHT: the HPA
    baseline runs with ``max(1, minReplicas)`` and scales up when demand returns."""
    rates = [0.0] * 40 + [10.0] * 40
    service = _service(rates, cold_start_s=30.0, min_replicas=0, metric=MetricKind.REQUEST_RATE)
    run = simulate(HpaBaseline(), [service], [FIXED], 0.0, 15.0, len(rates), 0.0)
    assert run.timelines[0].spec.min() >= 1
    assert run.timelines[0].ready[-1] >= 1
    assert run.reasons.get(Reason.METRICS_STALE.value, 0) == 0


def test_the_hpa_baseline_keeps_its_minimum_of_one() -> None:
    """Control: with minReplicas 1 the same baseline never goes below one replica and serves the demand back."""
    rates = [0.0] * 40 + [10.0] * 40
    service = _service(rates, cold_start_s=30.0, min_replicas=1)
    run = simulate(HpaBaseline(), [service], [FIXED], 0.0, 15.0, len(rates), 0.0)
    assert run.timelines[0].spec.min() == 1
    assert run.timelines[0].within_slo[-10:].all()


# ==== 4. the node loop forgets the other unneeded nodes' timers ======================================================


def _burst_run(script: dict[int, int], unneeded_s: float = 60.0, steps: int = 40) -> PolicyRun:
    pools = [
        FIXED,
        NodePool(
            name="burst",
            nodes=0,
            burst=True,
            maxNodes=4,
            gpusPerNode=8,
            bootSeconds=0,
            pricePerGpuHour=1.0,
            scaleDownUnneededSeconds=unneeded_s,
        ),
    ]
    return simulate(Scripted(2, script), [_service([5.0] * steps, cold_start_s=15.0)], pools, 0.0, 15.0, steps, 0.0)


def test_idle_burst_nodes_go_one_per_loop_once_unneeded_long_enough() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/engine.py`` ``node_autoscaler_plan`` removes one due burst node per loop (as it
    says, Cluster Autoscaler's one-by-one removal) but then pops the unneeded-since time of *every* due node; the
    others, still idle, start a new ``scaleDownUnneededSeconds`` at the next loop. Four empty burst nodes (idle from
    t=75 s, 60 s to wait) go at 135, 210, 285 and 360 s instead of 135, 150, 165, 180 s; at the default 600 s the
    last of four goes 30 minutes late, all billed (the baselines' burst GPU-hours and cost are overstated). RIGHT:
    only the removed node's entry is dropped; a node that stays unneeded keeps its time and goes at the next loop
    (or the empty ones go together, as the Cluster Autoscaler deletes empty nodes in bulk)."""
    run = _burst_run({0: 40, 4: 2})
    assert run.burst_gpus is not None
    assert run.burst_gpus[8] == 32  # idle since the end of step 4 (t=75 s): the first goes at t=135 s
    assert run.burst_gpus[12] == 0  # ... and the other three by the end of step 11 at the latest


def test_an_idle_burst_node_goes_after_scale_down_unneeded_seconds() -> None:
    """Pin: the first idle burst node goes exactly ``scaleDownUnneededSeconds`` after it became unneeded, and burst
    nodes are billed from the step after their request (booting or not) until the step of their removal."""
    run = _burst_run({0: 40, 4: 2})
    assert run.burst_gpus is not None
    burst = run.burst_gpus.tolist()
    # 40 asked at the end of step 0: 6 fit on the fixed node, 32 GPUs pending -> 4 burst nodes from step 1
    assert burst[0] == 0 and burst[1:9] == [32] * 8
    assert burst[9] == 24  # unneeded from t=75 s (end of step 4), removed at t=135 s (end of step 8)
    assert run.burst_gpu_seconds == pytest.approx(sum(burst) * 15.0)
    assert run.burst_cost == pytest.approx(sum(burst) * 15.0 / 3600.0 * 1.0)


# ==== 5. the node loop sizes a scale-up by summed GPUs ===============================================================


def _pending_plan(replica_gpus: int, replicas: int, burst_gpus_per_node: int) -> list[ScaleNodePool]:
    pools = [
        NodePool(name="fixed", nodes=1, gpusPerNode=8),
        NodePool(name="burst", nodes=0, burst=True, maxNodes=4, gpusPerNode=burst_gpus_per_node, bootSeconds=300),
    ]
    cluster = SimCluster()
    cluster.add_pool(SimPool("fixed", 8, None, 0.0, 1, 1), nodes=1)
    cluster.add_pool(SimPool("burst", burst_gpus_per_node, None, 300.0, 0, 4))
    cluster.add_training_pod("batch", "fill", 8, 10, node="fixed-0")  # the fixed node is full
    cluster.add_deployment(SimDeployment("ml", "chat", replicas, gpus_per_replica=replica_gpus, priority=1000))
    snapshot = cluster.snapshot(0.0)
    assert sum(1 for p in snapshot.pods if p.owner_kind == "Deployment" and p.node is None) == replicas
    plan = node_autoscaler_plan(snapshot, pools, {}, 0.0)
    return [a for a in plan.actions if isinstance(a, ScaleNodePool)]


def test_the_node_loop_buys_no_node_too_small_for_the_pending_pod() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/engine.py`` ``node_autoscaler_plan`` adds ``ceil(pending GPUs / gpusPerNode)`` nodes
    whatever the size of the pending pods: 8-GPU replicas pending (the fixed 8-GPU node full) make it add two 4-GPU
    burst nodes that can never hold one; they stay Pending, so the loop never scales down (pending pods clear every
    unneeded timer) and the nodes are billed to the end of the run (a 10-minute ``static`` run with up to 4 such
    nodes: 16 burst GPUs from the first step on, 5.20 $, not one replica more). The scenario is valid (a replica fits
    the fixed pool's nodes). RIGHT: as the Cluster Autoscaler does (it simulates the pod on the node group's
    template), a pool whose node cannot hold the pending pod is not scaled up for it."""
    assert _pending_plan(replica_gpus=8, replicas=1, burst_gpus_per_node=4) == []


def test_the_node_loop_adds_a_node_per_pod_that_does_not_pack() -> None:
    """Fixed (was a strict xfail).

    WRONG: the same sum: three pending 5-GPU replicas are 15 GPUs, ``ceil(15 / 8)`` = 2 burst nodes of 8 GPUs,
    which hold one 5-GPU pod each; the third waits for them to boot, then for a third node's boot (its next loop sees
    the 2 x 8 booting GPUs as covering the 5 pending ones): a whole extra boot of SLO misses for the baselines. RIGHT:
    nodes for the pods as they pack (Cluster Autoscaler's bin-packing estimator): 3 nodes."""
    actions = _pending_plan(replica_gpus=5, replicas=3, burst_gpus_per_node=8)
    assert [(a.pool, a.nodes) for a in actions] == [("burst", 3)]


def test_the_node_loop_adds_nodes_for_pods_that_pack() -> None:
    """Pin: pods that pack are counted right: four 4-GPU replicas pending are two 8-GPU burst nodes."""
    actions = _pending_plan(replica_gpus=4, replicas=4, burst_gpus_per_node=8)
    assert [(a.pool, a.nodes, a.reason) for a in actions] == [("burst", 2, Reason.BURST_SCALE_UP)]


# ==== 6. training gangs only a burst pool could hold =================================================================


def _training_scenario(onprem_nodes: int) -> dict[str, Any]:
    data = scenario_dict("trace.csv")  # fixed: 8-GPU nodes; burst: 8-GPU nodes, up to 2
    data["nodePools"][0]["nodes"] = onprem_nodes
    data["training"] = {"jobs": [{"name": "big", "pods": 2, "gpusPerPod": 8, "workSeconds": 300}]}
    return data


def test_a_gang_only_a_burst_pool_could_hold_is_refused(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/scenario.py`` ``Scenario._placeable`` (``_gang_problem``) counts every pool that can
    have a node as room for a training gang, burst pools included; but the simulated burst pools are tainted for
    inference only (``engine.build_cluster`` sets ``inference_only_pools``, ``SimCluster._fits_on`` keeps training
    off them). One on-prem 8-GPU node and a burst pool of 8-GPU nodes: a gang of 2 x 8 GPUs is accepted, then never
    starts in any column (0 training GPU-hours, 0 jobs finished) -- "the result of a cluster that cannot exist", which
    ``_placeable`` is there to refuse. RIGHT: only pools that do not burst count for training; the scenario is
    refused naming ``training.jobs.0``."""
    with pytest.raises(ScenarioError, match=r"training\.jobs\.0"):
        parse_scenario(_training_scenario(onprem_nodes=1))


def test_a_gang_that_fits_the_on_prem_pool_is_accepted_and_trains(tmp_path: Path) -> None:
    """Pin (the other side of the test above): with three on-prem nodes (one holds the replica) the same gang is
    accepted and runs to the end (300 s of work + 60 s restart in a 20-minute run), its work counted as 2 x 8 GPUs x
    300 s."""
    path = _write_scenario(tmp_path, _training_scenario(onprem_nodes=3), [5.0] * 20)
    scenario, base = load_scenario(path)
    result = run_scenario(scenario, base, ["static"])
    report = result.report["policies"]["static"]
    assert report["training_jobs_finished"] == 1
    assert report["training_gpu_hours"] == pytest.approx(16 * 300.0 / 3600.0)
    assert report["lost_training_gpu_hours"] == 0.0


# ==== 7. binSeconds that does not divide the trace's span ============================================================


def test_bin_seconds_does_not_make_the_run_longer_than_the_trace(tmp_path: Path) -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/run.py`` ``_load_demand`` resamples a rate-series trace to ``binSeconds``; the last
    bin runs past the trace's end and gets the mean of the part it covers, and ``build_services`` takes the run's
    span from that binned series. A 10-minute trace (10 rows at 60 s, 10 req/s: 6,000 requests) with
    ``binSeconds: 420`` becomes an 840 s run of 56 steps with 8,400 requests (``binSeconds: 3600``: an hour, 36,000
    requests); the report's days, requests, GPU-hours and costs all cover demand the trace does not have. RIGHT: the
    run covers the trace's own span (600 s: 40 steps of 15 s) and its 6,000 requests."""
    data = scenario_dict("trace.csv")
    data["services"][0]["simulation"]["binSeconds"] = 420
    path = _write_scenario(tmp_path, data, [10.0] * 10)
    scenario, base = load_scenario(path)
    result = run_scenario(scenario, base, ["static"])
    assert result.steps == 40
    assert result.runs["static"].requests == pytest.approx(6000.0)


@pytest.mark.parametrize("bin_seconds", [60, 120, 300])
def test_bin_seconds_that_divide_the_trace_keep_its_span_and_requests(tmp_path: Path, bin_seconds: int) -> None:
    """Pin: binning that divides the span changes neither the run's length nor its requests."""
    data = scenario_dict("trace.csv")
    data["services"][0]["simulation"]["binSeconds"] = bin_seconds
    path = _write_scenario(tmp_path, data, [10.0] * 5 + [20.0] * 5)
    scenario, base = load_scenario(path)
    result = run_scenario(scenario, base, ["static"])
    assert result.steps == 40
    assert result.runs["static"].requests == pytest.approx(60.0 * (10.0 * 5 + 20.0 * 5))
    assert result.report["scenario"]["simulated_days"] == pytest.approx(600.0 / 86400.0)


# ==== 8. metricsDelaySeconds rounded half-to-even ===================================================================


def _first_step_seeing_the_jump(step_s: float, delay_s: float) -> int:
    rates = [10.0] * 4 + [40.0] * 8
    policy = Scripted(5, {})
    simulate(policy, [_service(rates)], [FIXED], 0.0, step_s, len(rates), metrics_delay_s=delay_s)
    return policy.seen.index(40.0)


def test_a_metrics_delay_of_half_a_step_is_not_dropped() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/engine.py`` ``simulate`` turns the delay into steps with ``round(metrics_delay_s /
    step_s)``, Python's half-to-even rounding: at ``stepSeconds: 60`` the default ``metricsDelaySeconds: 30`` is 0
    steps, and the decision at the end of the step in which demand jumps already sees the jump (the step that has
    just ended: age 0, not 30 s); 15 s at 30 s steps is 0 too, while 45 s at 30 s steps is 60 s and 75 s is 60 s as
    well. The reactive columns look better on coarse steps than the scenario says they would. RIGHT: a non-zero delay
    is never rounded to none (whole steps rounded up), or a delay that is not a multiple of ``stepSeconds`` is refused
    at load naming ``metricsDelaySeconds``."""
    data = scenario_dict("trace.csv", stepSeconds=60)
    del data["metricsDelaySeconds"]  # the default, 30 s
    try:
        parse_scenario(data)
    except ScenarioError as error:
        assert "metricsDelaySeconds" in str(error)
        return
    assert _first_step_seeing_the_jump(60.0, 30.0) > 4  # demand jumps in step 4


@pytest.mark.parametrize(
    ("step_s", "delay_s", "first"), [(15.0, 0.0, 4), (15.0, 15.0, 5), (15.0, 30.0, 6), (60.0, 60.0, 5), (30.0, 60.0, 6)]
)
def test_a_delay_of_whole_steps_is_that_many_steps(step_s: float, delay_s: float, first: int) -> None:
    """Pin: a delay of k whole steps: the decision at the end of step i sees step i - k."""
    assert _first_step_seeing_the_jump(step_s, delay_s) == first


# ==== 9. the priority expander without pool priorities ==============================================================


def test_the_priority_expander_is_refused_or_pools_can_carry_a_priority() -> None:
    """Fixed (was a strict xfail).

    WRONG: ``autoscaler/sim/scenario.py`` ``Capacity.expanders`` accepts ``priority``, whose key is
    ``-pool.priority`` (``core/burst.py``); ``training.capacity_config`` builds every ``BurstPool`` with the default
    priority 0, and ``NodePool`` refuses a ``priority`` key (extra fields are forbidden). The expander never tells two
    burst pools apart: a scenario that lists it to prefer one pool is silently run with the next expander's choice.
    RIGHT: either ``capacity.expanders`` refuses ``priority`` naming the field, or a node pool takes a priority that
    reaches ``CapacityConfig.pools``."""
    from autoscaler.sim.training import capacity_config

    data = scenario_dict("trace.csv")
    data["capacity"] = {"expanders": ["priority", "cheapest"]}
    try:
        parse_scenario(data)
    except ScenarioError as error:
        assert "capacity.expanders" in str(error)
        return
    with_priority = copy.deepcopy(data)
    with_priority["nodePools"][1]["priority"] = 5
    scenario = parse_scenario(with_priority)
    assert [pool.priority for pool in capacity_config(scenario).pools] == [5]


# ==== pins: accounting =============================================================================================


def test_gpu_seconds_count_every_bound_pod_from_the_step_after_the_decision() -> None:
    """Pods asked at the end of step 2 are bound at t=45 s and cost GPUs from step 3, while they cold-start (ready
    from step 7): 3 steps x 2 replicas + 9 steps x 4, at 2 GPUs each, 15 s a step."""
    service = _service([5.0] * 12, gpus=2)
    run = simulate(Scripted(2, {2: 4}), [service], [NodePool(name="fixed", nodes=1, gpusPerNode=8)], 0.0, 15.0, 12, 0.0)
    assert run.gpu_seconds == pytest.approx((3 * 2 + 9 * 4) * 2 * 15.0)
    assert run.inference_gpus is not None
    assert run.inference_gpus.tolist() == [4] * 3 + [8] * 9
    assert run.timelines[0].ready.tolist() == [2] * 7 + [4] * 5


def test_pending_pods_cost_no_gpu_seconds() -> None:
    """A replica that no node can hold (1 fixed node of 8 GPUs, 3 replicas of 4) costs nothing while Pending."""
    service = _service([5.0] * 8, gpus=4)
    run = simulate(Scripted(3, {}), [service], [FIXED], 0.0, 15.0, 8, 0.0)
    assert run.timelines[0].ready.tolist() == [2] * 8
    assert run.gpu_seconds == pytest.approx(2 * 4 * 15.0 * 8)


def test_total_cost_adds_burst_money_lost_training_and_missed_requests_at_the_scenarios_prices() -> None:
    run = PolicyRun(
        "p",
        gpu_seconds=7200.0,
        burst_gpu_seconds=3600.0,
        burst_cost=4.1,
        requests=10_000.0,
        requests_in_slo_steps=7_000.0,
        requests_within_latency=8_000.0,
        lost_training_gpu_seconds=1800.0,
    )
    result = figures(run, oracle_gpu_hours=1.0, costs=(3.0, 2.0))
    assert result["total_cost"] == pytest.approx(4.1 + 0.5 * 3.0 + 3.0 * 2.0)
    assert result["slo_attainment"] == pytest.approx(0.7)
    assert result["requests_within_latency"] == pytest.approx(0.8)
    assert result["gpu_hours_vs_oracle"] == pytest.approx(2.0)
    assert result["training_gpu_hours"] is None  # no jobs: shown as "-"
    table = format_table({"policies": {"p": result}})
    assert "70.00%" in table and "11.60" in table  # 4.10 + 1.50 + 6.00


def test_a_gangs_restart_is_not_counted_as_training_work() -> None:
    """A gang bound at t=0 with a 60 s restart (image pull + checkpoint load) has trained 940 s by t=1,000 s."""
    cluster = SimCluster()
    cluster.add_node("n0", 8)
    job = SimJob("train", "g", 1, 8, 100, work_s=1e5, checkpoint_s=1800.0, submit_at=0.0, restart_s=60.0)
    cluster.add_job(job)
    for t in range(0, 1001, 15):
        cluster.advance(float(t))
    cluster.advance(1000.0)
    assert cluster.training_gpu_seconds() == (pytest.approx(940.0 * 8), 0.0)


def test_a_runs_jobs_are_copies_and_two_runs_of_one_policy_agree() -> None:
    """No state leaks between runs: the scenario's jobs are not advanced by a run, and the same policy object run
    twice gives the same figures."""
    pools = [NodePool(name="fixed", nodes=3, gpusPerNode=8)]  # the replicas spread over two, the gang takes one
    jobs = [SimJob("train", "g", 1, 8, 100, work_s=600.0, checkpoint_s=300.0, submit_at=0.0, restart_s=0.0)]
    rates = [10.0] * 20 + [60.0] * 20 + [10.0] * 20
    service = _service(rates, cold_start_s=30.0, metric=MetricKind.REQUEST_RATE)
    policy = make_policy("reactive")
    first = simulate(policy, [service], pools, 0.0, 15.0, len(rates), 30.0, jobs=jobs)
    second = simulate(policy, [service], pools, 0.0, 15.0, len(rates), 30.0, jobs=jobs)
    assert jobs[0].progress_s == 0.0 and jobs[0].stops == 0 and jobs[0].finished_at is None
    assert first.jobs_finished == second.jobs_finished == 1
    for name in ("gpu_seconds", "requests_in_slo_steps", "scale_actions", "training_gpu_seconds"):
        assert getattr(first, name) == getattr(second, name), name
    assert first.timelines[0].spec.tolist() == second.timelines[0].spec.tolist()
    assert first.reasons == second.reasons


@pytest.mark.parametrize("cold_start_s", [50.0, 60.0, 100.0])
def test_the_oracle_meets_the_slo_and_is_ready_no_earlier_than_needed(cold_start_s: float) -> None:
    """The oracle's lead is ``ceil(cold start / step)`` steps also when the cold start is not a multiple of the
    step: every step within the SLO, and the replicas for a jump ready at the jump, not a step before."""
    rates = [10.0] * 20 + [80.0] * 20 + [10.0] * 20
    service = _service(rates, cold_start_s=cold_start_s)
    run = simulate(Oracle(), [service], [NodePool(name="fixed", nodes=2, gpusPerNode=8)], 0.0, 15.0, len(rates), 0.0)
    timeline = run.timelines[0]
    need = service.need(80.0)
    assert timeline.within_slo.all()
    assert timeline.ready[20] >= need > timeline.ready[19]
