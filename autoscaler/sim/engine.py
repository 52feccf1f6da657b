"""The trace-driven simulator: replays demand through a policy on a simulated cluster, through the controller's ports.

The cluster is ``SimCluster`` (nodes with per-GPU allocation, a scheduler, pod start = binding + cold start, node
boot), which implements the controller's ``ClusterReader``, ``ClusterWriter`` and ``NodePoolScaler``. Per step i
(length dt, starting at t_i):

1. the cluster advances to t_i: pods whose cold start is over are ready, booted nodes take pods, pending pods are
   bound by the scheduler;
2. the step is served by the ready replicas: the latency model (``latency.py``) gives the P-quantile latency and the
   share of requests within the SLO; GPU-seconds are counted for every pod bound to a node (ready or starting);
3. at the end of the step the policy plans -- ``reactive`` and ``predictive`` through the controller's tick
   (``core.tick.decide_tick``), the baselines through their own rule -- on the snapshot the cluster gives and the
   metrics of ``metricsDelaySeconds`` ago (as the controller sees DCGM through Prometheus); the controller's
   actuator (``autoscaler.actuator``) applies the plan to the cluster, with the controller's guard;
4. the cluster's node autoscaler (Cluster-Autoscaler-like, ``node_autoscaler_plan``) adds burst nodes for pending
   pods and removes a burst node whose pods fit elsewhere after ``scaleDownUnneededSeconds``; its plan goes through
   the same actuator. It runs beside the policies that do not arbitrate capacity themselves (the baselines, and the
   controller's policies when the run has no capacity arbitration), as a cluster's Cluster Autoscaler would; the
   kube-scheduler's DefaultPreemption (``SimCluster(preemption=True)``) likewise. The controller with its capacity
   arbitration (issue 12) owns the burst pools and the preemption of training: neither runs beside it.

Training jobs (``SimJob``) share the cluster: their useful and lost GPU-hours are counted per run.

The controller's **rebalancer** (issue 15, ``core.rebalance.plan_rebalance``) runs beside the controller's policies
when the scenario enables it, as the controller's rebalance job does: after step 3, every ``intervalSeconds``, on the
cluster's snapshot, leaving alone the services the tick wanted to grow or guarded on latency, its evictions applied
through the same actuator (only applied ones count against the hourly bound). A Deployment's replica is recreated
by its ReplicaSet, pending, placed by the simulated scheduler and cold-starts again -- its GPU-seconds and the
service's lower ready count are counted like any other pod's; a training gang stops whole and restarts from its last
checkpoint. The GPUs *stranded* by fragmentation (``core.rebalance.stranded_gpus``: free, but on nodes where none of
the waiting pods fits) are measured at the start of every step when the scenario has training or a rebalance block.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.actuator import Actuator, GuardContext
from autoscaler.core.arbitrate import fits_typed
from autoscaler.core.cluster import ClusterSnapshot, PodInfo
from autoscaler.core.model import (
    EvictPod,
    MetricKind,
    Observation,
    Plan,
    PodMetrics,
    ScaleDeployment,
    ScaleNodePool,
    ServiceObservation,
)
from autoscaler.core.reasons import Reason
from autoscaler.core.rebalance import (
    HOUR_S,
    RebalanceConfig,
    RebalanceState,
    managed_services,
    plan_rebalance,
    protected_owners,
    record_pass,
    resumable_suspended,
    stranded_gpus,
)
from autoscaler.sim.cluster import Scoring, SimCluster, SimDeployment, SimJob, SimPool
from autoscaler.sim.latency import erlang_c, latency_and_share
from autoscaler.sim.policies import SimPolicy, SimService, metrics_delay_steps
from autoscaler.sim.scenario import NodePool

# Cluster Autoscaler's default: a node is a scale-down candidate below this share of its GPUs requested.
UNNEEDED_UTILISATION = 0.5

@dataclass
class ServiceTimeline:
    """Per-step series of one service under one policy (for the report and the plot)."""

    ready: np.ndarray
    spec: np.ndarray
    latency_s: np.ndarray
    within_slo: np.ndarray  # bool: the step's latency quantile met the SLO


@dataclass
class PolicyRun:
    policy: str
    gpu_seconds: float = 0.0
    burst_gpu_seconds: float = 0.0
    burst_cost: float = 0.0
    scale_actions: int = 0
    # steps where a service's replicas fell, and those of them followed within the service's cold start by replicas
    # above the level they fell to (``scale_downs_undone``: issue 14's waste, a replica wanted back before a new one
    # could even have started)
    scale_downs: int = 0
    scale_downs_undone: int = 0
    requests: float = 0.0
    requests_in_slo_steps: float = 0.0
    requests_within_latency: float = 0.0  # per-request estimate from the latency distribution's tail
    minutes: int = 0
    minutes_within_slo: int = 0
    preemptions: int = 0  # training gangs stopped (preempted, evicted, or their node removed)
    lost_training_gpu_seconds: float = 0.0
    training_gpu_seconds: float = 0.0  # useful training work kept (progress x GPUs)
    jobs_finished: int = 0
    jobs: int = 0
    # the rebalancer (issue 15): pods it evicted (applied), its evictions a PodDisruptionBudget refused, its passes
    # and the time of each applied eviction
    rebalance_moves: int = 0
    rebalance_blocked: int = 0
    rebalance_passes: int = 0
    rebalance_move_times: list[float] = field(default_factory=list)
    # GPUs stranded by fragmentation (free, on nodes no waiting pod fits on), GPU-seconds summed over the steps;
    # None when the run did not measure them
    stranded_gpu_seconds: float | None = None
    simulated_seconds: float = 0.0
    # per step, the plot's GPUs by use: held by inference pods, by training, GPUs of all nodes, of burst nodes
    inference_gpus: np.ndarray | None = None
    training_gpus: np.ndarray | None = None
    node_gpus: np.ndarray | None = None
    burst_gpus: np.ndarray | None = None
    stranded_gpus: np.ndarray | None = None
    timelines: list[ServiceTimeline] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    policy_object: object = None  # the policy after the run (the predictive one holds its forecast errors)
    cluster: SimCluster | None = None  # the simulated cluster after the run (its writes and events)

    def max_moves_in_an_hour(self) -> int:
        """The most rebalance evictions in any hour (the planner's window: the last 3,600 s, the end excluded)."""
        times = sorted(self.rebalance_move_times)
        best = 0
        first = 0
        for last, t in enumerate(times):
            while t - times[first] >= HOUR_S:
                first += 1
            best = max(best, last - first + 1)
        return best


@dataclass
class _NodeAutoscaler:
    """The cluster's Cluster-Autoscaler-like node loop: its memory of when each burst node became unneeded."""

    pools: Sequence[NodePool]
    unneeded_since: dict[str, float] = field(default_factory=dict)

    def plan(self, snapshot: ClusterSnapshot, now: float) -> Plan:
        return node_autoscaler_plan(snapshot, self.pools, self.unneeded_since, now)


def node_autoscaler_plan(
    snapshot: ClusterSnapshot, pools: Sequence[NodePool], unneeded_since: dict[str, float], now: float
) -> Plan:
    """Scale-up: enough burst nodes (pools in scenario order, up to ``maxNodes``) for the pending pods, beyond what
    the nodes already booting will take, each pod whole on one node. Scale-down: one burst node at a time, once it
    has been unneeded -- under half its GPUs requested, and its pods fit on the other ready nodes -- for the pool's
    ``scaleDownUnneededSeconds``."""
    burst = [p for p in pools if p.burst]
    if not burst:
        return Plan(now)
    gpus_of: dict[str, int] = {n.name: n.allocatable_gpus for n in snapshot.nodes}
    free = dict(gpus_of)
    ready = {n.name for n in snapshot.nodes if n.ready}
    waiting: list[int] = []  # GPUs of each pending pod
    on_node: dict[str, list[PodInfo]] = {}
    for pod in snapshot.pods:
        if pod.node is None:
            # Only inference tolerates the burst pools' taint: pending training does not make them grow.
            if pod.owner_kind == "Deployment" and pod.gpus > 0:
                waiting.append(pod.gpus)
        elif pod.node in free:
            free[pod.node] -= pod.gpus
            on_node.setdefault(pod.node, []).append(pod)
    nodes_of: dict[str, list[str]] = {p.name: [] for p in burst}
    for node in snapshot.nodes:
        if node.pool in nodes_of:
            nodes_of[node.pool].append(node.name)
    actions: list[ScaleNodePool] = []
    if waiting:
        # Sized by whole pods, as the Cluster Autoscaler's binpacking estimator does: the pods the booting nodes will
        # take first, then each pool's new nodes (largest pod first, first fit), never a node too small for a pod.
        waiting.sort(reverse=True)
        pending = sum(waiting)
        booting_room = [free[n] for p in burst for n in nodes_of[p.name] if n not in ready]
        booting = sum(booting_room)
        rest = _first_fit(waiting, booting_room)
        for pool in burst:
            if not rest:
                break
            count = len(nodes_of[pool.name])
            new_nodes: list[int] = []  # the GPUs left on each node this pool adds
            left: list[int] = []
            for gpus in rest:
                if gpus > pool.gpus_per_node:
                    left.append(gpus)  # no node of this pool can hold it
                elif not _first_fit([gpus], new_nodes):
                    continue
                elif len(new_nodes) < pool.node_limit - count:
                    new_nodes.append(pool.gpus_per_node - gpus)
                else:
                    left.append(gpus)
            rest = left
            if new_nodes:
                detail = f"{pending} GPU(s) pending, {booting} booting"
                actions.append(
                    ScaleNodePool(pool.name, count + len(new_nodes), count, Reason.BURST_SCALE_UP, detail)
                )
        unneeded_since.clear()
        return Plan(now, actions=tuple(actions))
    candidates = set()
    product = {n.name: n.gpu_product for n in snapshot.nodes}
    for pool in burst:
        for name in nodes_of[pool.name]:
            gpus = gpus_of[name]
            used = gpus - free[name]
            if (
                name in ready
                and used < UNNEEDED_UTILISATION * gpus
                and _fits_elsewhere(name, on_node.get(name, []), free, ready, product)
            ):
                candidates.add(name)
                unneeded_since.setdefault(name, now)
    for name in list(unneeded_since):
        if name not in candidates:
            del unneeded_since[name]
    for pool in burst:
        wait = pool.scale_down_unneeded_seconds
        due = [n for n in nodes_of[pool.name] if n in candidates and now - unneeded_since[n] >= wait]
        if due:
            count = len(nodes_of[pool.name])
            # the node found unneeded goes (Cluster Autoscaler deletes that node, not the pool's pick)
            removed = min(due, key=lambda n: (unneeded_since[n], n))
            detail = f"node unneeded for {pool.scale_down_unneeded_seconds:g}s"
            actions.append(ScaleNodePool(pool.name, count - 1, count, Reason.BURST_SCALE_DOWN, detail, removed))
            # only the node removed: the others found unneeded as long stay due, and go at the next loops
            unneeded_since.pop(removed, None)
            break  # one node per loop, as Cluster Autoscaler removes empty-ish nodes one by one
    return Plan(now, actions=tuple(actions))


def _first_fit(pods: Sequence[int], room: list[int]) -> list[int]:
    """Place each pod's GPUs (in order) on the first entry of ``room`` (free GPUs per node, updated in place) with
    enough; returns the pods that found none."""
    unplaced = []
    for gpus in pods:
        for index, free in enumerate(room):
            if free >= gpus:
                room[index] = free - gpus
                break
        else:
            unplaced.append(gpus)
    return unplaced


def _fits_elsewhere(
    name: str, pods: list[PodInfo], free: dict[str, int], ready: set[str], product: dict[str, str | None]
) -> bool:
    """Whether every pod on node ``name`` (``pods``) fits on another ready node, each pod whole on one node of its GPU
    type (the Cluster Autoscaler simulates their scheduling; free GPUs summed over nodes would count GPUs no pod can
    use): the capacity arbitration's own fit test (largest pod first, best fit)."""
    room = {n: free[n] for n in ready if n != name}
    return fits_typed(room, pods, product, {}) is not None


def build_cluster(
    services: Sequence[SimService],
    pools: Sequence[NodePool],
    initial: Sequence[int],
    start: float,
    scoring: Scoring = Scoring.LEAST_ALLOCATED,
    jobs: Sequence[SimJob] = (),
    preemption: bool = False,
) -> SimCluster:
    """The simulated cluster at ``start``: every pool's fixed nodes, ready; each service's initial replicas warm
    where they fit (higher priority first), the rest pending; fresh copies of the training jobs."""
    cluster = SimCluster(scoring, now=start, preemption=preemption)
    for pool in pools:
        cluster.add_pool(
            SimPool(pool.name, pool.gpus_per_node, pool.gpu_type, pool.boot_seconds, pool.nodes, pool.node_limit),
            nodes=pool.nodes,
        )
    order = sorted(range(len(services)), key=lambda k: -services[k].policy.priority)
    for index in order:
        policy = services[index].policy
        cluster.add_deployment(
            SimDeployment(
                policy.namespace, policy.name, initial[index], policy.gpus_per_replica, policy.cold_start_s,
                policy.priority,
            ),
            warm=True,
        )
    cluster.inference_only_pools = {pool.name for pool in pools if pool.burst}
    for job in jobs:
        cluster.add_job(dataclasses.replace(job))
    return cluster


def simulate(
    policy: SimPolicy,
    services: Sequence[SimService],
    pools: Sequence[NodePool],
    start: float,
    step_s: float,
    steps: int,
    metrics_delay_s: float,
    progress: Callable[[int], None] | None = None,
    scoring: Scoring = Scoring.LEAST_ALLOCATED,
    jobs: Sequence[SimJob] = (),
    rebalance: RebalanceConfig | None = None,
    fragmentation: RebalanceConfig | None = None,
    prepare: Callable[[SimCluster], None] | None = None,
) -> PolicyRun:
    """Run one policy over ``steps`` steps and return its figures and per-step timelines.

    ``rebalance``: run the controller's rebalancer with this configuration beside the policy, if it is one of the
    controller's (``policy.rebalances``). ``fragmentation``: measure the GPUs stranded by fragmentation each step,
    with this configuration's pools (default: ``rebalance``'s; neither: not measured). ``prepare``: called on the
    cluster once it is built, before the first step (an initial state a test or a study needs: a stray pod, a
    PodDisruptionBudget)."""
    run = PolicyRun(policy.name)
    run.simulated_seconds = steps * step_s
    initial = policy.reset(services, step_s)
    cluster = build_cluster(services, pools, initial, start, scoring, jobs, policy.scheduler_preemption)
    run.cluster = cluster
    if prepare is not None:
        prepare(cluster)
    actuator = Actuator(cluster, cluster)
    nodes = _NodeAutoscaler(pools)
    acting_since = start + step_s if policy.is_controller else None  # the controller starts at the first tick
    delay_steps = metrics_delay_steps(metrics_delay_s, step_s)
    seen_steps = np.maximum(np.arange(steps) - delay_steps, 0)
    policy.begin([np.asarray(s.rates, dtype=np.float64)[seen_steps] for s in services], start, steps)
    keys = [s.policy.key for s in services]
    burst_pools = [(p.name, p.gpus_per_node, p.price_per_gpu_hour) for p in pools if p.burst]
    node_loop = bool(burst_pools) and policy.node_autoscaler
    training_hist = np.zeros(steps, dtype=np.int32)
    node_hist = np.zeros(steps, dtype=np.int32)
    inference_hist = np.zeros(steps, dtype=np.int32)
    burst_hist = np.zeros(steps, dtype=np.int32)
    rebalancing = rebalance is not None and policy.rebalances
    rebalance_state = RebalanceState()
    measure = fragmentation if fragmentation is not None else rebalance
    stranded_hist = np.zeros(steps, dtype=np.int32) if measure is not None else None
    stranded_now, stranded_generation = 0, -1

    count = len(services)
    ready_hist = np.zeros((count, steps), dtype=np.int32)
    spec_hist = np.zeros((count, steps), dtype=np.int32)
    latency_hist = np.zeros((count, steps), dtype=np.float64)
    within_hist = np.zeros((count, steps), dtype=bool)
    util_hist = np.zeros((count, steps), dtype=np.float64)  # GPU utilisation per ready pod, percent

    # Minutes of the clock from the start (the last one may be partial): a minute is within the SLO when every step
    # overlapping it was (a step that does not divide a minute spans two of them; a long step spans several).
    minute_ok = np.ones(max(1, math.ceil(steps * step_s / 60.0 - 1e-9)), dtype=bool)
    reasons = run.reasons
    progress_every = max(1, steps // 200)

    for i in range(steps):
        now = start + i * step_s
        # 1. the cluster at the start of the step
        counts = cluster.counts(now)
        training_hist[i], node_hist[i] = cluster.gpu_use(now)
        if measure is not None and stranded_hist is not None:
            start_snapshot = cluster.snapshot(now)
            if cluster.generation != stranded_generation:  # the same cluster strands the same GPUs
                stranded_now, stranded_generation = stranded_gpus(start_snapshot, measure), cluster.generation
            stranded_hist[i] = stranded_now

        # 2. serve the step
        step_ok = True
        for s_index, service in enumerate(services):
            ready, bound, _ = counts[keys[s_index]]
            rate = float(service.rates[i])
            latency, share = latency_and_share(
                ready, rate, service.throughput, service.base_latency_s, service.quantile, service.slo_s
            )
            ok = latency <= service.slo_s
            requests = rate * step_s
            run.requests += requests
            run.requests_within_latency += requests * share
            if ok:
                run.requests_in_slo_steps += requests
            else:
                step_ok = False
            run.gpu_seconds += bound * service.policy.gpus_per_replica * step_s
            inference_hist[i] += bound * service.policy.gpus_per_replica
            ready_hist[s_index, i] = ready
            spec_hist[s_index, i] = cluster.deployments[keys[s_index]].replicas
            latency_hist[s_index, i] = latency
            within_hist[s_index, i] = ok
            util_hist[s_index, i] = 100.0 * min(1.0, rate / (ready * service.throughput)) if ready else 0.0
        if burst_pools:
            node_counts = cluster.nodes_per_pool()
            for name, gpus_per_node, price in burst_pools:
                burst_hist[i] += node_counts[name] * gpus_per_node
                gpu_seconds = node_counts[name] * gpus_per_node * step_s
                run.burst_gpu_seconds += gpu_seconds
                run.burst_cost += gpu_seconds / 3600.0 * price
        if not step_ok:
            first = math.floor(i * step_s / 60.0 + 1e-9)
            last = math.ceil((i + 1) * step_s / 60.0 - 1e-9)
            minute_ok[first:last] = False

        # 3. plan at the end of the step, on the cluster as it is and the metrics of delay ago; apply
        decided_at = now + step_s
        snapshot = cluster.snapshot(decided_at)
        counts = cluster.counts(decided_at)
        seen = max(0, i - delay_steps)
        observed = {}
        for s_index, service in enumerate(services):
            key = keys[s_index]
            ready, bound, pending = counts[key]
            observed[key] = _observe(
                service,
                policy.metric(s_index),
                cluster.deployments[key].replicas,
                ready,
                bound - ready,
                float(service.rates[seen]),
                float(util_hist[s_index, seen]),
                float(latency_hist[s_index, seen]),
                step_s,
                created=bound + pending,
                seen_ready=int(ready_hist[s_index, seen]),
            )
        plan = policy.plan(i, decided_at, Observation(decided_at, observed), snapshot)
        for decision in plan.decisions:
            reasons[decision.reason.value] = reasons.get(decision.reason.value, 0) + 1
        if plan.actions:
            context = GuardContext(decided_at, policy.guarded_policies(), acting_since=acting_since)
            results = actuator.apply(plan.actions, context)
            run.scale_actions += sum(
                1 for r in results if r.result == "applied" and isinstance(r.action, ScaleDeployment)
            )
            policy.applied(plan, results)

        # 3b. the controller's rebalance job (``Controller.rebalance``), through the same actuator: it leaves alone
        # the services this tick wanted to grow or guarded on latency, and only applied evictions spend the bound
        if rebalancing and rebalance is not None:
            protected = protected_owners(plan.decisions, spare_only=rebalance.spare_replicas_only)
            rebalance_snapshot = cluster.snapshot(decided_at)
            moves, planned = plan_rebalance(
                rebalance_snapshot, decided_at, rebalance, rebalance_state, protected=protected,
                managed=managed_services(plan.decisions), resumable=resumable_suspended(plan),
            )
            run.rebalance_passes += moves.ran
            applied: set[tuple[str, str]] = set()
            if moves.actions:
                context = GuardContext(decided_at, policy.guarded_policies(), acting_since=acting_since)
                for result in actuator.apply(moves.actions, context):
                    if result.result == "applied" and isinstance(result.action, EvictPod):
                        applied.add((result.action.namespace, result.action.name))
                        run.rebalance_moves += 1
                        run.rebalance_move_times.append(decided_at)
                        reasons[Reason.REBALANCE.value] = reasons.get(Reason.REBALANCE.value, 0) + 1
                    elif result.result == "blocked":
                        run.rebalance_blocked += 1
            rebalance_state = record_pass(rebalance_state, planned, moves, decided_at, applied)

        # 4. the cluster's node autoscaler
        if node_loop:
            node_plan = nodes.plan(cluster.snapshot(decided_at), decided_at)
            if node_plan.actions:
                actuator.apply(node_plan.actions, GuardContext(decided_at, {}))
        if progress is not None and (i + 1) % progress_every == 0:
            progress(progress_every)
    if progress is not None:
        progress(steps % progress_every)
    policy.end()

    if steps > 0:
        run.minutes, run.minutes_within_slo = int(minute_ok.size), int(minute_ok.sum())
    run.training_gpu_seconds, run.lost_training_gpu_seconds = cluster.training_gpu_seconds()
    run.preemptions = sum(job.stops for job in cluster.jobs.values())
    run.jobs = len(cluster.jobs)
    run.jobs_finished = sum(1 for job in cluster.jobs.values() if job.finished_at is not None)
    run.training_gpus, run.node_gpus = training_hist, node_hist
    run.inference_gpus, run.burst_gpus = inference_hist, burst_hist
    if stranded_hist is not None:
        run.stranded_gpus = stranded_hist
        run.stranded_gpu_seconds = float(stranded_hist.sum()) * step_s
    run.timelines = [
        ServiceTimeline(ready_hist[k], spec_hist[k], latency_hist[k], within_hist[k]) for k in range(count)
    ]
    for k, service in enumerate(services):
        # a rise k steps after the fall came k x step_s later: within the cold start while k x step_s <= it
        within = math.floor(service.policy.cold_start_s / step_s + 1e-9)
        downs, undone = scale_downs_undone(spec_hist[k], within)
        run.scale_downs += downs
        run.scale_downs_undone += undone
    return run


def scale_downs_undone(spec: np.ndarray, within_steps: int) -> tuple[int, int]:
    """(scale-downs, those undone) in a series of replica counts: the steps where it falls, and those of them after
    which it rises above the level it fell to within ``within_steps`` steps (a service's cold start: the replica
    wanted back before a replacement could even have started, so the scale-down bought nothing and costs a cold
    start)."""
    series = np.asarray(spec, dtype=np.int64)
    if series.size < 2 or within_steps < 1:
        return int(np.count_nonzero(np.diff(series) < 0)), 0
    falls = np.flatnonzero(np.diff(series) < 0) + 1  # the first step at the lower level
    if falls.size == 0:
        return 0, 0
    # the most replicas over the next ``within_steps`` steps after each step (the series' last value past its end)
    padded = np.concatenate([series, np.full(within_steps, series[-1])])
    ahead = np.lib.stride_tricks.sliding_window_view(padded[1:], within_steps).max(axis=1)
    return int(falls.size), int(np.count_nonzero(ahead[falls] > series[falls]))


def _observe(
    service: SimService,
    metric: MetricKind,
    spec: int,
    ready: int,
    starting: int,
    seen_rate: float,
    seen_util: float,
    seen_latency: float,
    step_s: float,
    created: int | None = None,
    seen_ready: int | None = None,
) -> ServiceObservation:
    """What the controller sees: the Deployment as it is now, and the metrics of the delayed step for its pods.

    ``created``: the Deployment's pods that exist (bound or pending; the simulator has no terminating pods), its
    ``status.replicas``; None: as many as ``spec``. ``seen_ready``: the pods ready in the delayed step (None: as many
    as now).

    GPU utilisation per ready pod is 100 * min(1, lambda / (c * mu)): the GPU is busy in proportion to the load it
    carries. Pods still starting report no usable sample (unready, as the HPA treats them). The delayed sample covers
    the pods ready then: pods ready since have no sample from then (missing, as the HPA treats them; counted as
    carrying the old pods' load, every replica turning ready added load that never existed: review 40), and pods
    gone since are no longer summed.
    """
    pods = None
    total = None
    sampled = ready if seen_ready is None else min(ready, seen_ready)
    # what the ready replicas finished: the default counter's rate, in an overload at most their throughput
    finished = min(seen_rate, sampled * service.throughput)
    if metric is MetricKind.GPU_UTILIZATION:
        pods = PodMetrics(sampled, seen_util * sampled, ready - sampled, starting)
    elif metric is MetricKind.ENGINE_ACTIVE:
        pods = PodMetrics(sampled, seen_util / 100.0 * sampled, ready - sampled, starting)
    elif metric is MetricKind.REQUEST_RATE:
        # The controller's default counter counts finished requests: in an overload it reads what the replicas
        # ready then serve, not the demand (the arrivals read it all, and flattered every policy scaling on it in
        # the bursts: azure-llm-code at 300 s 89.04 % within SLO on arrivals, 73.05 % on finished requests)
        total = finished if service.rate_counts_finished else seen_rate
    else:  # queue depth: mean requests waiting, Little's law on the M/M/c waiting time, at most a step's arrivals
        # (at or over capacity, or with no ready replica, the queue has no steady state: it grows; an infinite depth
        # is an invalid sample to the controller, which then held exactly when it had to scale up)
        capacity = ready * service.throughput
        wait = math.inf if seen_rate >= capacity else _mean_wait(ready, seen_rate, service.throughput)
        total = 0.0 if seen_rate <= 0 else seen_rate * min(wait, step_s)
    # The history the forecasts learn from is the counter's range query: at the sample it reads what the replicas
    # ready then finished, those gone since included (their series stay), unlike the instantaneous metric above
    # (review 46b: capped at the replicas ready now, a step was learnt as a demand no counter ever read)
    served = ready if seen_ready is None else seen_ready
    learnt = min(seen_rate, served * service.throughput) if service.forecast_learns_finished else seen_rate
    return ServiceObservation(
        key=service.policy.key,
        spec_replicas=spec,
        ready_replicas=ready,
        pods=pods,
        metric_total=total,
        latency_s=seen_latency,
        # the demand the forecasts learn from: the arrivals, or what the controller's history reads
        request_rate=learnt,
        status_replicas=spec if created is None else created,
    )


def _mean_wait(replicas: int, rate: float, throughput: float) -> float:
    if rate <= 0:
        return 0.0
    return erlang_c(replicas, rate / throughput) / (replicas * throughput - rate)
