"""Which training to stop so that inference gets the GPUs it needs: a pure victim search over whole gangs.

Kueue's shape: a pure search first, then an idempotent apply somebody else does. The rules (issue 12):

- only whole gangs are victims (one evicted worker of an 8-GPU job throws away the whole job's work since its last
  checkpoint, so taking one pod of a gang is never cheaper than taking the gang);
- never a non-preemptible gang, never one inside its minimum runtime, never one whose eviction would take a
  PodDisruptionBudget below its minimum (``disruptions_allowed``);
- never a serving replica: a pod whose controller is a Deployment (or its ReplicaSet), a StatefulSet, a DaemonSet or
  a ReplicationController (``SERVING_OWNER_KINDS``) is scaled by its own policy, not preempted as training -- whether
  or not a valid policy names it this tick (a GPUScalingPolicy with a typo, or none at all, must not turn an
  inference service into victims). The replicas of a policy's Deployment (``TrainingRules.protected``) are not even
  candidates; any other serving pod is a candidate only to say why not, unless every pod of its gang opts in with
  ``gpuautoscaler.dev/preemptible: "true"`` (e.g. a low-priority batch Deployment its owner wants stopped for
  inference). Bare pods and the pods of Jobs, JobSets, Kubeflow jobs and the like remain training: a pod that is in
  no gang is a gang of its own, ``pod/<namespace>/<name>``;
- the cheapest set that meets the need: the cost of a set is compared priority tier by priority tier from the highest
  down (taking from a higher priority is worse than any amount taken from a lower one), and within a tier by the work
  it throws away (GPUs x seconds since the last checkpoint, else since the start), then by the number of gangs, then
  the newest first (the least sunk time);
- the set is minimal: no victim can be dropped with the need still met.

The search is exact (branch and bound from the greedy answer) up to ``max_search_nodes`` explored; beyond that it
returns the best set found, which is still minimal and meets the need, and says it is not proven optimal.

The need is per replica: ``replicas`` replicas of ``gpus_per_replica`` GPUs each, every replica on one node, on nodes
of ``gpu_type`` (None: any). A need is met when the free GPUs after the victims leave, node by node, room for all the
replicas (sum over nodes of floor(free / gpus_per_replica)). A replica that also requests CPU or memory
(``GpuNeed.cpu_milli``, ``memory_bytes``) fits a node only with that much of each free there too (``Beside``: what the
node's allocatable leaves after every pod bound to it, the victims' own requests given back): GPUs freed on a node
whose CPU or memory is taken by pods that stay host nothing, and stopping a gang for them would lose its work for a
replica that stays Pending. A node whose CPU and memory are not known is room by its GPUs alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from autoscaler.core.cluster import (
    SERVING_OWNER_KINDS,
    STATIC_POD_OWNER_KIND,
    SUSPENDABLE_KINDS,
    ClusterSnapshot,
    PodInfo,
    Spread,
    add_beside,
    checkpoint_times,
    free_gpus_per_node,
    requests_by_node,
    spread_of,
)
from autoscaler.core.topology_spread import TopologySkew


@dataclass(frozen=True, slots=True)
class GpuNeed:
    replicas: int
    gpus_per_replica: int = 1
    gpu_type: str | None = None  # NodeInfo.gpu_product; None = any GPU node
    cpu_milli: int = 0  # CPU one replica requests, millicores (0: none, or not known)
    memory_bytes: int = 0  # memory one replica requests, bytes (0: none, or not known)
    # its Deployment's own pod anti-affinity (``core.cluster.spread_domains``): at most one replica per domain; None:
    # as many per node as the GPUs hold
    spread: Spread | None = field(default=None, compare=False)
    # its Deployment's hard topology spread constraints, as this tick's placements left them: the replicas go one
    # after the other where the skew allows (``core.topology_spread``); None: none
    skew: TopologySkew | None = field(default=None, compare=False)

    @property
    def beside_gpus(self) -> bool:
        """Whether a node's CPU or memory can keep a replica off it."""
        return self.cpu_milli > 0 or self.memory_bytes > 0


