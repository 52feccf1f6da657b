"""What the controller reads from the cluster, as plain data (built by the Kubernetes adapter or a fake)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint that keeps pods off (``NoSchedule`` / ``NoExecute``; ``PreferNoSchedule`` is no filter)."""

    key: str
    value: str | None = None
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod's toleration, as ``v1.Toleration``: ``key`` None (empty) with ``Exists`` tolerates every taint; ``effect``
    None tolerates every effect; ``operator`` ``Equal`` (the default) compares the value."""

    key: str | None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None

    def tolerates(self, taint: Taint) -> bool:
        """``v1.Toleration.ToleratesTaint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.key is not None and (self.value or "") == (taint.value or "")


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    namespace: str
    name: str
    spec_replicas: int
    ready_replicas: int
    selector: Mapping[str, str] = field(default_factory=dict)
    gpu_product: str | None = None  # the GPU type its pods select (template nodeSelector); None = any
    # ``status.replicas``: pods created for it and not terminating (the scale subresource's status.replicas, which
    # the HPA divides a per-pod External/Object metric by); None: not known (taken as ``spec_replicas``)
    status_replicas: int | None = None
    # where its pods may be scheduled (the pod template): its nodeSelector and its tolerations
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # GPUs one of its pods requests (the pod template, as kube-scheduler counts it); None: not read
    gpus_per_pod: int | None = None
    # CPU (millicores) and memory (bytes) one of its pods requests, as kube-scheduler counts them; 0: none or not read
    cpu_milli_per_pod: int = 0
    memory_bytes_per_pod: int = 0
    # the pod template's labels (what its pods carry: a pod anti-affinity term of its own may select them) and its
    # required pod anti-affinity (``spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution``)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    anti_affinity: tuple[PodAntiAffinityTerm, ...] = ()
    # its pod template's topologySpreadConstraints that filter (whenUnsatisfiable: DoNotSchedule)
    spread_constraints: tuple[TopologySpreadConstraint, ...] = ()


@dataclass(frozen=True, slots=True)
class TopologySpreadConstraint:
    """One of a pod's ``topologySpreadConstraints`` with ``whenUnsatisfiable: DoNotSchedule``: kube-scheduler's
    PodTopologySpread filter places the pod only on a node that has the ``topology_key`` label, and only where the
    pods the constraint counts in that node's domain, plus the pod itself when it is one of them, exceed the fewest in
    any domain by at most ``max_skew`` (``core.topology_spread``). ``ScheduleAnyway`` constraints score only: not
    kept."""

    max_skew: int  # at least 1
    topology_key: str
    # the pods counted, in the pod's own namespace (``pdb_selector``'s mapping; empty: a null labelSelector, none)
    selector: Mapping[str, str | LabelTest]
    # fewer domains than this and the fewest is taken as 0 (``minDomains``; 1 when unset)
    min_domains: int = 1
    # which nodes' domains count: those the pod's nodeSelector and required affinity admit (``nodeAffinityPolicy``
    # Honor, the default; False: Ignore), and those whose taints it tolerates (``nodeTaintsPolicy`` Honor; the
    # default Ignore: False)
    honor_node_affinity: bool = True
    honor_taints: bool = False


@dataclass(frozen=True, slots=True)
class PodAntiAffinityTerm:
    """One term of a pod's required pod anti-affinity: kube-scheduler's InterPodAffinity filter places the pod on no
    node whose ``topology_key`` label has the value of a node running a pod the term selects (a node without the
    label: the term does not apply there). A Deployment that keeps its own replicas apart ("one per node",
    ``kubernetes.io/hostname``) is the usual case on GPU serving."""

    # the pods it keeps away from (``pdb_selector``'s mapping: matchLabels strings, matchExpressions ``LabelTest``s;
    # empty: a null labelSelector, which selects no pod)
    selector: Mapping[str, str | LabelTest]
    topology_key: str  # the node label whose value is the domain (``kubernetes.io/hostname``: each node)
    # the namespaces of the pods it selects; None: every namespace (a ``namespaceSelector``: the namespaces' labels
    # are not read, so every namespace is taken -- more nodes kept, never fewer)
    namespaces: frozenset[str] | None = None

    def selects(self, pod: PodInfo) -> bool:
        """Whether ``pod`` is one the term keeps away from."""
        in_namespace = self.namespaces is None or pod.namespace in self.namespaces
        return in_namespace and selector_matches(self.selector, pod.labels)


HOSTNAME_LABEL = "kubernetes.io/hostname"


def topology_domain(node: NodeInfo, key: str) -> str | None:
    """The value of ``node``'s topology label ``key`` (None: no such label, the term does not apply there); the node's
    name for ``kubernetes.io/hostname`` when the label is not read (the kubelet sets it, to the name in practice)."""
    value = node.labels.get(key)
    if value is None and key == HOSTNAME_LABEL:
        return node.name
    return value


def next_replica(deployment: DeploymentInfo, node: str | None = None, name: str = "") -> PodInfo:
    """A stand-in for one of the Deployment's replicas (its template's labels, its namespace), on ``node`` or not yet
    placed: what a pod affinity term or spread constraint is matched against before the pod exists."""
    return PodInfo(
        deployment.namespace, name, node, 0, 0, "Pending", False, "Deployment", deployment.name,
        labels=deployment.pod_labels,
    )  # fmt: skip


def _barring(
    deployment: DeploymentInfo, snapshot: ClusterSnapshot, wide_only: bool = False
) -> Iterator[tuple[PodInfo, str, str]]:
    """``_barring_of`` the Deployment's next replica (its template's labels and terms)."""
    return _barring_of(next_replica(deployment), deployment.anti_affinity, snapshot, wide_only)


def _barring_of(
    replica: PodInfo,
    own_terms: Sequence[PodAntiAffinityTerm],
    snapshot: ClusterSnapshot,
    wide_only: bool = False,
    leaving_with: Callable[[PodInfo], bool] | None = None,
) -> Iterator[tuple[PodInfo, str, str]]:
    """(pod, topology key, domain) for each pod that keeps ``replica`` (a pod to be placed, with ``own_terms``) off
    a domain: the nodes kube-scheduler's InterPodAffinity filter keeps it off are those in a topology domain (same
    value of the term's key) where a pod its own required anti-affinity selects is bound and
    not finished (a terminating pod counts until it is gone) -- and, the symmetric check, where a pod runs whose own
    required anti-affinity selects the new replica (its template's labels, in its namespace): the pod's own terms
    where the reader read them (``PodInfo.anti_affinity``; any owner), else its Deployment's template's. Only the
    pods the snapshot holds are seen (the GPU pods): a term that keeps replicas away from CPU-only pods, or a CPU-only
    pod's own terms, are not honoured here. ``wide_only``: the terms over a domain wider than a
    node (not ``kubernetes.io/hostname``) alone. ``leaving_with``: the pods that leave with ``replica`` (its own,
    its gang's when it is moved) and keep it off nothing."""

    def kept(term: PodAntiAffinityTerm) -> bool:
        return not wide_only or term.topology_key != HOSTNAME_LABEL

    own = [t for t in own_terms if kept(t)]
    theirs = {
        (d.namespace, d.name): selecting
        for d in snapshot.deployments
        if d.anti_affinity and (selecting := tuple(t for t in d.anti_affinity if kept(t) and t.selects(replica)))
    }
    # pods whose own terms were read and select the replica (any owner); a pod read without them: its template's
    keeping = {
        id(pod): selecting
        for pod in pods_with_own_anti_affinity(snapshot.pods)
        if (selecting := tuple(t for t in pod.anti_affinity or () if kept(t) and t.selects(replica)))
    }
    if not own and not theirs and not keeping:
        return
    nodes = {n.name: n for n in snapshot.nodes}
    for pod in snapshot.pods:
        if pod.node not in nodes or pod.phase in ("Succeeded", "Failed"):
            continue
        if leaving_with is not None and leaving_with(pod):
            continue
        terms = [t for t in own if t.selects(pod)]
        if pod.anti_affinity is not None:
            terms.extend(keeping.get(id(pod), ()))
        elif pod.owner_kind == "Deployment":
            terms.extend(theirs.get((pod.namespace, pod.owner_name or ""), ()))
        for term in terms:
            domain = topology_domain(nodes[pod.node], term.topology_key)
            if domain is not None:
                yield pod, term.topology_key, domain


def anti_affinity_barred(
    deployment: DeploymentInfo, snapshot: ClusterSnapshot, wide_only: bool = False
) -> frozenset[str]:
    """The nodes kube-scheduler's InterPodAffinity filter keeps the Deployment's next replica off (``_barring``)."""
    return _nodes_in_domains(_barring(deployment, snapshot, wide_only), snapshot)


