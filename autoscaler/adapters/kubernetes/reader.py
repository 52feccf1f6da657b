"""ClusterReader over the Kubernetes API: Deployments, GPU Pods, GPU Nodes, PriorityClasses, PodDisruptionBudgets,
HPAs and the suspendable training workloads (batch Jobs, JobSets, PyTorchJobs, TFJobs, Kueue Workloads).

One snapshot = one paginated list per resource (plus Volcano PodGroups when a pod belongs to one). A snapshot is
all or nothing: if any list fails after its bounded retries, ``snapshot`` raises ``PortError`` and the caller
holds; a partial pod list would look like free GPUs. The exceptions are the optional kinds: a CRD that is not
installed (404) is skipped, and a list RBAC does not allow (403) is said once in the log and skipped.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client

from autoscaler.adapters.kubernetes._api import JSON, KubeApiError, Pager, parse_time
from autoscaler.adapters.kubernetes.workloads import (
    MIN_RUNTIME_ANNOTATION,
    SUSPENDED_AT_ANNOTATION,
    SUSPENDED_BY_ANNOTATION,
    SUSPENDED_GENERATION_ANNOTATION,
    WORKLOAD_KINDS,
    WorkloadKind,
    at_first_served,
    is_suspended,
    served_first,
)
from autoscaler.core.cluster import (
    DELETION_COST_BY_US,
    SELECTOR_OPERATORS,
    SERVING_OWNER_KINDS,
    ClusterSnapshot,
    DeploymentInfo,
    HpaInfo,
    LabelTest,
    NodeInfo,
    NodeRequirement,
    PodAntiAffinityTerm,
    PodDisruptionBudgetInfo,
    PodInfo,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    WorkloadInfo,
    affinity_of,
    effective_request,
    selector_matching_every_pod,
    selector_with_affinity,
    without_label,
)

log = logging.getLogger(__name__)

# Gang membership, in order of precedence. A gang id is "<source>/<namespace>/<name>" (names cannot contain "/").
VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
VOLCANO_JOB_LABEL = "volcano.sh/job-name"
# Seconds after its creation a node's Ready condition may still change as part of its start (Cluster Autoscaler's
# MaxNodeStartupTime): a node not Ready that changed later, its GPUs reported, is broken, not booting.
NODE_STARTUP_S = 900.0
KUEUE_WORKLOAD_KEY = "kueue.x-k8s.io/workload"  # annotation set from the Job's pod template (label accepted too)
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
# A workload Kueue manages carries its LocalQueue in this label; suspended, it waits for admission (capacity)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
KUBEFLOW_LABEL = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"  # the replica spec's key, lowercased
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
#: scheduler-plugins' coscheduling PodGroup label (current key first, the older one second)
COSCHEDULING_POD_GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")  # set by the Job controller (legacy key second)

# The workload kinds read into ``ClusterSnapshot.workloads``, in listing order, and the gang source of their pods.
WORKLOAD_GANG_SOURCES = {
    "Job": "job",
    "JobSet": "jobset",
    "PyTorchJob": "kubeflow",
    "TFJob": "kubeflow",
    "Workload": "kueue",
}
FINISHED_CONDITIONS = frozenset({"Complete", "Completed", "Succeeded", "Failed", "Finished"})
KUBEFLOW_REPLICA_SPECS = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs"}

DEFAULT_NODE_POOL_LABELS = (
    "gpuautoscaler.dev/node-pool",
    "node.cluster.x-k8s.io/pool",
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
)


@dataclass(frozen=True)
class ReaderConfig:
    page_size: int = 500  # the apiserver's own default chunk size for kubectl and informers
    gpu_resource: str = "nvidia.com/gpu"
    gpu_product_label: str = "nvidia.com/gpu.product"
    node_pool_labels: tuple[str, ...] = DEFAULT_NODE_POOL_LABELS  # first label present names the node's pool
    # Nodes of these pools count as GPU nodes even before the device plugin reports GPUs (booting burst nodes)
    gpu_pools: frozenset[str] = frozenset()
    gang_label: str | None = None  # a plain label whose value names the gang, when no scheduler integration does
    gang_min_available_annotation: str = "gpuautoscaler.dev/gang-min-available"
    checkpoint_annotation: str = "gpuautoscaler.dev/last-checkpoint"  # RFC 3339 or Unix seconds
    include_non_gpu_pods: bool = False
    # A pod requesting no ``gpu_resource`` but another resource of these prefixes (MIG slices, nvidia.com/mig-*; a
    # renamed time-sliced GPU, nvidia.com/gpu.shared) is kept, with 0 GPUs: dropped, a service whose replicas run on
    # MIG slices counted no replica bound, and its steady state read as a shortfall every tick (training stopped or
    # burst nodes bought for replicas that already run)
    accelerator_resource_prefixes: tuple[str, ...] = ("nvidia.com/",)
    include_non_gpu_nodes: bool = False
    deployment_label_selector: str | None = None
    read_podgroups: bool = True  # Volcano PodGroup minMember for gangs; skipped when no pod is in a PodGroup
    read_hpas: bool = True  # HorizontalPodAutoscalers, so that a Deployment an HPA scales is never written
    # Jobs, JobSets, PyTorchJobs, TFJobs, Kueue Workloads that ask for GPUs: a victim gang is suspended through its
    # spec rather than evicted pod by pod, and what we suspended is resumed later
    read_workloads: bool = True
    # NoSchedule taints that mean "this node is being removed" (Cluster Autoscaler's and Karpenter's): such a node,
    # like a cordoned one, takes no new pods and is no capacity. Not every NoSchedule taint: GPU nodes commonly carry
    # nvidia.com/gpu:NoSchedule, which GPU pods tolerate.
    # (Karpenter v1's karpenter.sh/disrupted; v0.32-v0.37 tainted karpenter.sh/disruption=disrupting)
    leaving_taints: tuple[str, ...] = (
        "ToBeDeletedByClusterAutoscaler",
        "karpenter.sh/disrupted",
        "karpenter.sh/disruption",
    )
    request_timeout_s: float = 10.0
    read_retries: int = 2
    retry_backoff_s: float = 0.2
    max_backoff_s: float = 2.0
    max_list_restarts: int = 2


_LEAVING_EFFECTS = ("NoSchedule", "NoExecute")
# Taints the node lifecycle and cloud controllers put on and take off by themselves (not-ready, unreachable, booting
# and uninitialized nodes...): a booting burst node carries them until it is up, and pods tolerate the NoExecute ones
# by default. Not a statement about which pods may run there.
_TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
# ... except, on a node that is Ready, the condition taints that keep new pods off while the condition lasts: a Ready
# node under disk pressure (a 20 GB model image pulled), memory or PID pressure, or without its network, is no room
# for a replica, and stopping training there frees nothing the scheduler will use
_CONDITION_TAINTS_WHEN_READY = frozenset(
    {
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
    }
)
# ... and the start-up taints node provisioners put on a new node until its agents are up (Cluster API's
# uninitialized, Cilium's agent-not-ready, Karpenter's unregistered): a booting node is no less room on its way
_TRANSIENT_TAINT_KEYS = frozenset(
    {"node.cluster.x-k8s.io/uninitialized", "node.cilium.io/agent-not-ready", "karpenter.sh/unregistered"}
)


def node_taints(raw: Any, ignore: tuple[str, ...] = (), ready: bool = False) -> tuple[Taint, ...]:
    """A node's ``spec.taints`` that keep pods off (NoSchedule, NoExecute), without the transient node-condition
    taints and the ``ignore`` keys (those already read as "leaving"). On a ``ready`` node the pressure and network
    condition taints are kept: they hold while the condition lasts."""
    out = []
    for t in _list(raw):
        t = _map(t)
        key, effect, value = t.get("key"), t.get("effect"), t.get("value")
        if not isinstance(key, str) or not key or effect not in _LEAVING_EFFECTS or key in ignore:
            continue
        if (key.startswith(_TRANSIENT_TAINT_PREFIXES) or key in _TRANSIENT_TAINT_KEYS) and not (
            ready and key in _CONDITION_TAINTS_WHEN_READY
        ):
            continue
        out.append(Taint(key, value if isinstance(value, str) else None, str(effect)))
    return tuple(out)


def _allocatable_beside(allocatable: Mapping[str, Any]) -> tuple[int, int] | None:
    """A node's allocatable (CPU millicores, memory bytes); None unless both are there and readable."""
    cpu, memory = allocatable.get("cpu"), allocatable.get("memory")
    if cpu is None or memory is None or isinstance(cpu, bool) or isinstance(memory, bool):
        return None
    cpu_milli, memory_bytes = _scaled_quantity(str(cpu), 1000), _scaled_quantity(str(memory), 1)
    return (cpu_milli, memory_bytes) if cpu_milli > 0 and memory_bytes > 0 else None


def _with_free_beside_gpus(nodes: list[NodeInfo], requested: Mapping[str, tuple[int, int]]) -> list[NodeInfo]:
    """Each node's CPU and memory free beside its GPUs (``NodeInfo.free_beside_gpus``): its allocatable (read with
    the node, ``free_beside_gpus`` holding it until now) less what the pods bound to it request (``requested``)."""
    out = []
    for node in nodes:
        if node.free_beside_gpus is not None:
            cpu, memory = node.free_beside_gpus
            used_cpu, used_memory = requested.get(node.name, (0, 0))
            node = replace(node, free_beside_gpus=(cpu - used_cpu, memory - used_memory))
        out.append(node)
    return out


