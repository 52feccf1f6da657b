"""The simulator's latency model: an M/M/c queue in front of the replicas, plus a fixed base latency.

Each ready replica completes ``throughput`` requests per second at saturation (its batching capacity), so the
service is c parallel servers of rate mu = throughput. A request's latency is
``base_latency + W``, where W is the M/M/c waiting time: P(W > t) = C(c, a) * exp(-(c*mu - lambda) * t), with the
offered load a = lambda / mu and C the Erlang C probability of waiting. Closed forms give the latency quantile and
the share of requests within an SLO, so a step costs O(c). When lambda >= c*mu the queue grows without bound: the
latency is infinite and no request meets the SLO.

Why this model: it is the textbook approximation for a pool of identical servers, it reacts to both
under-provisioning (queueing explodes as utilisation nears 1) and to the number of replicas (pooling), and its
parameters (per-replica throughput, base latency) are the two numbers a platform team knows about a model server.
"""

from __future__ import annotations

import math


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arriving request waits, for ``servers`` servers and offered load a = lambda/mu < servers.

    Uses the numerically stable Erlang B recursion, B(k) = a*B(k-1) / (k + a*B(k-1)).
    """
    if offered_load <= 0.0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered_load * blocking / (k + offered_load * blocking)
    utilisation = offered_load / servers
    return blocking / (1.0 - utilisation * (1.0 - blocking))


def latency_quantile(
    replicas: int, arrival_rate: float, throughput: float, base_latency_s: float, quantile: float = 0.95
) -> float:
    """The ``quantile`` of request latency in seconds (``math.inf`` when the replicas cannot keep up)."""
    if arrival_rate <= 0.0:
        return base_latency_s
    capacity = replicas * throughput
    if replicas <= 0 or arrival_rate >= capacity:
        return math.inf
    wait_probability = erlang_c(replicas, arrival_rate / throughput)
    tail = 1.0 - quantile
    if wait_probability <= tail:
        return base_latency_s
    return base_latency_s + math.log(wait_probability / tail) / (capacity - arrival_rate)


def share_within(replicas: int, arrival_rate: float, throughput: float, base_latency_s: float, slo_s: float) -> float:
    """Share of requests whose latency is at most ``slo_s``."""
    if slo_s < base_latency_s:
        return 0.0
    if arrival_rate <= 0.0:
        return 1.0
    capacity = replicas * throughput
    if replicas <= 0 or arrival_rate >= capacity:
        return 0.0
    wait_probability = erlang_c(replicas, arrival_rate / throughput)
    return 1.0 - wait_probability * math.exp(-(capacity - arrival_rate) * (slo_s - base_latency_s))


def replicas_needed(
    arrival_rate: float,
    throughput: float,
    base_latency_s: float,
    slo_s: float,
    quantile: float = 0.95,
    min_replicas: int = 1,
    max_replicas: int = 1_000_000,
) -> int:
    """Fewest replicas (within bounds) whose latency ``quantile`` meets ``slo_s`` at ``arrival_rate``.

    Scans c upward while carrying the Erlang B recursion, so the whole search is O(answer).
    Returns ``max_replicas`` when even that is not enough (the caller decides what a miss means).
    """
    if arrival_rate <= 0.0 or slo_s < base_latency_s:
        return max(min_replicas, 0) if arrival_rate <= 0.0 else max_replicas
    offered = arrival_rate / throughput
    tail = 1.0 - quantile
    slack = slo_s - base_latency_s
    blocking = 1.0
    servers = 0
    while servers < max_replicas:
        servers += 1
        blocking = offered * blocking / (servers + offered * blocking)
        if servers < min_replicas or offered >= servers:
            continue
        utilisation = offered / servers
        wait_probability = blocking / (1.0 - utilisation * (1.0 - blocking))
        if wait_probability <= tail:
            return servers
        if math.log(wait_probability / tail) / (servers * throughput - arrival_rate) <= slack:
            return servers
    return max_replicas


def latency_and_share(
    replicas: int, arrival_rate: float, throughput: float, base_latency_s: float, quantile: float, slo_s: float
) -> tuple[float, float]:
    """(latency quantile, share of requests within ``slo_s``) with one Erlang C evaluation."""
    if arrival_rate <= 0.0:
        return base_latency_s, 1.0 if slo_s >= base_latency_s else 0.0
    capacity = replicas * throughput
    if replicas <= 0 or arrival_rate >= capacity:
        return math.inf, 0.0
    wait_probability = erlang_c(replicas, arrival_rate / throughput)
    headroom = capacity - arrival_rate
    tail = 1.0 - quantile
    latency = base_latency_s
    if wait_probability > tail:
        latency += math.log(wait_probability / tail) / headroom
    share = 0.0 if slo_s < base_latency_s else 1.0 - wait_probability * math.exp(-headroom * (slo_s - base_latency_s))
    return latency, share