def pod_anti_affinity_barred(pod: PodInfo, snapshot: ClusterSnapshot) -> frozenset[str]:
    """The nodes kube-scheduler's InterPodAffinity filter keeps ``pod`` -- a pod of no Deployment (a training pod,
    one waiting), placed as it is or recreated from its spec -- off: its own required terms (``PodInfo.anti_affinity``)
    against the running pods, and the running pods whose own terms (or Deployment's template) select it. The pods
    leaving with it (``moves_with``) keep it off nothing."""
    leaving = functools.partial(moves_with, pod)
    return _nodes_in_domains(_barring_of(pod, pod.anti_affinity or (), snapshot, leaving_with=leaving), snapshot)


def moves_with(pod: PodInfo, other: PodInfo) -> bool:
    """Whether ``other`` leaves (and lands) with ``pod``: the pod itself, or a pod of its gang."""
    if pod.gang is not None and other.gang == pod.gang:
        return True
    return (other.namespace, other.name) == (pod.namespace, pod.name)


def _nodes_in_domains(barring: Iterable[tuple[PodInfo, str, str]], snapshot: ClusterSnapshot) -> frozenset[str]:
    """The nodes of the snapshot in any (topology key, domain) of ``barring``."""
    taken: dict[str, set[str]] = {}  # topology key -> the domains a pod it keeps away from (or that keeps it) is in
    for _, key, domain in barring:
        taken.setdefault(key, set()).add(domain)
    if not taken:
        return frozenset()
    return frozenset(
        n.name for n in snapshot.nodes if any(topology_domain(n, key) in domains for key, domains in taken.items())
    )


def anti_affinity_lifted(
    deployment: DeploymentInfo, snapshot: ClusterSnapshot, owners: Mapping[tuple[str, str], str]
) -> dict[str, frozenset[str]]:
    """The nodes of ``anti_affinity_barred`` that only the pods of one owner keep the next replica off (its own
    terms selecting them, or theirs selecting it): owner -> those nodes. ``owners``: (namespace, pod name) -> owner
    (a training gang the victim search may stop); a node kept off by any other pod too, or by pods of two owners,
    is none of them. kube-scheduler's preemption judges a node without its victims: once those pods are gone, the
    replica may go there."""
    barrers: dict[tuple[str, str], set[str | None]] = {}  # (key, domain) -> the owners of the pods keeping it
    for pod, key, domain in _barring(deployment, snapshot):
        barrers.setdefault((key, domain), set()).add(owners.get((pod.namespace, pod.name)))
    if not barrers:
        return {}
    keys = {key for key, _ in barrers}
    lifted: dict[str, set[str]] = {}
    for n in snapshot.nodes:
        by: set[str | None] = set()
        for key in keys:
            value = topology_domain(n, key)
            if value is not None:
                by |= barrers.get((key, value), set())
        if len(by) == 1 and (owner := next(iter(by))) is not None:
            lifted.setdefault(owner, set()).add(n.name)
    return {owner: frozenset(found) for owner, found in lifted.items()}


# The pods of the last two pod tuples with their own anti-affinity terms: ``anti_affinity_barred`` runs per service
# and per tick on the same pods (the snapshot's, and the arbitration's with this tick's counted replicas added, which
# share its PodInfos), and a pass over every pod each time would cost O(services x pods). Keyed on the pods tuple
# itself (identity; the entry keeps it alive: at most the previous tick's pods beyond the current ones), so a new
# snapshot is never answered from an old one.
_OWN_TERMS_KEPT = 2
_own_terms_cache: list[tuple[tuple[PodInfo, ...], tuple[PodInfo, ...]]] = []


def pods_with_own_anti_affinity(pods: tuple[PodInfo, ...]) -> tuple[PodInfo, ...]:
    """The pods among ``pods`` that carry required anti-affinity terms of their own (``PodInfo.anti_affinity``)."""
    for seen, found in list(_own_terms_cache):
        if seen is pods:
            return found
    found = tuple(p for p in pods if p.anti_affinity)
    _own_terms_cache[:] = [(pods, found), *_own_terms_cache[: _OWN_TERMS_KEPT - 1]]
    return found


# node -> the topology domains ("<key>=<value>") of a Deployment's spread (``spread_domains``): at most one of its new
# replicas in each; a node without an entry (a booting node's pool entry) is not spread
Spread = Mapping[str, tuple[str, ...]]


def _own_terms(deployment: DeploymentInfo | None) -> list[PodAntiAffinityTerm]:
    """The terms of the Deployment's anti-affinity that select its own pods (their labels, its namespace)."""
    if deployment is None:
        return []
    replica = next_replica(deployment)
    return [t for t in deployment.anti_affinity if t.selects(replica)]


def one_replica_per_node(deployment: DeploymentInfo | None) -> bool:
    """Whether the Deployment's own anti-affinity keeps its replicas one per node (a ``kubernetes.io/hostname``
    term): a node bought for it hosts one of them, whatever its GPUs."""
    return any(t.topology_key == HOSTNAME_LABEL for t in _own_terms(deployment))


def spread_domains(deployment: DeploymentInfo | None, nodes: Iterable[NodeInfo]) -> Spread | None:
    """Where the Deployment's own anti-affinity keeps its replicas apart (a term that selects its pods' labels, in its
    namespace): each node's domains, at most one new replica per domain (a node with none: the terms do not apply
    there). None when no term selects its own pods -- its replicas may share a node, as many as the GPUs hold."""
    own = _own_terms(deployment)
    if not own:
        return None
    return {
        n.name: tuple(f"{t.topology_key}={v}" for t in own if (v := topology_domain(n, t.topology_key)) is not None)
        for n in nodes
    }


