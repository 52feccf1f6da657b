"""Capacity arbitration, pure (issue 12): where the GPUs for inference come from, and when they go back.

One step of the tick, after the per-service decisions (``core.decide``) have set how many replicas each service
wants -- a lead time ahead when its forecast is usable (the forecast floor), reactively otherwise:

1. **Shortfall**: higher priority first, the replicas each service wants that hold no GPU yet are placed on the
   free GPUs, node by node (a replica's GPUs are on one node), then on the burst nodes still booting; what is left
   is the service's shortfall.
2. **Options**, for each shortfall, in one currency (money per hour x hours):
   - *preempt*: the cheapest minimal set of whole lower-priority training gangs (``core.victims``); it costs the
     work they lose since their last checkpoint plus the training GPU-hours they do not get while the shortfall
     lasts, both at ``training_gpu_hour_value``. Serving replicas (Deployment, StatefulSet, ... pods) are never
     victims, whether or not a valid policy names them this tick: a service whose GPUScalingPolicy is invalid keeps
     its replicas (``core.cluster.SERVING_OWNER_KINDS``; only an explicit opt-in label makes one preemptible);
   - *burst*: the pool the chained expanders choose (``core.burst``); it costs the nodes from the request on --
     boot, the shortfall (at least the minimum billing period), the idle cooldown before they go back -- plus the
     SLO risk of waiting for the boot (``slo_risk_per_gpu_hour`` x the GPUs short x boot).
     Allowed only when the shortfall lasts longer than boot + billing, or when no preemptible capacity is left
     (``core.burst.worth_a_node``).
   The cheaper allowed option is chosen -- unless leaving the shortfall unserved costs less still (*wait*:
   ``slo_risk_per_gpu_hour`` x the GPUs short x its duration, every one of them unserved throughout, the most
   waiting can cost): a shortfall the usable forecast vouches for (its quantile's, mostly demand that does not
   come) is then waited out while the service's latency meets its SLO (``ArbitrationInput.over_slo``). How long the
   shortfall lasts comes from the service's forecast when it is usable (the first time the forecast fits in the
   capacity it has), else ``assumed_shortfall_s``. A shortfall no
   usable forecast vouches for is acted on only once the service has been short for ``shortfall_confirm_s`` and
   while its metric (before the scale-down stabilisation) still asks for the replicas; a service whose Pending
   replicas get no GPUs this tick (confirming, holding, waited out) makes every later one wait: the scheduler gives
   its pods what they would free or buy first; one whose replicas wait for a burst node's boot makes a later one's
   preemption wait the same way (its victims' GPUs are free before the node is up). A waiting service's options are
   still costed (``then: ...``).
3. **Give back**, when no service is short (while shortfalls are only waited out: every pool but those their
   replicas could run on, whose timers stand): a burst pool whose spare GPUs have covered the coming demand for
   ``burst_idle_cooldown_s`` loses one node; once no burst node is left above its minimum and there has been no
   shortfall for ``resume_after_s``, the workloads this controller suspended are resumed where their GPUs are free.
   Both leave room for the replicas inference will want (the forecast's peak over a boot, resp. the gang's minimum
   runtime, or what the metric asks for beyond a scale-up rate limit), each whole on a node its pods may use, not
   as a sum of scattered GPUs (no give-back undone by that demand; no preempt/resume loop: a resumed gang is also
   protected from preemption for that runtime by ``TrainingRules.min_runtime_s``).
4. **Nodes that never come**: a burst node the provider counts but that has not registered as a Node within
   ``provision_timeout_s`` is no capacity; it is given back (one per pool and tick, ``remove_unregistered``: the
   provider removes a Machine without a Node, never a running node), shortfall or not, and the pool is not grown
   again for a back-off that doubles with each failure in a row (Cluster Autoscaler's unregistered-node removal and
   node-group backoff): more requests to a pool out of quota or stock would not come either.

Every action carries its reason and the numbers; ``CapacityReport`` lists every option with its cost and why it was
or was not chosen, for ``autoscaler plan`` and the simulator.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from autoscaler.core.burst import BurstChoice, BurstOption, BurstPool, choose_burst, largest_burst, worth_a_node
from autoscaler.core.cluster import (
    SUSPENDABLE_KINDS,
    ClusterSnapshot,
    DeploymentInfo,
    KeptApart,
    NodeInfo,
    PlacementRule,
    PodInfo,
    Spread,
    WorkloadInfo,
    add_beside,
    anti_affinity_barred,
    anti_affinity_lifted,
    free_gpus_per_node,
    gpu_types_meet,
    kept_off_by_landing,
    labels_select,
    next_replica,
    one_replica_per_node,
    place_best_fit,
    pod_anti_affinity_barred,
    replica_gpus,
    requests_by_node,
    schedulable_on,
    spread_domains,
    workload_pod,
)
from autoscaler.core.model import (
    Action,
    CapacityState,
    EvictPod,
    Mode,
    ResumeWorkload,
    ScaleDecision,
    ScaleNodePool,
    ServicePolicy,
    SuspendWorkload,
)
from autoscaler.core.predictive import rate_per_replica
from autoscaler.core.reasons import Reason
from autoscaler.core.topology_spread import TopologySkew, lacks_spread_keys, leaving_skews
from autoscaler.core.victims import (
    GangCandidate,
    GpuNeed,
    TrainingRules,
    choose_victims,
    gangs_from_snapshot,
    suspended_gangs,
)
from forecast.types import Forecast

# The forecast level read as a service's expected demand (consolidation: can it spare replicas for a cold start?).
# Besides each service's provisioned quantile, the only level the tick reads: the simulator fits just these two.
EXPECTED_LEVEL = 0.5

# Holds whose metrics were not read whole: they may keep replicas, never stop training or buy nodes for them.
_UNSURE_HOLDS = frozenset({Reason.METRICS_STALE, Reason.METRICS_PARTIAL, Reason.DECISION_FAILED})


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    """How the controller gets GPUs for inference and gives them back. Money is in the pools' currency."""

    training: TrainingRules = field(default_factory=TrainingRules)
    pools: tuple[BurstPool, ...] = ()  # burst pools the controller may grow (their node counts come from the tick)
    expanders: tuple[str, ...] = ("least-waste", "cheapest")  # chained pool choice, as Cluster Autoscaler's
    spend_cap_per_hour: float | None = None  # burst spend at most this per hour; None = no cap
    training_gpu_hour_value: float = 2.0  # what one training GPU-hour is worth (lost or delayed work), per GPU-hour
    slo_risk_per_gpu_hour: float = 20.0  # cost of one GPU-hour of inference demand left without a GPU
    assumed_shortfall_s: float = 1800.0  # how long a shortfall lasts when no usable forecast says, seconds
    # A shortfall no usable forecast vouches for is acted on (training stopped, nodes bought) only once the service
    # has been short this long: a one-sample spike (a burst of seconds, a scrape that read high) stops no training
    # and buys no node; its replicas are still asked for and wait for GPUs meanwhile (0: at its first tick; the
    # controller's and the simulator's settings default to 30), seconds
    shortfall_confirm_s: float = 0.0
    burst_idle_cooldown_s: float = 600.0  # a burst node is given back after it was spare this long, seconds
    # a burst node is spare only below this share of its GPUs in use (Cluster Autoscaler's 0.5): removing a node
    # restarts its pods elsewhere, each a cold start
    burst_unneeded_utilisation: float = 0.5
    resume_after_s: float = 300.0  # a suspended gang's GPUs are free this long before it is resumed, seconds
    # the forecast must keep a resumed gang's GPUs free for max(its minimum runtime, this), seconds: about a
    # checkpoint interval, so that a resumed gang is not stopped again before it has saved any work
    resume_horizon_s: float = 1800.0
    # A burst node that stays busy (at least half used, or its pods fit nowhere else) is still emptied when stopping
    # lower-priority training on the cluster's own nodes to make room for its pods costs less than keeping the node
    # over this many seconds (0: never; the node is then given back only once it is under half used)
    consolidate_horizon_s: float = 1800.0
    # a burst node the provider counts but that has not registered as a Node this long (or twice its pool's boot
    # time, whichever is longer) is not coming: it is no capacity on its way, it is given back (its Machine removed,
    # one per pool and tick, never below the pool's minimum), and its pool is not grown again while any is left nor
    # for a back-off after (Cluster Autoscaler's --max-node-provision-time), seconds
    provision_timeout_s: float = 900.0
    # the back-off of a pool whose nodes went past the provision timeout, from that moment; doubled with each such
    # failure in a row up to ``provision_backoff_max_s``; the count starts again after ``provision_backoff_reset_s``
    # without one (Cluster Autoscaler's initial/max node-group backoff and backoff reset), seconds
    provision_backoff_s: float = 300.0
    provision_backoff_max_s: float = 1800.0
    provision_backoff_reset_s: float = 10800.0
    # after a give-back of a pool's node failed to be written (a paused MachineDeployment, a Machine not found, an
    # API error), none of the pool's nodes is given back for this long: the same write would fail every tick, each
    # failure an error and an Event (Cluster Autoscaler's --scale-down-delay-after-failure, 3 min), seconds
    give_back_retry_s: float = 180.0
    preempt: bool = True  # False: never stop training (burst only)
    burst: bool = True  # False: never add nodes (preempt only)
    # While lower-priority GPU work waits, a scale-down's replicas are chosen (``core.scale_down_choice``): those on
    # the nodes with the most free GPUs, marked with a low pod-deletion-cost before the scale so that the ReplicaSet
    # deletes them first; the contended hold predicts the holes in that order. Off: the ReplicaSet's own order
    choose_scale_down_replicas: bool = False


@dataclass(frozen=True, slots=True)
class Shortfall:
    service: str
    priority: int
    replicas: int  # replicas short after the free GPUs and the booting nodes
    gpus_per_replica: int
    duration_s: float  # how long it is expected to last
    basis: str  # "forecast" | "assumed"
    covered_by_booting: int = 0  # replicas that will go on burst nodes already booting


@dataclass(frozen=True, slots=True)
class CapacityOption:
    service: str
    kind: str  # preempt | burst | wait
    cost: float | None  # None when the option is not available
    chosen: bool
    detail: str


@dataclass(frozen=True, slots=True)
class CapacityReport:
    shortfalls: tuple[Shortfall, ...] = ()
    options: tuple[CapacityOption, ...] = ()
    candidates: tuple[GangCandidate, ...] = ()  # every training gang, eligible or not (with why not)
    burst_options: tuple[BurstOption, ...] = ()
    notes: tuple[str, ...] = ()  # give-back decisions and why not
    pools: tuple[BurstPool, ...] = ()  # the burst pools with their node counts at this tick
    # the workloads this controller suspended ("<kind>/<namespace>/<name>") that would be resumed but for where their
    # free GPUs lie: enough are free on the nodes training may use, with the coming replicas' reserve kept, yet not in
    # the shape of their pods. What the rebalancer may gather GPUs for; for the others (inference short, the GPUs
    # reserved) its moves would only restart replicas.
    resumable_once_gathered: tuple[str, ...] = ()

    @property
    def spend_per_hour(self) -> float:
        return sum(p.nodes * p.gpus_per_node * p.price_per_gpu_hour for p in self.pools)


@dataclass(frozen=True, slots=True)
class ArbitrationInput:
    """What the arbitration reads, gathered by ``core.tick.decide_tick``."""

    now: float
    snapshot: ClusterSnapshot
    policies: Mapping[str, ServicePolicy]
    decisions: Sequence[ScaleDecision]
    # per forecasting service: (forecast, quantile, lead seconds) when its floor is usable
    forecasts: Mapping[str, tuple[Forecast, float, float]] = field(default_factory=dict)
    throughputs: Mapping[str, float] = field(default_factory=dict)
    pool_nodes: Mapping[str, int] | None = None  # nodes per pool as the provider counts them (booting included)
    tick_s: float = 15.0
    # per pool, the (min, max) nodes its provider allows (a MachineDeployment's Cluster Autoscaler min/max-size
    # annotations; None where unset, or not read): the provider clamps every write to them, so the pool is planned
    # within the tighter of them and the configured ``min_nodes`` / ``max_nodes``
    pool_bounds: Mapping[str, tuple[int | None, int | None]] | None = None
    # the services whose latency is not seen to meet their SLO this tick (above it; unknown on an incomplete reading;
    # no SLO at all -- ``core.tick._over_slo``): a shortfall of theirs is never waited out as cheaper than acting
    # (its demand may already be served late)
    over_slo: Set[str] = frozenset()


def _bound_replicas(snapshot: ClusterSnapshot, policy: ServicePolicy) -> int:
    """The service's live pods that hold GPUs on a node (starting or serving), not terminating ones: their GPUs are
    counted as coming back (``_free_by_node``), and counted as replicas too they hid a shortfall twice over."""
    return sum(
        1
        for pod in snapshot.pods
        if pod.owner_kind == "Deployment"
        and pod.owner_name == policy.name
        and pod.namespace == policy.namespace
        and pod.node is not None
        and not pod.terminating
        and pod.phase not in ("Succeeded", "Failed")
    )


def _with_beside(needs: tuple[int, int]) -> str:
    """`` (each pod with 8 CPU and 64 GiB memory beside its GPUs)``, or nothing when a pod requests neither."""
    return f" (each pod with {_beside_text(needs)} beside its GPUs)" if needs[0] > 0 or needs[1] > 0 else ""


def _beside_text(needs: tuple[int, int]) -> str:
    """``8 CPU and 64 GiB memory`` (what is requested of either)."""
    parts = []
    if needs[0] > 0:
        parts.append(f"{needs[0] / 1000:g} CPU")
    if needs[1] > 0:
        parts.append(f"{needs[1] / 2**30:.3g} GiB memory")
    return " and ".join(parts)


def replica_beside_gpus(deployment: DeploymentInfo | None) -> tuple[int, int]:
    """(CPU millicores, memory bytes) one replica of the Deployment requests (its pod template); (0, 0) not known."""
    if deployment is None:
        return 0, 0
    return deployment.cpu_milli_per_pod, deployment.memory_bytes_per_pod