# (CPU millicores, memory bytes) free on a node beside its GPUs: its allocatable less the requests of the pods bound
# there (``core.cluster.free_beside_gpus``); a node without an entry is not known and is room by its GPUs alone
Beside = Mapping[str, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class GangCandidate:
    """One training gang as the victim search sees it."""

    gang: str  # "<source>/<namespace>/<name>", or "pod/<namespace>/<name>" for a pod on its own
    priority: int
    gpus_by_node: Mapping[str, int]  # node -> GPUs the gang's pods hold there
    pods: tuple[tuple[str, str], ...]  # (namespace, name) of its pods
    started_at: float  # Unix seconds
    lost_work_gpu_s: float  # GPUs x seconds since the last checkpoint (else since the start), lost if stopped
    preemptible: bool = True
    why_not: str | None = None  # why it may not be taken (non-preemptible, PDB, minimum runtime), None = eligible
    # (PodDisruptionBudget "namespace/name", pods of this gang it covers, its disruptions allowed): the victims
    # together must stay within every budget, not only each gang on its own
    pdb_use: tuple[tuple[str, int, int], ...] = ()
    # uid of each pod of ``pods`` as read (None: unknown): an eviction names the pod read, not a successor
    pod_uids: tuple[str | None, ...] = ()
    # node -> (CPU millicores, memory bytes) the gang's pods request there: given back with its GPUs when it stops
    beside_by_node: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_node.values())


@dataclass(frozen=True, slots=True)
class VictimChoice:
    victims: tuple[GangCandidate, ...]
    met: bool  # False: even every eligible gang would not free enough; ``victims`` is then empty
    exact: bool  # the search completed: no cheaper eligible set meets the need
    ineligible: tuple[GangCandidate, ...] = ()  # with their ``why_not``, for ``autoscaler plan``
    explored: int = 0

    @property
    def lost_work_gpu_s(self) -> float:
        return sum(v.lost_work_gpu_s for v in self.victims)


@dataclass(frozen=True, slots=True)
class TrainingRules:
    """What may be preempted. Units: priorities are PriorityClass values, times are seconds.

    ``non_preemptible_label``: "false" on any pod of a gang protects it; "true" on every pod of a gang of serving
    replicas (``SERVING_OWNER_KINDS``) opts it in to preemption (the other rules still apply). ``protected``: the
    Deployments a valid policy scales this tick; their replicas are never candidates, opted in or not."""

    preemptible_below_priority: int = 1000  # gangs with a lower priority are preemptible
    # "false" protects a gang; "true" on every pod lets a gang of serving replicas be preempted
    non_preemptible_label: str = "gpuautoscaler.dev/preemptible"
    min_runtime_s: float = 600.0  # a gang younger than this is never stopped (no preempt/resume loop)
    protected: frozenset[str] = field(default_factory=frozenset)  # namespace/name of managed inference Deployments


def is_serving_pod(pod: PodInfo) -> bool:
    """Whether the pod is a replica of a serving controller (Deployment, StatefulSet, ...), not training."""
    return pod.owner_kind in SERVING_OWNER_KINDS


