"""Burst node pools, the pure part (issue 12, item 3): when to add nodes, which pool, how many, and when to give
them back.

Cluster Autoscaler's shape: *expanders* rank the pools that can host the need, chained so that each breaks the ties
of the one before (``least-waste``: fewest GPUs left idle on the new nodes; ``cheapest``: lowest price per hour for
the nodes added; ``priority``: the pool's configured priority, higher first; ``random`` is left out on purpose: a
plan must be reproducible). Unlike Cluster Autoscaler it scales ahead of Pending pods: a forecast shortfall that
lasts longer than a node's boot plus the pool's minimum billing period is worth a node; a shorter one is cheaper to
ride out on preemptible training (or to accept), unless no preemptible capacity is left -- and then still only if it
lasts past the node's boot (a node that boots after the shortfall is over serves none of it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BurstPool:
    """A pool that can grow. Units: GPUs, seconds, money per GPU-hour."""

    name: str
    gpus_per_node: int
    gpu_type: str | None
    boot_s: float
    price_per_gpu_hour: float
    nodes: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    priority: int = 0  # for the ``priority`` expander, higher first
    min_billing_s: float = 60.0  # a node is paid for at least this long once it starts


@dataclass(frozen=True, slots=True)
class BurstOption:
    pool: BurstPool
    nodes: int  # nodes to add
    wasted_gpus: int  # GPUs of those nodes the need leaves idle
    cost_per_hour: float
    why_not: str | None = None  # why this pool cannot be used, None = it can


@dataclass(frozen=True, slots=True)
class BurstChoice:
    chosen: BurstOption | None
    options: tuple[BurstOption, ...]  # every pool, with its figures and why it was not chosen


def nodes_for(pool: BurstPool, replicas: int, gpus_per_replica: int, one_per_node: bool = False) -> int:
    """Nodes of this pool that host ``replicas`` replicas of ``gpus_per_replica`` GPUs, each replica on one node
    (``one_per_node``: the replicas' own pod anti-affinity keeps them one per node, whatever the node's GPUs)."""
    per_node = pool.gpus_per_node // gpus_per_replica
    if one_per_node:
        per_node = min(per_node, 1)
    return math.ceil(replicas / per_node) if per_node > 0 else 0


def burst_options(
    pools: Sequence[BurstPool],
    replicas: int,
    gpus_per_replica: int,
    gpu_type: str | None,
    spend_per_hour: float = 0.0,
    spend_cap_per_hour: float | None = None,
    one_per_node: bool = False,
) -> list[BurstOption]:
    out = []
    for pool in pools:
        nodes = nodes_for(pool, replicas, gpus_per_replica, one_per_node)
        cost = nodes * pool.gpus_per_node * pool.price_per_gpu_hour
        wasted = nodes * pool.gpus_per_node - replicas * gpus_per_replica
        why = None
        if gpu_type is not None and pool.gpu_type != gpu_type:
            why = f"GPU type {pool.gpu_type} is not {gpu_type}"
        elif nodes == 0:
            why = f"a node has {pool.gpus_per_node} GPUs, a replica needs {gpus_per_replica} on one node"
        elif pool.nodes + nodes > pool.max_nodes:
            why = f"{pool.nodes} + {nodes} nodes is above maxNodes {pool.max_nodes}"
        elif spend_cap_per_hour is not None and spend_per_hour + cost > spend_cap_per_hour + 1e-9:
            why = f"spend {spend_per_hour + cost:.2f}/h would pass the cap {spend_cap_per_hour:.2f}/h"
        out.append(BurstOption(pool, nodes, max(0, wasted), cost, why))
    return out


# Money per hour is compared to this many decimals: 3 GPUs x 2.4 (7.199999999999999) and 8 x 0.9 (7.2) are the
# same price, and the expander after ``cheapest`` must break that tie, not a rounding error.
_PRICE_DECIMALS = 6

# Each expander ranks an option (lower first); chained, each breaks the ties of the one before.
_RANKS: dict[str, Callable[[BurstOption], float]] = {
    "least-waste": lambda option: option.wasted_gpus,
    "cheapest": lambda option: round(option.cost_per_hour, _PRICE_DECIMALS),
    "priority": lambda option: -option.pool.priority,
}
EXPANDERS = tuple(_RANKS)


def choose_burst(
    pools: Sequence[BurstPool],
    replicas: int,
    gpus_per_replica: int = 1,
    gpu_type: str | None = None,
    expanders: Sequence[str] = ("least-waste", "cheapest"),
    spend_per_hour: float = 0.0,
    spend_cap_per_hour: float | None = None,
    one_per_node: bool = False,
) -> BurstChoice:
    """The pool to grow for ``replicas`` more replicas, by the chained expanders (then by name), or none
    (``one_per_node``: see ``nodes_for``)."""
    unknown = [e for e in expanders if e not in _RANKS]
    if unknown:
        raise ValueError(f"unknown expander {unknown[0]!r} (known: {', '.join(EXPANDERS)})")
    options = burst_options(
        pools, replicas, gpus_per_replica, gpu_type, spend_per_hour, spend_cap_per_hour, one_per_node
    )
    usable = [o for o in options if o.why_not is None]
    if replicas <= 0 or not usable:
        return BurstChoice(None, tuple(options))
    best = min(usable, key=lambda o: (*(_RANKS[e](o) for e in expanders), o.pool.name))
    return BurstChoice(best, tuple(options))


def largest_burst(
    pools: Sequence[BurstPool],
    at_most: int,
    gpus_per_replica: int = 1,
    gpu_type: str | None = None,
    expanders: Sequence[str] = ("least-waste", "cheapest"),
    spend_per_hour: float = 0.0,
    spend_cap_per_hour: float | None = None,
    one_per_node: bool = False,
) -> tuple[int, BurstChoice] | None:
    """The most replicas, at most ``at_most``, that some pool can still take (its maximum, the spend cap), and
    ``choose_burst``'s choice for them; None when not even one fits. Whether a pool can take k replicas only gets
    harder as k grows (its nodes for them never fall), so the largest is found by bisection: log2(at_most) choices
    where counting down from ``at_most`` made as many as replicas were short."""
    best: tuple[int, BurstChoice] | None = None
    low, high = 1, at_most
    while low <= high:
        middle = (low + high) // 2
        choice = choose_burst(
            pools, middle, gpus_per_replica, gpu_type, expanders, spend_per_hour, spend_cap_per_hour, one_per_node
        )
        if choice.chosen is not None:
            best, low = (middle, choice), middle + 1
        else:
            high = middle - 1
    return best


def worth_a_node(shortfall_s: float, pool: BurstPool, preemptible_gpus_left: int, gpus_needed: int) -> tuple[bool, str]:
    """Whether a forecast shortfall of ``shortfall_s`` seconds justifies booting a node of ``pool`` (and why)."""
    if preemptible_gpus_left < gpus_needed:
        # Nothing else can cover it, but a node that boots after the shortfall is over covers none of it either: it
        # is paid for (boot, billing, the idle cooldown) and serves nothing
        if shortfall_s <= pool.boot_s:
            return False, f"shortfall of {shortfall_s:.0f}s is over before a node boots ({pool.boot_s:g}s)"
        return True, f"only {preemptible_gpus_left} preemptible GPUs left for {gpus_needed} needed"
    threshold = pool.boot_s + pool.min_billing_s
    if shortfall_s > threshold:
        return True, f"shortfall lasts {shortfall_s:.0f}s > boot {pool.boot_s:g}s + billing {pool.min_billing_s:g}s"
    return False, f"shortfall of {shortfall_s:.0f}s <= boot + billing {threshold:g}s: preempt or ride it out"


@dataclass(frozen=True, slots=True)
class BurstNode:
    name: str
    pool: str
    gpus_used: int
    idle_since: float | None  # Unix seconds since when no pod of ours needed it; None = in use


def nodes_to_release(nodes: Sequence[BurstNode], now: float, cooldown_s: float, keep: int = 0) -> list[BurstNode]:
    """Burst nodes idle for at least ``cooldown_s``, emptiest and longest idle first, keeping ``keep`` of them."""
    idle = [n for n in nodes if n.idle_since is not None and now - n.idle_since >= cooldown_s]
    idle.sort(key=lambda n: (n.gpus_used, n.idle_since, n.name))
    return idle[: max(0, len(idle) - keep)]