def _free_beside_gpus(snapshot: ClusterSnapshot) -> dict[str, tuple[int, int]]:
    """Each ready node's CPU and memory free beside its GPUs, where known (``NodeInfo.free_beside_gpus``)."""
    return {n.name: n.free_beside_gpus for n in snapshot.nodes if n.ready and n.free_beside_gpus is not None}


def _barred(snapshot: ClusterSnapshot, deployment: DeploymentInfo | None, by_pods: bool = True) -> frozenset[str]:
    """The nodes the Deployment's pods cannot be scheduled on (a nodeSelector label the node lacks, a taint they do
    not tolerate): their free GPUs are no room for its replicas, and stopping training there frees nothing for them.

    Its tolerations are the template's and those its running pods carry: a mutating webhook (or an admission plugin)
    adds tolerations at admission that the template never shows -- the pods already running on a tainted node are
    the proof -- and the next replica gets them too. With ``by_pods``, also the nodes its required pod anti-affinity
    keeps its next replica off (``core.cluster.anti_affinity_barred``): barred by the pods running there, not by
    what the node is (a new node of the same pool is not)."""
    if deployment is None:
        return frozenset()
    admitted = {
        t
        for p in snapshot.pods
        if p.owner_kind == "Deployment"
        and p.owner_name == deployment.name
        and p.namespace == deployment.namespace
        and p.tolerations
        for t in p.tolerations
    }
    extra = admitted - set(deployment.tolerations)
    if extra:
        ordered = sorted(extra, key=lambda t: (t.key or "", t.operator, t.value or "", t.effect or ""))
        deployment = replace(deployment, tolerations=(*deployment.tolerations, *ordered))
    # (a node without the key of one of its hard topology spread constraints takes none of its pods either)
    by_node = frozenset(
        n.name for n in snapshot.nodes if not schedulable_on(deployment, n) or lacks_spread_keys(deployment, n)
    )
    return by_node | anti_affinity_barred(deployment, snapshot) if by_pods else by_node


def _usable(key: str, barred: Set[str]) -> bool:
    """Whether an entry of the free or booting GPUs (a node, "<node> (terminating pods)", "<pool> (requested...)")
    is on a node the pods may use. Node and pool names hold no space."""
    return not barred or key.split(" ", 1)[0] not in barred


@dataclass(frozen=True, slots=True)
class _Blocker:
    """A service whose replicas wait for GPUs this tick without any being freed or bought for them (it confirms, holds
    on incomplete metrics, or its shortfall is waited out), or that wait for a node's boot (``on_boot``: only a
    later preemption waits for it): the scheduler binds its Pending pods first, on any GPU they may use."""

    service: str
    priority: int
    replicas: int
    why: str
    gpu_type: str | None  # the GPU type its pods select; None: any
    barred: frozenset[str]  # the nodes its pods cannot be scheduled on
    gpus: int  # GPUs one of its replicas requests
    # its replicas are counted on nodes still booting: GPUs freed sooner (a preemption's) go to its Pending pods
    # first, but a node bought later boots after its own and is no race
    on_boot: bool = False
    # its shortfall is waited out as cheaper than acting (``_cheaper_to_wait``): a choice, not a constraint, which a
    # later service's action it would take the GPUs of revokes (``arbitrate``)
    waited_out: bool = False
    # the nodes of ``barred`` its pods' required pod anti-affinity keeps them off (a pod it selects runs in their
    # domain), not the nodes' labels or taints: a node bought in the same pool is no such node
    kept_off: frozenset[str] = frozenset()


def _takes_freed(blocker: _Blocker, nodes: Set[str], snapshot: ClusterSnapshot, pools: Sequence[BurstPool]) -> bool:
    """Whether the blocker's Pending pods could take GPUs freed on ``nodes`` (a preemption's victims' nodes): one of
    them not leaving, not barred to its pods, of a GPU type they select (a node not yet labelled: its pool's type)
    and with as many GPUs as one of its replicas requests."""
    pool_types = {p.name: p.gpu_type for p in pools}
    for n in snapshot.nodes:
        if n.name not in nodes or n.leaving or n.name in blocker.barred or n.allocatable_gpus < blocker.gpus:
            continue
        kind = n.gpu_product if n.gpu_product is not None else pool_types.get(n.pool or "")
        if gpu_types_meet(kind, blocker.gpu_type):
            return True
    return False


def _takes_bought(blocker: _Blocker, pool: BurstPool, snapshot: ClusterSnapshot) -> bool:
    """Whether the blocker's Pending pods could take a node bought in ``pool``: of a GPU type they select, with as
    many GPUs as one of its replicas requests, and not barred to them where the pool's registered nodes show (its
    labels and taints; with no registered node they are unknown: taken as shared)."""
    if not gpu_types_meet(pool.gpu_type, blocker.gpu_type) or pool.gpus_per_node < blocker.gpus:
        return False
    registered = [n for n in snapshot.nodes if n.pool == pool.name and not n.leaving]
    return not registered or any(n.name not in blocker.barred or n.name in blocker.kept_off for n in registered)


def _spread_booting(spread: Spread | None, booting: Mapping[str, int], per_node: bool) -> Spread | None:
    """``spread`` with the nodes still on their way: a requested node ("<pool> (requested k)") is a host of its own
    for a Deployment spread one per node (its other domains, a zone, are not known before it registers)."""
    if spread is None:
        return None
    if not per_node:
        return spread
    requested = {key: (f"requested={key}",) for key in booting if " (requested" in key}
    return {**spread, **requested}


