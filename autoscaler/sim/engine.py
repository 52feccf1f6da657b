"""The trace-driven simulator: replays demand through a policy on a model cluster, step by step.

Per step i (length dt, starting at t_i):
1. pods whose cold start is over become ready; burst nodes whose boot is over join their pool; pending pods are
   placed on free GPUs (higher priority first) and start their cold start;
2. the step is served by the ready replicas: the latency model (``latency.py``) gives the P-quantile latency and the
   share of requests within the SLO; GPU-seconds are counted for every pod holding GPUs (ready or starting);
3. at the end of the step the policy decides, seeing the metrics of ``metricsDelaySeconds`` ago (as the controller
   sees DCGM through Prometheus); new pods wait for GPUs, removed pods go newest first (pending, then starting,
   then ready);
4. a Cluster-Autoscaler-like loop adds burst nodes for pending pods and removes a burst node after its GPUs were
   unneeded for ``scaleDownUnneededSeconds``. It is the same for every policy.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.core.model import MetricKind, PodMetrics, ServiceObservation
from autoscaler.sim.latency import erlang_c, latency_and_share
from autoscaler.sim.policies import SimPolicy, SimService
from autoscaler.sim.scenario import NodePool


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
    requests: float = 0.0
    requests_in_slo_steps: float = 0.0
    requests_within_latency: float = 0.0  # per-request estimate from the latency distribution's tail
    minutes: int = 0
    minutes_within_slo: int = 0
    preemptions: int = 0
    lost_training_gpu_seconds: float = 0.0
    timelines: list[ServiceTimeline] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    policy_object: object = None  # the policy after the run (the predictive one holds its forecast errors)


@dataclass
class _Pods:
    ready: int
    starting: deque[float]  # ready-at times, oldest first (one cold start per service, so sorted)
    pending: int = 0

    @property
    def total(self) -> int:
        return self.ready + len(self.starting) + self.pending

    @property
    def holding_gpus(self) -> int:
        return self.ready + len(self.starting)


@dataclass
class _Pool:
    spec: NodePool
    burst_ready: int = 0
    booting: deque[float] = field(default_factory=deque)  # ready-at times of burst nodes
    unneeded_since: float | None = None

    @property
    def capacity_gpus(self) -> int:
        return (self.spec.nodes + self.burst_ready) * self.spec.gpus_per_node


def simulate(
    policy: SimPolicy,
    services: Sequence[SimService],
    pools: Sequence[NodePool],
    start: float,
    step_s: float,
    steps: int,
    metrics_delay_s: float,
    progress: Callable[[int], None] | None = None,
) -> PolicyRun:
    """Run one policy over ``steps`` steps and return its figures and per-step timelines."""
    run = PolicyRun(policy.name)
    initial = policy.reset(services, step_s)
    pods = [_Pods(ready=n, starting=deque()) for n in initial]
    pool_states = [_Pool(p) for p in pools]
    # Initial replicas are already warm; if they do not fit, the extra ones wait for GPUs like any other pod.
    free = sum(pool.capacity_gpus for pool in pool_states)
    for s_index, service in enumerate(services):
        gpus = service.policy.gpus_per_replica
        fit = max(0, min(pods[s_index].ready, free // gpus))
        pods[s_index].pending += pods[s_index].ready - fit
        pods[s_index].ready = fit
        free -= fit * gpus
    spec = [p.total for p in pods]
    delay_steps = round(metrics_delay_s / step_s)
    order = sorted(range(len(services)), key=lambda i: -services[i].policy.priority)  # placement priority

    count = len(services)
    ready_hist = np.zeros((count, steps), dtype=np.int32)
    spec_hist = np.zeros((count, steps), dtype=np.int32)
    latency_hist = np.zeros((count, steps), dtype=np.float64)
    within_hist = np.zeros((count, steps), dtype=bool)
    util_hist = np.zeros((count, steps), dtype=np.float64)  # GPU utilisation per ready pod, percent

    steps_per_minute = max(1, round(60.0 / step_s))
    minute_ok = True
    reasons = run.reasons
    progress_every = max(1, steps // 200)

    for i in range(steps):
        now = start + i * step_s
        # 1. pods and nodes that finished starting
        for pod_state in pods:
            starting = pod_state.starting
            while starting and starting[0] <= now:
                starting.popleft()
                pod_state.ready += 1
        for pool in pool_states:
            while pool.booting and pool.booting[0] <= now:
                pool.booting.popleft()
                pool.burst_ready += 1
        _place_pending(services, pods, pool_states, order, now)

        # 2. serve the step
        step_ok = True
        for s_index, service in enumerate(services):
            pod_state = pods[s_index]
            rate = float(service.rates[i])
            ready = pod_state.ready
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
            run.gpu_seconds += pod_state.holding_gpus * service.policy.gpus_per_replica * step_s
            ready_hist[s_index, i] = ready
            spec_hist[s_index, i] = spec[s_index]
            latency_hist[s_index, i] = latency
            within_hist[s_index, i] = ok
            util_hist[s_index, i] = 100.0 * min(1.0, rate / (ready * service.throughput)) if ready else 0.0
        for pool in pool_states:
            burst_nodes = pool.burst_ready + len(pool.booting)
            if burst_nodes:
                gpu_seconds = burst_nodes * pool.spec.gpus_per_node * step_s
                run.burst_gpu_seconds += gpu_seconds
                run.burst_cost += gpu_seconds / 3600.0 * pool.spec.price_per_gpu_hour
        minute_ok = minute_ok and step_ok
        if (i + 1) % steps_per_minute == 0 or i == steps - 1:
            run.minutes += 1
            run.minutes_within_slo += minute_ok
            minute_ok = True

        # 3. decide at the end of the step, on delayed metrics
        decided_at = now + step_s
        seen = max(0, i - delay_steps)
        for s_index, service in enumerate(services):
            pod_state = pods[s_index]
            observation = _observe(
                service,
                policy.metric(s_index),
                pod_state,
                spec[s_index],
                float(service.rates[seen]),
                float(util_hist[s_index, seen]),
                float(latency_hist[s_index, seen]),
            )
            desired, reason = policy.decide(s_index, i, decided_at, observation)
            reasons[reason.value] = reasons.get(reason.value, 0) + 1
            if desired != spec[s_index]:
                run.scale_actions += 1
                _resize(pod_state, desired)
                spec[s_index] = desired
        _place_pending(services, pods, pool_states, order, decided_at)

        # 4. burst node pools
        _autoscale_nodes(services, pods, pool_states, decided_at)
        if progress is not None and (i + 1) % progress_every == 0:
            progress(progress_every)
    if progress is not None:
        progress(steps % progress_every)

    run.timelines = [
        ServiceTimeline(ready_hist[k], spec_hist[k], latency_hist[k], within_hist[k]) for k in range(count)
    ]
    return run


def _observe(
    service: SimService,
    metric: MetricKind,
    pod_state: _Pods,
    spec: int,
    seen_rate: float,
    seen_util: float,
    seen_latency: float,
) -> ServiceObservation:
    """What the controller sees: the Deployment as it is now, and the metrics of the delayed step for its pods.

    GPU utilisation per ready pod is 100 * min(1, lambda / (c * mu)): the GPU is busy in proportion to the load it
    carries. Pods still starting report no usable sample (unready, as the HPA treats them).
    """
    ready = pod_state.ready
    pods = None
    total = None
    if metric is MetricKind.GPU_UTILIZATION:
        pods = PodMetrics(ready, seen_util * ready, 0, len(pod_state.starting))
    elif metric is MetricKind.ENGINE_ACTIVE:
        pods = PodMetrics(ready, seen_util / 100.0 * ready, 0, len(pod_state.starting))
    elif metric is MetricKind.REQUEST_RATE:
        total = seen_rate
    else:  # queue depth: mean requests waiting, Little's law on the M/M/c waiting time
        capacity = ready * service.throughput
        total = math.inf if seen_rate >= capacity else seen_rate * _mean_wait(ready, seen_rate, service.throughput)
    return ServiceObservation(
        key=service.policy.key,
        spec_replicas=spec,
        ready_replicas=ready,
        pods=pods,
        metric_total=total,
        latency_s=seen_latency,
        request_rate=seen_rate,
    )


def _mean_wait(replicas: int, rate: float, throughput: float) -> float:
    if rate <= 0:
        return 0.0
    return erlang_c(replicas, rate / throughput) / (replicas * throughput - rate)


def _resize(pod_state: _Pods, desired: int) -> None:
    """Add pending pods, or remove pods newest first: pending, then starting, then ready."""
    change = desired - pod_state.total
    if change >= 0:
        pod_state.pending += change
        return
    remove = -change
    from_pending = min(remove, pod_state.pending)
    pod_state.pending -= from_pending
    remove -= from_pending
    while remove and pod_state.starting:
        pod_state.starting.pop()
        remove -= 1
    pod_state.ready -= remove


def _place_pending(
    services: Sequence[SimService], pods: list[_Pods], pools: list[_Pool], order: list[int], now: float
) -> None:
    """Start pending pods on free GPUs, higher priority first. GPUs of all pools are one capacity here (the pools
    hold the same GPU type); which pool a pod lands in only matters for burst accounting (``_burst_used``)."""
    free = sum(pool.capacity_gpus for pool in pools) - _used_gpus(services, pods)
    for s_index in order:
        pod_state = pods[s_index]
        if not pod_state.pending or free <= 0:
            continue
        service = services[s_index]
        gpus = service.policy.gpus_per_replica
        fit = min(pod_state.pending, free // gpus)
        if fit:
            ready_at = now + service.policy.cold_start_s
            pod_state.starting.extend([ready_at] * fit)
            pod_state.pending -= fit
            free -= fit * gpus


def _used_gpus(services: Sequence[SimService], pods: list[_Pods]) -> int:
    return sum(p.holding_gpus * s.policy.gpus_per_replica for s, p in zip(services, pods, strict=True))


def _autoscale_nodes(services: Sequence[SimService], pods: list[_Pods], pools: list[_Pool], now: float) -> None:
    """Cluster-Autoscaler-like: add burst nodes for pending GPUs (pools in scenario order), remove a burst node once
    its GPUs were unneeded for the pool's ``scaleDownUnneededSeconds``. Pods fill fixed pools first."""
    pending = sum(p.pending * s.policy.gpus_per_replica for s, p in zip(services, pods, strict=True))
    used = _used_gpus(services, pods)
    fixed = sum(pool.capacity_gpus for pool in pools if not pool.spec.burst)
    spill = max(0, used - fixed)  # GPUs held in burst pools
    for pool in pools:
        spec = pool.spec
        if not spec.burst:
            continue
        in_pool = min(spill, pool.capacity_gpus)
        spill -= in_pool
        booting_gpus = len(pool.booting) * spec.gpus_per_node
        if pending > 0:
            nodes_now = spec.nodes + pool.burst_ready + len(pool.booting)
            add = min(math.ceil(max(0, pending - booting_gpus) / spec.gpus_per_node), spec.node_limit - nodes_now)
            if add > 0:
                pool.booting.extend([now + spec.boot_seconds] * add)
            pending -= booting_gpus + max(add, 0) * spec.gpus_per_node
            pool.unneeded_since = None
            continue
        if pool.burst_ready and pool.capacity_gpus - in_pool >= spec.gpus_per_node:
            if pool.unneeded_since is None:
                pool.unneeded_since = now
            elif now - pool.unneeded_since >= spec.scale_down_unneeded_seconds:
                # The rebalancer empties a node before it goes; here the pods are assumed to fit elsewhere.
                pool.burst_ready -= 1
                pool.unneeded_since = now
        else:
            pool.unneeded_since = None