def spread_of(spread: Spread, key: str) -> tuple[str, ...]:
    """The domains of an entry of free GPUs (a node, or "<node> (terminating pods)": the node's)."""
    found = spread.get(key)
    return found if found is not None else spread.get(key.split(" ", 1)[0], ())


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    node: str | None
    gpus: int  # nvidia.com/gpu requested (sum over containers)
    priority: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool
    owner_kind: str | None = None
    owner_name: str | None = None
    gang: str | None = None  # gang id (Volcano job, Kueue workload, JobSet, PyTorchJob, or a plain label)
    # the pods of its gang that must start together (minAvailable, minMember; None: unknown, all of them), counted in
    # the pods a snapshot holds: the Kubernetes reader takes off the gang's live pods it leaves out (asking no GPU)
    gang_min_available: int | None = None
    created_at: float | None = None  # Unix seconds
    ready_at: float | None = None  # Unix seconds
    last_checkpoint_at: float | None = None  # Unix seconds, from an annotation when the job publishes it
    labels: Mapping[str, str] = field(default_factory=dict)
    # the GPU type its own spec selects (nodeSelector nvidia.com/gpu.product); None = any, or not read
    gpu_product: str | None = None
    # being deleted (deletionTimestamp set): it still holds its GPUs through its grace period, then frees them
    terminating: bool = False
    # when its grace period ends, Unix seconds: ``metadata.deletionTimestamp``, which the API server sets to the
    # deletion request + the grace period (None: not being deleted, or not read). Until then a kubelet that answers
    # still runs it (a training pod writing its checkpoint on SIGTERM)
    deletion_at: float | None = None
    uid: str | None = None  # metadata.uid: an eviction names this pod, not a successor with the same name
    # Unix seconds the scheduler bound it (PodScheduled); bound to ready is the measured cold start (creation when
    # unknown): waiting for a node is node boot, which the lead adds on its own when GPUs are short
    scheduled_at: float | None = None
    # annotated not to be disrupted (cluster-autoscaler.kubernetes.io/safe-to-evict: "false", karpenter.sh/
    # do-not-disrupt: "true"): no voluntary move evicts it, and a node it runs on is not emptied
    do_not_disrupt: bool = False
    # where it may be scheduled (its own spec): its nodeSelector and its tolerations; a move lands only where both
    # allow (None: not read -- anywhere its GPU type allows)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] | None = None
    # restarts of its containers (status.containerStatuses[].restartCount, summed): after one, its Ready time is
    # that of a recovery (an OOM kill, a liveness probe), not of its start, and measures no cold start
    restarts: int = 0
    # controller.kubernetes.io/pod-deletion-cost (an int32; unset or unreadable: 0, as the ReplicaSet controller
    # reads it): a ReplicaSet's scale-down deletes its ready pods of lower cost first (``replica_removal_order``)
    deletion_cost: int = 0
    # who set that cost: None when the pod carries none, ``DELETION_COST_BY_US`` when this controller did (its
    # ``gpuautoscaler.dev/deletion-cost-by`` mark beside it), "" when somebody else did (a person, another tool): a
    # Deployment with such a pod is never marked by this controller (``core.scale_down_choice``)
    deletion_cost_by: str | None = None
    # Unix seconds of the earliest Ready this reader has seen the pod reach (None: none seen before ``ready_at``). A
    # readiness probe that fails under load and passes again moves the Ready condition's time without a restart; the
    # cold start is measured to this first one, not to the latest recovery
    first_ready_at: float | None = None
    # its own required pod anti-affinity (``spec.affinity.podAntiAffinity``'s required terms): kube-scheduler keeps a
    # new pod off the domains of a running pod whose terms select it, whoever owns that pod (a StatefulSet, a Job, a
    # bare pod). None: not read -- a Deployment's pod is then judged by its Deployment's template
    anti_affinity: tuple[PodAntiAffinityTerm, ...] | None = None
    # CPU (millicores) and memory (bytes) it requests, as kube-scheduler counts them; 0: none or not read
    cpu_milli: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    allocatable_gpus: int
    gpu_product: str | None
    pool: str | None
    ready: bool  # a GPU node is ready only when Ready and its allocatable GPUs are above 0
    labels: Mapping[str, str] = field(default_factory=dict)
    # cordoned, tainted for removal by an autoscaler, or being deleted: not ready, and not on its way either (a burst
    # node that is not ready otherwise counts as booting capacity)
    leaving: bool = False
    # leaving but still its provider's node: cordoned (spec.unschedulable, by hand or by a drain) with no removal
    # taint and not being deleted, or broken (its kubelet lost, Ready Unknown; every GPU unhealthy, allocatable 0 of
    # a capacity above 0). No room and not on its way, but no node "requested, not registered" either
    out_of_service: bool = False
    # its NoSchedule / NoExecute taints other than the transient node-condition ones (not-ready, uninitialized...):
    # a pod that does not tolerate one is never scheduled there
    taints: tuple[Taint, ...] = ()
    # since when the node has been as it is: the later of its registration (creationTimestamp) and its Ready
    # condition's last change, Unix seconds; None: unknown. A burst node not ready this long (its device plugin never
    # reported GPUs, its kubelet NotReady) is no capacity on its way. Not the registration alone: a VM recreated
    # under its old Node object's name boots on a days-old object
    state_since: float | None = None
    # broken since ``state_since``, not by anyone's choice: its kubelet lost (Ready Unknown), or Ready False long
    # after it registered with its GPUs (a container runtime down, a driver crash). Billed and useless: a burst node
    # broken past its pool's provision limit is given back like one that never became ready (``core.arbitrate``)
    broken: bool = False
    # every GPU unhealthy while its kubelet reports (allocatable 0 of a GPU capacity above 0: a GPU fallen off the bus,
    # a driver's XID errors); broken too, since the reader first saw it so (``state_since``; the Node object keeps no
    # time for it, and a device plugin restarting zeroes it for a moment)
    gpus_unhealthy: bool = False
    # annotated not to be removed by an autoscaler (``cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"``,
    # ``karpenter.sh/do-not-disrupt: "true"`` on the Node: a person investigating it, a node kept on purpose): never
    # given back, emptied or consolidated, broken or idle
    do_not_disrupt: bool = False
    # (CPU millicores, memory bytes) its allocatable leaves after the requests of every pod bound to it, GPU pods or
    # not (the snapshot holds only the GPU pods), terminating ones included as kube-scheduler counts them; None: not
    # known. A replica requesting more of either than is free here (its GPUs freed or not) stays Pending
    # (``core.victims``)
    free_beside_gpus: tuple[int, int] | None = None


def schedulable_on(deployment: DeploymentInfo, node: NodeInfo) -> bool:
    """Whether the Deployment's pods may be scheduled on the node as kube-scheduler's NodeAffinity (nodeSelector)
    and TaintToleration filters judge it (GPUs and the GPU type aside: the callers count those). A node that is not
    ready is judged on its taints alone: a booting node gets some labels (GPU feature discovery's) only once up."""
    return _admits(node, deployment.node_selector, deployment.tolerations)


def pod_schedulable_on(pod: PodInfo, node: NodeInfo) -> bool:
    """``schedulable_on`` for one pod, on its own spec's nodeSelector and tolerations (a pod whose tolerations were
    not read is taken to fit wherever its GPU type does, as before they were read)."""
    if pod.tolerations is None:
        return True
    return _admits(node, pod.node_selector, pod.tolerations)


def selected_by(node: NodeInfo, node_selector: Mapping[str, str]) -> bool:
    """Whether ``node`` carries every label of ``node_selector`` and meets its required node affinity, if it is a
    ``NodeSelector`` with one (an unlabelled node is no match for a selector)."""
    return labels_select(node.labels, node_selector, node.name)


def labels_select(labels: Mapping[str, str], node_selector: Mapping[str, str], node_name: str | None = None) -> bool:
    """Whether a node's ``labels`` (and its name, for a ``matchFields`` term) meet ``node_selector``: every label of
    the nodeSelector, and one term of its required node affinity when it is a ``NodeSelector`` with one
    (kube-scheduler's NodeAffinity filter: the nodeSelector and the required affinity must both match)."""
    if not all(labels.get(key) == value for key, value in node_selector.items()):
        return False
    affinity = affinity_of(node_selector)
    # a term without requirements matches no node (``v1.NodeSelectorTerm``: "a null or empty term matches no objects")
    return affinity is None or any(term and all(r.holds(labels, node_name) for r in term) for term in affinity)


