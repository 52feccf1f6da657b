"""Kubernetes adapters over the official ``kubernetes`` client: reader, writer, policies, node pools, CRD, the
leader's pod label.

Typical wiring::

    api = load_api_client(settings.kubernetes.config_mode, settings.kubernetes.kubeconfig, settings.kubernetes.context)
    reader = KubeClusterReader(api, ReaderConfig(request_timeout_s=settings.kubernetes.request_timeout_seconds))
    writer = KubeClusterWriter(api, WriterConfig(request_timeout_s=...))
    policies = PolicyLoader(api, settings.namespaces).sync(writer, now)
    snapshot = reader.snapshot(now)
"""

from autoscaler.adapters.kubernetes._api import (
    ConflictError,
    KubeApiError,
    KubeUnavailable,
    UnsupportedWorkloadError,
)
from autoscaler.adapters.kubernetes.config import KubeConfigError, load_api_client
from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL, KubernetesLeaderPodLabel
from autoscaler.adapters.kubernetes.nodepool import (
    MachineDeploymentNodePools,
    make_node_pool_scaler,
    register_node_pool_provider,
)
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, PolicyLoader, PolicySet
from autoscaler.adapters.kubernetes.reader import KubeClusterReader, ReaderConfig, parse_gang
from autoscaler.adapters.kubernetes.status import (
    AT_MAX_REPLICAS,
    INVALID_SPEC,
    METRICS_STALE,
    READY,
    ConditionUpdate,
    ForecastRecord,
    LastAction,
    StatusUpdate,
)
from autoscaler.adapters.kubernetes.writer import KubeClusterWriter, WriterConfig

__all__ = [
    "AT_MAX_REPLICAS",
    "INVALID_SPEC",
    "LEADER_LABEL",
    "METRICS_STALE",
    "READY",
    "ConditionUpdate",
    "ConflictError",
    "ForecastRecord",
    "InvalidPolicy",
    "KubeApiError",
    "KubeClusterReader",
    "KubeClusterWriter",
    "KubeConfigError",
    "KubeUnavailable",
    "KubernetesLeaderPodLabel",
    "LastAction",
    "LoadedPolicy",
    "MachineDeploymentNodePools",
    "PolicyLoader",
    "PolicySet",
    "ReaderConfig",
    "StatusUpdate",
    "UnsupportedWorkloadError",
    "WriterConfig",
    "load_api_client",
    "make_node_pool_scaler",
    "parse_gang",
    "register_node_pool_provider",
]
