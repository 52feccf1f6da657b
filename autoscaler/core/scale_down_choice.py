"""Which replicas a scale-down removes (``capacity.choose_scale_down_replicas``, off by default), pure.

A ReplicaSet's scale-down deletes its replicas in its own order (``core.cluster.replica_removal_order``): not ready
first, then the lower ``controller.kubernetes.io/pod-deletion-cost``, then those on the nodes most crowded with the
Deployment's pods. Under a spreading scheduler that frees one GPU here and one there, and the GPUs a scale-down gives
back are stranded: no gang fits in them. While lower-priority GPU work waits (``core.cluster.waiting_gpu_work``),
this module chooses the replicas instead -- among ready replicas of equal cost, those on the node with the most free
GPUs first, so that a whole node frees sooner -- and plans, right before the scale-down, one ``SetPodDeletionCost``
per replica chosen (``CHOSEN_DELETION_COST``, the others keep the default 0) and one clearing each mark of ours left
on a replica not chosen now. The contended hold predicts the holes with the same order (``node_room(choosing=...)``).

The trade-off, measured (benchmarks/README.md): more GPUs gathered for training without a single eviction, and the
whole nodes freed at a scale-down are taken back by the next rise -- several times the gangs stopped. Hence off by
default.

Never touched: a Deployment one of whose pods carries a deletion cost somebody else set (a person, another tool: no
``gpuautoscaler.dev/deletion-cost-by`` mark of ours beside it). A mark not written never stops the scale-down: the
actuator applies the scale whatever the marks' results, and the ReplicaSet then deletes in its own order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from autoscaler.core.cluster import (
    CHOSEN_DELETION_COST,
    DELETION_COST_BY_US,
    PodInfo,
    WaitingGpuWork,
    replica_removal_order,
)
from autoscaler.core.model import Action, ScaleDeployment, ServicePolicy, SetPodDeletionCost
from autoscaler.core.reasons import Reason


def foreign_deletion_cost(pods: Iterable[PodInfo]) -> bool:
    """Whether one of the pods carries a deletion cost that this controller did not set."""
    return any(p.deletion_cost_by is not None and p.deletion_cost_by != DELETION_COST_BY_US for p in pods)


def choosing(
    policies: Mapping[str, ServicePolicy],
    pods: Mapping[str, Sequence[PodInfo]],
    waiting: Sequence[WaitingGpuWork],
) -> frozenset[str]:
    """The services ("namespace/deployment") whose scale-down replicas are chosen this tick: GPU work of a lower
    priority than the service's waits, and no pod of its Deployment carries somebody else's deletion cost."""
    if not waiting:
        return frozenset()
    lowest = min(w.priority for w in waiting)
    return frozenset(
        key
        for key, policy in policies.items()
        if policy.priority > lowest and not foreign_deletion_cost(pods.get(key, ()))
    )


def mark_scale_downs(
    actions: Sequence[Action],
    pods: Mapping[str, Sequence[PodInfo]],
    chosen: Collection[str],
    free: Mapping[str, int],
) -> tuple[Action, ...]:
    """``actions`` with, before each scale-down of a Deployment, the marks that choose its replicas:

    - a chosen service (``chosen``) lowering its replicas by k: ``CHOSEN_DELETION_COST`` on the first k of its pods in
      ``replica_removal_order(pods, free)`` (unless marked so already), and the mark of ours removed from any other;
    - any other service whose pods still carry marks of ours (set at an earlier tick, when work waited): the marks
      removed, so that its ReplicaSet deletes in its own order -- unless somebody else's cost is on one of its pods
      (then nothing of that Deployment is touched).

    Scale-ups and other actions are left as they are."""
    out: list[Action] = []
    for action in actions:
        if isinstance(action, ScaleDeployment) and action.replicas < action.previous_replicas:
            out.extend(_marks(action, pods.get(f"{action.namespace}/{action.name}", ()), chosen, free))
        out.append(action)
    return tuple(out)


def _marks(
    action: ScaleDeployment, pods: Sequence[PodInfo], chosen: Collection[str], free: Mapping[str, int]
) -> list[SetPodDeletionCost]:
    key = f"{action.namespace}/{action.name}"
    if not pods or foreign_deletion_cost(pods):
        return []
    removed = action.previous_replicas - action.replicas
    picked: list[PodInfo] = []
    if key in chosen:
        picked = replica_removal_order(pods, free)[:removed]
    names = {p.name for p in picked}
    out: list[SetPodDeletionCost] = []
    for pod in picked:
        if pod.deletion_cost_by == DELETION_COST_BY_US and pod.deletion_cost == CHOSEN_DELETION_COST:
            continue  # marked so at an earlier tick
        where = f"on {pod.node}, {free.get(pod.node, 0)} GPU(s) free there" if pod.node is not None else "unscheduled"
        detail = f"one of the {removed} replica(s) the scale-down of {key} removes: {where}"
        out.append(_mark(pod, CHOSEN_DELETION_COST, action.name, detail))
    for pod in pods:
        if pod.name not in names and pod.deletion_cost_by == DELETION_COST_BY_US:
            detail = f"not one of the replicas the scale-down of {key} removes now: our mark removed"
            out.append(_mark(pod, None, action.name, detail))
    return out


def _mark(pod: PodInfo, cost: int | None, deployment: str, detail: str) -> SetPodDeletionCost:
    return SetPodDeletionCost(pod.namespace, pod.name, pod.uid, cost, Reason.SCALE_DOWN_CHOICE, detail, deployment)