_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = range(-(2**63), 2**63)
# apimachinery's label key name part and label value (content.IsLabelKey, IsLabelValue), and a DNS-1123 subdomain
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: None when it fails (no integer, or beyond int64)."""
    if not _INTEGER.fullmatch(text):
        return None
    number = int(text)
    return number if number in _INT64 else None


def _label_key(key: str) -> bool:
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2 and not (0 < len(parts[0]) <= 253 and _DNS_SUBDOMAIN.fullmatch(parts[0])):
        return False
    name = parts[-1]
    return 0 < len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


@functools.lru_cache(maxsize=4096)
def _parses(requirement: NodeRequirement) -> bool:
    """Whether kube-scheduler parses ``requirement`` (component-helpers' nodeaffinity: ``labels.NewRequirement`` for
    a label, ``nodeSelectorRequirementsAsFieldSelector`` for a field); a term with one it cannot parse matches no
    node. The API server checks less than this for a pod (not the values), and nothing of a custom resource's
    template."""
    operator, values = requirement.operator, requirement.values
    if requirement.on_name:
        return requirement.key == "metadata.name" and operator in ("In", "NotIn") and len(values) == 1
    if operator in ("In", "NotIn"):
        count = len(values) > 0
    elif operator in ("Exists", "DoesNotExist"):
        count = not values
    elif operator in ("Gt", "Lt"):
        count = len(values) == 1 and _int64(values[0]) is not None
    else:
        return False
    return count and _label_key(requirement.key) and all(_label_value(v) for v in values)


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One requirement of a required node affinity term (``v1.NodeSelectorRequirement``): a node label ``key``, or
    with ``on_name`` a ``matchFields`` requirement on the node's name (key ``metadata.name``, the only field the API
    allows); ``operator`` In, NotIn, Exists, DoesNotExist, Gt or Lt (Gt and Lt on one integer value). Anything the
    API server would refuse (another operator, another field, a Gt on a word) or kube-scheduler cannot parse
    (``_parses``: a value no label can have, In or NotIn without values) holds on no node: its term admits nothing,
    as kube-scheduler treats a term it cannot parse."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    on_name: bool = False

    def holds(self, labels: Mapping[str, str], node_name: str | None) -> bool:
        """Whether a node with ``labels`` (and name ``node_name``; None: unknown, no name matches) meets it."""
        if not _parses(self):
            return False  # (so the operator is known, Exists has no values, Gt one integer...)
        value = node_name if self.on_name else labels.get(self.key)
        if self.operator in ("Gt", "Lt"):
            # both sides base-10 int64, as the label selector parses them; no label, or one that is no int64: no match
            have, bound = _int64(value) if value is not None else None, _int64(self.values[0])
            if have is None or bound is None:
                return False
            return have > bound if self.operator == "Gt" else have < bound
        return set_requirement_holds(self.operator, self.values, value)


class NodeSelector(Mapping[str, str]):
    """Where a pod may be scheduled by node labels: its ``nodeSelector`` (this mapping's items) and the terms of its
    ``requiredDuringSchedulingIgnoredDuringExecution`` node affinity (``affinity``: a node meets one term whose every
    requirement holds; None: no required affinity; ``()``: one that admits no node). A plain mapping stands for a
    nodeSelector alone wherever a selector is taken, and equals a ``NodeSelector`` of the same labels without
    affinity. Immutable and hashable. Preferred affinity is no filter and is not kept."""

    __slots__ = ("_affinity", "_labels")

    def __init__(
        self, labels: Mapping[str, str] | None = None, affinity: tuple[tuple[NodeRequirement, ...], ...] | None = None
    ) -> None:
        self._labels: dict[str, str] = dict(labels or {})
        self._affinity = affinity

    @property
    def affinity(self) -> tuple[tuple[NodeRequirement, ...], ...] | None:
        """The required affinity's terms (read-only: the selector is hashed and used as a cache key)."""
        return self._affinity

    def __getitem__(self, key: str) -> str:
        return self._labels[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __bool__(self) -> bool:
        # a selector of affinity alone still rules nodes out (``if node_selector:`` must not skip it)
        return bool(self._labels) or self.affinity is not None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeSelector):
            return self._labels == other._labels and self.affinity == other.affinity
        if isinstance(other, Mapping):
            return self.affinity is None and self._labels == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((frozenset(self._labels.items()), self.affinity))

    def __repr__(self) -> str:
        return f"NodeSelector({self._labels!r}, affinity={self.affinity!r})"


def affinity_of(selector: Mapping[str, str]) -> tuple[tuple[NodeRequirement, ...], ...] | None:
    """The required affinity's terms of ``selector`` (None: a plain nodeSelector, or a ``NodeSelector`` without)."""
    return selector.affinity if isinstance(selector, NodeSelector) else None


def selector_with_affinity(
    labels: Mapping[str, str], affinity: tuple[tuple[NodeRequirement, ...], ...] | None
) -> Mapping[str, str]:
    """The selector of a pod with nodeSelector ``labels`` and required affinity terms ``affinity``: a plain dict when
    it has no required affinity (the common case, compared and printed as before), else a ``NodeSelector``."""
    return dict(labels) if affinity is None else NodeSelector(labels, affinity)


def without_label(selector: Mapping[str, str], key: str) -> Mapping[str, str]:
    """``selector`` without the nodeSelector label ``key`` (its affinity kept)."""
    labels = {k: v for k, v in selector.items() if k != key}
    return selector_with_affinity(labels, affinity_of(selector))


def selector_key(selector: Mapping[str, str]) -> tuple[tuple[tuple[str, str], ...], object]:
    """A hashable stand-in for ``selector``, equal for selectors that admit the same nodes by the same rule (a cache
    keyed on the labels alone would give work with a required affinity the nodes found for work without)."""
    return tuple(sorted(selector.items())), affinity_of(selector)


def _admits(node: NodeInfo, node_selector: Mapping[str, str], tolerations: Sequence[Toleration]) -> bool:
    if node.ready and not selected_by(node, node_selector):
        return False
    return tolerates_all(tolerations, node.taints)


def tolerates_all(tolerations: Sequence[Toleration], taints: Iterable[Taint]) -> bool:
    """Whether ``tolerations`` tolerate every NoSchedule / NoExecute taint of ``taints`` (kube-scheduler's
    TaintToleration filter)."""
    return all(
        any(t.tolerates(taint) for t in tolerations) for taint in taints if taint.effect in ("NoSchedule", "NoExecute")
    )


def replica_gpus(policy_gpus: int, deployment: DeploymentInfo | None) -> int:
    """GPUs one replica needs on one node: what its pod template requests when read (that is what the scheduler
    places), else the policy's ``gpusPerReplica``."""
    if deployment is not None and deployment.gpus_per_pod is not None and deployment.gpus_per_pod > 0:
        return deployment.gpus_per_pod
    return policy_gpus


@dataclass(frozen=True, slots=True)
class HpaInfo:
    """A HorizontalPodAutoscaler: another controller that may write a Deployment's replicas."""

    namespace: str
    name: str
    target_kind: str
    target_name: str
    min_replicas: int
    max_replicas: int
    current_replicas: int | None = None  # status.currentReplicas
    desired_replicas: int | None = None  # status.desiredReplicas: what the HPA recommends now


# The operators of a Kubernetes label selector's ``matchExpressions``.
SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def set_requirement_holds(operator: str, values: Collection[str], value: str | None) -> bool:
    """Whether a label's ``value`` (``None``: the label is absent) meets one set-based requirement of a Kubernetes
    label selector (``operator`` one of ``SELECTOR_OPERATORS``): In (present, value in values), NotIn (absent, or
    value not in values), Exists, DoesNotExist. Pod selectors (``LabelTest``) and node affinity
    (``NodeRequirement``) alike."""
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    return value is None  # DoesNotExist


@dataclass(frozen=True, slots=True, eq=False)
class LabelTest:
    """What a label selector requires of one label key when it is more than one value (``matchExpressions``).

    The core matches a selector mapping by equality: a pod is selected when the mapping is not empty and
    ``pod.labels.get(key) == wanted`` for every ``(key, wanted)`` pair. A plain string ``wanted`` is a ``matchLabels``
    entry; a ``LabelTest`` compares equal to exactly the label values it accepts (``None``: the label is absent), so
    the same equality test is the Kubernetes one: every ``(operator, values)`` requirement must hold --
    ``In`` (present, value in values), ``NotIn`` (absent, or value not in values), ``Exists``, ``DoesNotExist``.
    A ``LabelTest`` without requirements accepts every value: see :func:`selector_matching_every_pod`.
    """

    requirements: tuple[tuple[str, frozenset[str]], ...]

    def __post_init__(self) -> None:
        for operator, _ in self.requirements:
            if operator not in SELECTOR_OPERATORS:
                raise ValueError(f"unknown label selector operator {operator!r}")

    def accepts(self, value: str | None) -> bool:
        """Whether a label value (``None``: the pod lacks the label) meets every requirement."""
        return all(set_requirement_holds(operator, values, value) for operator, values in self.requirements)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LabelTest):
            return self.requirements == other.requirements
        if other is None or isinstance(other, str):
            return self.accepts(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to many strings: no hash can agree with theirs


# The key of the one entry of a selector that selects every pod of its namespace: no pod has a label with an empty
# key (Kubernetes refuses one), and the test there accepts anything, absent included.
EVERY_POD_KEY = ""


def selector_matching_every_pod() -> dict[str, str | LabelTest]:
    """A selector mapping that selects every pod of the namespace (Kubernetes' empty selector ``{}``)."""
    return {EVERY_POD_KEY: LabelTest(())}


def selector_matches(selector: Mapping[str, str | LabelTest], labels: Mapping[str, str]) -> bool:
    """Whether a selector mapping selects a pod with these labels. An empty mapping selects none (Kubernetes' null
    selector); ``matchLabels`` entries are strings, other requirements ``LabelTest`` values."""
    return bool(selector) and all(labels.get(key) == wanted for key, wanted in selector.items())


@dataclass(frozen=True, slots=True)
class PodDisruptionBudgetInfo:
    """A PodDisruptionBudget. ``selector`` maps a label key to the value a pod must carry (``matchLabels``) or to a
    ``LabelTest`` (``matchExpressions``); empty selects no pod, ``selector_matching_every_pod()`` every pod of the
    namespace. See ``selects``."""

    namespace: str
    name: str
    selector: Mapping[str, str | LabelTest]
    disruptions_allowed: int

    def selects(self, pod: PodInfo) -> bool:
        """Whether the budget covers the pod, as the Eviction API decides it."""
        return pod.namespace == self.namespace and selector_matches(self.selector, pod.labels)


# Workload kinds stopped through their spec (Job/JobSet/Kubeflow ``suspend``, Kueue Workload ``active``); a gang of
# any other kind is stopped by evicting its pods.
SUSPENDABLE_KINDS = frozenset({"Job", "JobSet", "PyTorchJob", "TFJob", "Workload"})


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """A training workload that can be stopped through its spec (Job, JobSet, Kubeflow job, Kueue Workload)."""

    kind: str  # Job | JobSet | PyTorchJob | TFJob | Workload
    namespace: str
    name: str
    gang: str  # the gang id its pods carry ("job/<namespace>/<name>", ...)
    suspended: bool
    priority: int = 0
    pod_gpus: tuple[int, ...] = ()  # GPUs of each pod it runs (to place it again when resumed)
    gpu_product: str | None = None  # the GPU type its pods select; None = any
    # set when this controller suspended it (an annotation in a cluster): only those are resumed by us
    suspended_by_us_at: float | None = None
    min_runtime_s: float | None = None  # the workload's own minimum runtime (annotation), else the rules' default
    # suspended by a queue until admitted (Kueue: the object carries kueue.x-k8s.io/queue-name): waiting for capacity,
    # not paused by someone on purpose
    queued: bool = False
    # where its GPU pods may be scheduled, as its pod templates that ask for GPUs say: its nodeSelector (admission
    # only adds to it -- Kueue a flavor's node labels -- so a node it rules out is ruled out), and the (CPU
    # millicores, memory bytes) each pod requests beside its GPUs; templates that differ (a master's and its
    # workers'): the labels all select alike, and the least any requests. Its tolerations are not kept: admission adds
    # some the template never shows (a Kueue flavor's, a webhook's), so a taint is no reason to rule a node out.
    node_selector: Mapping[str, str] = field(default_factory=dict, compare=False)
    pod_beside: tuple[int, int] = field(default=(0, 0), compare=False)
    # its GPU pods' labels (their templates' and those the workload's controller adds: the Job's job-name, ...) and
    # their own required pod anti-affinity terms: kube-scheduler keeps each of its pods off the domains of a running
    # pod its terms select or whose terms select it, and -- a term selecting its own pods (workers one per node) --
    # off a domain one of its pods already took. Templates that differ: the labels and terms they all share (looser
    # than any, as the nodeSelector). Empty: none, or not read (the simulator)
    pod_labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    pod_anti_affinity: tuple[PodAntiAffinityTerm, ...] = field(default=(), compare=False)

    @property
    def gpus(self) -> int:
        return sum(self.pod_gpus)


def workload_pod(workload: WorkloadInfo) -> PodInfo:
    """A stand-in for one of a suspended workload's GPU pods, not yet created: its template's labels and terms, its
    gang -- what an anti-affinity term is matched against before the pod exists. Named after the workload in a way
    no pod can be (a "/" in it), so that it is never taken for a pod of the snapshot or another workload's."""
    return PodInfo(
        workload.namespace, f"{workload.kind}/{workload.name} (not created)", None, max(workload.pod_gpus, default=0),
        workload.priority, "Pending", False, workload.kind, workload.name, gang=workload.gang,
        labels=workload.pod_labels, anti_affinity=workload.pod_anti_affinity,
    )  # fmt: skip


def kept_off_by_landing(
    pod: PodInfo, landing: Sequence[tuple[PodInfo, Sequence[NodeInfo]]], nodes: Iterable[NodeInfo]
) -> frozenset[str]:
    """The nodes pod anti-affinity keeps ``pod`` off for pods not bound yet but expected this tick (``landing``: a
    pod and the nodes it was counted onto -- which one is not told, so each of them): either one's required terms
    selecting the other, over the term's domain. A pod of its own gang keeps it off nothing."""
    domains: set[tuple[str, str]] = set()
    for other, where in landing:
        if moves_with(pod, other):
            continue
        terms = [t for t in pod.anti_affinity or () if t.selects(other)]
        terms += [t for t in other.anti_affinity or () if t.selects(pod)]
        for term in terms:
            for node in where:
                domain = topology_domain(node, term.topology_key)
                if domain is not None:
                    domains.add((term.topology_key, domain))
    if not domains:
        return frozenset()
    return frozenset(n.name for n in nodes if any(topology_domain(n, key) == value for key, value in domains))


class KeptApart:
    """A ``PlacementRule`` for the pods of one workload whose own required anti-affinity selects its own pods (a
    gang's workers kept one per node, or per zone): a pod placed keeps the next off every node of its domain, as
    kube-scheduler's InterPodAffinity filter does once the first is bound. An entry that is not a node of
    ``nodes`` (its domain unknown) is allowed."""

    def __init__(self, pod: PodInfo, nodes: Mapping[str, NodeInfo]) -> None:
        self._keys = sorted({t.topology_key for t in pod.anti_affinity or () if t.selects(pod)})
        self._nodes = nodes
        self._taken: set[tuple[str, str]] = set()  # (topology key, domain) a pod placed holds

    @property
    def binds(self) -> bool:
        """Whether the pods keep apart at all (a term selecting them)."""
        return bool(self._keys)

    def _domains(self, entry: str) -> list[tuple[str, str]]:
        node = self._nodes.get(entry)
        if node is None:
            return []
        return [(key, domain) for key in self._keys if (domain := topology_domain(node, key)) is not None]

    def allows(self, entry: str) -> bool:
        return self._taken.isdisjoint(self._domains(entry))

    def add(self, entry: str) -> None:
        self._taken.update(self._domains(entry))


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    time: float
    deployments: tuple[DeploymentInfo, ...] = ()
    pods: tuple[PodInfo, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    pdbs: tuple[PodDisruptionBudgetInfo, ...] = ()
    hpas: tuple[HpaInfo, ...] = ()
    workloads: tuple[WorkloadInfo, ...] = ()
    # suspendable workload kinds whose list answered before and was refused this time ("jobs.batch", ...): the
    # training of those kinds is unknown this tick (its own minimum runtime, its suspension, a Kueue Workload standing
    # for it), so no training is stopped on it; everything else goes on
    training_unread: tuple[str, ...] = ()


def effective_request(app: Sequence[int], init: Sequence[tuple[int, bool]], overhead: int = 0) -> int:
    """A pod's effective request of one resource as kube-scheduler counts it (``resourcehelper.PodRequests``,
    KEP-753): ``app`` the app containers' requests, ``init`` each init container's request and whether it is a
    sidecar (``restartPolicy: Always``), in order, ``overhead`` the pod's ``spec.overhead`` (its RuntimeClass's),
    added on top. Sidecars run beside everything started after them: a plain init container needs its own request
    plus the sidecars started before it; the app containers need theirs plus all sidecars."""
    sidecars = 0
    init_peak = 0
    for amount, sidecar in init:
        if sidecar:
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, amount + sidecars)
    return max(sum(app) + sidecars, init_peak) + overhead


def hpas_targeting(snapshot: ClusterSnapshot, namespace: str, deployment: str) -> tuple[HpaInfo, ...]:
    """The HPAs that scale this Deployment (they and we must never both write its replicas)."""
    return tuple(
        h
        for h in snapshot.hpas
        if h.namespace == namespace and h.target_kind == "Deployment" and h.target_name == deployment
    )


# Seconds a published checkpoint time may lie after the snapshot's time (clocks of the job and the controller).
CHECKPOINT_CLOCK_SKEW_S = 300.0


def checkpoint_times(pods: Iterable[PodInfo], now: float) -> list[float]:
    """The checkpoint times the pods publish that the run can have made by ``now``: one later than ``now`` (beyond
    clock skew) is a wrong unit or clock -- epoch milliseconds read as seconds are a time in the year 57970 -- and
    would count the gang's work since as 0 (the cheapest to preempt, always recently checkpointed); it is unknown."""
    return [
        p.last_checkpoint_at
        for p in pods
        if p.last_checkpoint_at is not None and p.last_checkpoint_at <= now + CHECKPOINT_CLOCK_SKEW_S
    ]


def cold_starts_by_service(snapshot: ClusterSnapshot) -> dict[str, list[float]]:
    """Observed bind-to-ready seconds of each Deployment's pods (``namespace/name`` -> seconds; from creation when
    the bind time is unknown; a pod whose containers restarted is left out: its Ready time is a recovery's; to the
    first Ready the reader saw when its readiness has flapped since, ``PodInfo.first_ready_at``). A replica that
    waited for a burst node to boot measured boot + cold start from its creation: with a handful of replicas that one
    pod was the p95, and the lead then added the node boot again."""
    out: dict[str, list[float]] = {}
    for pod in snapshot.pods:
        if pod.owner_kind != "Deployment" or not pod.owner_name:
            continue
        start = pod.scheduled_at if pod.scheduled_at is not None else pod.created_at
        ready = pod.first_ready_at if pod.first_ready_at is not None else pod.ready_at
        if start is None or ready is None or ready < start or pod.restarts > 0:
            continue
        out.setdefault(f"{pod.namespace}/{pod.owner_name}", []).append(ready - start)
    return out


def free_gpus(snapshot: ClusterSnapshot) -> int:
    """GPUs on ready nodes not requested by a live pod, minus those pending pods are waiting for."""
    ready = {n.name: n.allocatable_gpus for n in snapshot.nodes if n.ready}
    used = 0
    for pod in snapshot.pods:
        if pod.phase in ("Succeeded", "Failed"):
            continue
        if pod.node is None or pod.node in ready:
            used += pod.gpus
    return max(0, sum(ready.values()) - used)


# Controllers of serving replicas (``PodInfo.owner_kind``): never preempted as training (``core.victims``, unless a
# gang opts in). The Kubernetes reader resolves a ReplicaSet to its Deployment; a ReplicaSet it could not resolve
# still counts.
SERVING_OWNER_KINDS = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "ReplicationController"})
# The controller of a static pod's mirror: its kubelet runs it from a file, and an eviction deletes only the mirror
STATIC_POD_OWNER_KIND = "Node"