def free_gpus_by_node(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Allocatable minus requested GPUs of the pods bound there, for ready GPU nodes."""
    free = free_gpus_per_node(snapshot)
    return {n.name: free[n.name] for n in snapshot.nodes if n.ready}


def _gang_id(pod: PodInfo) -> str:
    return pod.gang or f"pod/{pod.namespace}/{pod.name}"


def gangs_from_snapshot(snapshot: ClusterSnapshot, now: float, rules: TrainingRules) -> list[GangCandidate]:
    """Training gangs of the snapshot (pods with GPUs bound to a node, not owned by a managed inference Deployment),
    each with its cost and, when it may not be taken, why. A gang with a serving replica (``SERVING_OWNER_KINDS``)
    is never eligible unless every one of its pods is labelled ``non_preemptible_label`` = "true"."""
    members: dict[str, list[PodInfo]] = defaultdict(list)
    for pod in snapshot.pods:
        if not pod.node or pod.gpus <= 0 or pod.phase in ("Succeeded", "Failed"):
            continue
        if pod.owner_kind == "Deployment" and f"{pod.namespace}/{pod.owner_name}" in rules.protected:
            continue
        members[_gang_id(pod)].append(pod)
    # a workload's own minimum runtime (its annotation) outranks the rules' default, as it does for resuming
    own_runtime = {w.gang: w.min_runtime_s for w in snapshot.workloads if w.min_runtime_s is not None}
    suspended = suspended_gangs(snapshot)
    # Stopped through their spec (``core.arbitrate``: the controller deletes the pods), not by the Eviction API: none
    # of its refusals applies, though their budgets are still kept
    by_spec = frozenset(w.gang for w in snapshot.workloads if w.kind in SUSPENDABLE_KINDS and not w.suspended)
    out = []
    for gang, pods in sorted(members.items()):
        min_runtime_s = own_runtime.get(gang, rules.min_runtime_s)
        by_node: dict[str, int] = defaultdict(int)
        for pod in pods:
            by_node[pod.node or ""] += pod.gpus
        # The gang runs from when its last pod became ready (a gang that queued for hours and started a minute ago
        # has a minute of work to lose and is inside its minimum runtime); before that, from its last pod's bind: a
        # gang whose pods waited hours for room and were bound a minute ago (one still pulling its image) has not
        # run yet. From its pods' creation only when no bind time is known.
        ready_times = [p.ready_at for p in pods if p.ready_at is not None]
        bind_times = [p.scheduled_at for p in pods if p.scheduled_at is not None]
        if ready_times and len(ready_times) == len(pods):
            started = max(ready_times)
        elif bind_times:
            started = min(max(bind_times), now)
        else:
            started = min((p.created_at for p in pods if p.created_at is not None), default=now)
        checkpoints = checkpoint_times(pods, now)
        # work since the last checkpoint, but only this run's: a checkpoint older than the (re)start was resumed from
        since = min(max(max(checkpoints), started), now) if checkpoints else started
        gpus = sum(by_node.values())
        # A gang is as important as its most important pod: stopping it stops that pod too
        priority = max(p.priority for p in pods)
        why_not = None
        protected_label = any(p.labels.get(rules.non_preemptible_label) == "false" for p in pods)
        serving = _serving_owner(pods, rules)
        preemptible = priority < rules.preemptible_below_priority and not protected_label and serving is None
        if serving is not None:
            why_not = (
                f"serving replicas of {serving}: scaled by their own policy, never preempted as training "
                f'(label every pod {rules.non_preemptible_label}="true" to opt in)'
            )
        elif not preemptible:
            why_not = (
                f"labelled {rules.non_preemptible_label}=false"
                if protected_label
                else f"priority {priority} >= {rules.preemptible_below_priority}"
            )
        elif any(p.owner_kind == STATIC_POD_OWNER_KIND for p in pods):
            # A static pod: its kubelet runs it from a file, and an eviction deletes only its mirror object -- no GPU
            # is freed, and the next tick would evict it again.
            why_not = "a static pod (its kubelet runs it; an eviction frees nothing)"
        elif any(p.do_not_disrupt for p in pods) and not all(
            p.labels.get(rules.non_preemptible_label) == "true" for p in pods
        ):
            # A pod annotated against voluntary disruption (cluster-autoscaler.kubernetes.io/safe-to-evict: "false",
            # karpenter.sh/do-not-disrupt: "true") -- commonly a long training run -- is not stopped by this
            # autoscaler either, unless its team opted in to this controller's preemption by label.
            why_not = (
                "a pod is annotated do-not-disrupt (safe-to-evict=false or karpenter.sh/do-not-disrupt); label every "
                f'pod {rules.non_preemptible_label}="true" to allow its preemption'
            )
        elif any(p.terminating for p in pods):
            # stopping already (an eviction or suspension of an earlier tick, or its own end): its GPUs are on
            # their way back (``core.arbitrate`` counts them so), and taking it again stops nothing
            why_not = "already stopping: its pods are terminating"
        elif gang in suspended:
            # suspended through its spec (by an earlier tick, or anyone), its controller not yet done deleting the
            # pods: its GPUs are on their way back (``core.arbitrate`` counts them so); taking it again stops nothing
            why_not = "already stopping: its workload is suspended"
        elif now - started < min_runtime_s:
            why_not = f"running {now - started:.0f}s < minimum runtime {min_runtime_s:g}s"
        else:
            why_not = _pdb_blocks(snapshot, pods, evicted=gang not in by_spec)
        pdb_use = pdbs_covering(snapshot, pods)
        out.append(
            GangCandidate(
                gang=gang,
                priority=priority,
                gpus_by_node=dict(by_node),
                pods=tuple((p.namespace, p.name) for p in pods),
                started_at=started,
                lost_work_gpu_s=gpus * max(0.0, now - since),
                preemptible=preemptible,
                why_not=why_not,
                pdb_use=pdb_use,
                pod_uids=tuple(p.uid for p in pods),
                beside_by_node=requests_by_node(pods),
            )
        )
    return out


def suspended_gangs(snapshot: ClusterSnapshot) -> frozenset[str]:
    """Gangs whose workload is suspended (Kueue: deactivated) through its spec: pods of theirs still running are
    being deleted by their controller."""
    return frozenset(w.gang for w in snapshot.workloads if w.suspended)


def _serving_owner(pods: Sequence[PodInfo], rules: TrainingRules) -> str | None:
    """``<Kind> <namespace>/<name>`` of the first serving replica among ``pods`` when the gang has not opted in to
    preemption (every pod labelled ``non_preemptible_label`` = "true"); None when it has or has no serving replica."""
    serving = [p for p in pods if is_serving_pod(p)]
    if not serving or all(p.labels.get(rules.non_preemptible_label) == "true" for p in pods):
        return None
    first = serving[0]
    return f"{first.owner_kind} {first.namespace}/{first.owner_name or first.name}"


def pdbs_covering(snapshot: ClusterSnapshot, pods: Sequence[PodInfo]) -> tuple[tuple[str, int, int], ...]:
    """(budget "namespace/name", pods of ``pods`` it covers, its disruptions allowed) for every budget covering any."""
    out = []
    for pdb in snapshot.pdbs:
        if not pdb.selector:
            continue
        covered = sum(
            1
            for p in pods
            if p.namespace == pdb.namespace and all(p.labels.get(k) == v for k, v in pdb.selector.items())
        )
        if covered:
            out.append((f"{pdb.namespace}/{pdb.name}", covered, pdb.disruptions_allowed))
    return tuple(out)


def within_budgets(victims: Iterable[GangCandidate]) -> bool:
    """Whether the victims together evict no more pods under any PodDisruptionBudget than it allows."""
    used: dict[str, int] = defaultdict(int)
    allowed: dict[str, int] = {}
    for v in victims:
        for key, covered, allowance in v.pdb_use:
            used[key] += covered
            allowed[key] = allowance
    return all(used[key] <= allowed[key] for key in used)


def unevictable_under_budgets(snapshot: ClusterSnapshot, pods: Sequence[PodInfo]) -> str | None:
    """Why one of ``pods`` can never be evicted, or None: the Eviction API refuses (HTTP 500) a pod that more than
    one PodDisruptionBudget selects, whatever they allow, so planning its eviction (a preemption or a move) would fail
    at every tick while a pod that can be evicted stays untouched."""
    for pod in pods:
        covering = pdbs_covering(snapshot, (pod,))
        if len(covering) > 1:
            names = ", ".join(key for key, _, _ in covering)
            return (
                f"pod {pod.namespace}/{pod.name} is covered by {len(covering)} PodDisruptionBudgets ({names}): "
                "the Eviction API refuses it"
            )
    return None


def _pdb_blocks(snapshot: ClusterSnapshot, pods: Sequence[PodInfo], evicted: bool = True) -> str | None:
    """Why the budgets forbid stopping ``pods``, or None; ``evicted``: stopped through the Eviction API."""
    unevictable = unevictable_under_budgets(snapshot, pods) if evicted else None
    if unevictable is not None:
        return unevictable
    for key, covered, allowed in pdbs_covering(snapshot, pods):
        if covered > allowed:
            return f"PodDisruptionBudget {key} allows {allowed} of its {covered}"
    return None


def need_met(
    free: Mapping[str, int], need: GpuNeed, node_types: Mapping[str, str | None], beside: Beside | None = None
) -> bool:
    """Whether ``free`` GPUs (and, for a need that requests them, the CPU and memory ``beside`` them) hold the
    need's replicas, each whole on one node of its GPU type (one per domain of its ``spread``; with its ``skew``,
    one after the other where its topology spread allows)."""
    slots = 0
    check_beside = beside is not None and need.beside_gpus
    used: set[str] = set()  # the spread's domains a replica was counted in
    fits: dict[str, int] | None = {} if need.skew is not None else None  # the slots per node, for the skew
    for node, gpus in free.items():
        if need.gpu_type is None or node_types.get(node) == need.gpu_type:
            fit = gpus // need.gpus_per_replica
            if check_beside and fit > 0:
                fit = min(fit, _fit_beside(beside.get(node), need))  # type: ignore[union-attr]
            if need.spread is not None and fit > 0:
                domains = spread_of(need.spread, node)
                if domains:
                    # one replica per domain: counted on the first node of it that holds one (the nodes of a
                    # domain are alike to a need counted by replicas, so which one is no matter)
                    fit = 0 if not used.isdisjoint(domains) else 1
                    used.update(domains)
            if fits is not None:
                fits[node] = fit
                continue
            slots += fit
            if slots >= need.replicas:
                return True
    if fits is not None and need.skew is not None:
        return need.skew.placeable(fits, need.replicas) >= need.replicas
    return slots >= need.replicas


def _fit_beside(room: tuple[int, int] | None, need: GpuNeed) -> int:
    """Replicas of ``need`` the CPU and memory ``room`` of a node holds (unbounded when not known)."""
    if room is None:
        return 1 << 30
    cpu, memory = room
    fit = 1 << 30
    if need.cpu_milli > 0:
        fit = min(fit, max(0, cpu) // need.cpu_milli)
    if need.memory_bytes > 0:
        fit = min(fit, max(0, memory) // need.memory_bytes)
    return fit


def _order_key(c: GangCandidate) -> tuple[int, float, float, str]:
    return (c.priority, c.lost_work_gpu_s, -c.started_at, c.gang)


def victim_set_cost(victims: Sequence[GangCandidate], priorities: Sequence[int]) -> tuple[object, ...]:
    """The cost to minimise, comparable as a tuple: the lost work and the gangs taken from each priority tier
    (``priorities`` sorted from the highest down), then the gang count, then the newest first (minus the sum of start
    times), then the names, so that the answer is deterministic."""
    tiers: dict[int, float] = defaultdict(float)
    taken: dict[int, int] = defaultdict(int)
    for v in victims:
        tiers[v.priority] += v.lost_work_gpu_s
        taken[v.priority] += 1
    # (lost work, gangs) per tier, priorities sorted high to low: a gang with no work to lose (checkpointed this
    # instant) is still taken from its tier, which is worse than anything taken from a lower one
    profile = tuple((round(tiers.get(p, 0.0), 6), taken.get(p, 0)) for p in priorities)
    chosen = sorted(victims, key=_order_key)
    return (profile, len(chosen), -sum(v.started_at for v in chosen), tuple(v.gang for v in chosen))


def choose_victims(
    need: GpuNeed,
    free: Mapping[str, int],
    candidates: Sequence[GangCandidate],
    node_types: Mapping[str, str | None],
    max_search_nodes: int = 20_000,
    beside: Beside | None = None,
) -> VictimChoice:
    """The cheapest minimal set of whole eligible gangs whose GPUs, added to ``free``, meet ``need``; with ``beside``
    (a need that requests CPU or memory), whose CPU and memory added to it hold the replicas as well."""
    if not need.beside_gpus or not beside:
        beside = None  # room by GPUs alone: the search as it always was
    eligible = sorted((c for c in candidates if c.why_not is None), key=_order_key)
    ineligible = tuple(c for c in candidates if c.why_not is not None)
    if need.replicas <= 0 or need_met(free, need, node_types, beside):
        return VictimChoice((), True, True, ineligible)
    # GPUs freed on a node that is not ready (absent from ``free``) host nothing: only the ready nodes count.
    node_types = {n: t for n, t in node_types.items() if n in free}
    # Only gangs that hold GPUs on ready nodes of the right type can help.
    useful = [
        c
        for c in eligible
        if any(n in free and (need.gpu_type is None or node_types.get(n) == need.gpu_type) for n in c.gpus_by_node)
    ]
    if not _met_after(free, beside, useful, need, node_types):
        return VictimChoice((), False, True, ineligible)
    priorities = sorted({c.priority for c in useful}, reverse=True)

    # Incumbent: greedy in order, then made minimal. When the cheap gangs taken first use up a PodDisruptionBudget
    # that a later, sufficient gang needed, greedy again starting from each of the first few gangs in turn: a search
    # cut short (max_search_nodes) must not report "impossible" when one such pass finds a set.
    greedy = _greedy(useful, free, need, node_types, first=None, beside=beside)
    for start in useful[:GREEDY_RESTARTS]:
        if _met_after(free, beside, greedy, need, node_types):
            break
        greedy = _greedy(useful, free, need, node_types, first=start, beside=beside)
    greedy_met = _met_after(free, beside, greedy, need, node_types)
    best: list[GangCandidate] = _minimal(greedy, free, need, node_types, beside) if greedy_met else []
    best_cost: tuple[object, ...] | None = victim_set_cost(best, priorities) if greedy_met else None

    # Branch and bound over include/exclude, in the greedy order. Cost only grows with additions, so a partial set
    # that already costs more than the incumbent is cut; so is a branch that cannot meet the need even with all
    # that is left.
    explored = 0
    exact = True
    none_free = dict.fromkeys(free, 0)
    suffix_free = [_freed(none_free, useful[i:]) for i in range(len(useful) + 1)]
    none_beside = dict.fromkeys(beside, (0, 0)) if beside is not None else None
    suffix_beside = [
        _freed_beside(none_beside, useful[i:]) if none_beside is not None else None for i in range(len(useful) + 1)
    ]

    def search(
        index: int,
        chosen: list[GangCandidate],
        current: dict[str, int],
        current_beside: dict[str, tuple[int, int]] | None,
    ) -> None:
        nonlocal best, best_cost, explored, exact
        if explored >= max_search_nodes:
            exact = False
            return
        explored += 1
        if best_cost is not None and victim_set_cost(chosen, priorities) >= best_cost:
            return
        if need_met(current, need, node_types, current_beside):
            minimal = _minimal(chosen, free, need, node_types, beside)
            minimal_cost = victim_set_cost(minimal, priorities)
            if best_cost is None or minimal_cost < best_cost:
                best, best_cost = minimal, minimal_cost
            return
        if index == len(useful):
            return
        rest_beside = suffix_beside[index]
        bound_beside = _add_beside(current_beside, rest_beside) if current_beside is not None and rest_beside else None
        if not need_met(_add(current, suffix_free[index]), need, node_types, bound_beside):
            return
        candidate = useful[index]
        if within_budgets([*chosen, candidate]):
            chosen.append(candidate)
            with_beside = _add_beside(current_beside, candidate.beside_by_node) if current_beside is not None else None
            search(index + 1, chosen, _add(current, candidate.gpus_by_node), with_beside)
            chosen.pop()
        search(index + 1, chosen, current, current_beside)

    search(0, [], dict(free), dict(beside) if beside is not None else None)
    if not best:  # every set that frees enough takes some PodDisruptionBudget below its minimum
        return VictimChoice((), False, exact, ineligible, explored)
    return VictimChoice(tuple(sorted(best, key=_order_key)), True, exact, ineligible, explored)


GREEDY_RESTARTS = 32  # greedy passes started from each of the first gangs when the plain pass meets nothing


def _met_after(
    free: Mapping[str, int],
    beside: Beside | None,
    victims: Sequence[GangCandidate],
    need: GpuNeed,
    node_types: Mapping[str, str | None],
) -> bool:
    """Whether the need is met once ``victims`` are gone (their GPUs, and their CPU and memory, given back)."""
    after = _freed_beside(beside, victims) if beside is not None else None
    return need_met(_freed(free, victims), need, node_types, after)


def _greedy(
    useful: Sequence[GangCandidate],
    free: Mapping[str, int],
    need: GpuNeed,
    node_types: Mapping[str, str | None],
    first: GangCandidate | None,
    beside: Beside | None = None,
) -> list[GangCandidate]:
    """Gangs in order (``first`` before the others), each taken when the set stays within every budget, until the
    need is met."""
    chosen: list[GangCandidate] = []
    order = useful if first is None else [first, *(c for c in useful if c is not first)]
    for c in order:
        if not within_budgets([*chosen, c]):
            continue
        chosen.append(c)
        if _met_after(free, beside, chosen, need, node_types):
            break
    return chosen


def _add(free: Mapping[str, int], extra: Mapping[str, int]) -> dict[str, int]:
    """``free`` plus ``extra`` on the nodes ``free`` has (the ready ones: GPUs freed elsewhere host nothing)."""
    out = dict(free)
    for node, gpus in extra.items():
        if node in out:
            out[node] += gpus
    return out


def _add_beside(room: Beside, extra: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``room`` plus ``extra`` (CPU and memory) on the nodes ``room`` knows (the others are not bounded by them)."""
    out = dict(room)
    for node, amount in extra.items():
        add_beside(out, node, amount)
    return out


def _freed(free: Mapping[str, int], victims: Iterable[GangCandidate]) -> dict[str, int]:
    out = dict(free)
    for v in victims:
        for node, gpus in v.gpus_by_node.items():
            if node in out:
                out[node] += gpus
    return out


def _freed_beside(room: Beside, victims: Iterable[GangCandidate]) -> dict[str, tuple[int, int]]:
    out = dict(room)
    for v in victims:
        if v.beside_by_node:
            out = _add_beside(out, v.beside_by_node)
    return out


def _minimal(
    victims: Sequence[GangCandidate],
    free: Mapping[str, int],
    need: GpuNeed,
    node_types: Mapping[str, str | None],
    beside: Beside | None = None,
) -> list[GangCandidate]:
    """Drop victims that turned out unneeded, the most expensive first."""
    kept = list(victims)
    for v in sorted(victims, key=_order_key, reverse=True):
        trial = [k for k in kept if k is not v]
        if _met_after(free, beside, trial, need, node_types):
            kept = trial
    return kept
