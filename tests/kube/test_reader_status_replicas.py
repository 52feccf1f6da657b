"""The reader takes a Deployment's ``status.replicas`` (pods created and not terminating): the scale subresource's
status.replicas, which the HPA divides a per-pod External metric by (tests/core/test_hpa_status_replicas.py)."""

from __future__ import annotations

from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, ReaderConfig
from autoscaler.adapters.kubernetes.reader import KubeClusterReader as Reader
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0


def reader(api: client.ApiClient) -> KubeClusterReader:
    return KubeClusterReader(api, ReaderConfig(), sleep=lambda s: None)


def test_status_replicas_is_read_beside_spec_and_ready(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    scaling_up = o.deployment("chat", "ml", replicas=10, ready=6)
    scaling_up["status"]["replicas"] = 8  # two of the ten pods not created yet
    rolling = o.deployment("embed", "ml", replicas=4)
    rolling["status"]["replicas"] = 5  # a surge pod during a rolling update
    settled = o.deployment("rerank", "ml", replicas=3)
    apiserver.seed(scaling_up, rolling, settled)
    deployments = {d.name: d for d in reader(api_client).snapshot(NOW).deployments}
    chat = deployments["chat"]
    assert (chat.spec_replicas, chat.ready_replicas, chat.status_replicas) == (10, 6, 8)
    assert (deployments["embed"].spec_replicas, deployments["embed"].status_replicas) == (4, 5)
    assert (deployments["rerank"].spec_replicas, deployments["rerank"].status_replicas) == (3, 3)


def test_a_missing_status_replicas_is_zero() -> None:
    """The API omits a zero ``status.replicas`` (and a Deployment the controller has not seen has no status): upstream's
    scale subresource then shows 0, and the HPA divides by that (its ratio is +Inf, never within the tolerance)."""
    raw = {"metadata": {"namespace": "ml", "name": "chat"}, "spec": {"replicas": 3}, "status": {"readyReplicas": 0}}
    assert Reader._deployment(raw).status_replicas == 0
    del raw["status"]
    info = Reader._deployment(raw)
    assert (info.spec_replicas, info.status_replicas) == (3, 0)
    raw["status"] = {"replicas": 2}
    assert Reader._deployment(raw).status_replicas == 2