def _template_gpus(pod_spec: Mapping[str, Any], resource: str) -> int | None:
    """GPUs a pod of this template requests, None when it cannot be read (containers that are not objects)."""
    try:
        return pod_gpus(pod_spec, resource)
    except (AttributeError, TypeError):
        return None


def pod_tolerations(pod_spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """A pod (template) spec's tolerations, plus those the ExtendedResourceToleration admission plugin gives a pod
    for each extended resource its containers or init containers request (``nvidia.com/gpu``, MIG slices...): a taint
    keyed by the resource, the usual ``nvidia.com/gpu:NoSchedule``, is tolerated by the pods requesting it even when
    their template does not say so, and by no other pod. The plugin's toleration has effect NoSchedule only: a
    ``NoExecute`` taint on the resource still keeps pods off that do not tolerate it themselves."""
    out = [Toleration(name, "Exists", None, "NoSchedule") for name in sorted(_extended_resources(pod_spec))]
    for t in _list(pod_spec.get("tolerations")):
        t = _map(t)
        key, operator, value, effect = t.get("key"), t.get("operator") or "Equal", t.get("value"), t.get("effect")
        out.append(
            Toleration(
                key if isinstance(key, str) and key else None,
                str(operator),
                value if isinstance(value, str) else None,
                effect if isinstance(effect, str) and effect else None,
            )
        )
    return tuple(out)


def _extended_resources(pod_spec: Mapping[str, Any]) -> set[str]:
    """The extended resources (a domain-prefixed name outside kubernetes.io: ``nvidia.com/gpu``) the containers and
    init containers request or limit, as the ExtendedResourceToleration admission plugin reads them."""
    names: set[str] = set()
    for name in _resource_names(pod_spec):
        domain = name.split("/", 1)[0] if "/" in name else ""
        if domain and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io"):
            names.add(name)
    return names


def _resource_names(spec: Mapping[str, Any]) -> Iterator[str]:
    """Every resource name a container or init container of the pod (template) requests or limits."""
    for container in [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]:
        resources = _map(_map(container).get("resources"))
        for section in (_map(resources.get("requests")), _map(resources.get("limits"))):
            yield from (k for k in section if isinstance(k, str))


# The annotations with which a pod's owner says no autoscaler may evict it voluntarily (the Cluster Autoscaler's,
# Karpenter's): honoured by the rebalancer's moves and by emptying a node, as those autoscalers honour them.
DO_NOT_DISRUPT_ANNOTATIONS = {
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
    "karpenter.sh/do-not-disrupt": "true",
}


# ... and with which a Node is kept from being removed by an autoscaler (the Cluster Autoscaler's, Karpenter's): no
# give-back, no emptying, no consolidation of that node.
NODE_DO_NOT_DISRUPT_ANNOTATIONS = {
    "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
    "karpenter.sh/do-not-disrupt": "true",
}


POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
_INT32 = (-(2**31), 2**31 - 1)


def deletion_cost(annotations: Mapping[str, Any]) -> int:
    """``controller.kubernetes.io/pod-deletion-cost`` as the ReplicaSet controller reads it
    (``GetDeletionCostFromPodAnnotations``): a base-10 int32 without a plus sign or leading zeros, 0 when unset or
    not such a value (the controller ignores the error and ranks the pod at 0)."""
    value = annotations.get(POD_DELETION_COST_ANNOTATION)
    if not isinstance(value, str) or not re.fullmatch(r"0|-?[1-9][0-9]*|-0", value):
        return 0
    cost = int(value)
    return cost if _INT32[0] <= cost <= _INT32[1] else 0


# The mark this controller writes beside a deletion cost it sets (``core.scale_down_choice``), and its value
DELETION_COST_BY_ANNOTATION = "gpuautoscaler.dev/deletion-cost-by"


def deletion_cost_by(annotations: Mapping[str, Any]) -> str | None:
    """Who set the pod's deletion cost (``PodInfo.deletion_cost_by``): None when it carries none,
    ``DELETION_COST_BY_US`` when our mark is beside it, "" when somebody else set it."""
    if POD_DELETION_COST_ANNOTATION not in annotations:
        return None
    return DELETION_COST_BY_US if annotations.get(DELETION_COST_BY_ANNOTATION) == DELETION_COST_BY_US else ""


def _do_not_disrupt(annotations: Mapping[str, Any], which: Mapping[str, str] = DO_NOT_DISRUPT_ANNOTATIONS) -> bool:
    return any(
        isinstance(annotations.get(key), str) and annotations[key].strip().lower() == value
        for key, value in which.items()
    )


def parse_gang(gang: str) -> tuple[str, str, str]:
    """``"jobset/ml/train-1"`` -> ``("jobset", "ml", "train-1")``: source, namespace, workload name."""
    source, namespace, name = gang.split("/", 2)
    return source, namespace, name


def _int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            from kubernetes.utils import parse_quantity

            return int(parse_quantity(value))  # type: ignore[no-untyped-call]
        except (ValueError, TypeError):
            return default


def pod_gpus(spec: Mapping[str, Any], resource: str) -> int:
    """Effective GPU request as kube-scheduler counts it (``core.cluster.effective_request``: sidecar init containers
    add to everything started after them).

    Extended resources have requests == limits; when only limits are set the request defaults to them. The pod's
    overhead (``spec.overhead``, from its RuntimeClass) is added on top, as ``resourcehelper.PodRequests`` does.
    """

    def amount(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        return _int(requests.get(resource, limits.get(resource)))

    app = [amount(c) for c in spec.get("containers") or []]
    init = [(amount(c), c.get("restartPolicy") == "Always") for c in spec.get("initContainers") or []]
    overhead = spec.get("overhead")
    extra = _int(overhead.get(resource)) if isinstance(overhead, Mapping) else 0
    return effective_request(app, init, extra)


@functools.lru_cache(maxsize=4096)
def _scaled_quantity(value: str, scale: int) -> int:
    """A Kubernetes quantity times ``scale``, rounded up (``"500m"`` CPU x 1000 = 500 millicores, ``"64Gi"`` x 1 =
    bytes), at most ``QUANTITY_CAP`` (the API server keeps a decimal exponent uncapped: "1e999990" is more than any
    node has, not an integer of millions of digits built for seconds); 0 when it cannot be read (a request the
    scheduler would have refused never reaches a bound pod). Pods repeat a few quantities: each is parsed once."""
    from decimal import MAX_EMAX, MIN_EMIN, Decimal, InvalidOperation, localcontext

    from kubernetes.utils import parse_quantity

    try:
        with localcontext() as context:  # an exponent past the default context's is a huge amount, not unreadable
            context.Emax, context.Emin = MAX_EMAX, MIN_EMIN
            amount = Decimal(parse_quantity(value)) * scale  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, InvalidOperation, ArithmeticError):
        return 0
    if not amount.is_finite() or amount <= 0:
        return 0
    if amount >= QUANTITY_CAP:
        return QUANTITY_CAP
    return int(amount.to_integral_value(rounding="ROUND_CEILING"))


# what a quantity counts at most (int64's largest, as the API server's own integer amounts): more than any node has
QUANTITY_CAP = (1 << 63) - 1


def _amount(value: Any, scale: int) -> int:
    """A quantity as read from the API (``_scaled_quantity``); 0 when absent or not a quantity."""
    if value is None or isinstance(value, bool):
        return 0
    return _scaled_quantity(value if isinstance(value, str) else str(value), scale)


def _requests_of(container: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory bytes) one container requests; a limit alone is the request (the API server's
    default)."""
    resources = container.get("resources")
    if not resources or not isinstance(resources, Mapping):
        return 0, 0
    requests, limits = _dict(resources.get("requests")), _dict(resources.get("limits"))
    cpu, memory = requests.get("cpu"), requests.get("memory")
    if cpu is None:
        cpu = limits.get("cpu")
    if memory is None:
        memory = limits.get("memory")
    return _amount(cpu, 1000), _amount(memory, 1)


def requests_beside_gpus(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory bytes) a pod (template) requests, as kube-scheduler counts them
    (``core.cluster.effective_request``: sidecar init containers beside what starts after them, the pod's overhead
    on top, a pod-level request in place of the containers'); a quantity that cannot be read counts 0 (unknown: it
    keeps no replica off a node). One pass over the containers: every pod of the cluster is read so each tick."""
    app_cpu = app_memory = 0
    for container in _list(spec.get("containers")):
        if type(container) is dict or isinstance(container, Mapping):
            cpu, memory = _requests_of(container)
            app_cpu += cpu
            app_memory += memory
    init_cpu: list[tuple[int, bool]] = []
    init_memory: list[tuple[int, bool]] = []
    for container in _list(spec.get("initContainers")):
        if type(container) is dict or isinstance(container, Mapping):
            cpu, memory = _requests_of(container)
            sidecar = container.get("restartPolicy") == "Always"
            init_cpu.append((cpu, sidecar))
            init_memory.append((memory, sidecar))
    overhead = _dict(spec.get("overhead"))
    # a pod-level request (``spec.resources``, PodLevelResources) replaces the containers' (``PodRequests``)
    pod_level = _dict(_dict(spec.get("resources")).get("requests"))
    out = []
    for resource, scale, app, init in (("cpu", 1000, app_cpu, init_cpu), ("memory", 1, app_memory, init_memory)):
        extra = _amount(overhead.get(resource), scale)
        level = pod_level.get(resource)
        if level is not None and not isinstance(level, bool):
            out.append(_amount(level, scale) + extra)
        else:
            out.append(effective_request([app], init, extra))
    return out[0], out[1]


def node_selector_of(spec: Mapping[str, Any]) -> Mapping[str, str]:
    """Where a pod (template) spec lets kube-scheduler place it by node labels: its ``nodeSelector`` (string entries
    only: anything else a malformed object carries selects nothing kube-scheduler would match) and, when it has one,
    its required node affinity (``core.cluster.NodeSelector``). A plain dict when it has no required affinity."""
    labels = {k: v for k, v in _map(spec.get("nodeSelector")).items() if isinstance(k, str) and isinstance(v, str)}
    return selector_with_affinity(labels, required_affinity_of(spec))


def required_affinity_of(spec: Mapping[str, Any]) -> tuple[tuple[NodeRequirement, ...], ...] | None:
    """The terms of a pod spec's ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` (None when
    it has none), each the requirements of its ``matchExpressions`` and ``matchFields``. A requirement the API server
    would refuse (a key or value that is no string, values or expressions that are no list) is kept as one that holds
    nowhere: its term admits no node, as kube-scheduler treats a term it cannot parse; an affinity that is no object
    where one is due has no terms, and admits no node either (never read as none, which admits every node). Only the
    required affinity filters nodes; the preferred one scores."""
    required: Any = spec
    for field_name in ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        required = required.get(field_name)
        if required is None:
            return None
        if not isinstance(required, Mapping):
            return ()  # unreadable: admits no node
    terms = []
    for raw_term in _list(required.get("nodeSelectorTerms")):
        term = _map(raw_term)
        requirements = []
        for on_name, field_name in ((False, "matchExpressions"), (True, "matchFields")):
            raw_exprs = term.get(field_name)
            if raw_exprs is None:
                raw_exprs = []
            elif not isinstance(raw_exprs, list):
                raw_exprs = [None]  # unreadable: a requirement that holds nowhere
            for raw_expr in raw_exprs:
                expr = _map(raw_expr)
                key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values", [])
                if values is None:
                    values = []
                if not (
                    isinstance(key, str)
                    and isinstance(operator, str)
                    and isinstance(values, list)
                    and all(isinstance(v, str) for v in values)
                ):
                    key, operator, values = "", "", []  # holds nowhere
                requirements.append(NodeRequirement(key, operator, tuple(values), on_name))
        terms.append(tuple(requirements))
    return tuple(terms)


def required_pod_anti_affinity_of(spec: Mapping[str, Any], namespace: str) -> tuple[PodAntiAffinityTerm, ...]:
    """The terms of a pod spec's ``affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution``: the
    pods each keeps it away from (its ``labelSelector``; null selects none), the node label whose value is the domain
    (``topologyKey``), and their namespaces -- its ``namespaces``, else the pod's own; with a ``namespaceSelector``
    every namespace (the namespaces' labels are not read: more nodes kept, never fewer). A term the API server would
    refuse (no topologyKey, a selector it cannot parse) is not kept. ``matchLabelKeys`` (which narrows a term to,
    say, one ReplicaSet's pods) is not read: the term is taken as its selector alone, wider."""
    raw_terms = _map(_map(_map(spec.get("affinity")).get("podAntiAffinity"))).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = []
    for raw in _list(raw_terms):
        term = _map(raw)
        key = term.get("topologyKey")
        if not isinstance(key, str) or not key:
            continue
        try:
            selector = pdb_selector(term.get("labelSelector"))
        except ValueError:
            continue
        namespaces: frozenset[str] | None
        if term.get("namespaceSelector") is not None:
            namespaces = None
        else:
            listed = frozenset(n for n in _list(term.get("namespaces")) if isinstance(n, str) and n)
            namespaces = listed or frozenset({namespace})
        terms.append(PodAntiAffinityTerm(selector, key, namespaces))
    return tuple(terms)


def hard_spread_constraints_of(spec: Mapping[str, Any]) -> tuple[TopologySpreadConstraint, ...]:
    """A pod spec's ``topologySpreadConstraints`` that filter nodes (``whenUnsatisfiable: DoNotSchedule``; the
    ``ScheduleAnyway`` ones only score): ``maxSkew``, ``topologyKey``, ``labelSelector`` (null counts no pod),
    ``minDomains`` (1 when unset) and the node inclusion policies (``nodeAffinityPolicy`` Honor unless Ignore,
    ``nodeTaintsPolicy`` Ignore unless Honor). A constraint the API server would refuse (no key, a skew below 1, a
    selector it cannot parse) is not kept. ``matchLabelKeys`` (which narrows the count to, say, one ReplicaSet's
    pods) is not read: every pod the selector matches is counted, wider during a rollout."""
    constraints = []
    for raw in _list(spec.get("topologySpreadConstraints")):
        item = _map(raw)
        if item.get("whenUnsatisfiable") != "DoNotSchedule":
            continue
        key, skew, min_domains = item.get("topologyKey"), item.get("maxSkew"), item.get("minDomains")
        if not isinstance(key, str) or not key or not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
            continue
        if min_domains is None:
            min_domains = 1
        if not isinstance(min_domains, int) or isinstance(min_domains, bool) or min_domains < 1:
            continue
        try:
            selector = pdb_selector(item.get("labelSelector"))
        except ValueError:
            continue
        constraints.append(
            TopologySpreadConstraint(
                skew,
                key,
                selector,
                min_domains,
                honor_node_affinity=item.get("nodeAffinityPolicy") != "Ignore",
                honor_taints=item.get("nodeTaintsPolicy") == "Honor",
            )
        )
    return tuple(constraints)


def _gpu_pods_place(templates: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, str], tuple[int, int]]:
    """``WorkloadInfo.node_selector`` and ``pod_beside`` of a workload whose GPU pods come from ``templates`` (pod
    specs): one selector and one request stand for all its pods, so when its templates differ (a PyTorchJob's master
    and workers on different pools) only what every one of them asks is kept -- the labels all select alike, and per
    resource the least any requests -- never stricter for a pod than the scheduler is (the first template's alone
    ruled out, for every pod, the nodes only the other templates' pods may use: such a workload was never resumed)."""
    selectors = [node_selector_of(t) for t in templates]
    common = _shared_labels(selectors)
    # a required affinity only when every template has the same one (templates of different affinities: none kept,
    # looser than any, as the labels are)
    affinities = {affinity_of(s) for s in selectors}
    affinity = next(iter(affinities)) if len(affinities) == 1 else None
    requests = [requests_beside_gpus(t) for t in templates]
    beside = (min(r[0] for r in requests), min(r[1] for r in requests)) if requests else (0, 0)
    return selector_with_affinity(common, affinity), beside


