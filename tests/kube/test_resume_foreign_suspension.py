"""resume_workload decides on its fresh read only from 'suspended?' and 'any of our annotations?': it resumes a
workload whose suspension the reader itself says is NOT ours (stale mark: the generation moved on since our
suspension, i.e. somebody resumed and suspended it again by hand), or one with no mark at all."""
import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeClusterReader, KubeClusterWriter, ReaderConfig, WriterConfig
from autoscaler.ports import ChangedSinceRead
from tests.kube import objects as o
from tests.kube.fake_apiserver import FakeApiServer

NOW = 1_800_000_000.0
STALE = {
    "gpuautoscaler.dev/suspended-by": "gpu-autoscaler",
    "gpuautoscaler.dev/suspended-at": "2026-01-01T00:10:00Z",
    "gpuautoscaler.dev/suspended-generation": "2",
}


def _writer(api: client.ApiClient) -> KubeClusterWriter:
    return KubeClusterWriter(api, WriterConfig(reporting_instance="t"), clock=lambda: NOW, sleep=lambda s: None)


def test_a_hand_resuspended_job_is_not_resumed(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    job = o.job("train", "ml", suspend=True, gpus=4, annotations=STALE)
    job["metadata"]["generation"] = 4  # our suspension made generation 2; a human resumed (3) and re-suspended (4)
    apiserver.seed(job)
    (w,) = KubeClusterReader(api_client, ReaderConfig(), sleep=lambda s: None).snapshot(NOW).workloads
    assert w.suspended and w.suspended_by_us_at is None  # the reader: not ours
    with pytest.raises(ChangedSinceRead):  # not written; the tick decided on a read from before (``skipped``)
        _writer(api_client).resume_workload("Job", "ml", "train")
    assert apiserver.get("batch/v1", "Job", "train", "ml")["spec"]["suspend"] is True


def test_a_job_suspended_by_someone_else_is_not_resumed(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    # Counterpart of test_a_workload_suspended_by_someone_else_is_not_marked_as_ours: suspend leaves it alone,
    # resume does not.
    apiserver.seed(o.job("queued", "ml", suspend=True, gpus=1))
    with pytest.raises(ChangedSinceRead):  # not written (``skipped``), not reported as a resume
        _writer(api_client).resume_workload("Job", "ml", "queued")
    assert apiserver.get("batch/v1", "Job", "queued", "ml")["spec"]["suspend"] is True