def preemptible_gpus(snapshot: ClusterSnapshot, below_priority: int) -> int:
    """GPUs held on ready nodes by pods that are not serving replicas (``SERVING_OWNER_KINDS``), below
    ``below_priority`` (training the capacity arbitration may preempt; its own rules -- labels, opt-ins, minimum
    runtime, PDBs -- decide which)."""
    ready = {n.name for n in snapshot.nodes if n.ready}
    return sum(
        pod.gpus
        for pod in snapshot.pods
        if pod.node in ready
        and pod.owner_kind not in SERVING_OWNER_KINDS
        and pod.priority < below_priority
        and pod.phase not in ("Succeeded", "Failed")
    )


def free_gpus_per_node(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Allocatable minus the GPUs requested by live pods bound there, for every node (ready or not)."""
    used: dict[str, int] = {}
    for pod in snapshot.pods:
        if pod.node and pod.phase not in ("Succeeded", "Failed"):
            used[pod.node] = used.get(pod.node, 0) + pod.gpus
    return {n.name: max(0, n.allocatable_gpus - used.get(n.name, 0)) for n in snapshot.nodes}


def requests_by_node(pods: Iterable[PodInfo]) -> dict[str, tuple[int, int]]:
    """(CPU millicores, memory bytes) ``pods`` request on each node they are bound to (pods requesting neither, or on
    no node, left out): what they give back beside their GPUs when they go."""
    out: dict[str, tuple[int, int]] = {}
    for pod in pods:
        if pod.node and (pod.cpu_milli or pod.memory_bytes):
            cpu, memory = out.get(pod.node, (0, 0))
            out[pod.node] = (cpu + pod.cpu_milli, memory + pod.memory_bytes)
    return out


def gpu_types_meet(kind: str | None, other: str | None) -> bool:
    """Whether pods selecting GPU type ``kind`` may take GPUs of ``other`` (None: any type)."""
    return kind is None or other is None or kind == other


def fits_beside(room: Mapping[str, tuple[int, int]] | None, node: str, need: tuple[int, int]) -> bool:
    """Whether ``node``'s CPU and memory free beside its GPUs (``room``: node -> (millicores, bytes), as
    ``NodeInfo.free_beside_gpus``) hold ``need`` too; a node whose are not known (no entry, or no ``room``): yes.
    Only what the pod requests is checked, as kube-scheduler's NodeResourcesFit does: a node whose pods already
    request more memory than it has (allocatable shrunk under them, static pods) still takes a pod that requests
    no memory."""
    known = room.get(node) if room is not None else None
    return known is None or ((need[0] <= 0 or known[0] >= need[0]) and (need[1] <= 0 or known[1] >= need[1]))


class PlacementRule(Protocol):
    """A rule that lets a pod onto an entry of free GPUs (a node, "<node> (terminating pods)", a requested node) by
    what was placed before it, and learns of each placement: a Deployment's topology spread
    (``core.topology_spread.TopologySkew``)."""

    def allows(self, entry: str) -> bool: ...

    def add(self, entry: str) -> None: ...


def place_best_fit(
    free: dict[str, int],
    replicas: int,
    gpus: int,
    gpu_type: str | None = None,
    node_types: Mapping[str, str | None] | None = None,
    beside: dict[str, tuple[int, int]] | None = None,
    needs: tuple[int, int] = (0, 0),
    spread: Spread | None = None,
    spread_used: set[str] | None = None,
    rule: PlacementRule | None = None,
) -> int:
    """Place up to ``replicas`` pods of ``gpus`` GPUs each on nodes of ``gpu_type`` (None: any), best fit (the
    fullest node that fits first, then by name), consuming ``free``; returns how many were placed. A pod that
    requests CPU or memory (``needs``: millicores, bytes) fits only a node with that much free ``beside`` its GPUs,
    when known there (``NodeInfo.free_beside_gpus``), and consumes it. With ``spread`` (``spread_domains``) at most
    one pod per domain: the domains taken are added to ``spread_used`` (pass the same set to place more of the same
    Deployment's replicas later in a tick). With ``rule``, only where it allows, and it learns of each placement."""
    checks = beside is not None and (needs[0] > 0 or needs[1] > 0)
    used = spread_used if spread_used is not None else set()
    placed = 0
    while placed < replicas:
        fits = [
            (left, node)
            for node, left in free.items()
            if left >= gpus
            and (gpu_type is None or node_types is None or node_types.get(node) == gpu_type)
            and (not checks or fits_beside(beside, node, needs))
            and (spread is None or used.isdisjoint(spread_of(spread, node)))
            and (rule is None or rule.allows(node))
        ]
        if not fits:
            break
        _, node = min(fits)
        free[node] -= gpus
        if checks:
            add_beside(beside, node, needs, -1)
        if spread is not None:
            used.update(spread_of(spread, node))
        if rule is not None:
            rule.add(node)
        placed += 1
    return placed


def add_beside(room: dict[str, tuple[int, int]] | None, node: str, amount: tuple[int, int], sign: int = 1) -> None:
    """``amount`` (millicores, bytes) added to (``sign`` -1: taken from) ``node``'s CPU and memory in ``room``, where
    known: a node without an entry stays unbounded by them."""
    if room is None or (amount[0] == 0 and amount[1] == 0):
        return
    known = room.get(node)
    if known is not None:
        room[node] = (known[0] + sign * amount[0], known[1] + sign * amount[1])


@dataclass(frozen=True, slots=True)
class WaitingGpuWork:
    """GPU work waiting for GPUs: a pending pod, or one pod of a suspended workload."""

    priority: int
    gpus: int  # GPUs one of its pods needs on one node
    gpu_product: str | None = None  # the GPU type it selects; None = any
    # the GPUs of each pod that starts with it, all at once (a gang: the pending pods of one gang, a suspended
    # workload's pods; empty: its one pod), and how many of them must find a node for it to start (a gang's
    # minAvailable less its pods already placed and its pending pods that ask for no GPU; 0: all of them). More than
    # its pods: too few of the gang's pods exist to reach its minAvailable, and a gang scheduler starts none of it
    # until they do (Volcano, coscheduling): it cannot start.
    pods: tuple[int, ...] = ()
    min_pods: int = 0
    # where its pods may be scheduled (a pending pod's own spec, a suspended workload's pod template): its nodeSelector
    # and its tolerations (None: not read, a suspended workload's -- admission adds tolerations its template lacks)
    node_selector: Mapping[str, str] = field(default_factory=dict, compare=False)
    tolerations: tuple[Toleration, ...] | None = None
    # suspended by this controller: it waits for the arbitration's resume, which waits for room beyond the forecast's
    # reserve -- room a hole may make even where it fits the free GPUs by count
    resumed_by_us: bool = False
    # (CPU millicores, memory bytes) each of its pods requests beside its GPUs (a pending pod's own, a suspended
    # workload's template's; (0, 0): none, or not read)
    beside: tuple[int, int] = field(default=(0, 0), compare=False)
    # the gang of a pending pod ((namespace, gang id)): its pending pods are one entry each, alike, one work
    gang_key: tuple[str, str] | None = field(default=None, compare=False)
    # a suspended workload's pods, not yet created (``workload_pod``): their labels and own anti-affinity terms
    template_pod: PodInfo | None = field(default=None, compare=False)

    @property
    def takes(self) -> int:
        """GPUs it takes from the free ones when it starts with all its pods (a gang starts whole or not at all)."""
        return sum(self.gang)

    @property
    def gang(self) -> tuple[int, ...]:
        """The GPUs of each pod that starts with it, largest first."""
        return tuple(sorted(self.pods, reverse=True)) if self.pods else (self.gpus,)

    @property
    def needed_pods(self) -> int:
        """How many of ``gang`` must find a node for it to start (more than ``gang`` holds: it cannot start)."""
        return self.min_pods if self.min_pods > 0 else len(self.gang)


def waiting_gpu_work(snapshot: ClusterSnapshot) -> list[WaitingGpuWork]:
    """Pending pods that ask for GPUs, and workloads suspended by this controller or by a queue such as Kueue (not
    those somebody paused on purpose), each as its largest pod. A pending pod no ready node of its type could ever
    hold (more GPUs than any such node has) is left out: it waits for nothing an inference service gives back."""
    largest: dict[str | None, int] = {}
    for node in snapshot.nodes:
        if node.ready:
            largest[node.gpu_product] = max(largest.get(node.gpu_product, 0), node.allocatable_gpus)
    biggest = max(largest.values(), default=0)
    # (not one being deleted: a deleted Job's pod held by a finalizer never starts)
    unplaced = [
        p for p in snapshot.pods if p.node is None and p.gpus > 0 and p.phase == "Pending" and not p.terminating
    ]

    def fits(p: PodInfo) -> bool:
        return p.gpus <= (biggest if p.gpu_product is None else largest.get(p.gpu_product, 0))

    # a gang one of whose pods no node could hold never starts: none of its pods waits for a hole either
    never = {(p.namespace, p.gang) for p in unplaced if p.gang is not None and not fits(p)}
    pending = [p for p in unplaced if fits(p) and (p.namespace, p.gang) not in never]
    gangs: dict[tuple[str, str], list[int]] = {}
    for p in pending:
        if p.gang is not None:
            gangs.setdefault((p.namespace, p.gang), []).append(p.gpus)
    # a gang's pods already placed count towards its minAvailable (Volcano, Kueue's partial admission), and so do its
    # pending pods that ask for no GPU (an MPI launcher, read with includeNonGpuPods): they wait for no GPU
    placed: dict[tuple[str, str], int] = {}
    min_available: dict[tuple[str, str], int] = {}
    for p in snapshot.pods:
        if p.gang is None:
            continue
        key = (p.namespace, p.gang)
        if p.gang_min_available is not None:
            min_available[key] = p.gang_min_available
        if p.phase in ("Succeeded", "Failed") or p.terminating:
            continue
        if p.node is not None or (p.gpus <= 0 and p.phase == "Pending"):
            placed[key] = placed.get(key, 0) + 1
    out: list[WaitingGpuWork] = []
    for p in pending:
        beside = (p.cpu_milli, p.memory_bytes)
        if p.gang is None:
            out.append(
                WaitingGpuWork(p.priority, p.gpus, p.gpu_product, (), 0, p.node_selector, p.tolerations, beside=beside)
            )
            continue
        key = (p.namespace, p.gang)
        sizes = tuple(gangs[key])
        # more than ``sizes`` when fewer of its pods exist than its minAvailable: it cannot start (``needed_pods``)
        needed = max(1, min_available[key] - placed.get(key, 0)) if key in min_available else 0
        out.append(
            WaitingGpuWork(
                p.priority, p.gpus, p.gpu_product, sizes, needed, p.node_selector, p.tolerations,
                beside=beside, gang_key=key,
            )
        )  # fmt: skip
    out += [
        WaitingGpuWork(
            w.priority,
            max(w.pod_gpus),
            w.gpu_product,
            tuple(g for g in w.pod_gpus if g > 0),
            node_selector=w.node_selector,
            resumed_by_us=w.suspended_by_us_at is not None,
            beside=w.pod_beside,
            template_pod=workload_pod(w),
        )
        for w in snapshot.workloads
        if w.suspended and (w.suspended_by_us_at is not None or w.queued) and w.pod_gpus and max(w.pod_gpus) > 0
    ]
    return out


def _where(work: WaitingGpuWork) -> tuple[object, ...]:
    """Where a waiting pod may go, as a key: its GPU type, nodeSelector with required affinity, and tolerations."""
    return (work.gpu_product, selector_key(work.node_selector), work.tolerations)


def waiting_for_room(
    waiting: Sequence[WaitingGpuWork], snapshot: ClusterSnapshot, not_room: Collection[str] = ()
) -> list[WaitingGpuWork]:
    """The waiting work that does not start on the GPUs free now: those of the ready nodes (not leaving) of its GPU
    type that its pods may be scheduled on, outside the pools in ``not_room`` (burst pools, which take inference
    only), with the CPU and memory its pods request beside them where the node says -- a gang whole, or the pods of
    it it needs, each on one node (largest first, best fit). Work that starts there already waits for something else
    (a Kueue workload queued for quota, a pod the scheduler has not bound yet): a GPU freed elsewhere is not what it
    waits for. The free GPUs hold what they hold once: the work takes them in the scheduler's order, higher priority
    first (then as listed), and what no longer fits in what the work before it took waits for room. Work this
    controller suspended is always kept, and takes none: its resume waits for room beyond the forecast's reserve,
    which a hole may be. In the order of ``waiting``."""
    free = free_gpus_per_node(snapshot)
    nodes = [
        n for n in snapshot.nodes if n.ready and not n.leaving and n.pool not in not_room and free.get(n.name, 0) > 0
    ]
    left = {n.name: free[n.name] for n in nodes}
    by_name = {n.name: n for n in snapshot.nodes}
    # CPU and memory beside the free GPUs, where known (a node without an entry: unbounded by them)
    left_beside = {n.name: n.free_beside_gpus for n in nodes if n.free_beside_gpus is not None}
    eligible: dict[tuple[object, ...], list[str]] = {}  # the nodes a GPU type, nodeSelector and tolerations allow
    gangs: dict[tuple[str, str], bool] = {}  # whether each gang starts (judged once, on its first entry met)
    # a pending gang's entries (one per pending pod): its pods are placed each where its own spec allows -- a
    # launcher and its workers may select different nodes, and one entry's selector is not the gang's
    members: dict[tuple[str, str], list[WaitingGpuWork]] = {}
    for work in waiting:
        if work.gang_key is not None:
            members.setdefault(work.gang_key, []).append(work)
    # shapes that did not start: the room only shrinks, so work of such a shape never starts later in the walk (a
    # thousand pods alike, the cluster full, are placed once)
    failed: set[tuple[object, ...]] = set()
    waits: set[int] = set()

    def nodes_for(where: tuple[object, ...], work: WaitingGpuWork) -> list[str]:
        names = eligible.get(where)
        if names is None:
            names = eligible[where] = [
                n.name
                for n in nodes
                if work.gpu_product in (None, n.gpu_product)  # an unlabelled node is no match for a selector
                and selected_by(n, work.node_selector)
                and (work.tolerations is None or _admits(n, work.node_selector, work.tolerations))
            ]
        return names

    def place(
        pods: Sequence[tuple[int, tuple[object, ...], tuple[int, int], WaitingGpuWork]],
        needed: int,
        kept_off: frozenset[str] = frozenset(),
        apart: KeptApart | None = None,
    ) -> tuple[bool, dict[str, int], dict[str, tuple[int, int]]]:
        """Whether ``needed`` of ``pods`` find nodes over ``left`` (none of ``kept_off``; where ``apart`` allows),
        and what they took (kept only when the work starts)."""
        room: dict[str, int] = {}
        room_beside: dict[str, tuple[int, int]] = {}
        found = 0
        for gpus, where, beside, spec in pods:
            view = {name: room.get(name, left[name]) for name in nodes_for(where, spec) if name not in kept_off}
            view = {name: free_now for name, free_now in view.items() if free_now > 0}
            view_beside = {name: room_beside.get(name, left_beside[name]) for name in view if name in left_beside}
            if place_best_fit(view, 1, gpus, beside=view_beside, needs=beside, rule=apart):
                found += 1
                room.update(view)
                room_beside.update(view_beside)
        return found >= needed, room, room_beside

    for index in sorted(range(len(waiting)), key=lambda i: -waiting[i].priority):
        work = waiting[index]
        if work.resumed_by_us:
            waits.add(index)
            continue
        if work.gang_key is not None and work.gang_key in gangs:
            if not gangs[work.gang_key]:
                waits.add(index)
            continue
        # each pod to place: (GPUs, where it may go, the CPU and memory it requests, whose spec says so)
        pods: list[tuple[int, tuple[object, ...], tuple[int, int], WaitingGpuWork]]
        entries = members.get(work.gang_key, []) if work.gang_key is not None else []
        if entries and sorted(e.gpus for e in entries) == sorted(work.gang):
            pods = [(e.gpus, _where(e), e.beside, e) for e in entries]
        else:  # its pods are not all listed here (a suspended workload, a gang cut short): its template for each
            pods = [(gpus, _where(work), work.beside, work) for gpus in work.gang]
        pods.sort(key=lambda pod: -pod[0])
        shape = (tuple(pod[:3] for pod in pods), work.needed_pods)
        if shape in failed:
            waits.add(index)
            if work.gang_key is not None:
                gangs[work.gang_key] = False
            continue
        starts, room, room_beside = place(pods, work.needed_pods)
        if starts and work.template_pod is not None:
            # A suspended workload's pods are also kept off where their own terms or a running pod's say, and apart
            # where their terms select each other. Judged only once the work fits without them (tighter, so work
            # that does not fit without them does not with them, and the running pods are walked only for work that
            # may start); a failure for them alone says nothing of its shape's other work, and is not cached.
            kept_off = pod_anti_affinity_barred(work.template_pod, snapshot)
            apart = KeptApart(work.template_pod, by_name)
            rule = apart if apart.binds else None
            if kept_off or rule is not None:
                starts, room, room_beside = place(pods, work.needed_pods, kept_off, rule)
                if not starts:
                    if work.gang_key is not None:
                        gangs[work.gang_key] = False
                    waits.add(index)
                    continue
        if work.gang_key is not None:
            gangs[work.gang_key] = starts
        if starts:
            left.update(room)
            left_beside.update(room_beside)
        else:
            failed.add(shape)
            waits.add(index)
    return [work for index, work in enumerate(waiting) if index in waits]


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """Room on the ready nodes, gathered in one pass per tick: free GPUs, GPU type, the GPUs each Deployment's live
    pods hold per node, and the order its ReplicaSet would delete them in on a scale-down."""

    free: Mapping[str, int]  # ready nodes only
    product: Mapping[str, str | None]
    held: Mapping[str, Mapping[str, int]]  # "namespace/deployment" -> node -> GPUs
    # "namespace/deployment" -> (node or None when unscheduled, GPUs) of each active pod, first deleted first
    removal_order: Mapping[str, tuple[tuple[str | None, int], ...]] = field(default_factory=dict)
    # each node's labels: a hole opens for waiting work only on a node its nodeSelector allows (none: no label)
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # each node's NoSchedule / NoExecute taints (``NodeInfo.taints``; none: untainted): a hole opens for a pending pod
    # only on a node whose taints it tolerates
    taints: Mapping[str, tuple[Taint, ...]] = field(default_factory=dict)

    def selects(self, node: str, node_selector: Mapping[str, str]) -> bool:
        """Whether ``node`` meets ``node_selector`` (``selected_by``: its labels, and its required affinity)."""
        return labels_select(self.labels.get(node, {}), node_selector, node)

    def admits(self, node: str, work: WaitingGpuWork) -> bool:
        """Whether the waiting ``work``'s pods may be scheduled on ``node``: its nodeSelector and required affinity,
        and its tolerations against the node's taints (tolerations not read -- a suspended workload's, which
        admission adds to -- tolerate every taint)."""
        if not self.selects(node, work.node_selector):
            return False
        return work.tolerations is None or tolerates_all(work.tolerations, self.taints.get(node, ()))


def deployment_pods(snapshot: ClusterSnapshot) -> dict[str, list[PodInfo]]:
    """The active pods (not finished, not terminating) of every Deployment, by "namespace/deployment": those its
    ReplicaSet ranks on a scale-down."""
    active: dict[str, list[PodInfo]] = {}
    for pod in snapshot.pods:
        if pod.owner_kind != "Deployment" or pod.phase in ("Succeeded", "Failed") or pod.terminating:
            continue
        active.setdefault(f"{pod.namespace}/{pod.owner_name}", []).append(pod)
    return active


def node_room(snapshot: ClusterSnapshot, choosing: Collection[str] = ()) -> NodeRoom:
    """``choosing``: the Deployments ("namespace/deployment") whose scale-down replicas this controller chooses
    this tick (``core.scale_down_choice``): their order is ``replica_removal_order`` with the free GPUs per node, the
    order the marks it writes before the scale-down make the ReplicaSet follow."""
    ready = {n.name for n in snapshot.nodes if n.ready}
    free = {n: left for n, left in free_gpus_per_node(snapshot).items() if n in ready}
    held: dict[str, dict[str, int]] = {}
    for pod in snapshot.pods:
        if pod.owner_kind != "Deployment" or pod.phase in ("Succeeded", "Failed"):
            continue
        if pod.node in ready:
            by_node = held.setdefault(f"{pod.namespace}/{pod.owner_name}", {})
            by_node[pod.node] = by_node.get(pod.node, 0) + pod.gpus
    order = {
        key: tuple((p.node, p.gpus) for p in replica_removal_order(pods, free if key in choosing else None))
        for key, pods in deployment_pods(snapshot).items()
    }
    return NodeRoom(
        free,
        {n.name: n.gpu_product for n in snapshot.nodes},
        held,
        order,
        {n.name: n.labels for n in snapshot.nodes},
        {n.name: n.taints for n in snapshot.nodes if n.taints},
    )


_PHASE_RANK = {"Pending": 0, "Unknown": 1}  # Running (and anything else) last

# The mark this controller writes beside a ``controller.kubernetes.io/pod-deletion-cost`` it sets
# (``gpuautoscaler.dev/deletion-cost-by``), its value, and the cost it gives a replica chosen for a scale-down (the
# others keep the ReplicaSet's default, 0: the chosen ones are deleted first, right after the not-ready ones)
DELETION_COST_BY_US = "gpu-autoscaler"
CHOSEN_DELETION_COST = -1


def replica_removal_order(pods: Sequence[PodInfo], free: Mapping[str, int] | None = None) -> list[PodInfo]:
    """The active pods of one Deployment in the order its ReplicaSet deletes them on a scale-down (the ReplicaSet
    controller's ``ActivePodsWithRanks``): unscheduled first, then Pending, Unknown, Running; not ready before
    ready; then the lower ``controller.kubernetes.io/pod-deletion-cost`` first (``PodInfo.deletion_cost``: a person
    or another tool may have set it); then *doubled up* -- a pod on a node holding more of the Deployment's pods
    first; then the latest ready, then more container restarts (upstream: the most restarts of one container; here
    their sum), then the newest (ties: the later name). Upstream compares ready times in powers of two of their age
    (``LogarithmicScaleDown``); exact times keep the order deterministic and agree with it across buckets.

    ``free`` (GPUs free per ready node): the order this controller makes the ReplicaSet follow when it chooses the
    replicas (``core.scale_down_choice``): the costs it set itself count as unset (it sets them again from this
    order), and among ready pods of equal cost the one on the node with the most free GPUs goes first -- its
    deletion frees GPUs where a hole is nearest; of equally roomy nodes, one after the other, by name, so that a
    scale-down empties one of them rather than some of each -- before the ReplicaSet's own ranks."""
    on_node: dict[str | None, int] = {}
    for pod in pods:
        on_node[pod.node] = on_node.get(pod.node, 0) + 1

    def rank(pod: PodInfo) -> tuple[object, ...]:
        ready_time = pod.ready_at if pod.ready and pod.ready_at is not None else math.inf
        created = pod.created_at if pod.created_at is not None else math.inf
        cost = pod.deletion_cost
        roomiest: tuple[int, str] = (0, "")
        if free is not None:
            cost = 0 if pod.deletion_cost_by == DELETION_COST_BY_US else cost
            if pod.ready and pod.node is not None:
                roomiest = (-free.get(pod.node, 0), pod.node)  # equally roomy nodes one after the other, whole
        return (
            pod.node is not None, _PHASE_RANK.get(pod.phase, 2), pod.ready, cost, roomiest, -on_node[pod.node],
            -ready_time, -pod.restarts, -created,
        )  # fmt: skip

    return sorted(sorted(pods, key=lambda p: p.name, reverse=True), key=rank)


def hole_for_waiting_work(room: NodeRoom, service: str, waiting: Sequence[WaitingGpuWork]) -> tuple[int, int] | None:
    """``hole_node_for_waiting_work`` without the node."""
    hole = hole_node_for_waiting_work(room, service, waiting)
    return None if hole is None else hole[:2]


def hole_node_for_waiting_work(
    room: NodeRoom, service: str, waiting: Sequence[WaitingGpuWork]
) -> tuple[int, int, str, int] | None:
    """The fewest of the service's ("namespace/deployment") replicas a scale-down must remove -- in the order its
    ReplicaSet deletes them -- before one node is left with free GPUs enough for one of the ``waiting`` pods, and the
    GPUs of the waiting pod that hole is for (the smallest one that does not fit on that node yet, of its GPU type
    and whose nodeSelector, required affinity and tolerations the node meets: the work that would take the freed
    GPUs, not any waiting work; a small job for another GPU type, or for other nodes, takes nothing a scale-down frees
    here). None when no scale-down would
    (the waiting pods need more than the free GPUs and the service's GPUs on any node together, or already fit where
    they are: they wait for something else). A smaller scale-down hands the waiting work nothing it can use. The
    ReplicaSet takes replicas from the nodes most crowded with them first, not from the node a hole would open
    soonest: a bin-packed service frees GPUs on its full nodes before its last, half-empty one. Cost: the service's
    replicas x the distinct waiting sizes. The third and fourth items: the node the hole opens on, and its free GPUs
    then."""
    # by GPU type, then by where its pods may go (a node its selector or taints rule out is no hole for the work)
    sizes: dict[str | None, dict[object, tuple[WaitingGpuWork, list[int]]]] = {}
    for work in waiting:
        by_place = sizes.setdefault(work.gpu_product, {})
        by_place.setdefault((selector_key(work.node_selector), work.tolerations), (work, []))[1].append(work.gpus)
    ordered = {
        product: [(first, sorted(set(gpus))) for first, gpus in by_place.values()]
        for product, by_place in sizes.items()
    }
    freed: dict[str, int] = {}
    for removed, (node, gpus) in enumerate(room.removal_order.get(service, ()), start=1):
        free = room.free.get(node) if node is not None else None
        if node is None or free is None:
            continue  # an unscheduled replica, or one on a node that is no room: it frees nothing usable
        freed[node] = freed.get(node, 0) + gpus
        product = room.product.get(node)
        # the waiting pods that do not fit on this node yet and would once these replicas are gone
        fits = [
            w
            for by_place in (ordered.get(None, []), ordered.get(product, []) if product is not None else [])
            for first, listed in by_place
            if room.admits(node, first)
            for w in listed
            if free < w <= free + freed[node]
        ]
        if fits:
            return removed, min(fits), node, free + freed[node]
    return None