def _shared_labels(labels: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The labels every one of ``labels`` holds with the same value: what a workload's GPU pods all carry, or all
    select (one set stands for them all: templates that differ -- a master's and its workers' -- keep only what they
    share)."""
    shared = dict(labels[0]) if labels else {}
    for other in labels[1:]:
        shared = {k: v for k, v in shared.items() if other.get(k) == v}
    return shared


def _shared_terms(terms: Sequence[tuple[PodAntiAffinityTerm, ...]]) -> tuple[PodAntiAffinityTerm, ...]:
    """The required anti-affinity terms every one of a workload's GPU pod templates has (looser than any: the
    workers' own terms, when the master has none, are not kept)."""
    if not terms:
        return ()
    return tuple(t for t in terms[0] if all(t in other for other in terms[1:]))


def _as_created(spec: Mapping[str, Any], labels: Mapping[str, str]) -> Mapping[str, Any]:
    """A pod template's spec with its required pod anti-affinity terms as the API server makes them on a pod created
    from it with ``labels`` (KEP-3633, MatchLabelKeysInPodAffinity): each ``matchLabelKeys`` key merged into the
    term's labelSelector as ``key In (value)``, each ``mismatchLabelKeys`` key as ``key NotIn (value)``. A template
    is not a pod: it is stored unmerged, and read as its selector alone a term is wider than its pods' (this Job's
    workers one per node becomes one per node with every other trainer's pods). A key ``labels`` do not carry -- one
    the controller sets per pod (a replica index), or none -- narrows the real term by a value not known here: the
    term is left out (looser; as its selector alone it would keep the pods off nodes their real term allows)."""
    anti = _map(_map(spec.get("affinity")).get("podAntiAffinity"))
    raw_terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not any(_map(t).get("matchLabelKeys") or _map(t).get("mismatchLabelKeys") for t in _list(raw_terms)):
        return spec
    terms: list[Any] = []
    for raw in _list(raw_terms):
        term = _map(raw)
        keys = [(k, "In") for k in _list(term.get("matchLabelKeys"))]
        keys += [(k, "NotIn") for k in _list(term.get("mismatchLabelKeys"))]
        selector = term.get("labelSelector")
        if not keys or not isinstance(selector, Mapping):
            terms.append(raw)
            continue
        if not all(isinstance(k, str) and k in labels for k, _ in keys):
            continue
        expressions = list(_list(selector.get("matchExpressions")))
        expressions += [{"key": k, "operator": op, "values": [labels[k]]} for k, op in keys]
        terms.append({**term, "labelSelector": {**selector, "matchExpressions": expressions}})
    affinity = {
        **_map(spec.get("affinity")),
        "podAntiAffinity": {**anti, "requiredDuringSchedulingIgnoredDuringExecution": terms},
    }
    return {**spec, "affinity": affinity}


def _requests_any(spec: Mapping[str, Any], prefixes: tuple[str, ...]) -> bool:
    """Whether a container (or init container) of the pod requests a resource whose name starts with a prefix."""
    return bool(prefixes) and any(name.startswith(prefixes) for name in _resource_names(spec))


def pinned_product(pod_spec: Mapping[str, Any], label: str) -> str | None:
    """The one GPU type a pod (or pod template) can be placed on, as kube-scheduler's NodeAffinity filter allows it:
    its ``nodeSelector`` entry, else a required node affinity every term of which (terms are ORed) admits only that
    type through an ``In`` on the label. None when it accepts any type, or several."""
    selected = _map(pod_spec.get("nodeSelector")).get(label)
    if isinstance(selected, str) and selected:
        return selected
    node_affinity = _map(_map(pod_spec.get("affinity")).get("nodeAffinity"))
    terms = _list(_map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")).get("nodeSelectorTerms"))
    allowed: set[str] = set()
    for term in terms:
        term_allowed: set[str] | None = None
        for raw_expr in _list(_map(term).get("matchExpressions")):
            expr = _map(raw_expr)
            values = _list(expr.get("values"))
            if expr.get("key") != label or expr.get("operator") != "In" or not all(isinstance(v, str) for v in values):
                continue
            term_allowed = set(values) if term_allowed is None else term_allowed & set(values)
        if term_allowed is None:
            return None  # this term lets any type through
        allowed |= term_allowed
    return next(iter(allowed)) if len(allowed) == 1 else None


def pdb_selector(raw: object) -> dict[str, str | LabelTest]:
    """A PodDisruptionBudget's ``spec.selector`` as the core's selector mapping, meaning what it means to Kubernetes
    (policy/v1, ``metav1.LabelSelectorAsSelector``): null selects no pod, ``{}`` (no matchLabels, no matchExpressions)
    every pod of the namespace, otherwise a pod must have every ``matchLabels`` entry and meet every
    ``matchExpressions`` requirement (In, NotIn, Exists, DoesNotExist).

    Raises ``ValueError`` for a selector the API server would not have accepted (unknown operator, In/NotIn without
    values, Exists/DoesNotExist with values, a key or value that is not a string...).
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"selector is {type(raw).__name__}, not an object")
    match_labels = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping):
        raise ValueError(f"matchLabels is {type(match_labels).__name__}, not an object")
    if not isinstance(expressions, list):
        raise ValueError(f"matchExpressions is {type(expressions).__name__}, not a list")
    if not match_labels and not expressions:
        return selector_matching_every_pod()
    requirements: dict[str, list[tuple[str, frozenset[str]]]] = {}
    for key, value in match_labels.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise ValueError(f"matchLabels entry {key!r}: {value!r} is not a label")
        requirements.setdefault(key, []).append(("In", frozenset({value})))
    for expr in expressions:
        if not isinstance(expr, Mapping):
            raise ValueError(f"matchExpressions item {expr!r} is not an object")
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or not key:
            raise ValueError(f"matchExpressions item {dict(expr)!r} has no key")
        if operator not in SELECTOR_OPERATORS:
            raise ValueError(f"matchExpressions operator {operator!r} on {key!r} is not a Kubernetes one")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"matchExpressions values of {key!r} are not a list of strings")
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"matchExpressions {operator} on {key!r} has no values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"matchExpressions {operator} on {key!r} has values")
        requirements.setdefault(key, []).append((operator, frozenset(values)))
    selector: dict[str, str | LabelTest] = {}
    for key, found in requirements.items():
        (operator, values), *rest = found
        if not rest and operator == "In" and len(values) == 1:
            selector[key] = next(iter(values))  # one value: a plain matchLabels entry
        else:
            selector[key] = LabelTest(tuple(found))
    return selector


def _latest(*times: float | None) -> float | None:
    """The latest of the known times, None when none is known."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


KUEUE_PREFIX = "kueue.x-k8s.io/"


def _kueue_marked(meta: Mapping[str, Any], pod_spec: Mapping[str, Any] | None = None) -> bool:
    """Whether an object carries a mark of Kueue: a ``kueue.x-k8s.io/`` label or annotation (a Job's queue name, a
    pod's workload or pod group), or, on a pod, one of Kueue's scheduling gates."""
    keys: list[Any] = [*_map(meta.get("labels")), *_map(meta.get("annotations"))]
    if pod_spec is not None:
        keys += [_map(gate).get("name") for gate in _list(pod_spec.get("schedulingGates"))]
    return any(isinstance(key, str) and key.startswith(KUEUE_PREFIX) for key in keys)


def _quota_refused(workload_status: Mapping[str, Any]) -> bool:
    """Whether a Kueue Workload's status says it holds no quota now (``QuotaReserved`` False: pending, or evicted)."""
    reserved = _condition(workload_status, "QuotaReserved")
    return bool(reserved and reserved.get("status") == "False")


def deployment_for_replicaset(rs_name: str, pod_template_hash: str | None) -> str | None:
    """A ReplicaSet ``<deployment>-<pod-template-hash>`` belongs to ``<deployment>``; saves listing ReplicaSets."""
    if pod_template_hash and rs_name.endswith("-" + pod_template_hash):
        return rs_name[: -len(pod_template_hash) - 1]
    return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _dict(value: Any) -> Mapping[str, Any]:
    """``_map``, its common case (a JSON object) first: every pod's requests are read so, each tick."""
    return value if type(value) is dict else _map(value)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _job_pods(job_spec: Mapping[str, Any], job_status: Mapping[str, Any] | None = None) -> int:
    """Pods a Job runs at once: ``parallelism`` (default 1), at most the ``completions`` still to do when set (the Job
    controller's ``min(parallelism, completions - succeeded)``: a resumed Job does not run its finished pods again)."""
    pods = _int(job_spec.get("parallelism"), 1)
    completions = job_spec.get("completions")
    if completions is None:
        return pods
    done = _int(_map(job_status).get("succeeded"), 0)
    return max(0, min(pods, _int(completions, pods) - max(0, done)))


def _seconds(value: Any) -> float | None:
    """A non-negative finite number of seconds, else None (a bad annotation falls back to the default)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def suspended_by_us_at(annotations: Mapping[str, Any], generation: Any) -> float | None:
    """When this controller suspended the workload, from the annotations its suspension wrote; None when they are
    absent, unreadable, or stale (the spec changed since: someone resumed and suspended it again by hand)."""
    if not annotations.get(SUSPENDED_BY_ANNOTATION):
        return None
    ours = annotations.get(SUSPENDED_GENERATION_ANNOTATION)
    if ours is not None and generation is not None and str(ours) != str(generation):
        return None
    return parse_time(annotations.get(SUSPENDED_AT_ANNOTATION))


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class ReadStats:
    api_calls: int = 0
    seconds: float = 0.0
    objects: dict[str, int] = field(default_factory=dict)


class KubeClusterReader:
    """``ClusterReader`` for a live cluster. ``last_stats`` tells how many API calls the last snapshot took."""

    def __init__(
        self,
        api_client: client.ApiClient,
        config: ReaderConfig | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config or ReaderConfig()
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._scheduling = client.SchedulingV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._calls = 0
        self._podgroups_missing_logged = False
        self._hpas_missing_logged = False
        # the HPAs the last list that answered read; None until one answered (``_hpas``)
        self._last_hpas: tuple[HpaInfo, ...] | None = None
        self._hpas_kept_logged = False
        self._workloads_forbidden_logged: set[str] = set()
        # the workload kinds the last read was refused (403): a Job Kueue manages is then not suspended directly
        self._workloads_forbidden: frozenset[str] = frozenset()
        # the workload kinds whose list answered since this reader started: one of them refused later is named in the
        # snapshot (``ClusterSnapshot.training_unread``), said once per refusal
        self._workloads_answered: set[str] = set()
        self._workloads_unread_logged: set[str] = set()
        self._training_unread: tuple[str, ...] = ()
        self._kueue_unreadable_logged = False
        self._served_versions: dict[str, str] = {}  # workload kind -> the version its list last answered at
        # Something read in this snapshot is managed by Kueue (a kueue.x-k8s.io/ label, annotation or gate): only then
        # is a Workload list that 404s asked again at Kueue's other version, so a cluster without Kueue pays no
        # second 404 every tick. (Once a version answered, it is asked first and the other one always follows.)
        self._kueue_seen = False
        # gang -> the pods of it the last snapshot left out for asking no GPU ("namespace/name": a list restarted
        # after its continue token expired converts a pod twice), counted off its minAvailable
        self._unread_members: dict[str, set[str]] = {}
        self._autoscaling = client.AutoscalingV2Api(api_client)
        self.last_stats = ReadStats()
        # pod uid -> the earliest Ready time read for it (``PodInfo.first_ready_at``), for the pods of the last snapshot
        self._first_ready: dict[str, float] = {}
        # node name -> when this reader first saw every GPU of it unhealthy, for the nodes so in the last snapshot
        self._unhealthy_since: dict[str, float] = {}
        cfg = self.config
        self._pager = Pager(
            page_size=cfg.page_size,
            timeout_s=cfg.request_timeout_s,
            retries=cfg.read_retries,
            backoff_s=cfg.retry_backoff_s,
            max_backoff_s=cfg.max_backoff_s,
            max_restarts=cfg.max_list_restarts,
            sleep=sleep,
            on_call=self._count_call,
        )

    def _count_call(self) -> None:
        self._calls += 1

    # -- the port --

    def snapshot(self, now: float) -> ClusterSnapshot:
        # Parsing 20,000 pods allocates millions of dicts with no reference cycles; the cyclic GC would walk them
        # again and again for nothing (40 % of the snapshot's time at 20,000 pods). Refcounting still frees them.
        with _gc_paused():
            return self._snapshot(now)

    def _snapshot(self, now: float) -> ClusterSnapshot:
        started, self._calls = time.monotonic(), 0
        self._kueue_seen = False
        cfg = self.config
        self._unread_members = {}
        priority_classes, default_priority = self._priority_classes()
        deployments = self._pager.items(
            "list deployments",
            self._apps.list_deployment_for_all_namespaces,
            **({"label_selector": cfg.deployment_label_selector} if cfg.deployment_label_selector else {}),
        )

        # Finished pods hold no GPUs; let the server drop them rather than shipping them to us. Pods and nodes are
        # converted page by page: their raw JSON is most of a large cluster's list, and is never held whole.
        def convert(raw: JSON) -> tuple[PodInfo | None, tuple[str, int, int] | None] | None:
            # read once, for its node's sum and for the pod; every pod bound to a node counts: the CPU-only pods the
            # snapshot leaves out take a node's CPU and memory as well
            requests = requests_beside_gpus(_map(raw.get("spec")))
            node = _map(raw.get("spec")).get("nodeName")
            used = (node, *requests) if node and isinstance(node, str) and (requests[0] or requests[1]) else None
            pod = self._pod(raw, priority_classes, default_priority, requests)
            return None if pod is None and used is None else (pod, used)

        entries, pod_count = self._pager.converted(
            "list pods",
            convert,
            self._core.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        # summed over this list's own items: a list restarted after its continue token expired (``Pager``) converts
        # its first pages again, and a sum kept as they were converted counted their pods twice
        requested: dict[str, tuple[int, int]] = {}  # node -> (CPU millicores, memory bytes) its pods request
        converted = []
        for pod, used in entries:
            if pod is not None:
                converted.append(pod)
            if used is not None:
                node, cpu, memory = used
                before = requested.get(node, (0, 0))
                requested[node] = (before[0] + cpu, before[1] + memory)
        del entries
        nodes, node_count = self._pager.converted("list nodes", self._node, self._core.list_node)
        raw_pdbs = self._pager.items(
            "list poddisruptionbudgets", self._policy.list_pod_disruption_budget_for_all_namespaces
        )
        hpas = self._hpas()
        raw_workloads = self._raw_workloads()
        pods = self._with_first_ready(self._with_unread_members(self._with_podgroup_min_available(converted)))
        nodes = _with_free_beside_gpus(self._with_unhealthy_since(nodes, now), requested)
        snapshot = ClusterSnapshot(
            time=now,
            deployments=tuple(
                self._deployment(d, self.config.gpu_product_label, self.config.gpu_resource) for d in deployments
            ),
            pods=tuple(pods),
            nodes=tuple(nodes),
            priority_classes=priority_classes,
            pdbs=tuple(self._pdb(p) for p in raw_pdbs),
            hpas=hpas,
            workloads=self._workloads(raw_workloads, priority_classes, default_priority),
            training_unread=self._training_unread,
        )
        self.last_stats = ReadStats(
            api_calls=self._calls,
            seconds=time.monotonic() - started,
            objects={
                "deployments": len(deployments),
                "pods": pod_count,
                "gpu_pods": len(pods),
                "nodes": node_count,
                "gpu_nodes": len(nodes),
                "pdbs": len(raw_pdbs),
                "priorityclasses": len(priority_classes),
                "hpas": len(hpas),
                "workloads": sum(len(items) for items in raw_workloads.values()),
                "gpu_workloads": len(snapshot.workloads),
            },
        )
        return snapshot

    # -- conversions --

    def _priority_classes(self) -> tuple[dict[str, int], int]:
        items = self._pager.items("list priorityclasses", self._scheduling.list_priority_class)
        classes = {pc["metadata"]["name"]: _int(pc.get("value")) for pc in items}
        # Two global defaults can exist (created in a race validation cannot see): the Priority admission plugin then
        # gives a pod without a class the lowest of their values.
        default = min((_int(pc.get("value")) for pc in items if pc.get("globalDefault")), default=0)
        return classes, default

    @staticmethod
    def _deployment(
        raw: JSON, gpu_product_label: str = "nvidia.com/gpu.product", gpu_resource: str = "nvidia.com/gpu"
    ) -> DeploymentInfo:
        meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
        replicas = spec.get("replicas")
        pod_spec = ((spec.get("template") or {}).get("spec")) or {}
        product = pinned_product(_map(pod_spec), gpu_product_label)
        cpu_milli, memory_bytes = requests_beside_gpus(_map(pod_spec))
        # the GPU type is ``gpu_product`` (matched on the pool's type for a node not labelled yet): not repeated here
        selector = without_label(node_selector_of(_map(pod_spec)), gpu_product_label)
        return DeploymentInfo(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            spec_replicas=1 if replicas is None else _int(replicas),  # the API's default when unset
            ready_replicas=_int(status.get("readyReplicas")),
            selector=dict(((spec.get("selector") or {}).get("matchLabels")) or {}),
            gpu_product=product,
            # pods created and not terminating: what the scale subresource's status.replicas shows (it is this
            # field); the API omits a zero, and the HPA reads a missing one as 0 too
            status_replicas=_int(status.get("replicas")),
            node_selector=selector,
            tolerations=pod_tolerations(_map(pod_spec)),
            gpus_per_pod=_template_gpus(_map(pod_spec), gpu_resource),
            cpu_milli_per_pod=cpu_milli,
            memory_bytes_per_pod=memory_bytes,
            pod_labels={
                k: v
                for k, v in _map(_map((spec.get("template") or {}).get("metadata")).get("labels")).items()
                if isinstance(k, str) and isinstance(v, str)
            },
            anti_affinity=required_pod_anti_affinity_of(_map(pod_spec), meta.get("namespace", "")),
            spread_constraints=hard_spread_constraints_of(_map(pod_spec)),
        )

    def _gang(
        self, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> tuple[str | None, int | None]:
        cfg = self.config
        explicit_min = annotations.get(cfg.gang_min_available_annotation)
        min_available = (_int(explicit_min, 0) or None) if explicit_min is not None else None
        for key in VOLCANO_GROUP_ANNOTATIONS:
            if annotations.get(key):
                return f"volcano/{namespace}/{annotations[key]}", min_available
        if labels.get(VOLCANO_JOB_LABEL):
            return f"volcano/{namespace}/{labels[VOLCANO_JOB_LABEL]}", min_available
        workload = annotations.get(KUEUE_WORKLOAD_KEY) or labels.get(KUEUE_WORKLOAD_KEY)
        if workload:
            return f"kueue/{namespace}/{workload}", min_available
        if labels.get(KUEUE_POD_GROUP_LABEL):
            total = annotations.get(KUEUE_POD_GROUP_COUNT_ANNOTATION)
            return f"kueue/{namespace}/{labels[KUEUE_POD_GROUP_LABEL]}", min_available or (
                _int(total) if total else None
            )
        if labels.get(JOBSET_LABEL):
            return f"jobset/{namespace}/{labels[JOBSET_LABEL]}", min_available
        if labels.get(KUBEFLOW_LABEL):
            return f"kubeflow/{namespace}/{labels[KUBEFLOW_LABEL]}", min_available
        for key in JOB_NAME_LABELS:
            if labels.get(key):
                return f"job/{namespace}/{labels[key]}", min_available
        if cfg.gang_label and labels.get(cfg.gang_label):
            return f"label/{namespace}/{labels[cfg.gang_label]}", min_available
        for key in COSCHEDULING_POD_GROUP_LABELS:
            if labels.get(key):
                return f"podgroup/{namespace}/{labels[key]}", min_available
        return None, None

    def _count_unread_member(self, meta: JSON, spec: JSON, status: JSON) -> None:
        """A pod left out for asking no GPU (an MPI launcher, a Ray head, a parameter server) still counts towards
        its gang's minAvailable: noted under its gang, for ``_with_unread_members``. Not one being deleted, finished,
        or held by a scheduling gate before it was bound (the scheduler does not place it: it brings the gang no
        nearer its minimum, as such GPU pods are not read either)."""
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            return
        if not spec.get("nodeName") and _list(spec.get("schedulingGates")):
            return
        namespace = meta.get("namespace", "")
        gang, _ = self._gang(namespace, meta.get("labels") or {}, meta.get("annotations") or {})
        if gang is None:  # as ``_pod``: a non-serving controller's pods are one job (a ReplicaSet is serving)
            owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
            kind, name = (owner.get("kind"), owner.get("name")) if owner is not None else (None, None)
            if kind and name and kind not in SERVING_OWNER_KINDS:
                gang = f"owner/{namespace}/{kind}/{name}"
        if gang is not None:
            self._unread_members.setdefault(gang, set()).add(f"{namespace}/{meta.get('name', '')}")

    def _with_unread_members(self, pods: list[PodInfo]) -> list[PodInfo]:
        """A gang's minAvailable less its live pods left out for asking no GPU (``_count_unread_member``): what its
        pods read must reach (``PodInfo.gang_min_available``). Read whole, the GPU pods of an MPI job whose
        launcher asks for none would look one short of its minAvailable, a gang that cannot start."""
        unread = self._unread_members
        if not unread:
            return pods
        return [
            replace(pod, gang_min_available=max(1, pod.gang_min_available - len(unread[pod.gang])))
            if pod.gang in unread and pod.gang_min_available is not None
            else pod
            for pod in pods
        ]

    def _pod(
        self,
        raw: JSON,
        priority_classes: Mapping[str, int],
        default_priority: int,
        requests: tuple[int, int] | None = None,
    ) -> PodInfo | None:
        cfg = self.config
        meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
        gpus = pod_gpus(spec, cfg.gpu_resource)
        if gpus <= 0 and not cfg.include_non_gpu_pods and not _requests_any(spec, cfg.accelerator_resource_prefixes):
            self._count_unread_member(meta, spec, status)
            return None
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if not self._kueue_seen:
            self._kueue_seen = _kueue_marked(meta, spec)
        namespace = meta.get("namespace", "")
        priority = spec.get("priority")
        if priority is None:
            priority = priority_classes.get(spec.get("priorityClassName") or "", default_priority)
        owner_kind = owner_name = None
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller"):
                owner_kind, owner_name = ref.get("kind"), ref.get("name")
                break
        if owner_kind == "ReplicaSet" and owner_name:
            deployment = deployment_for_replicaset(owner_name, labels.get("pod-template-hash"))
            if deployment:
                owner_kind, owner_name = "Deployment", deployment
        gang, gang_min = self._gang(namespace, labels, annotations)
        if gang is None and owner_kind and owner_name and owner_kind not in SERVING_OWNER_KINDS:
            # Pods of one controller no gang key names (a RayCluster's workers, an operator's own kind) are one
            # job: taken one by one they would each be a gang of their own, and evicting some kills the whole run.
            gang = f"owner/{namespace}/{owner_kind}/{owner_name}"
        ready_cond = _condition(status, "Ready")
        ready = bool(ready_cond and ready_cond.get("status") == "True")
        scheduled_cond = _condition(status, "PodScheduled")
        scheduled = bool(scheduled_cond and scheduled_cond.get("status") == "True")
        terminating = bool(meta.get("deletionTimestamp"))
        if terminating and not spec.get("nodeName"):
            # Being deleted before it was ever bound (a finalizer such as Kueue's holds it): it holds no GPUs and
            # the scheduler will never place it, so it is no work waiting for GPUs either.
            return None
        if not spec.get("nodeName") and _list(spec.get("schedulingGates")):
            # Held by a scheduling gate (a dataset being staged, Kueue's admission): the scheduler does not even try
            # it, so no GPU freed or bought now can start it (Cluster Autoscaler and Karpenter act only on pods the
            # scheduler marked Unschedulable). Once its gates are removed it is read as any pending pod.
            return None
        product = pinned_product(spec, cfg.gpu_product_label)
        cpu_milli, memory_bytes = requests if requests is not None else requests_beside_gpus(spec)
        return PodInfo(
            namespace=namespace,
            name=meta.get("name", ""),
            node=spec.get("nodeName") or None,
            gpus=gpus,
            priority=_int(priority),
            phase=status.get("phase") or "Unknown",
            # A terminating pod still holds its GPUs but is leaving: never count it as serving capacity.
            ready=ready and not terminating,
            owner_kind=owner_kind,
            owner_name=owner_name,
            gang=gang,
            gang_min_available=gang_min,
            created_at=parse_time(meta.get("creationTimestamp")),
            scheduled_at=parse_time(scheduled_cond.get("lastTransitionTime")) if scheduled and scheduled_cond else None,
            ready_at=parse_time(ready_cond.get("lastTransitionTime")) if ready and ready_cond else None,
            last_checkpoint_at=parse_time(annotations.get(cfg.checkpoint_annotation)),
            labels=dict(labels),
            gpu_product=product,
            terminating=terminating,
            deletion_at=parse_time(meta.get("deletionTimestamp")) if terminating else None,
            uid=meta.get("uid") if isinstance(meta.get("uid"), str) else None,
            do_not_disrupt=_do_not_disrupt(annotations),
            node_selector=node_selector_of(spec),
            tolerations=pod_tolerations(spec),
            restarts=sum(max(0, _int(_map(c).get("restartCount"))) for c in _list(status.get("containerStatuses"))),
            deletion_cost=deletion_cost(annotations),
            deletion_cost_by=deletion_cost_by(annotations),
            cpu_milli=cpu_milli,
            memory_bytes=memory_bytes,
            anti_affinity=required_pod_anti_affinity_of(spec, namespace),
        )

    def _hpas(self) -> tuple[HpaInfo, ...]:
        """Every HorizontalPodAutoscaler (autoscaling/v2). Without RBAC for them (403) the controller goes on as
        before, saying once that it cannot see HPAs: an upgrade must not stop the scaling. A list refused after one
        answered (an authorization webhook down, a ClusterRole being re-applied) is not "no HPA": the HPAs last read
        are kept, so a Deployment an HPA scales stays recommend-only instead of being scaled down by two
        controllers for an API error."""
        if not self.config.read_hpas:
            return ()
        try:
            items = self._pager.items(
                "list horizontalpodautoscalers", self._autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces
            )
        except KubeApiError as exc:
            if exc.status not in (403, 404):
                raise
            if self._last_hpas is not None:
                if not self._hpas_kept_logged:  # once while the list stays refused
                    log.warning(
                        "HorizontalPodAutoscalers not readable (%s): the %d read last are kept until the list answers",
                        exc,
                        len(self._last_hpas),
                    )
                    self._hpas_kept_logged = True
                return self._last_hpas
            if not self._hpas_missing_logged:
                log.warning(
                    "HorizontalPodAutoscalers not readable (%s): a Deployment an HPA also scales is not "
                    "detected; grant list on horizontalpodautoscalers",
                    exc,
                )
                self._hpas_missing_logged = True
            return ()
        out = []
        for raw in items:
            meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
            ref = spec.get("scaleTargetRef") or {}
            out.append(
                HpaInfo(
                    namespace=meta.get("namespace", ""),
                    name=meta.get("name", ""),
                    target_kind=ref.get("kind", ""),
                    target_name=ref.get("name", ""),
                    min_replicas=_int(spec.get("minReplicas"), 1),
                    max_replicas=_int(spec.get("maxReplicas"), 0),
                    current_replicas=None if status.get("currentReplicas") is None else _int(status["currentReplicas"]),
                    desired_replicas=None if status.get("desiredReplicas") is None else _int(status["desiredReplicas"]),
                )
            )
        self._last_hpas, self._hpas_kept_logged = tuple(out), False
        return self._last_hpas

    # -- training workloads --

    def _raw_workloads(self) -> dict[str, list[JSON]]:
        """Every object of each suspendable kind (kind -> items). A CRD that is not installed (404) is skipped
        silently; a kind RBAC does not let us list (403) is said once and skipped: its gangs are then evicted pod by
        pod instead of suspended, and what we suspended is not resumed. A kind whose list answered before and is
        refused now (an authorization webhook down, a ClusterRole being re-applied) is named in
        ``ClusterSnapshot.training_unread``: read as "none of that kind", its training lost what protects it (its own
        minimum runtime, a Kueue Workload standing for it) and was stopped for an API error; now no training is
        stopped while it lasts, and the scaling goes on."""
        self._workloads_forbidden = frozenset()
        self._training_unread = ()
        if not self.config.read_workloads:
            return {}
        out: dict[str, list[JSON]] = {}
        forbidden: set[str] = set()
        unread: list[str] = []
        for kind, spec in WORKLOAD_KINDS.items():
            what = f"list {spec.plural}.{spec.group}"
            try:
                if kind == "Job":
                    items = self._pager.items(what, self._batch.list_job_for_all_namespaces)
                else:
                    may_fall_back = kind != "Workload" or self._kueue_seen or kind in self._served_versions
                    items = self._list_served(what, kind, spec, may_fall_back)
            except KubeApiError as exc:
                if exc.status == 404:
                    log.debug("%s: not installed (%s)", what, exc)
                    continue
                if exc.status != 403:
                    raise
                forbidden.add(kind)  # (a Job Kueue manages is then not suspended through its own spec either)
                if kind in self._workloads_answered:
                    unread.append(f"{spec.plural}.{spec.group}")
                    if kind not in self._workloads_unread_logged:
                        log.warning(
                            "%s refused after it answered (%s): no training is stopped until it answers again (its "
                            "own minimum runtime, suspension and Kueue Workload unknown); grant list on %s.%s, or "
                            "restart the controller to go on without them",
                            what, exc, spec.plural, spec.group,
                        )  # fmt: skip
                        self._workloads_unread_logged.add(kind)
                    continue
                if kind not in self._workloads_forbidden_logged:
                    log.warning(
                        "%s not readable (%s): their gangs are evicted pod by pod instead of suspended, and those "
                        "suspended are not resumed; grant list on %s.%s",
                        what,
                        exc,
                        spec.plural,
                        spec.group,
                    )
                    self._workloads_forbidden_logged.add(kind)
                continue
            out[kind] = items
            self._workloads_answered.add(kind)
            self._workloads_unread_logged.discard(kind)
            if not self._kueue_seen:
                self._kueue_seen = any(_kueue_marked(_map(_map(item).get("metadata"))) for item in items)
        self._workloads_forbidden = frozenset(forbidden)
        self._training_unread = tuple(unread)
        return out

    def _list_served(self, what: str, kind: str, spec: WorkloadKind, may_fall_back: bool = True) -> list[JSON]:
        """Every object of a custom workload kind, at the first of its versions the API server serves (the one that
        answered last time first): a 404 is a CRD not installed or a version not served, and the next version is
        tried (``may_fall_back``). Raises the last 404 when no version is served."""
        versions = served_first(spec, self._served_versions.get(kind))
        version, items = at_first_served(
            versions if may_fall_back else versions[:1],
            lambda v: self._pager.items(what, self._custom.list_cluster_custom_object, spec.group, v, spec.plural),
        )
        self._served_versions[kind] = version
        return items

    def _workloads(
        self, raw: Mapping[str, list[JSON]], priority_classes: Mapping[str, int], default_priority: int
    ) -> tuple[WorkloadInfo, ...]:
        """The live workloads that ask for GPUs, each with the gang id its pods carry.

        A Kueue Workload owned by one of the other kinds (what Kueue creates for a queued Job or JobSet) stands for
        its owner: it takes the owner's gang and the owner is dropped, because Kueue would undo a suspension of an
        admitted Job through the Job's own spec; deactivating the Workload is how it is stopped.

        When the Workloads cannot be read (403) while their owners can, a running object Kueue manages (labelled
        ``kueue.x-k8s.io/queue-name``) is left out too: suspended through its own spec, Kueue would start it again
        (its Workload is still admitted) and the preemption would free nothing, tick after tick. Its gang is then
        stopped as any gang without a readable workload is: its pods evicted through the Eviction API (PDBs hold,
        Kueue does not undo an eviction). One waiting in its queue (suspended) is kept: waiting work, nothing to stop.
        """
        found: dict[tuple[str, str, str], WorkloadInfo] = {}
        owned_by: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        kueue_unreadable = "Workload" in self._workloads_forbidden
        for kind, items in raw.items():
            for obj in items:
                converted = self._workload(kind, obj, priority_classes, default_priority)
                if converted is None:
                    continue
                info, owner = converted
                if (
                    kueue_unreadable
                    and kind != "Workload"
                    and not info.suspended
                    and _map(_map(obj.get("metadata")).get("labels")).get(KUEUE_QUEUE_LABEL)
                ):
                    if not self._kueue_unreadable_logged:
                        log.warning(
                            "%s %s/%s (and any other object labelled %s) is managed by Kueue and Kueue Workloads are "
                            "not readable: not suspended through its spec (Kueue would undo it), its pods are evicted "
                            "if it is preempted; grant list on workloads.kueue.x-k8s.io",
                            kind, info.namespace, info.name, KUEUE_QUEUE_LABEL,
                        )  # fmt: skip
                        self._kueue_unreadable_logged = True
                    continue
                key = (kind, info.namespace, info.name)
                found[key] = info
                if kind == "Workload" and owner is not None and owner[0] in WORKLOAD_KINDS and owner[0] != "Workload":
                    owned_by[key] = (owner[0], info.namespace, owner[1])
        for key, owner_key in owned_by.items():
            parent = found.pop(owner_key, None)
            if parent is not None:
                info = found[key]
                # Kueue suspends the Job it manages until the Workload is admitted, and the Workload stays active
                # meanwhile: the owner suspended under an active Workload is training waiting in its queue.
                waiting = parent.suspended and not info.suspended
                found[key] = replace(
                    info,
                    gang=parent.gang,
                    suspended=info.suspended or waiting,
                    queued=info.queued or waiting,
                    pod_gpus=info.pod_gpus or parent.pod_gpus,
                    gpu_product=info.gpu_product or parent.gpu_product,
                    # where its pods go, from the same templates its GPUs were read from
                    node_selector=info.node_selector if info.pod_gpus else parent.node_selector,
                    pod_beside=info.pod_beside if info.pod_gpus else parent.pod_beside,
                    # the pods are the owner's, created from its templates with the labels its controller adds
                    pod_labels=parent.pod_labels if parent.pod_gpus else info.pod_labels,
                    pod_anti_affinity=parent.pod_anti_affinity if parent.pod_gpus else info.pod_anti_affinity,
                    min_runtime_s=info.min_runtime_s if info.min_runtime_s is not None else parent.min_runtime_s,
                )
        kept = [w for w in found.values() if w.gpus > 0]
        return tuple(sorted(kept, key=lambda w: (w.namespace, w.kind, w.name)))

    def _workload(
        self, kind: str, obj: JSON, priority_classes: Mapping[str, int], default_priority: int
    ) -> tuple[WorkloadInfo, tuple[str, str] | None] | None:
        """One workload object -> (WorkloadInfo, its controller owner (kind, name)); None when it is finished,
        being deleted, or its pods belong to another gang (a JobSet's Jobs, a Job under a Volcano queue...)."""
        cfg = self.config
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if not name or meta.get("deletionTimestamp"):
            return None
        if any(
            isinstance(c, Mapping) and c.get("type") in FINISHED_CONDITIONS and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            return None  # a finished workload holds no GPUs and cannot be suspended or resumed
        # (pod template, pod count) of every kind of pod the workload runs
        # (custom resources are only as well-formed as their CRD's schema: anything not a mapping counts as empty)
        templates: list[tuple[Mapping[str, Any], int]] = []
        # the labels the workload's controller adds to each template's pods (what a pod anti-affinity term of its
        # own, selecting its siblings, most often names)
        added: list[dict[str, str]] = []
        if kind == "Job":
            templates.append((_map(spec.get("template")), _job_pods(spec, _map(status))))
            # (the API server puts them on the template when it generates the selector: not with a manual one)
            added.append(dict.fromkeys(JOB_NAME_LABELS, name) if spec.get("manualSelector") is not True else {})
        elif kind == "JobSet":
            for rjob in _list(spec.get("replicatedJobs")):
                job_spec = _map(_map(_map(rjob).get("template")).get("spec"))
                pods = _int(_map(rjob).get("replicas"), 1) * _job_pods(job_spec)
                templates.append((_map(job_spec.get("template")), pods))
                added.append({JOBSET_LABEL: name, JOBSET_REPLICATED_JOB_LABEL: str(_map(rjob).get("name") or "")})
        elif kind in KUBEFLOW_REPLICA_SPECS:
            for replica_type, replica in _map(spec.get(KUBEFLOW_REPLICA_SPECS[kind])).items():
                templates.append((_map(_map(replica).get("template")), _int(_map(replica).get("replicas"), 1)))
                added.append({KUBEFLOW_LABEL: name, KUBEFLOW_REPLICA_TYPE_LABEL: str(replica_type).lower()})
        elif kind == "Workload":
            for pod_set in _list(spec.get("podSets")):
                templates.append((_map(_map(pod_set).get("template")), _int(_map(pod_set).get("count"), 1)))
                added.append({})
        # The gang id exactly as _gang gives it to the pods: the template's labels and annotations plus the one
        # the workload's controller adds. Another source taking precedence means another object is the gang.
        source = WORKLOAD_GANG_SOURCES[kind]
        expected = f"{source}/{namespace}/{name}"
        first_meta = _map(templates[0][0].get("metadata")) if templates else {}
        labels = dict(_map(first_meta.get("labels")))
        annotations = dict(_map(first_meta.get("annotations")))
        if kind == "Job":
            labels[JOB_NAME_LABELS[0]] = name
        elif kind == "JobSet":
            labels[JOBSET_LABEL] = name
        elif kind in KUBEFLOW_REPLICA_SPECS:
            labels[KUBEFLOW_LABEL] = name
        else:
            annotations[KUEUE_WORKLOAD_KEY] = name
        gang, _ = self._gang(namespace, labels, annotations)
        if gang != expected:
            return None
        gpus: list[int] = []
        priorities: list[int] = []
        product: str | None = None
        gpu_templates: list[Mapping[str, Any]] = []  # the pod templates that ask for GPUs
        gpu_labels: list[dict[str, str]] = []  # their pods' labels
        for (template, count), extra in zip(templates, added, strict=True):
            pod_spec = _map(template.get("spec"))
            try:
                per_pod = pod_gpus(pod_spec, cfg.gpu_resource)
            except (AttributeError, TypeError):  # containers that are not objects: nothing to read GPUs from
                per_pod = 0
            if per_pod <= 0 or count <= 0:
                continue
            gpus.extend([per_pod] * count)
            explicit = pod_spec.get("priority")
            priorities.append(
                _int(explicit)
                if explicit is not None
                else priority_classes.get(pod_spec.get("priorityClassName") or "", default_priority)
            )
            if product is None:
                product = pinned_product(pod_spec, cfg.gpu_product_label)
            gpu_templates.append(pod_spec)
            own_labels = _map(_map(template.get("metadata")).get("labels"))
            gpu_labels.append({**{str(k): str(v) for k, v in own_labels.items()}, **extra})
        priority = max(priorities, default=default_priority)
        if kind == "Workload" and spec.get("priority") is not None:
            priority = _int(spec.get("priority"), priority)
        suspended = is_suspended(obj, kind)
        # Active, but Kueue found no quota for it (or evicted it to requeue): it waits in its ClusterQueue with no pod
        # running, as a queued Job waits suspended. Read as running, a RayJob's or a pod group's queued training was
        # missing from the waiting GPU work. One Kueue has not looked at yet (no condition) is left as it was.
        awaiting_quota = kind == "Workload" and not suspended and _quota_refused(_map(status))
        own = meta.get("annotations") or {}
        # The controller owner, when it is one of the workload kinds in its own API group: a Workload owned by
        # another group's kind of the same name (Volcano's batch.volcano.sh "Job") does not stand for a batch/v1 Job.
        owner = next(
            (
                (ref.get("kind", ""), ref.get("name", ""))
                for ref in meta.get("ownerReferences") or []
                if isinstance(ref, Mapping)
                and ref.get("controller")
                and ref.get("kind") in WORKLOAD_KINDS
                and str(ref.get("apiVersion") or "").rpartition("/")[0] == WORKLOAD_KINDS[ref["kind"]].group
            ),
            None,
        )
        node_selector, pod_beside = _gpu_pods_place(gpu_templates)
        info = WorkloadInfo(
            kind=kind,
            namespace=namespace,
            name=name,
            gang=expected,
            suspended=suspended or awaiting_quota,
            priority=priority,
            pod_gpus=tuple(gpus),
            gpu_product=product,
            suspended_by_us_at=suspended_by_us_at(own, meta.get("generation")) if suspended else None,
            min_runtime_s=_seconds(own.get(MIN_RUNTIME_ANNOTATION)),
            queued=awaiting_quota
            or (suspended and kind != "Workload" and bool(_map(meta.get("labels")).get(KUEUE_QUEUE_LABEL))),
            node_selector=node_selector,
            pod_beside=pod_beside,
            pod_labels=_shared_labels(gpu_labels),
            pod_anti_affinity=_shared_terms(
                [
                    required_pod_anti_affinity_of(_as_created(t, pod_labels), namespace)
                    for t, pod_labels in zip(gpu_templates, gpu_labels, strict=True)
                ]
            ),
        )
        return info, owner

    def _with_first_ready(self, pods: list[PodInfo]) -> list[PodInfo]:
        """Each pod with the earliest Ready time read for it (``PodInfo.first_ready_at``) when its Ready condition
        moved since: a readiness probe that failed and passed again (no container restart) is a recovery, not a cold
        start. Remembered per pod uid for the pods of this snapshot only; a restarted controller starts from their
        current Ready times."""
        seen: dict[str, float] = {}
        out = []
        for pod in pods:
            uid = pod.uid
            if uid is None:
                out.append(pod)
                continue
            earlier = self._first_ready.get(uid)
            if pod.ready_at is None:  # not Ready now (a probe failing): the first Ready stays known
                if earlier is not None:
                    seen[uid] = earlier
                    pod = replace(pod, first_ready_at=earlier)
                out.append(pod)
                continue
            first = pod.ready_at if earlier is None else min(earlier, pod.ready_at)
            seen[uid] = first
            out.append(replace(pod, first_ready_at=first) if first < pod.ready_at else pod)
        self._first_ready = seen
        return out

    def _with_unhealthy_since(self, nodes: list[NodeInfo], now: float) -> list[NodeInfo]:
        """Each node whose GPUs are all unhealthy while its kubelet reports, broken since this reader first saw it
        so (``NodeInfo.gpus_unhealthy``): the Node keeps no time for it. Remembered for the nodes so in this snapshot
        only: a node healthy again starts afresh, and a restarted controller waits a whole provision limit again."""
        seen: dict[str, float] = {}
        out = []
        for node in nodes:
            if node.gpus_unhealthy and not node.broken:
                since = self._unhealthy_since.get(node.name, now)
                # not before it registered or its Ready condition last changed: a Node re-created under the name (a
                # VM recreated), or a kubelet restarted, is not charged with the time the old one was seen so
                since = max(since, min(node.state_since, now)) if node.state_since is not None else since
                seen[node.name] = since
                node = replace(node, broken=True, state_since=since)
            out.append(node)
        self._unhealthy_since = seen
        return out

    def _with_podgroup_min_available(self, pods: list[PodInfo]) -> list[PodInfo]:
        """Fill Volcano gangs' minAvailable from their PodGroup's ``spec.minMember`` (one list, only if needed)."""
        wanted = {p.gang for p in pods if p.gang and p.gang.startswith("volcano/") and p.gang_min_available is None}
        if not wanted or not self.config.read_podgroups:
            return pods
        try:
            groups = self._pager.items(
                "list podgroups",
                self._custom.list_cluster_custom_object,
                "scheduling.volcano.sh",
                "v1beta1",
                "podgroups",
            )
        except KubeApiError as exc:
            if exc.status not in (403, 404):
                raise
            # Volcano not installed (404) or no RBAC for it (403): gangs keep an unknown minimum (whole gang).
            if not self._podgroups_missing_logged:
                log.info("Volcano PodGroups not readable (%s); gang minimums unknown", exc)
                self._podgroups_missing_logged = True
            return pods
        minimum = {
            f"volcano/{g['metadata'].get('namespace', '')}/{g['metadata']['name']}": _int(
                (g.get("spec") or {}).get("minMember"), 0
            )
            for g in groups
        }
        out = []
        for pod in pods:
            if pod.gang in wanted and minimum.get(pod.gang):
                pod = replace(pod, gang_min_available=minimum[pod.gang])
            out.append(pod)
        return out

    def _node(self, raw: JSON) -> NodeInfo | None:
        cfg = self.config
        meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
        labels = meta.get("labels") or {}
        allocatable = status.get("allocatable") or {}
        capacity = status.get("capacity") or {}
        gpus = _int(allocatable.get(cfg.gpu_resource))
        pool = next((labels[key] for key in cfg.node_pool_labels if labels.get(key)), None)
        is_gpu_node = (
            cfg.gpu_resource in allocatable
            or cfg.gpu_resource in capacity
            or cfg.gpu_product_label in labels
            or (pool is not None and pool in cfg.gpu_pools)
        )
        if not is_gpu_node and not cfg.include_non_gpu_nodes:
            return None
        ready_cond = _condition(status, "Ready")
        ready = bool(ready_cond and ready_cond.get("status") == "True")
        # Broken, not booting: its kubelet stopped reporting (Ready Unknown: a booting node's kubelet reports False),
        # or its device plugin reported GPUs and every one is unhealthy now (allocatable 0 of a capacity above 0;
        # a booting node has no GPU capacity yet). Read as booting, a broken burst node covered a shortfall for as
        # long as it stayed.
        lost = bool(ready_cond and ready_cond.get("status") == "Unknown")
        unhealthy = gpus <= 0 and _int(capacity.get(cfg.gpu_resource)) > 0
        created = parse_time(meta.get("creationTimestamp"))
        changed = parse_time((ready_cond or {}).get("lastTransitionTime"))
        # Not Ready long after it registered, its GPUs reported (a container runtime down, a driver crash): broken,
        # as Cluster Autoscaler judges it (a node is still starting only while its Ready condition changed within
        # 15 minutes of its creation). A VM recreated under an old Node's name is still booting: its kubelet reports
        # no device-plugin capacity until the plugin registers again.
        failed = (
            bool(ready_cond and ready_cond.get("status") == "False")
            and _int(capacity.get(cfg.gpu_resource)) > 0
            and created is not None
            and changed is not None
            and changed - created > NODE_STARTUP_S
        )
        lost = lost or failed
        taints = spec.get("taints") or []
        leaving = isinstance(taints, list) and any(
            isinstance(t, dict) and t.get("key") in cfg.leaving_taints and t.get("effect") in _LEAVING_EFFECTS
            for t in taints
        )
        deleting = bool(meta.get("deletionTimestamp"))  # held by a finalizer while its instance goes
        cordoned = bool(spec.get("unschedulable", False))
        away = cordoned or leaving or deleting or lost or unhealthy  # out of service, being removed, or going
        return NodeInfo(
            name=meta.get("name", ""),
            allocatable_gpus=gpus,
            gpu_product=labels.get(cfg.gpu_product_label),
            pool=pool,
            # Cluster Autoscaler's rule: a GPU node is not ready until its GPUs are allocatable. A cordoned node, or
            # one an autoscaler is removing (or already being deleted), takes no new pods, so it is no capacity for
            # a scale-up either.
            ready=ready and gpus > 0 and not away,
            labels=dict(labels),
            leaving=away,
            out_of_service=(cordoned or lost or unhealthy) and not leaving and not deleting,
            # (only when it is known since when: without the Ready condition's change, ``state_since`` would be
            # its creation, and a node lost a moment ago read as broken for as long as it has existed)
            broken=lost and changed is not None,
            gpus_unhealthy=unhealthy and ready,
            do_not_disrupt=_do_not_disrupt(_map(meta.get("annotations")), NODE_DO_NOT_DISRUPT_ANNOTATIONS),
            taints=node_taints(taints, cfg.leaving_taints, ready=ready),
            # a VM recreated under an old Node object's name boots on it: counted from its Ready condition's change
            state_since=_latest(created, changed),
            # its allocatable for now: the pods' requests are taken off once all are read (``_with_free_beside_gpus``)
            free_beside_gpus=_allocatable_beside(allocatable),
        )

    @staticmethod
    def _pdb(raw: JSON) -> PodDisruptionBudgetInfo:
        meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        try:
            selector = pdb_selector(spec.get("selector"))
        except ValueError as exc:
            # A budget whose pods we cannot tell must still hold the planner back: it covers the whole namespace.
            log.warning("PodDisruptionBudget %s/%s: %s; taken to cover its whole namespace", namespace, name, exc)
            selector = selector_matching_every_pod()
        # No status yet means the disruption controller has not looked at it: assume no budget. Nor while its status
        # is older than its spec: the Eviction API refuses every eviction until the controller has caught up.
        stale = _int(status.get("observedGeneration"), 0) < _int(meta.get("generation"), 0)
        return PodDisruptionBudgetInfo(
            namespace=namespace,
            name=name,
            selector=selector,
            disruptions_allowed=0 if stale else _int(status.get("disruptionsAllowed")),
        )