def _counted_replicas(
    deployment: DeploymentInfo | None, gpus: int, *placements: tuple[Mapping[str, int], Mapping[str, int]]
) -> list[PodInfo]:
    """Stand-ins for the Deployment's replicas a placement counted onto nodes (the entries of each ``(before,
    after)`` with fewer GPUs after; "<node> (terminating pods)": its node; a node requested is
    none yet), one per ``gpus`` taken on a node and at least one: once bound there, kube-scheduler keeps off their
    domain a later replica whose required pod anti-affinity selects them, and counts each in the domain of a later
    replica whose topology spread constraint selects them."""
    if deployment is None:
        return []
    taken: dict[str, int] = {}
    for before, after in placements:
        for key, left in after.items():
            if left < before.get(key, left):
                node = key.split(" ", 1)[0]
                taken[node] = taken.get(node, 0) + before[key] - left
    name = f"{deployment.name} (counted this tick)"
    return [
        next_replica(deployment, node, name)
        for node in sorted(taken)
        for _ in range(max(1, taken[node] // max(1, gpus)))
    ]


def _held_off(
    free: Mapping[str, int],
    gpus: int,
    gpu_type: str | None,
    node_types: Mapping[str, str | None],
    kept_off: Set[str],
    by_node: Set[str],
    skew: TopologySkew | None,
) -> list[str]:
    """The ready nodes with a replica's GPUs free, of its type, that its pods' labels, taints and selectors allow but
    its required pod anti-affinity or hard topology spread refuses now (sorted)."""
    return sorted(
        node
        for node, left in free.items()
        if left >= gpus
        and " " not in node  # a node's own entry, not "<node> (terminating pods)" nor a requested one
        and (gpu_type is None or node_types.get(node) == gpu_type)
        and node not in by_node
        and (node in kept_off or (skew is not None and not skew.allows(node)))
    )


def _spread_taken(spread: Spread | None, used: Set[str]) -> frozenset[str]:
    """The nodes of the domains this tick's placements already took for a spread Deployment: no room for one more
    of its replicas, whatever a preemption frees there."""
    if spread is None or not used:
        return frozenset()
    return frozenset(node for node, domains in spread.items() if not used.isdisjoint(domains))


def _lifted_by_victims(
    deployment: DeploymentInfo, snapshot: ClusterSnapshot, candidates: Sequence[GangCandidate], kept_off: Set[str]
) -> dict[str, frozenset[str]]:
    """Eligible gang -> the nodes of ``kept_off`` (the Deployment's pod anti-affinity's, nothing else barring them)
    that only its own pods keep the next replica off (``core.cluster.anti_affinity_lifted``)."""
    owners = {pod: c.gang for c in candidates if c.why_not is None for pod in c.pods}
    if not owners:
        return {}
    lifted = anti_affinity_lifted(deployment, snapshot, owners)
    return {gang: nodes & kept_off for gang, nodes in lifted.items() if not nodes.isdisjoint(kept_off)}


def _with_lifted(
    free: Mapping[str, int],
    room: Mapping[str, int],
    candidates: Sequence[GangCandidate],
    lifted: Mapping[str, frozenset[str]],
) -> tuple[dict[str, int], list[GangCandidate]]:
    """The victim search's room and candidates once the nodes only a gang keeps the replica off (``lifted``) are
    room if, and only if, that gang is stopped: their free GPUs counted as the gang's (freed with it), none in the
    room itself, and another gang's GPUs there not counted (stopping it alone opens nothing there -- fewer GPUs
    seen, never more). The candidates keep their names and costs; their GPUs alone differ."""
    owner_of = {node: gang for gang, nodes in lifted.items() for node in nodes}
    opened = dict(room)
    unlocked: dict[str, dict[str, int]] = {}
    for key, left in free.items():
        gang = owner_of.get(key.split(" ", 1)[0])
        if gang is not None:
            opened[key] = 0
            unlocked.setdefault(gang, {})[key] = max(left, 0)
    searched = []
    for c in candidates:
        if c.why_not is not None:
            searched.append(c)
            continue
        held = {k: v for k, v in c.gpus_by_node.items() if owner_of.get(k.split(" ", 1)[0], c.gang) == c.gang}
        for key, left in unlocked.get(c.gang, {}).items():
            held[key] = held.get(key, 0) + left
        searched.append(replace(c, gpus_by_node=held) if held != c.gpus_by_node else c)
    return opened, searched


def _only_usable(room: Mapping[str, int], barred: Set[str]) -> dict[str, int]:
    return {k: v for k, v in room.items() if _usable(k, barred)} if barred else dict(room)


def _place_usable(
    room: dict[str, int],
    barred: Set[str],
    replicas: int,
    gpus: int,
    gpu_type: str | None,
    node_types: Mapping[str, str | None],
    beside: dict[str, tuple[int, int]] | None = None,
    needs: tuple[int, int] = (0, 0),
    spread: Spread | None = None,
    spread_used: set[str] | None = None,
    rule: PlacementRule | None = None,
) -> int:
    """``_place`` on the entries of ``room`` the pods may use, consuming ``room`` (and ``beside``); with ``spread``
    at most one replica per domain, with ``rule`` where it allows (``place_best_fit``)."""
    if not barred:
        return place_best_fit(room, replicas, gpus, gpu_type, node_types, beside, needs, spread, spread_used, rule)
    view = _only_usable(room, barred)
    placed = place_best_fit(view, replicas, gpus, gpu_type, node_types, beside, needs, spread, spread_used, rule)
    room.update(view)
    return placed


RETURNING = " (terminating pods)"  # the suffix of a ready node's entry of GPUs coming back (``_free_by_node``)


def _place_on_coming(
    free: dict[str, int],
    booting: dict[str, int],
    barred: Set[str],
    replicas: int,
    gpus: int,
    gpu_type: str | None,
    node_types: Mapping[str, str | None],
    beside: dict[str, tuple[int, int]] | None = None,
    needs: tuple[int, int] = (0, 0),
    returning_beside: Mapping[str, tuple[int, int]] | None = None,
    spread: Spread | None = None,
    spread_used: set[str] | None = None,
    rule: PlacementRule | None = None,
) -> int:
    """``_place_usable`` on the capacity on its way (``booting``), a ready node's GPUs coming back together with its
    free ones: 4 free beside 4 returning hold an 8-GPU replica, where either alone does not (and a second gang was
    stopped for the replica, tick after tick of the first one's grace period). What is placed takes the returning
    GPUs first, then the node's free ones; both maps are consumed. On a ready node whose CPU and memory are known
    (``beside``) a replica needs them too: those free there and those its terminating pods give back
    (``returning_beside``); what it takes is taken from ``beside``."""
    returning = {key: key[: -len(RETURNING)] for key in booting if key.endswith(RETURNING)}
    room = dict(booting)
    for key, ready_node in returning.items():
        room[key] += free.get(ready_node, 0)
    # the ready node's CPU and memory free now plus what its terminating pods give back, under the returning key
    coming_beside: dict[str, tuple[int, int]] | None = None
    if beside is not None and (needs[0] > 0 or needs[1] > 0):
        coming_beside = {key: beside[ready_node] for key, ready_node in returning.items() if ready_node in beside}
        for key, ready_node in returning.items():
            add_beside(coming_beside, key, (returning_beside or {}).get(ready_node, (0, 0)))
    placed = _place_usable(
        room, barred, replicas, gpus, gpu_type, node_types, coming_beside, needs, spread, spread_used, rule
    )
    if beside is not None and coming_beside is not None:
        # what the placements left, less what is still on its way back, is what is free on the node now
        for key, left in coming_beside.items():
            ready_node = returning[key]
            beside[ready_node] = left
            add_beside(beside, ready_node, (returning_beside or {}).get(ready_node, (0, 0)), -1)
    for key, before in booting.items():
        node = returning.get(key)
        if node is None:
            booting[key] = room[key]
            continue
        taken = before + free.get(node, 0) - room[key]
        booting[key] = max(0, before - taken)
        if taken > before and node in free:
            free[node] -= taken - before
    return placed


def _fits(
    free: Mapping[str, int],
    pod_gpus: Sequence[int],
    beside: dict[str, tuple[int, int]] | None = None,
    needs: tuple[int, int] = (0, 0),
    rule: PlacementRule | None = None,
) -> dict[str, int] | None:
    """``free`` after placing every pod (largest first, each by ``place_best_fit``), or None when one does not fit.
    Each pod requesting ``needs`` (CPU millicores, memory bytes) fits only where that much is free ``beside`` the
    GPUs (where known), and takes it: ``beside`` is consumed only when every pod fits. With ``rule``, each pod only
    where it allows (a gang's pods kept apart, ``KeptApart``), and it learns of each placement."""
    left = dict(free)
    room = dict(beside) if beside is not None else None
    for gpus in sorted(pod_gpus, reverse=True):
        if place_best_fit(left, 1, gpus, beside=room, needs=needs, rule=rule) == 0:
            return None
    if beside is not None and room is not None:
        beside.update(room)
    return left


def _registered(snapshot: ClusterSnapshot, pool_names: Set[str]) -> dict[str, int]:
    """Nodes of each pool its provider still counts among those listed: all but a node being removed (an
    autoscaler's removal taint, or deleting: the provider's size has already, or is about to, let it go). A node
    out of service (cordoned by hand or by a drain, its kubelet lost, its GPUs unhealthy) is still the provider's
    node: left out, it would read as a node requested and not registered, capacity on its way that never comes,
    hiding a shortfall for as long as it stays so."""
    out: dict[str, int] = {}
    for n in snapshot.nodes:
        if n.pool is not None and n.pool in pool_names and (not n.leaving or n.out_of_service):
            out[n.pool] = out.get(n.pool, 0) + 1
    return out


def _unregistered(
    snapshot: ClusterSnapshot, pools: Sequence[BurstPool], pool_nodes: Mapping[str, int] | None
) -> dict[str, int]:
    """Per burst pool, the nodes its provider counts beyond those registered as Nodes (requested, booting, or never
    coming); pools without any, or whose size the provider did not give, are left out."""
    if not pool_nodes:
        return {}
    registered = _registered(snapshot, {p.name for p in pools})
    out = {}
    for pool in pools:
        missing = pool_nodes.get(pool.name, 0) - registered.get(pool.name, 0)
        if missing > 0 and pool.gpus_per_node > 0:
            out[pool.name] = missing
    return out


def _provision_overdue(
    unregistered: Mapping[str, int],
    state: CapacityState,
    config: CapacityConfig,
    now: float,
    unread: Set[str] = frozenset(),
) -> tuple[dict[str, int], dict[str, tuple[float, int]]]:
    """The pools whose unregistered nodes are past the provision timeout (pool -> how many), and the timers for
    the next tick. A timer starts when a pool's unregistered count first rises (a new request) and stands while
    the count holds or falls (some registered); at 0 it is dropped. Once overdue it also stands when the count rises
    (a node drained by the Cluster Autoscaler, which the provider still counts, or one added by someone else): the
    node already stuck stays no capacity and is still given back, its failure counted once. ``unread``: pools whose
    size was not read this tick (an API error): their timers stand as they were, and none is overdue this tick.
    A time later than ``now`` (the wall clock stepped back) is taken as ``now``. After a restart a timer starts again
    from the first tick: a node requested before it gets up to a whole timeout more."""
    timers: dict[str, tuple[float, int]] = {}
    overdue: dict[str, int] = {}
    for name in unread:
        if name in state.unregistered_since:
            since, count = state.unregistered_since[name]
            timers[name] = (min(since, now), count)
    for name, count in unregistered.items():
        if name in unread:
            continue
        limit = _provision_limit(name, config)
        prev = state.unregistered_since.get(name)
        if prev is None:
            since = now
        else:
            since = min(prev[0], now)
            if count > prev[1] and now - since < limit:
                since = now
        timers[name] = (since, count)
        if now - since >= limit:
            overdue[name] = count
    return overdue, timers


def _stuck_booting(snapshot: ClusterSnapshot, config: CapacityConfig, now: float) -> dict[str, tuple[str, float]]:
    """Burst nodes not ready for longer than their pool's provision limit since they registered or their Ready
    condition last changed (``NodeInfo.state_since``), and not leaving (node -> (pool, how long)): no capacity on its
    way. Most often the device plugin never reported GPUs (a driver or image problem); counted as booting, such a node
    hid a shortfall for as long as it stayed. Also a broken one (``NodeInfo.broken``: its kubelet lost, or NotReady
    long after it served) that nobody is removing: read as out of service, no capacity either, but billed for as long
    as it stays -- all night, without a MachineHealthCheck to replace it (and the Cluster Autoscaler, which removes
    unready nodes after 20 minutes, does not manage the pools this controller owns)."""
    names = {p.name for p in config.pools}
    out: dict[str, tuple[str, float]] = {}
    for n in snapshot.nodes:
        if n.pool not in names or n.pool is None or n.ready or n.state_since is None:
            continue
        if n.leaving and not (n.broken and n.out_of_service):
            continue  # being removed (a removal taint, being deleted), or cordoned by hand and not broken
        age = now - n.state_since
        if age >= _provision_limit(n.pool, config):
            out[n.name] = (n.pool, age)
    return out


def _provision_limit(pool: str, config: CapacityConfig) -> float:
    """How long a pool's requested node may take to register: the provision timeout, or twice its boot time."""
    by_name = next((p for p in config.pools if p.name == pool), None)
    return max(config.provision_timeout_s, 2.0 * by_name.boot_s) if by_name is not None else config.provision_timeout_s


def _failed_at(
    overdue: Mapping[str, int],
    timers: Mapping[str, tuple[float, int]],
    stuck: Mapping[str, tuple[str, float]],
    config: CapacityConfig,
    now: float,
) -> dict[str, float]:
    """Per pool failing to deliver nodes, the moment its current failure happened: its requested nodes went past the
    provision limit unregistered (the timer's start + the limit), or its earliest stuck node did (now - how long it
    has been not ready + the limit); the later of the two when both."""
    out = {name: timers[name][0] + _provision_limit(name, config) for name in overdue}
    earliest: dict[str, float] = {}
    for pool, age in stuck.values():
        at = now - age + _provision_limit(pool, config)
        earliest[pool] = min(earliest.get(pool, at), at)
    for pool, at in earliest.items():
        out[pool] = max(out.get(pool, at), at)
    return out


def _provision_backoff(
    failed_at: Mapping[str, float],
    state: CapacityState,
    config: CapacityConfig,
    now: float,
) -> tuple[dict[str, tuple[float, int]], dict[str, float]]:
    """The failures for the next tick (pool -> when its nodes last went past the timeout, how many times in a row)
    and the pools backing off now (pool -> until when). A pool's nodes going past the timeout is one failure, counted
    once (keyed by the moment it happened: the timer's start + the limit); its back-off starts then and doubles with
    each failure in a row, up to the maximum; a failure more than ``provision_backoff_reset_s`` after the previous
    one counts as the first again, and a record that old is dropped."""
    failures: dict[str, tuple[float, int]] = {}
    for name, (at, count) in state.provision_failures.items():
        at = min(at, now)  # the wall clock stepped back: at most the back-off from now
        if now - at < config.provision_backoff_reset_s:
            failures[name] = (at, count)
    for name, at in failed_at.items():
        prev = failures.get(name)
        if prev is None:
            failures[name] = (at, 1)
        elif prev[0] != at:
            failures[name] = (at, prev[1] + 1 if at - prev[0] < config.provision_backoff_reset_s else 1)
    backing_off: dict[str, float] = {}
    for name, (at, count) in failures.items():
        until = at + min(config.provision_backoff_max_s, config.provision_backoff_s * 2.0 ** min(count - 1, 30))
        if until > now:
            backing_off[name] = until
    return failures, backing_off


def _free_by_node(
    snapshot: ClusterSnapshot,
    burst_pools: Set[str],
    node_types: dict[str, str | None],
    pools: Sequence[BurstPool] = (),
    coming: Mapping[str, int] | None = None,
    stuck: Set[str] = frozenset(),
) -> tuple[dict[str, int], dict[str, int]]:
    """Free GPUs of ready nodes, and of booting nodes: not ready yet, of a burst pool this controller grows, and not
    leaving. Any other node that is not ready (an on-prem node whose kubelet died; any node cordoned, tainted for
    removal or being deleted, a burst node given back included) is no capacity on its way: counting it would hide a
    shortfall for as long as it stays. ``node_types`` (node -> GPU type) gains the type of every entry it adds.

    A burst node is on its way from the request on: a booting node whose device plugin has not reported its GPUs yet
    (allocatable 0) brings its pool's ``gpus_per_node`` (``pools``), and ``coming`` (pool -> nodes the provider
    counts beyond those registered, ``_unregistered``, the pools past the provision timeout left out) are booting
    nodes without a Node object yet; ``stuck`` (registered, still not ready past the provision timeout) are not.
    Counted as nothing, each tick of the boot would buy another node (or stop training) for the same shortfall."""
    free = free_gpus_per_node(snapshot)
    burst = {p.name: p for p in pools}
    burst.update({name: BurstPool(name, 0, None, 0.0, 0.0) for name in burst_pools if name not in burst})
    ready = {n.name: free[n.name] for n in snapshot.nodes if n.ready}
    used: dict[str, int] = {}
    for pod in snapshot.pods:
        if pod.node and pod.phase not in ("Succeeded", "Failed"):
            used[pod.node] = used.get(pod.node, 0) + pod.gpus
    booting: dict[str, int] = {}
    for n in snapshot.nodes:
        pool = burst.get(n.pool) if n.pool is not None else None
        if pool is None or n.leaving or n.name in stuck:
            continue
        if not n.ready:
            gpus = n.allocatable_gpus if n.allocatable_gpus > 0 else pool.gpus_per_node
            booting[n.name] = max(0, gpus - used.get(n.name, 0))
            if node_types.get(n.name) is None:
                node_types[n.name] = pool.gpu_type
    for name, count in (coming or {}).items():
        pool = burst[name]
        for k in range(count):
            key = f"{name} (requested, not registered {k + 1})"
            booting[key] = pool.gpus_per_node
            node_types[key] = pool.gpu_type
    # GPUs of terminating pods on ready nodes are on their way back too (a gang stopped by an earlier tick, a
    # replica scaled down), and so are those of a gang whose workload is suspended (its controller deletes its pods):
    # counted as coming, so that a tick in their grace period does not stop a second gang for the same shortfall.
    for pod in _returning_pods(snapshot, ready):
        key = f"{pod.node}{RETURNING}"
        booting[key] = booting.get(key, 0) + pod.gpus
        node_types[key] = node_types.get(pod.node or "")
    return ready, booting


def _returning_pods(snapshot: ClusterSnapshot, ready: Mapping[str, int]) -> list[PodInfo]:
    """The GPU pods on ``ready`` nodes whose GPUs are coming back: terminating, or of a suspended gang."""
    stopping = suspended_gangs(snapshot)
    return [
        pod
        for pod in snapshot.pods
        if (pod.terminating or (pod.gang is not None and pod.gang in stopping))
        and pod.node in ready
        and pod.gpus > 0
        and pod.phase not in ("Succeeded", "Failed")
    ]


def _live_gpu_pods(snapshot: ClusterSnapshot, node: str) -> list[PodInfo]:
    return [p for p in snapshot.pods if p.node == node and p.gpus > 0 and p.phase not in ("Succeeded", "Failed")]


def fits_typed(
    free: Mapping[str, int],
    pods: Sequence[PodInfo],
    node_types: Mapping[str, str | None],
    deployment_types: Mapping[str, str | None],
    barred: Mapping[str, Set[str]] | None = None,
    beside: Mapping[str, tuple[int, int]] | None = None,
    beside_left: dict[str, tuple[int, int]] | None = None,
    rules: Mapping[str, PlacementRule] | None = None,
) -> dict[str, int] | None:
    """``free`` after placing every pod (largest first, best fit) on a node of the GPU type it runs on (its own
    selector, else its Deployment's; None: any) that its Deployment's pods may use (``barred``: Deployment
    "namespace/name" -> nodes its pods cannot be scheduled on), or None when one does not fit. With ``beside``, a
    pod fits a node only with the CPU and memory it requests free there too (where known); ``beside_left`` is then
    given what they leave of it (when all fit). ``rules``: Deployment -> where its topology spread lets its pods go
    (``core.topology_spread.leaving_skews``)."""
    left = dict(free)
    room = dict(beside) if beside is not None else None
    placing = []
    for pod in pods:
        key = f"{pod.namespace}/{pod.owner_name}"
        placing.append((pod, pod.gpu_product or deployment_types.get(key), (barred or {}).get(key, frozenset())))
    # largest first, and among equals the most constrained (a GPU type, nodes it may not use) before those that go
    # anywhere: listed first, a pod of any type took the one slot of the type another needed, and whether a node was
    # given back hung on the order the API lists pods in
    placing.sort(key=lambda item: (-item[0].gpus, item[1] is None, -len(item[2])))
    for pod, wanted, barred_nodes in placing:
        needs = (pod.cpu_milli, pod.memory_bytes)
        rule = (rules or {}).get(f"{pod.namespace}/{pod.owner_name}")
        if _place_usable(left, barred_nodes, 1, pod.gpus, wanted, node_types, room, needs, rule=rule) == 0:
            return None
    if beside_left is not None and room is not None:
        beside_left.clear()
        beside_left.update(room)
    return left


def _needed_replicas(
    arb: ArbitrationInput, key: str, policy: ServicePolicy, t0: float, t1: float, quantile: float | None = None
) -> int | None:
    """Replicas the service's usable forecast asks for at its peak over [t0, t1] (at its provisioned quantile, or
    ``quantile``), or None without one."""
    entry = arb.forecasts.get(key)
    if entry is None:
        return None
    forecast, provisioned, _ = entry
    quantile = provisioned if quantile is None else quantile
    rate = rate_per_replica(policy, arb.throughputs.get(key))
    if rate is None:
        return None
    end = min(t1, forecast.end)
    if end <= t0:
        return None
    demand = forecast.max_over(t0, end, quantile)
    return min(max(math.ceil(max(demand, 0.0) / rate - 1e-9), policy.min_replicas), policy.max_replicas)


def _duration(
    arb: ArbitrationInput, key: str, policy: ServicePolicy, capacity: int, config: CapacityConfig
) -> tuple[float, str, bool]:
    """How long the service stays short of ``capacity`` replicas: the forecast's first fit, else assumed; and
    whether the forecast vouches for the shortfall (it needs more than ``capacity`` at the first step it covers
    from now + lead). A forecast that fits from now + lead on says nothing about [now, now + lead): what the replicas
    are wanted for now is the metric's alone."""
    entry = arb.forecasts.get(key)
    if entry is None:
        return config.assumed_shortfall_s, "assumed", False
    forecast, _, lead = entry
    step = max(arb.tick_s, 60.0)
    t = arb.now + lead
    end = forecast.end
    first = True
    while t < end:
        need = _needed_replicas(arb, key, policy, t, min(t + step, end))
        if need is not None and need <= capacity:
            return max(arb.tick_s, t - arb.now), "forecast", not first
        first = first and need is None
        t += step
    return max(arb.tick_s, end - arb.now), "forecast", not first


def _pools(arb: ArbitrationInput, config: CapacityConfig) -> list[BurstPool]:
    """The configured burst pools with their node counts at this tick, and within the bounds their provider allows
    (``ArbitrationInput.pool_bounds``)."""
    counts: dict[str, int] = {}
    for node in arb.snapshot.nodes:
        if node.pool:
            counts[node.pool] = counts.get(node.pool, 0) + 1
    if arb.pool_nodes is not None:
        counts.update(arb.pool_nodes)
    out = []
    for p in config.pools:
        low, high = (arb.pool_bounds or {}).get(p.name, (None, None))
        min_nodes = max(p.min_nodes, low) if low is not None else p.min_nodes
        max_nodes = min(p.max_nodes, high) if high is not None else p.max_nodes
        out.append(replace(p, nodes=counts.get(p.name, 0), min_nodes=min_nodes, max_nodes=max_nodes))
    return out


def _bound_notes(configured: Sequence[BurstPool], bounded: Sequence[BurstPool]) -> list[str]:
    """Where a pool's provider allows less than it is configured for (``_pools`` planned it within the provider's
    bounds: the writes would be clamped to them)."""
    notes = []
    for conf, pool in zip(configured, bounded, strict=True):
        if pool.max_nodes < conf.max_nodes:
            notes.append(
                f"{pool.name}: the provider allows at most {pool.max_nodes} node(s) (its max-size annotation), below "
                f"the configured max_nodes {conf.max_nodes}: planned within {pool.max_nodes}"
            )
        if pool.min_nodes > conf.min_nodes:
            notes.append(
                f"{pool.name}: the provider keeps at least {pool.min_nodes} node(s) (its min-size annotation), above "
                f"the configured min_nodes {conf.min_nodes}: nothing given back below {pool.min_nodes}"
            )
    return notes


def _cheaper_to_wait(
    gpus_short: int, duration_s: float, action_cost: float | None, preempting: bool, config: CapacityConfig
) -> tuple[str, float] | None:
    """Why a forecast shortfall is waited out rather than acted on, and the most waiting costs; or None. Leaving demand
    without GPUs has its price in the same currency (``slo_risk_per_gpu_hour`` per GPU-hour): every GPU short, unserved
    for the whole shortfall, is the most waiting can cost (the forecast's shortfall is its quantile's, a P99's: most of
    it demand that does not come). When even that is below the cheaper action -- a 16-GPU gang stopped, or a node bought
    for its billing period, for one replica short at the P99 for half an hour -- the action costs more than it can save.
    The caller asks only for a shortfall the forecast vouches for (one without a usable forecast, or that the forecast
    fits from now + lead on, is the metric's demand, already here) and only while the service meets its SLO (a breach is
    demand served late now)."""
    if action_cost is None:
        return None
    unserved = gpus_short * duration_s / 3600.0 * config.slo_risk_per_gpu_hour
    if unserved >= action_cost:
        return None
    action = "preempting" if preempting else "a burst node"
    return (
        f"{gpus_short} GPU(s) of demand unserved for ~{duration_s:.0f}s cost at most {unserved:.2f} "
        f"(sloRiskPerGpuHour {config.slo_risk_per_gpu_hour:g}), less than {action} ({action_cost:.2f}), and latency "
        "meets the SLO: waited out"
    ), unserved


def _wait(service: str, detail: str, cost: float = 0.0) -> CapacityOption:
    """The option chosen when a shortfall is neither preempted for nor burst for this tick. ``cost``: what waiting
    was priced at when that was the choice (a wait-out, beside the actions' costs in ``autoscaler plan``); 0 when it
    is forced (confirming, behind another service, over before a replica is ready)."""
    return CapacityOption(service, "wait", cost, True, detail)


def _budgets_left(candidates: Sequence[GangCandidate], spent: Mapping[str, int]) -> list[GangCandidate]:
    """``candidates`` with each PodDisruptionBudget's allowance less what earlier victims of this tick (for other
    services) took from it; a gang the rest no longer covers is not eligible. ``choose_victims`` keeps one
    service's set within the budgets; this keeps the tick's."""
    if not spent:
        return list(candidates)
    out = []
    for c in candidates:
        if not any(budget in spent for budget, _, _ in c.pdb_use):
            out.append(c)
            continue
        use = tuple((budget, covered, allowed - spent.get(budget, 0)) for budget, covered, allowed in c.pdb_use)
        why = c.why_not
        if why is None:
            over = next(((b, n, left) for b, n, left in use if n > left), None)
            if over is not None:
                why = f"PodDisruptionBudget {over[0]} allows {max(over[2], 0)} more this tick, the gang needs {over[1]}"
        out.append(replace(c, pdb_use=use, why_not=why))
    return out


def _take_victim(
    victim: GangCandidate,
    free: dict[str, int],
    pdb_spent: dict[str, int],
    workloads: Mapping[str, WorkloadInfo],
    detail: str,
    service: str,
) -> list[EvictPod | SuspendWorkload]:
    """Stop ``victim`` for ``service``: its disruptions spent from the tick's budgets, its GPUs back in ``free``, and
    the actions that stop it."""
    for budget, covered, _ in victim.pdb_use:
        pdb_spent[budget] = pdb_spent.get(budget, 0) + covered
    _return_gpus(free, victim)
    return _stop_actions(victim, workloads, detail, service)


def _return_gpus(free: dict[str, int], victim: GangCandidate) -> None:
    """The victim's GPUs back in ``free``, on the nodes ``free`` counts."""
    for node, gpus in victim.gpus_by_node.items():
        if node in free:
            free[node] += gpus


def _return_beside(beside: dict[str, tuple[int, int]], victim: GangCandidate) -> None:
    """The victim's CPU and memory back in ``beside``, on the nodes whose are known."""
    for node, amount in victim.beside_by_node.items():
        add_beside(beside, node, amount)


def _stop_actions(
    victim: GangCandidate, workloads: Mapping[str, WorkloadInfo], detail: str, service: str
) -> list[EvictPod | SuspendWorkload]:
    workload = workloads.get(victim.gang)
    lost = victim.lost_work_gpu_s
    if workload is not None and workload.kind in SUSPENDABLE_KINDS and not workload.suspended:
        return [
            SuspendWorkload(
                workload.kind, workload.namespace, workload.name, Reason.PREEMPT_FOR_INFERENCE, detail, service, lost
            )
        ]
    share = lost / max(1, len(victim.pods))
    uids = victim.pod_uids or (None,) * len(victim.pods)
    budgets = tuple((budget, covered) for budget, covered, _ in victim.pdb_use)
    return [
        EvictPod(namespace, name, Reason.PREEMPT_FOR_INFERENCE, detail, victim.gang, service, share, uid, budgets)
        for (namespace, name), uid in zip(victim.pods, uids, strict=True)
    ]


def arbitrate(
    arb: ArbitrationInput, state: CapacityState, config: CapacityConfig
) -> tuple[list[Action], CapacityReport, CapacityState]:
    """The preemptions, burst scale-ups and give-backs of this tick, their report, and the state for the next.

    A shortfall waited out as cheaper than acting leaves its replicas Pending, and the scheduler gives them first
    what a later (lower-priority) service's action frees or buys: that service then waits behind a wait that was
    chosen, not forced -- every tick, for as long as the forecast stays above capacity, however late its own demand
    is served. Waiting saves nothing once the GPUs would go to the waiting service anyway, so such a wait-out is
    revoked and the tick decided again with that service acted on (at most once per service: each pass revokes at
    least one more, and a revoked one never waits out again this tick)."""
    unread = arb.snapshot.training_unread
    if unread and config.preempt:
        # A workload kind's list refused after it answered: its training's own minimum runtime, suspension and Kueue
        # Workload are unknown, so none is stopped this tick; bursting and giving back go on (an API error never
        # causes a preemption, nor holds the scaling).
        config = replace(config, preempt=False)
    acting: dict[str, str] = {}
    while True:
        actions, report, new_state, revoked = _arbitrate(arb, state, config, acting)
        if not revoked:
            if unread:
                why = f"no training stopped this tick: {', '.join(unread)} refused after it answered"
                report = replace(report, notes=(*report.notes, why))
            return actions, report, new_state
        acting = {**acting, **revoked}


def _arbitrate(
    arb: ArbitrationInput, state: CapacityState, config: CapacityConfig, acting: Mapping[str, str]
) -> tuple[list[Action], CapacityReport, CapacityState, dict[str, str]]:
    """``arbitrate``'s pass with the services of ``acting`` never waited out as cheaper (why: its value), and the
    services whose wait-out a later service's action would make moot (why: its value)."""
    now, snapshot = arb.now, arb.snapshot
    node_types = {n.name: n.gpu_product for n in snapshot.nodes}
    unregistered = _unregistered(snapshot, config.pools, arb.pool_nodes)
    read = set(arb.pool_nodes or {})
    unread = {p.name for p in config.pools if p.name not in read}
    overdue, unregistered_since = _provision_overdue(unregistered, state, config, now, unread)
    stuck_booting = _stuck_booting(snapshot, config, now)
    bound = [p for p in snapshot.pods if p.node and p.gpus > 0 and p.phase not in ("Succeeded", "Failed")]
    busy = {p.node for p in bound}
    # ... of which a stuck node still *holds* only the pods not being deleted: the node lifecycle controller evicts
    # the pods of a NotReady node once their toleration (300 s by default) runs out, their owners re-create them
    # elsewhere, and the deleted ones stay Terminating until the kubelet answers or the node goes -- nothing on it
    # comes back, so it is given back like an empty one (its Machine billed meanwhile, all night). Not before the
    # grace period of each has run out (``PodInfo.deletion_at``): a stuck node's kubelet still reports (the reader
    # takes one whose kubelet is lost as leaving), so until then it runs the pod's shutdown -- a training pod's
    # checkpoint on SIGTERM -- which giving the node back would kill
    holding = {p.node for p in bound if not p.terminating or (p.deletion_at is not None and now < p.deletion_at)}
    # A stuck node with GPU pods bound served once (its kubelet went NotReady since), and so did a broken one (its
    # kubelet lost, NotReady long after it registered its GPUs): no capacity, but no sign that the pool's new nodes
    # fail, so it neither closes the pool nor counts as a provisioning failure
    broken = {n.name for n in snapshot.nodes if n.broken}
    # nodes annotated not to be removed by an autoscaler (scale-down-disabled, do-not-disrupt): never given back
    kept = {n.name for n in snapshot.nodes if n.do_not_disrupt}
    never_served = {node: v for node, v in stuck_booting.items() if node not in busy and node not in broken}
    stuck_pools = {pool for pool, _ in never_served.values()}
    failed_at = _failed_at(overdue, unregistered_since, never_served, config, now)
    provision_failures, backing_off = _provision_backoff(failed_at, state, config, now)
    coming = {name: count for name, count in unregistered.items() if name not in overdue}
    free, booting = _free_by_node(
        snapshot, {p.name for p in config.pools}, node_types, config.pools, coming, frozenset(stuck_booting)
    )
    free_read = dict(free)  # to tell the nodes this tick's Pending replicas were counted onto
    # CPU and memory beside the free GPUs, where the nodes say: consumed and given back as the GPUs are
    beside = _free_beside_gpus(snapshot)
    # the CPU and memory the returning pods (``_returning_pods``) give back with their GPUs
    returning_beside = requests_by_node(_returning_pods(snapshot, free)) if beside else {}
    # The policies' Deployments are not even candidates; every other serving replica (a Deployment whose policy is
    # invalid this tick, or that has none) is a candidate only to say why it is not taken (``core.victims``).
    managed = frozenset(arb.policies)
    rules = replace(config.training, protected=config.training.protected | managed)
    candidates = gangs_from_snapshot(snapshot, now, rules)
    workloads = {w.gang: w for w in snapshot.workloads}
    pools = _pools(arb, config)
    spend = sum(p.nodes * p.gpus_per_node * p.price_per_gpu_hour for p in pools)
    desired = {d.key: d for d in arb.decisions}
    gpu_types = {f"{d.namespace}/{d.name}": d.gpu_product for d in snapshot.deployments}
    deployments = {f"{d.namespace}/{d.name}": d for d in snapshot.deployments}

    actions: list[Action] = []
    shortfalls: list[Shortfall] = []
    options: list[CapacityOption] = []
    burst_seen: list[BurstOption] = []
    taken: set[str] = set()
    added_nodes: dict[str, int] = {}
    stale_holds: list[str] = []
    short_since_by_service: dict[str, float] = {}  # the services short this tick, since when
    waiting_for: set[str] = set()  # short services not acted on this tick (confirming, or behind one that waits)
    # ... of which those whose own shortfall is cheaper to wait out (``_cheaper_to_wait``), behind another service or
    # not: a wait by choice either way (it would wait with nobody before it)
    by_choice: set[str] = set()
    # the services, in priority order, whose replicas wait for GPUs this tick without any being freed or bought for
    # them: what a later service frees or buys, the scheduler gives to their pods first where they may use it
    blockers: list[_Blocker] = []
    priority_notes: list[str] = []  # services whose pods run below their policy's priority
    revoked: dict[str, str] = {}  # waited-out services a later one's action would hand the GPUs to (``arbitrate``)
    acting_notes: list[str] = []  # ... and, in the pass that acts for them, why
    pdb_spent: dict[str, int] = {}  # disruptions this tick's victims take from each PodDisruptionBudget
    ordered = sorted(arb.policies.items(), key=lambda kv: (-kv[1].priority, kv[0]))
    runs_at = pod_priorities(snapshot)
    # the replicas this tick's placements counted onto nodes (``_counted_replicas``): a later service whose required
    # pod anti-affinity selects them is kept off their domains, as it will be once they are bound -- else a gang there
    # was stopped for a replica that may not join them
    counted: list[PodInfo] = []
    for key, policy in ordered:
        decision = desired.get(key)
        if decision is None or decision.recommend_only or policy.mode is Mode.RECOMMEND_ONLY:
            continue
        unplaced = max(0, decision.desired_replicas - _bound_replicas(snapshot, policy))
        if unplaced == 0:
            continue
        deployment = deployments.get(key)
        # a replica's GPUs are what its pods request (a policy may leave gpusPerReplica at its default of 1)
        g = replica_gpus(policy.gpus_per_replica, deployment)
        needs = replica_beside_gpus(deployment)
        gpu_type = gpu_types.get(key)
        # only the nodes its pods may be scheduled on are room for them (nodeSelector, taints, and its required pod
        # anti-affinity: not where a pod it keeps away from runs)
        by_node = _barred(snapshot, deployment, by_pods=False)
        with_counted = replace(snapshot, pods=(*snapshot.pods, *counted)) if counted else snapshot
        kept_off = anti_affinity_barred(deployment, with_counted) - by_node if deployment is not None else frozenset()
        barred = by_node | kept_off
        # ... of which those kept off by a term over a domain wider than a node (a zone, not
        # ``kubernetes.io/hostname``): a node bought in their pool comes up in that domain too, as its nodes' labels
        # show (the rule that closes a pool to a nodeSelector its nodes do not meet)
        kept_with_pool = (
            anti_affinity_barred(deployment, with_counted, wide_only=True) - by_node
            if deployment is not None
            else frozenset()
        )
        kept_per_node = kept_off - kept_with_pool  # a node bought in their pool is none of these (``_takes_bought``)
        # this service as a blocker (``_Blocker``): its replicas, why they wait, and whether on a boot or by choice
        as_blocker = functools.partial(
            _Blocker, key, policy.priority, gpu_type=gpu_type, barred=barred, gpus=g, kept_off=kept_per_node
        )
        # a pool whose nodes the service's pods cannot be scheduled on (a taint they do not tolerate, a nodeSelector
        # its nodes do not meet, as its registered nodes show; a zone where a pod its anti-affinity keeps away from
        # runs) would boot nodes that host none of its replicas (every ready one of them: one node tainted by hand,
        # or a booting node's start-up taint, closes nothing; a booting node's zone label is its zone); its requested
        # nodes are no room for them either
        members: dict[str, list[NodeInfo]] = {}
        for n in snapshot.nodes:
            if n.pool is not None and not n.leaving:
                members.setdefault(n.pool, []).append(n)
        # its hard topology spread constraints: each replica placed where the skew allows, then counted
        # (and the replicas earlier services' placements counted onto nodes this tick: a constraint whose selector
        # takes in another Deployment's pods counts them once bound -- else a gang was stopped in a zone they put
        # ahead); a pool whose every node is in a zone the skew refuses now is closed too (review 49b: its new nodes
        # come up there)
        skew = TopologySkew.of(deployment, with_counted)
        closed = sorted(
            name
            for name, pool_nodes in members.items()
            if (
                any(n.ready for n in pool_nodes)
                and all(n.name in by_node or n.name in kept_with_pool for n in pool_nodes if n.ready)
            )
            or all(n.name in kept_with_pool for n in pool_nodes)
            or (skew is not None and all(skew.refuses_domain_of(n.name) for n in pool_nodes))
        )
        # its own pod anti-affinity (one replica per node, or per zone): a node holds one of its new replicas at
        # most, whatever its free GPUs -- the domains taken this tick are kept across the placements below
        per_node = one_replica_per_node(deployment)
        spread = spread_domains(deployment, snapshot.nodes)
        spread_used: set[str] = set()
        # a node whose free GPUs lack the CPU or memory beside them for a replica is no room for it either: its
        # replica stays Pending there, the shortfall is real
        free_before = dict(free)
        unplaced -= _place_usable(
            free, barred, unplaced, g, gpu_type, node_types, beside, needs, spread, spread_used, skew
        )
        counted += _counted_replicas(deployment, g, (free_before, free))
        # Its stretch without GPUs goes on while replicas have none, on booting nodes' room or not (a hold neither
        # starts nor ends it: it says nothing about demand)
        previous_since = state.service_short_since.get(key)
        if unplaced > 0 and (previous_since is not None or decision.reason not in _UNSURE_HOLDS):
            short_since_by_service[key] = min(previous_since if previous_since is not None else now, now)
        boot_room = sum(v for k, v in booting.items() if not k.endswith(RETURNING))
        free_before, booting_before = dict(free), dict(booting)
        on_booting = _place_on_coming(
            free, booting, barred | set(closed), unplaced, g, gpu_type, node_types, beside, needs, returning_beside,
            _spread_booting(spread, booting, per_node), spread_used, skew,
        )  # fmt: skip
        counted += _counted_replicas(deployment, g, (free_before, free), (booting_before, booting))
        if sum(v for k, v in booting.items() if not k.endswith(RETURNING)) < boot_room:
            blockers.append(as_blocker(on_booting, "they wait for a node's boot", on_boot=True))
        short = unplaced - on_booting
        if short <= 0:
            continue
        if decision.reason in _UNSURE_HOLDS:
            # A hold on stale or partial metrics says nothing about demand (a partial answer only forbids a
            # scale-down): no training is stopped and no node bought for it, and nothing is given back while the
            # service waits for room (the next complete tick decides).
            stale_holds.append(
                f"{key}: {short} replica(s) waiting for GPUs, but it holds ({decision.reason.value}): neither "
                "preempt nor burst on a hold, nothing given back"
            )
            blockers.append(as_blocker(short, "holds on incomplete metrics"))
            continue
        capacity = decision.desired_replicas - short
        duration, basis, vouched = _duration(arb, key, policy, capacity, config)
        shortfalls.append(Shortfall(key, policy.priority, short, g, duration, basis, on_booting))
        if basis == "forecast" and duration <= policy.cold_start_s:
            # A replica asked for now serves after its cold start: the forecast says the need is gone by then.
            options.append(
                _wait(
                    key,
                    f"{key}: {short} replica(s) short for ~{duration:.0f}s (forecast), over before a replica "
                    f"started now is ready ({policy.cold_start_s:g}s): neither preempt nor burst",
                )
            )
            blockers.append(as_blocker(short, "its shortfall is waited out"))
            continue
        since = short_since_by_service.get(key, now)
        # What the metric (with the forecast floor) asks for this tick, before the scale-down stabilisation: replicas
        # kept only by the stabilisation after a spike are no demand to stop training or buy nodes for.
        asked = decision.recommended_replicas
        if asked is None:
            asked = decision.desired_replicas
        wait_why: str | None = None
        if not vouched and asked <= capacity:
            # the spike is over: its stretch ends (the next one is confirmed afresh)
            short_since_by_service.pop(key, None)
            wait_why = (
                f"the metric asks for {asked} replica(s) now, which have GPUs: the rest are kept by the scale-down "
                "stabilisation"
            )
        elif not vouched and now - since < config.shortfall_confirm_s:
            # Without a forecast saying the need lasts, one sample is no evidence that it does: stopping a gang
            # loses its work since the last checkpoint, a node is billed for its minimum. Confirmed by the next
            # ticks, it is acted on; gone by then, nothing was lost.
            seen = "first seen now" if since >= now else f"short for {now - since:.0f}s"
            wait_why = (
                f"no usable forecast vouches for it ({seen}): acted on once it has lasted "
                f"{config.shortfall_confirm_s:g}s (shortfall_confirm)"
            )
        hours = duration / 3600.0
        preemptor = preemptor_priority(policy, runs_at)
        if preemptor < policy.priority:
            priority_notes.append(
                f"{key}: its pods run at priority {preemptor}, below its policy's {policy.priority}: only training "
                f"below {preemptor} is preempted (the scheduler would evict the replicas for anything above)"
            )
        lower = _budgets_left([c for c in candidates if c.gang not in taken and c.priority < preemptor], pdb_spent)
        need = GpuNeed(short, g, gpu_type, needs[0], needs[1], spread, skew.copy() if skew is not None else None)
        choice = None
        # victim gang -> the nodes only its own pods keep the replica off (their terms, or the replica's selecting
        # them): stopping it frees those nodes' GPUs for the replica as well, as kube-scheduler's preemption judges a
        # node without its victims
        lifted: dict[str, frozenset[str]] = {}
        if config.preempt:
            spread_full = _spread_taken(spread, spread_used)
            room_for_victims = _only_usable(free, barred | spread_full)
            searched = lower
            if kept_off and deployment is not None:
                lifted = _lifted_by_victims(deployment, with_counted, lower, kept_off - spread_full)
                if lifted:
                    room_for_victims, searched = _with_lifted(free, room_for_victims, lower, lifted)
            choice = choose_victims(need, room_for_victims, searched, node_types, beside=beside)
            if lifted and choice.victims:
                originals = {c.gang: c for c in lower}
                choice = replace(choice, victims=tuple(originals[v.gang] for v in choice.victims))
        preempt_cost = None
        if choice is not None and choice.met and choice.victims:
            victim_gpus = sum(v.gpus for v in choice.victims)
            preempt_cost = (choice.lost_work_gpu_s / 3600.0 + victim_gpus * hours) * config.training_gpu_hour_value
        preemptible_left = sum(
            gpus
            for c in lower
            if c.why_not is None
            for node, gpus in c.gpus_by_node.items()
            if (gpu_type is None or node_types.get(node) == gpu_type)
            and (_usable(node, barred) or node in lifted.get(c.gang, ()))
        )
        current_pools = [replace(p, nodes=p.nodes + added_nodes.get(p.name, 0)) for p in pools]
        # a pool whose requested nodes never registered is not grown again while they are counted, nor during its
        # back-off after (a quota, a stock-out, a broken machine template: more requests would not come either)
        usable_pools = [
            p
            for p in current_pools
            if p.name not in closed
            and p.name not in overdue
            and p.name not in backing_off
            and p.name not in stuck_pools
        ]
        burst = (
            choose_burst(usable_pools, short, g, gpu_type, config.expanders, spend, config.spend_cap_per_hour, per_node)
            if config.burst and usable_pools
            else None
        )
        preempt_met = choice is not None and choice.met and bool(choice.victims)
        capped: int | None = None
        if burst is not None and burst.chosen is None and not preempt_met and short > 1:
            # No pool can take the whole shortfall (its maximum, its provider's) and no training can be stopped
            # for it: the nodes the pools still allow, for as many replicas as they host (as the Cluster
            # Autoscaler caps a scale-up at the group's maximum), rather than none
            found = largest_burst(
                usable_pools, short - 1, g, gpu_type, config.expanders, spend, config.spend_cap_per_hour, per_node
            )
            if found is not None:
                burst, capped = BurstChoice(found[1].chosen, burst.options), found[0]
        burst_cost = None
        burst_why = "no burst pool configured" if not pools else "burst disabled"
        if pools and config.burst and not usable_pools:
            why = []
            if closed:
                why.append(
                    f"its pods do not tolerate (or select; or their anti-affinity or topology spread keeps them off) "
                    "the nodes of "
                    f"{', '.join(closed)}"
                )
            if overdue:
                why.append(f"{', '.join(sorted(overdue))}: requested nodes never registered")
            if stuck_pools - set(overdue):
                why.append(f"{', '.join(sorted(stuck_pools - set(overdue)))}: registered nodes never became ready")
            waiting = sorted(name for name in backing_off if name not in overdue and name not in stuck_pools)
            if waiting:
                why.append(
                    "; ".join(
                        f"{name}: backing off until {backing_off[name] - now:.0f}s from now (its requested nodes never "
                        "registered or never became ready)"
                        for name in waiting
                    )
                )
            burst_why = "; ".join(why)
        if burst is not None:
            burst_seen.extend(burst.options)
            if burst.chosen is None:
                reasons = [o.why_not for o in burst.options if o.why_not]
                burst_why = "; ".join(r for r in reasons if r) or "no pool can host the replicas"
            else:
                pool = burst.chosen.pool
                worth, burst_why = worth_a_node(duration, pool, preemptible_left if config.preempt else 0, short * g)
                if capped is not None:
                    burst_why += f"; capped at the pools' maximum: for {capped} of the {short} replicas"
                if worth:
                    # The node is paid from the request: its boot, the shortfall (at least the minimum billing),
                    # then the idle cooldown before it is given back.
                    paid_s = pool.boot_s + max(duration, pool.min_billing_s) + config.burst_idle_cooldown_s
                    burst_cost = burst.chosen.cost_per_hour * paid_s / 3600.0 + (
                        short * g * pool.boot_s / 3600.0 * config.slo_risk_per_gpu_hour
                    )
        shortage = f"{key}: {short} replica(s) x {g} GPU short for ~{duration:.0f}s ({basis})"
        held_off = _held_off(free, g, gpu_type, node_types, kept_off, by_node, skew)
        if held_off:
            # free GPUs the operator sees on the nodes, which the pods' own placement rules refuse: say so
            shown = ", ".join(held_off[:5]) + (f" and {len(held_off) - 5} more" if len(held_off) > 5 else "")
            shortage += f" (GPUs free on {shown}, where its pod anti-affinity or topology spread keeps it off)"
        pick_preempt = preempt_cost is not None and (burst_cost is None or preempt_cost <= burst_cost)
        pick_burst = not pick_preempt and burst_cost is not None
        # Only a shortfall the forecast vouches for: one it does not (it fits from now + lead on) is the metric's
        # demand, already here, and its "duration" is the lead alone -- costed afresh each tick over that same lead,
        # it would look cheaper to wait for as long as the metric asks.
        cheap: float | None = None  # the most waiting costs, when the wait is that choice
        if wait_why is None and vouched and (pick_preempt or pick_burst) and key not in arb.over_slo:
            cheaper = _cheaper_to_wait(
                short * g, duration, preempt_cost if pick_preempt else burst_cost, pick_preempt, config
            )
            if cheaper is not None and key in acting:
                acting_notes.append(f"{key}: not waited out ({cheaper[0].removesuffix(': waited out')}): {acting[key]}")
            elif cheaper is not None:
                wait_why, cheap = cheaper
        if choice is not None and choice.met and choice.victims:
            names = ", ".join(v.gang for v in choice.victims)
            text = (
                f"{shortage}; stop {names} ({sum(v.gpus for v in choice.victims)} GPUs, "
                f"{choice.lost_work_gpu_s / 3600.0:.2f} GPU-h since checkpoint): cost {preempt_cost:.2f}"
            )
            if not pick_preempt:
                text += f" > burst {burst_cost:.2f}"
        elif choice is not None:
            text = f"{shortage}; no set of preemptible lower-priority gangs frees enough"
            if need.beside_gpus and beside:
                text += f" (GPUs with {_beside_text(needs)} beside them, per replica)"
        else:
            text = f"{shortage}; preemption disabled"
        if burst_cost is not None and burst is not None and burst.chosen is not None:
            chosen = burst.chosen
            btext = (
                f"{shortage}; +{chosen.nodes} node(s) of {chosen.pool.name} ({chosen.cost_per_hour:.2f}/h, boot "
                f"{chosen.pool.boot_s:g}s): cost {burst_cost:.2f}; {burst_why}"
            )
            if not pick_burst:
                btext += f" > preempt {preempt_cost:.2f}"
        else:
            btext = f"{shortage}; burst not possible: {burst_why}"
        # A service whose replicas wait for GPUs this tick without any freed or bought for them is served first by the
        # scheduler, on any GPU its pods may use: what this one would free (its victims' nodes) or buy (a node of the
        # chosen pool) would go to it where its pods could take it (GPU type, GPUs per replica, taints, selectors).
        # So is one whose replicas wait for a node's boot, for GPUs freed before the node is up.
        if pick_preempt and choice is not None:
            freed = {node for v in choice.victims for node in v.gpus_by_node}
            takers = [b for b in blockers if b.service != key and _takes_freed(b, freed, snapshot, pools)]
        elif pick_burst and burst is not None and burst.chosen is not None:
            bought = burst.chosen.pool
            takers = [b for b in blockers if not b.on_boot and _takes_bought(b, bought, snapshot)]
        else:
            takers = []
        blocker = takers[0] if takers else None
        if wait_why is None and takers and all(b.waited_out for b in takers):
            # Only waited-out services stand between this one and its action: their wait is revoked (``arbitrate``)
            for b in takers:
                revoked.setdefault(
                    b.service,
                    f"{key} (priority {policy.priority}) would {'preempt' if pick_preempt else 'burst'} for GPUs its "
                    "Pending replicas take first: waiting saves nothing",
                )
        if blocker is not None and blocker.on_boot:
            wait_why = (
                f"{blocker.service} (priority {blocker.priority}) has {blocker.replicas} replica(s) waiting for a "
                "node's boot: the scheduler would give the GPUs freed now to its pods first"
            )
        elif blocker is not None:
            wait_why = (
                f"{blocker.service} (priority {blocker.priority}) has {blocker.replicas} replica(s) waiting for GPUs "
                f"that get none this tick ({blocker.why}): the scheduler would give the GPUs "
                f"{'freed' if pick_preempt else 'bought'} now to its pods first"
            )
        if wait_why is not None:
            # costed as usual (what would be done), but not done this tick
            then = "preempt" if pick_preempt else "burst" if pick_burst else None
            pick_preempt = pick_burst = False
            waiting_for.add(key)
            if cheap is not None:
                by_choice.add(key)
            chose = cheap is not None and not takers  # waited out by choice, not behind another service
            blockers.append(as_blocker(short, "it waits", waited_out=chose))
            then_text = f" (then: {then})" if then else ""
            priced = cheap if cheap is not None and chose else 0.0
            options.append(
                _wait(key, f"{shortage}; neither preempt nor burst this tick: {wait_why}{then_text}", priced)
            )
        options.append(CapacityOption(key, "preempt", preempt_cost, pick_preempt, text))
        options.append(CapacityOption(key, "burst", burst_cost, pick_burst, btext))
        if pick_preempt and choice is not None:
            for victim in choice.victims:
                taken.add(victim.gang)
                actions.extend(_take_victim(victim, free, pdb_spent, workloads, text, key))
                _return_beside(beside, victim)
            free_before = dict(free)
            # the nodes only the victims kept the replica off are open once they are gone
            opened = barred - {node for v in choice.victims for node in lifted.get(v.gang, ())}
            _place_usable(free, opened, short, g, gpu_type, node_types, beside, needs, spread, spread_used, skew)
            counted += _counted_replicas(deployment, g, (free_before, free))
        elif pick_burst and burst is not None and burst.chosen is not None:
            chosen = burst.chosen
            pool = chosen.pool
            added_nodes[pool.name] = added_nodes.get(pool.name, 0) + chosen.nodes
            spend += chosen.cost_per_hour
            # The requested nodes boot for the next service too: what this one leaves on them is room on its way.
            for k in range(chosen.nodes):
                name = f"{pool.name} (requested {added_nodes[pool.name] - k})"
                booting[name] = pool.gpus_per_node
                node_types[name] = pool.gpu_type
            booting_before = dict(booting)
            _place_usable(
                booting, barred, short, g, gpu_type, node_types,
                spread=_spread_booting(spread, booting, per_node), spread_used=spread_used, rule=skew,
            )  # fmt: skip
            counted += _counted_replicas(deployment, g, (booting_before, booting))
            blockers.append(as_blocker(short, "they wait for a node's boot", on_boot=True))
            # One write per pool and tick: the size the pool had when the tick read it (the writer's precondition)
            # plus every service's nodes, with every service's reason.
            merged = [a for a in actions if isinstance(a, ScaleNodePool) and a.pool == pool.name]
            actions = [a for a in actions if a not in merged]
            before = next((p.nodes for p in pools if p.name == pool.name), pool.nodes)
            detail = "; ".join([*(a.detail for a in merged), btext])
            services = tuple(dict.fromkeys([*(s for a in merged for s in a.services), key]))
            actions.append(
                ScaleNodePool(
                    pool.name,
                    before + added_nodes[pool.name],
                    before,
                    Reason.BURST_SCALE_UP,
                    detail,
                    services=services,
                )
            )

    notes: list[str] = [*_bound_notes(config.pools, pools), *stale_holds, *priority_notes, *acting_notes]
    # A node that never registered costs (a VM that booted and could not join is billed; a request stuck in a
    # quota holds the pool's size) and hosts nothing: its Machine is given back, one per pool and tick (the
    # provider removes a Machine without a Node, never a registered one), never below the pool's minimum.
    given_back: set[str] = set()
    sizes = {p.name: p for p in pools}
    # pools whose last give-back failed recently: none of their nodes is given back before the retry delay is over
    give_back_failed_at = {
        name: min(at, now)  # a wall clock stepped back: at most the delay from now
        for name, at in state.give_back_failed_at.items()
        if now - min(at, now) < config.give_back_retry_s
    }
    for name, at in sorted(give_back_failed_at.items()):
        notes.append(
            f"{name}: a give-back of its nodes failed {now - at:.0f}s ago: none given back before "
            f"{at + config.give_back_retry_s - now:.0f}s from now (give_back_retry)"
        )
    # Nodes being removed (a removal taint, a deletionTimestamp) are read as no longer counted by the provider, and
    # mostly are (our give-back lowers the size with its mark). The Cluster Autoscaler's lowers it only after its
    # drain: until then such a node is one of the "unregistered" ones, and the pool has no Machine without a Node to
    # give back (the give-back would fail every tick for as long as a drain is stuck). So nothing is given back
    # while as many nodes as it counts unregistered are being removed.
    removing: dict[str, int] = {}
    for n in snapshot.nodes:
        if n.pool in sizes and n.leaving and not n.out_of_service:
            removing[n.pool] = removing.get(n.pool, 0) + 1
    for name, count in sorted(overdue.items()):
        since = unregistered_since[name][0]
        failures = provision_failures[name][1]
        stuck = (
            f"{name}: {count} node(s) the provider counts have not registered for {now - since:.0f}s (provision "
            f"timeout; failure {failures} in a row): counted as no capacity, the pool not grown again while they are "
            f"counted nor before {backing_off.get(name, now) - now:.0f}s from now (check the provider: quota, "
            "stock-out, machine template)"
        )
        stuck_pool = sizes.get(name)
        if stuck_pool is None or name in give_back_failed_at:
            notes.append(stuck)
            continue
        if stuck_pool.nodes <= stuck_pool.min_nodes:
            notes.append(
                f"{stuck}; not given back: the pool is at its minimum size {stuck_pool.min_nodes} (a "
                "MachineHealthCheck's nodeStartupTimeout replaces such Machines)"
            )
            continue
        if count <= removing.get(name, 0):
            notes.append(
                f"{stuck}; not given back while {removing[name]} of its nodes are being removed (the provider may "
                "still count them: a Cluster Autoscaler drain lowers the size only once done)"
            )
            continue
        given_back.add(name)
        notes.append(f"{stuck}; one given back")
        # The Machine removed must itself have waited the limit (the timer is the pool's: a MachineHealthCheck's
        # fresh replacement of the stuck one is booting), less however long the pool has been overdue: a health
        # check whose nodeStartupTimeout (10 min by default) is below the limit replaces every Machine before it is
        # old enough, so the wait is bounded at two limits from the request, after which the current one goes.
        limit = _provision_limit(name, config)
        min_age = max(0.0, 2.0 * limit - (now - since))
        actions.append(
            ScaleNodePool(
                name, stuck_pool.nodes - 1, stuck_pool.nodes, Reason.BURST_NODE_NOT_REGISTERED,
                f"{stuck}; giving back one that never registered: {stuck_pool.nodes} -> {stuck_pool.nodes - 1}",
                remove_unregistered=True,
                unregistered_min_age_s=min_age,
            )
        )  # fmt: skip
    # A registered burst node not ready past the provision limit (its device plugin never reported GPUs, its kubelet
    # NotReady) hosts nothing and is billed: given back by name (its Machine), one per pool and tick, shortfall or
    # not, never below the pool's minimum, and only with no GPU pod on it that is not being deleted; its pool is not
    # grown while such a node is counted, then backs off like a pool whose nodes never registered (one that served
    # once, GPU pods bound, neither closes its pool nor counts as a failure).
    for node, (pool_name, age) in sorted(stuck_booting.items(), key=lambda kv: (-kv[1][1], kv[0])):
        stuck = (
            f"{node} ({pool_name}): broken for {age:.0f}s (its kubelet lost, or NotReady long after it registered its "
            "GPUs), past the provision timeout: no capacity (check its kubelet, container runtime, driver)"
            if node in broken
            else f"{node} ({pool_name}): not ready for {age:.0f}s since it registered or last changed (no GPUs "
            "reported, or its kubelet NotReady), past the provision timeout: counted as no capacity, the pool not "
            "grown while it is counted (check its device plugin, driver, kubelet)"
        )
        stuck_pool = sizes.get(pool_name)
        if stuck_pool is None or pool_name in given_back or pool_name in give_back_failed_at:
            notes.append(stuck)
            continue
        if node in holding:
            notes.append(f"{stuck}; not given back, and its pool not closed: GPU pods are bound to it")
            continue
        if node in kept:
            notes.append(f"{stuck}; not given back: annotated not to be removed by an autoscaler")
            continue
        if stuck_pool.nodes <= stuck_pool.min_nodes:
            notes.append(f"{stuck}; not given back: the pool is at its minimum size {stuck_pool.min_nodes}")
            continue
        if pool_name in added_nodes:
            # A broken node, or a stuck one that served, does not close its pool: grown for a shortfall this tick,
            # it is given back at a later one (both writes expect the size read: the second would be refused)
            notes.append(
                f"{stuck}; not given back this tick: its pool is grown this tick (one resize per pool and tick)"
            )
            continue
        given_back.add(pool_name)
        if node in busy:
            stuck = f"{stuck}; the GPU pods bound to it are all being deleted (evicted, re-created elsewhere)"
        notes.append(f"{stuck}; given back")
        actions.append(
            ScaleNodePool(
                pool_name, stuck_pool.nodes - 1, stuck_pool.nodes, Reason.BURST_NODE_NOT_READY,
                f"{stuck}; giving it back: {stuck_pool.nodes} -> {stuck_pool.nodes - 1}", node,
            )
        )  # fmt: skip
    short_since = state.short_since
    free_since = state.free_since
    unneeded = dict(state.burst_unneeded_since)
    resumable = dict(state.resumable_since)
    gathered: list[str] = []  # suspended workloads that gathered GPUs would get resumed (the give-back finds them)
    # A service holding on stale or partial metrics, short or not: its demand is unknown this tick, and capacity is
    # never taken away on an incomplete observation (the actuator's guard knows only stale services)
    # (not a service at 0 replicas -- its Deployment missing, or scaled to zero: it holds no GPUs a give-back takes)
    unsure = sorted(
        d.key
        for d in arb.decisions
        if d.key in arb.policies and d.current_replicas > 0 and d.reason in _UNSURE_HOLDS and not d.recommend_only
    )
    # Only shortfalls waited out as cheaper than acting (a choice, not a constraint; it can last hours, as long as the
    # forecast's quantile stays above capacity): a burst pool their replicas could run on keeps its timer where it
    # stands (as while a shortfall is confirmed: its room is what a grown shortfall would be placed on); a pool none
    # of them can use (another GPU type, too few GPUs a node, barred) is given back as on a tick without a shortfall,
    # and suspended training resumed on what is free -- the waiting replicas were placed first, so what is left is
    # room they cannot use. The cluster's short/free stretches stand: neither is decided.
    # (a service behind another counts when its own shortfall is cheaper to wait out: two waited out together, the
    # later one behind the first, held every give-back)
    waited_out_only = bool(waiting_for) and waiting_for <= by_choice and not stale_holds and not unsure
    if any(s.service not in waiting_for for s in shortfalls):
        short_since = short_since if short_since is not None else now
        free_since = None
        unneeded, resumable = {}, {}
    elif (stale_holds or waiting_for or unsure) and not waited_out_only:
        if unsure and not stale_holds:
            notes.append(f"nothing given back this tick: {', '.join(unsure)} hold(s) on incomplete metrics")
        # neither known to be short nor free (a hold, a shortfall not confirmed yet): nothing given back, the
        # timers stand until a tick decides
        pass
    else:
        held = None
        if waited_out_only:
            waiters = [b for b in blockers if b.service in waiting_for]
            pools_held = {p.name for p in pools if any(_takes_bought(b, p, snapshot) for b in waiters)}
            held = (pools_held, ", ".join(sorted(waiting_for)))
        else:
            short_since = None
            free_since = free_since if free_since is not None else now
        lower = [c for c in candidates if c.gang not in taken]
        actions.extend(
            _give_back(
                arb,
                config,
                pools,
                free,
                node_types,
                unneeded,
                resumable,
                workloads,
                notes,
                lower,
                runs_at,
                given_back,
                set(give_back_failed_at),
                placed={n for n, left in free.items() if left < free_read.get(n, left)},
                gathered=gathered,
                beside=beside,
                held=held,
            )
        )
    report = CapacityReport(
        tuple(shortfalls),
        tuple(options),
        tuple(candidates),
        tuple(burst_seen),
        tuple(notes),
        tuple(pools),
        tuple(gathered),
    )
    return (
        actions,
        report,
        CapacityState(
            short_since,
            free_since,
            unneeded,
            resumable,
            unregistered_since,
            provision_failures,
            short_since_by_service,
            give_back_failed_at,
        ),
        revoked,
    )


def _consolidation(
    arb: ArbitrationInput,
    config: CapacityConfig,
    pool: BurstPool,
    node: str,
    free: Mapping[str, int],
    node_types: Mapping[str, str | None],
    candidates: Sequence[GangCandidate],
    reserve: int,
    runs_at: Mapping[str, int],
    beside: Mapping[str, tuple[int, int]] | None = None,
    spread_moved: Mapping[str, TopologySkew] | None = None,
) -> tuple[tuple[GangCandidate, ...], str, str] | str | None:
    """Whether to empty the busy burst ``node`` onto the cluster's other nodes, stopping lower-priority training to
    make room, because that costs less than keeping the node for ``consolidate_horizon_s``: the victims, the reason
    and the service the stops are for (Events go to it); a string saying why not; None when not considered at all.

    A burst node outlives its shortfall when inference's next scale-ups keep landing on it while the GPUs inference
    gave back on the cluster's own nodes went to queued training: it then stays over half used for hours and the
    half-used rule never gives it back. Keeping it costs its price for every GPU; emptying it costs what the victims
    lose since their checkpoints, their GPUs for the horizon at ``training_gpu_hour_value``, and the SLO risk of a
    cold start for each moved replica. ``spread_moved``: the topology spread as this tick's earlier give-backs left
    it (``leaving_skews``)."""
    horizon_s = config.consolidate_horizon_s
    if horizon_s <= 0 or not config.preempt:
        return None
    pods = _live_gpu_pods(arb.snapshot, node)
    if not pods:
        return None
    policies: list[ServicePolicy] = []
    for pod in pods:
        if pod.do_not_disrupt:  # as the Cluster Autoscaler and Karpenter leave such a node alone
            return f"{node} runs {pod.namespace}/{pod.name}, annotated not to be disrupted: not emptied"
        policy = arb.policies.get(f"{pod.namespace}/{pod.owner_name}") if pod.owner_kind == "Deployment" else None
        if policy is None:
            return f"{node} also runs {pod.namespace}/{pod.name}, not a managed replica: not emptied"
        policies.append(policy)
    # Moved replicas serve again only after a cold start: each service must carry its expected demand (the median
    # forecast over that cold start) on the replicas it keeps elsewhere, or the move waits for a quieter moment.
    for key, policy in {p.key: p for p in policies}.items():
        moving = sum(1 for pod in pods if f"{pod.namespace}/{pod.owner_name}" == key)
        keeps = _bound_replicas(arb.snapshot, policy) - moving
        expected = _needed_replicas(arb, key, policy, arb.now, arb.now + policy.cold_start_s, quantile=EXPECTED_LEVEL)
        if expected is None:
            return f"{key} has no usable forecast to tell whether it can spare {moving} replica(s) for a cold start"
        if keeps < expected:
            return f"{key} would keep {keeps} replica(s) elsewhere, its median forecast needs {expected}: not now"
    priority = min(preemptor_priority(p, runs_at) for p in policies)
    gpus_per_replica = max(p.gpus for p in pods)
    # The GPU type the moved replicas need: the pool's, else the one their pods run on or their Deployments pin
    # (a pool without a type must not make any gang a victim: one of another type frees nothing for them)
    pinned = {f"{d.namespace}/{d.name}": d.gpu_product for d in arb.snapshot.deployments}
    wanted = {pod.gpu_product or pinned.get(f"{pod.namespace}/{pod.owner_name}") for pod in pods}
    gpu_type = pool.gpu_type
    if gpu_type is None and len(wanted - {None}) > 1:
        return f"{node} runs replicas of several GPU types ({', '.join(sorted(t for t in wanted if t))}): not emptied"
    if gpu_type is None and wanted - {None}:
        gpu_type = next(t for t in wanted if t is not None)
    # Each replica is sought as the largest one (a mixed node is over-asked, never under-asked), and the forecast's
    # extra demand over a boot must fit too, as for a spare node.
    # (and with the most CPU and memory any of them requests; the replicas of one service spread by its own pod
    # anti-affinity, one per domain -- those of several services are counted by GPUs alone)
    deployments = {f"{d.namespace}/{d.name}": d for d in arb.snapshot.deployments}
    services = {p.key for p in policies}
    service = next(iter(services)) if len(services) == 1 else None
    spread = spread_domains(deployments.get(service), arb.snapshot.nodes) if service is not None else None
    skew = leaving_skews(arb.snapshot, pods, spread_moved).get(service) if service is not None else None
    need = GpuNeed(
        len(pods) + math.ceil(reserve / gpus_per_replica),
        gpus_per_replica,
        gpu_type,
        max(p.cpu_milli for p in pods),
        max(p.memory_bytes for p in pods),
        spread,
        skew,
    )
    # only the nodes every moved replica may be scheduled on (nodeSelector, taints, pod anti-affinity): training
    # stopped elsewhere frees nothing for them
    barred = frozenset().union(*(_barred(arb.snapshot, deployments.get(p.key)) for p in policies))
    elsewhere = {n: left for n, left in free.items() if n != node and _usable(n, barred)}
    lower = [c for c in candidates if c.priority < priority and node not in c.gpus_by_node]
    # the CPU and memory this tick's placements left (``free``'s companion), else the snapshot's
    room = beside if beside is not None else _free_beside_gpus(arb.snapshot)
    choice = choose_victims(need, elsewhere, lower, node_types, beside=room)
    if not choice.met:
        return "stopping every preemptible lower-priority gang would not make room for its replicas elsewhere"
    hours = horizon_s / 3600.0
    victim_gpus = sum(v.gpus for v in choice.victims)
    used = sum(p.gpus for p in pods)
    cold_start_s = max(p.cold_start_s for p in policies)
    move = (choice.lost_work_gpu_s / 3600.0 + victim_gpus * hours) * config.training_gpu_hour_value + (
        used * cold_start_s / 3600.0 * config.slo_risk_per_gpu_hour
    )
    keep = pool.gpus_per_node * pool.price_per_gpu_hour * hours
    stop = ", ".join(v.gang for v in choice.victims) or "nothing"
    detail = (
        f"{pool.name}: empty {node} ({used} GPU(s) of replicas) onto the cluster's own nodes, stopping {stop} "
        f"({victim_gpus} GPUs, {choice.lost_work_gpu_s / 3600.0:.2f} GPU-h since checkpoint): cost {move:.2f} < "
        f"keeping the node {keep:.2f} over {horizon_s:g}s"
    )
    if move >= keep:
        return f"emptying {node} would cost {move:.2f} >= keeping it {keep:.2f} over {horizon_s:g}s"
    return choice.victims, detail, policies[0].key


def pod_priorities(snapshot: ClusterSnapshot) -> dict[str, int]:
    """The lowest priority a live pod of each Deployment ("namespace/name") runs at."""
    out: dict[str, int] = {}
    for pod in snapshot.pods:
        if pod.owner_kind != "Deployment" or not pod.owner_name or pod.phase in ("Succeeded", "Failed"):
            continue
        key = f"{pod.namespace}/{pod.owner_name}"
        if key not in out or pod.priority < out[key]:
            out[key] = pod.priority
    return out


def preemptor_priority(policy: ServicePolicy, runs_at: Mapping[str, int]) -> int:
    """The priority a service preempts training at: its policy's ``spec.priority``, but never above the priority
    its pods run at. A gang taken for replicas of a lower PriorityClass comes back Pending above them, and the
    scheduler's own preemption then evicts the replicas to place it: a loop."""
    return min(policy.priority, runs_at.get(policy.key, policy.priority))


@dataclass(frozen=True, slots=True)
class _Reserved:
    """Replicas a service will want beyond those this tick gives it, and where one of them may go."""

    service: str
    replicas: int
    gpus: int  # GPUs one of its replicas requests
    gpu_type: str | None  # the GPU type its pods select; None: any
    barred: frozenset[str]  # the nodes its pods cannot be scheduled on
    # its own pod anti-affinity (``core.cluster.spread_domains``): one of its replicas per domain; None: not spread
    spread: Spread | None = field(default=None, compare=False)


def _reserved(arb: ArbitrationInput, window_s: float) -> list[_Reserved]:
    """Per service, the replicas it will want beyond its desired count over the next ``window_s``: its usable
    forecast's peak, or what its metric asks for now when a scale-up rate limit (or the up-stabilisation) holds part
    of it back for the next ticks (never above maxReplicas), whichever is more; higher priority first."""
    decisions = {d.key: d for d in arb.decisions}
    deployments = {f"{d.namespace}/{d.name}": d for d in arb.snapshot.deployments}
    out = []
    for key, policy in sorted(arb.policies.items(), key=lambda kv: (-kv[1].priority, kv[0])):
        decision = decisions.get(key)
        desired = decision.desired_replicas if decision is not None else 0
        forecast = _needed_replicas(arb, key, policy, arb.now, arb.now + window_s) or 0
        asked = 0
        if decision is not None and decision.recommended_replicas is not None:
            asked = min(decision.recommended_replicas, policy.max_replicas)
        extra = max(forecast, asked) - desired
        if extra > 0:
            deployment = deployments.get(key)
            gpus = replica_gpus(policy.gpus_per_replica, deployment)
            out.append(
                _Reserved(
                    key,
                    extra,
                    gpus,
                    deployment.gpu_product if deployment else None,
                    _barred(arb.snapshot, deployment),
                    spread_domains(deployment, arb.snapshot.nodes),
                )
            )
    return out


def _enough_once_gathered(
    usable: Mapping[str, int],
    free: Mapping[str, int],
    workload: WorkloadInfo,
    reserved: Sequence[_Reserved],
    node_types: Mapping[str, str | None],
) -> bool:
    """Whether a suspended workload that does not fit would be resumed were its GPUs gathered: its GPUs taken from
    the free ones -- first on the nodes it may use, then elsewhere (where the pods moved off its nodes would go) --
    leave room for every reserved replica, whole, on a node of its type. Only then can moving pods (the rebalancer)
    get it resumed; which moves, and whether any exist, is the rebalancer's question."""
    left = dict(free)
    need = workload.gpus
    for node in sorted(left, key=lambda n: (n not in usable, -left[n], n)):
        take = min(max(left[node], 0), need)
        left[node] -= take
        need -= take
        if need <= 0:
            break
    return need <= 0 and _reserve_fits(left, reserved, node_types)


def _reserve_gpus(reserved: Sequence[_Reserved]) -> int:
    return sum(r.replicas * r.gpus for r in reserved)


def _reserve_fits(free: Mapping[str, int], reserved: Sequence[_Reserved], node_types: Mapping[str, str | None]) -> bool:
    """Whether every reserved replica fits whole on one node of its GPU type that its pods may use (one per domain of
    its own anti-affinity's spread): a sum of free GPUs scattered in pieces no replica fits in would let a give-back
    go that the reserved replicas then undo."""
    left = dict(free)
    return all(
        _place_usable(left, r.barred, r.replicas, r.gpus, r.gpu_type, node_types, spread=r.spread) == r.replicas
        for r in reserved
    )


def _node_given_back(free: dict[str, int], node: str, after: Mapping[str, int]) -> set[str]:
    """``free`` once ``node`` is gone and its pods run on the GPUs ``after`` leaves free: the next pool's give-back
    must not count the same room (two half-empty pools would otherwise each be given back onto the other). Returns
    the nodes its pods were counted onto."""
    free.pop(node, None)
    received = {n for n, left in after.items() if left < free.get(n, left)}
    free.update(after)
    return received


def _keep_off_moved(
    barred: dict[str, frozenset[str]], snapshot: ClusterSnapshot, moved: Sequence[PodInfo], landing: Set[str]
) -> None:
    """``barred`` (Deployment -> nodes its pods may not use) once the pods ``moved`` off a node given back run on
    ``landing`` (the nodes they were counted onto, which pod where not told: each on every one of them -- more nodes
    kept off, never fewer): a replica spread one per node may not join a sibling moved this tick either."""
    if not moved or not landing:
        return
    there = replace(snapshot, pods=tuple(replace(p, node=node) for p in moved for node in sorted(landing)))
    for deployment in snapshot.deployments:  # its own terms, or theirs selecting it (the symmetric check)
        kept = anti_affinity_barred(deployment, there)
        if kept:
            key = f"{deployment.namespace}/{deployment.name}"
            barred[key] = barred.get(key, frozenset()) | kept


# the note of a pool none of whose nodes may be given back (``NodeInfo.do_not_disrupt``)
_ALL_KEPT = "its nodes are annotated not to be removed by an autoscaler: not given back"


def _give_back(
    arb: ArbitrationInput,
    config: CapacityConfig,
    pools: Sequence[BurstPool],
    free: dict[str, int],
    node_types: Mapping[str, str | None],
    unneeded: dict[str, float],
    resumable: dict[str, float],
    workloads: Mapping[str, WorkloadInfo],
    notes: list[str],
    candidates: Sequence[GangCandidate],
    runs_at: Mapping[str, int],
    resized: Set[str] = frozenset(),
    retry_wait: Set[str] = frozenset(),
    placed: Set[str] = frozenset(),
    gathered: list[str] | None = None,
    beside: Mapping[str, tuple[int, int]] | None = None,
    held: tuple[Set[str], str] | None = None,
) -> list[Action]:
    """Burst nodes first, then the training this controller suspended. ``runs_at``: the snapshot's
    ``pod_priorities``, computed once per tick by the caller. ``resized``: pools already resized this tick (a node
    that never registered given back): still burst pools with nodes left, but none of their nodes is given back this
    tick (one resize per pool and tick). ``retry_wait``:
    pools whose last give-back failed within ``give_back_retry_s``: their spare timers are kept as usual (set, reset
    when a node is busy again), only the give-back itself waits. ``placed``: nodes this tick's Pending replicas were
    counted onto (their room is theirs: given back, the replicas would have none, and the next tick buy it again).
    ``held``: while shortfalls are waited out, the pools their replicas could run on and the services waiting: those
    pools' timers stand where they are (none of their nodes given back)."""
    now = arb.now
    actions: list[Action] = []
    # the CPU and memory beside the free GPUs, taken as ``free`` is by the pods of a node given back
    beside = dict(beside) if beside is not None else None
    node_pool = {n.name: n.pool for n in arb.snapshot.nodes}
    node_labels = {n.name: n.labels for n in arb.snapshot.nodes}
    nodes_by_name = {n.name: n for n in arb.snapshot.nodes}
    kept = {n.name for n in arb.snapshot.nodes if n.do_not_disrupt}  # scale-down disabled on them: never given back
    gpu_types = {f"{d.namespace}/{d.name}": d.gpu_product for d in arb.snapshot.deployments}
    # the nodes each Deployment's pods cannot be scheduled on: no room for the pods of a node given back
    barred = {f"{d.namespace}/{d.name}": _barred(arb.snapshot, d) for d in arb.snapshot.deployments}
    burst_names = {pool.name for pool in pools}
    burst_left = False
    # Nodes the pods of a node given back earlier in this tick were counted onto: their own pods are no longer all
    # that runs there, so they are not given back before the next tick reads them (their room was counted twice).
    received: set[str] = set()
    # Disruptions this tick's consolidations took from each PodDisruptionBudget, as the preemption path counts them
    # between services: two pools' victims under one budget must stay within it together.
    pdb_spent: dict[str, int] = {}
    # The topology spread of the Deployments whose pods a node given back earlier in this tick moved: counted off that
    # node and onto the nodes they were placed on (``leaving_skews``), so that a second node's replicas are judged
    # on what the first left -- each alone, two give-backs emptied the zone the others were held to.
    spread_moved: dict[str, TopologySkew] = {}
    # per pool, its kept nodes the provider still counts (not those being removed: a removal taint, a deletion)
    kept_in: dict[str | None, int] = {}
    for n in arb.snapshot.nodes:
        if n.name in kept and not (n.leaving and not n.out_of_service):
            kept_in[n.pool] = kept_in.get(n.pool, 0) + 1
    for pool in pools:
        if pool.nodes <= pool.min_nodes:
            unneeded.pop(pool.name, None)
            continue
        if pool.nodes <= kept_in.get(pool.name, 0):
            # every node it has is kept: none can be given back, so none is waited for (a resume included)
            unneeded.pop(pool.name, None)
            notes.append(f"{pool.name}: {_ALL_KEPT}")
            continue
        if pool.name in resized:
            burst_left = True
            continue
        if held is not None and pool.name in held[0]:
            # kept for the waiting replicas, not waiting to be given back: no reason for training to wait (those
            # replicas were placed first, so the GPUs left free are room they cannot use)
            notes.append(f"{pool.name}: its nodes could host {held[1]}, whose shortfall is waited out: not given back")
            continue
        burst_left = True
        # Spare: the pool's emptiest node's pods fit on the other free GPUs and the replicas coming over a boot
        # (the forecast's, those a rate limit holds back) still fit without that node, each whole on one node.
        pool_free = {
            n: left
            for n, left in free.items()
            if node_pool.get(n) == pool.name and n not in received and n not in placed
        }
        mine = {n: left for n, left in pool_free.items() if n not in kept}
        # (a node that took moved pods first: its pool's timer stands for the next tick, a kept node beside it or not)
        if not mine and any(node_pool.get(n) == pool.name for n in received):
            notes.append(f"{pool.name}: its nodes take pods moved off a node given back this tick: not before the next")
            continue
        if not mine and any(node_pool.get(n) == pool.name for n in placed):
            unneeded.pop(pool.name, None)
            notes.append(f"{pool.name}: its nodes take this tick's Pending replicas: not given back")
            continue
        if pool_free and not mine:
            unneeded.pop(pool.name, None)
            notes.append(f"{pool.name}: {_ALL_KEPT}")
            continue
        spare_here = max(mine.values(), default=0)
        others = sum(free.values()) - spare_here
        used_on_node = pool.gpus_per_node - spare_here
        reserved = _reserved(arb, pool.boot_s + arb.tick_s)
        reserve = _reserve_gpus(reserved)
        emptiest = min(mine, key=lambda n: (-mine[n], n)) if mine else ""
        # Its pods must fit, each on one node of the GPU type it runs on, with the forecast's reserve left free:
        # a sum of free GPUs over every other node (any type, however scattered) would give back a node whose
        # replicas then wait, and the next short tick would buy it again.
        beside_after: dict[str, tuple[int, int]] = {}
        pods_here = _live_gpu_pods(arb.snapshot, emptiest) if mine else []
        skews_after = leaving_skews(arb.snapshot, pods_here, spread_moved)  # as the placements below leave them
        after = fits_typed(
            {n: left for n, left in free.items() if n != emptiest}, pods_here,
            node_types, gpu_types, barred, beside, beside_after, skews_after,
        ) if mine else None  # fmt: skip
        guarded = next(
            (
                p
                for p in arb.snapshot.pods
                if p.node == emptiest and p.do_not_disrupt and p.phase not in ("Succeeded", "Failed")
            ),
            None,
        )
        if guarded is not None and mine:
            # as the Cluster Autoscaler and Karpenter leave such a node alone
            notes.append(
                f"{pool.name}: {emptiest} runs {guarded.namespace}/{guarded.name}, annotated not to be disrupted: "
                "not given back"
            )
            unneeded.pop(pool.name, None)
            continue
        if (
            used_on_node < config.burst_unneeded_utilisation * pool.gpus_per_node
            and after is not None
            and _reserve_fits(after, reserved, node_types)
        ):
            since = unneeded.setdefault(pool.name, now)
            if now - since < config.burst_idle_cooldown_s:
                notes.append(f"{pool.name}: a node spare for {now - since:.0f}s of {config.burst_idle_cooldown_s:g}s")
            elif pool.name in retry_wait:
                notes.append(f"{pool.name}: a node spare for {now - since:.0f}s; its give-back waits (retry delay)")
            else:
                detail = (
                    f"{pool.name}: a node spare for {now - since:.0f}s (>= {config.burst_idle_cooldown_s:g}s), "
                    f"{used_on_node} GPU(s) in use fit in {others} free elsewhere, {reserve} reserved for coming "
                    "replicas"
                )
                actions.append(
                    ScaleNodePool(pool.name, pool.nodes - 1, pool.nodes, Reason.BURST_SCALE_DOWN, detail, emptiest)
                )
                unneeded.pop(pool.name, None)
                landing = _node_given_back(free, emptiest, after)
                received |= landing
                _keep_off_moved(barred, arb.snapshot, pods_here, landing)
                spread_moved.update(skews_after)
                if beside is not None:
                    beside = beside_after
            continue
        busy = (
            f"{pool.name}: no node spare ({used_on_node} of {pool.gpus_per_node} GPUs in use, {others} free "
            f"elsewhere, {reserve} reserved for coming replicas)"
        )
        plan = None
        if mine:
            within = _budgets_left(candidates, pdb_spent)
            plan = _consolidation(
                arb, config, pool, emptiest, free, node_types, within, reserve, runs_at, beside, spread_moved
            )
        if plan is None or isinstance(plan, str):
            unneeded.pop(pool.name, None)
            notes.append(busy if plan is None else f"{busy}; {plan}")
            continue
        victims, detail, service = plan
        since = unneeded.setdefault(pool.name, now)
        if now - since < config.burst_idle_cooldown_s:
            notes.append(f"{detail}: for {now - since:.0f}s of {config.burst_idle_cooldown_s:g}s")
            continue
        if pool.name in retry_wait:
            notes.append(f"{detail}: for {now - since:.0f}s; its give-back waits for the retry delay")
            continue
        # the moved replicas must fit once the victims' GPUs are back, each whole on a node of its type: else the
        # stops would be for nothing and the replicas left without GPUs
        trial = {n: left for n, left in free.items() if n != emptiest}
        trial_beside = dict(beside) if beside is not None else None
        for victim in victims:
            _return_gpus(trial, victim)
            if trial_beside is not None:
                _return_beside(trial_beside, victim)
        if (
            fits_typed(
                trial,
                pods_here,
                node_types,
                gpu_types,
                barred,
                trial_beside,
                None,
                leaving_skews(arb.snapshot, pods_here, spread_moved),
            )
            is None
        ):
            unneeded.pop(pool.name, None)
            notes.append(f"{busy}; {detail}: its replicas would not fit once the stops are made: not emptied")
            continue
        detail = f"{detail}, for {now - since:.0f}s"
        stopped = {v.gang for v in victims}
        candidates = [c for c in candidates if c.gang not in stopped]
        stops = [a for victim in victims for a in _take_victim(victim, free, pdb_spent, workloads, detail, service)]
        actions.extend(stops)
        actions.append(
            ScaleNodePool(
                pool.name, pool.nodes - 1, pool.nodes, Reason.BURST_SCALE_DOWN, detail, emptiest, needs=tuple(stops)
            )
        )
        unneeded.pop(pool.name, None)
        skews_after = leaving_skews(arb.snapshot, pods_here, spread_moved)
        moved = fits_typed(
            {n: left for n, left in free.items() if n != emptiest}, pods_here,
            node_types, gpu_types, barred, trial_beside, beside_after, skews_after,
        )  # fmt: skip
        landing = _node_given_back(free, emptiest, moved or {})
        received |= landing
        _keep_off_moved(barred, arb.snapshot, pods_here, landing)
        spread_moved.update(skews_after)
        if beside is not None and moved is not None:
            beside = beside_after
    suspended = sorted(
        (w for w in workloads.values() if w.suspended and w.suspended_by_us_at is not None),
        key=lambda w: (-w.priority, w.suspended_by_us_at, w.namespace, w.name),
    )
    if burst_left:
        resumable.clear()
        if suspended:
            notes.append(f"{len(suspended)} suspended workload(s) wait: burst nodes are given back first")
        return actions
    waiting = {f"{w.kind}/{w.namespace}/{w.name}" for w in suspended}
    for key in [k for k in resumable if k not in waiting]:
        del resumable[key]
    # the workloads resumed this tick: (a stand-in for their pods, the nodes they were counted onto)
    resumed_here: list[tuple[PodInfo, list[NodeInfo]]] = []
    for workload in suspended:
        key = f"{workload.kind}/{workload.namespace}/{workload.name}"
        if not workload.pod_gpus or max(workload.pod_gpus) <= 0:
            # Sizes unknown (the reader could not read its pod templates): "fits" would be true of any cluster.
            resumable.pop(key, None)
            notes.append(f"{workload.kind} {workload.namespace}/{workload.name}: its pods' GPUs unknown: not resumed")
            continue
        runtime = workload.min_runtime_s if workload.min_runtime_s is not None else config.training.min_runtime_s
        runtime = max(runtime, config.resume_horizon_s)
        reserved = _reserved(arb, runtime)
        reserve = _reserve_gpus(reserved)
        # Training goes back on the cluster's own nodes: the burst pools are for inference (tainted so), and on those
        # its template's nodeSelector allows (resumed onto free GPUs elsewhere, its pods would only wait Pending).
        # Nor where its pods' own required anti-affinity, or a running pod's, keeps them off; a gang whose pods'
        # terms select each other is placed one per domain (resumed onto one node's free GPUs, all but one of its
        # pods would wait Pending, and the gang with them).
        # (and the workloads resumed before it this tick count: their pods are not bound yet)
        stand_in = workload_pod(workload)
        kept_off = pod_anti_affinity_barred(stand_in, arb.snapshot) | kept_off_by_landing(
            stand_in, resumed_here, arb.snapshot.nodes
        )
        usable = {
            n: left
            for n, left in free.items()
            if workload.gpu_product in (None, node_types.get(n))
            and node_pool.get(n) not in burst_names
            and labels_select(node_labels.get(n, {}), workload.node_selector, n)
            and n not in kept_off
        }
        apart = KeptApart(stand_in, nodes_by_name)
        # ... and where the CPU and memory its pods request are free beside the GPUs (where the nodes say)
        resumed_beside = dict(beside) if beside is not None else None
        after = _fits(usable, workload.pod_gpus, resumed_beside, workload.pod_beside, apart if apart.binds else None)
        if after is None or not _reserve_fits({**free, **after}, reserved, node_types):
            if (
                after is None
                and gathered is not None
                and _enough_once_gathered(usable, free, workload, reserved, node_types)
            ):
                gathered.append(key)
            resumable.pop(key, None)
            notes.append(
                f"{workload.kind} {workload.namespace}/{workload.name}: {workload.gpus} GPU(s) do not fit in the free "
                f"GPUs{_with_beside(workload.pod_beside)} with {reserve} reserved for coming replicas over its "
                f"{runtime:g}s minimum runtime (the forecast's, those a scale-up rate limit holds back)"
            )
            continue
        since = resumable.setdefault(key, now)
        if now - since < config.resume_after_s:
            notes.append(
                f"{workload.kind} {workload.namespace}/{workload.name}: its GPUs free for {now - since:.0f}s of "
                f"{config.resume_after_s:g}s before resuming"
            )
            continue
        resumed_here.append(
            (stand_in, [nodes_by_name[n] for n, left in after.items() if left < free[n] and n in nodes_by_name])
        )
        for node, left in after.items():
            free[node] = left
        beside = resumed_beside
        resumable.pop(key, None)
        detail = (
            f"{workload.gpus} GPU(s) free for {now - since:.0f}s, forecast keeps them free for {runtime:g}s "
            f"({reserve} GPU(s) reserved for inference)"
        )
        actions.append(ResumeWorkload(workload.kind, workload.namespace, workload.name, Reason.RESUME_TRAINING, detail))
    return actions
