"""The move ledger's ConfigMap adapter over HTTP (the fake API server; the real one in tests/realkube)."""

from __future__ import annotations

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes.ledger import KubernetesMoveLedger
from autoscaler.ports import PortError
from tests.kube.fake_apiserver import FakeApiServer


def test_absent_then_created_then_updated_and_read_back(api_client: client.ApiClient) -> None:
    ledger = KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves")
    assert ledger.read() == ()
    ledger.write((10.0, 10.0))
    ledger.write((10.0, 10.0, 20.5))
    assert KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves").read() == (10.0, 10.0, 20.5)


def test_a_write_over_another_processes_write_is_refused(api_client: client.ApiClient) -> None:
    a = KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves")
    b = KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves")
    assert a.read() == () and b.read() == ()
    a.write((1.0,))
    with pytest.raises(PortError, match="409"):
        b.write((2.0,))  # b created it "from nothing" after a did: 409 AlreadyExists
    assert b.read() == (1.0,)
    a.write((1.0, 3.0))
    with pytest.raises(PortError, match="409"):
        b.write((1.0, 2.0))  # b's resourceVersion is older than a's write
    assert a.read() == (1.0, 3.0)


def test_edited_data_is_an_error_that_names_the_field(apiserver: FakeApiServer, api_client: client.ApiClient) -> None:
    apiserver.seed(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "moves", "namespace": "gpu-autoscaler"},
         "data": {"moveTimes": "yesterday"}}
    )
    with pytest.raises(PortError, match=r"data\.moveTimes is not JSON"):
        KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves").read()


def test_the_targets_moved_for_are_written_and_read_back(api_client: client.ApiClient) -> None:
    """A new leader reads which targets were moved for, and when (``movedFor``), beside the move times: it waits out
    ``retry_after_s`` for them as the old leader would have."""
    old = KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves")
    assert old.read() == () and old.targets() == ()
    old.write((10.0,), (("gang job/ml/w", 10.0), ("deployment/inf/chat", 5.0)))
    new = KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves")
    assert new.read() == (10.0,)
    assert new.targets() == (("gang job/ml/w", 10.0), ("deployment/inf/chat", 5.0))
    new.write((10.0, 20.0))  # no targets given: none kept
    assert old.read() == (10.0, 20.0) and old.targets() == ()


def test_a_ledger_written_before_targets_were_recorded_reads_no_targets(
    apiserver: FakeApiServer, api_client: client.ApiClient
) -> None:
    apiserver.seed(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "moves", "namespace": "gpu-autoscaler"},
         "data": {"moveTimes": "[1.5]"}}
    )
    ledger = KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves")
    assert ledger.read() == (1.5,) and ledger.targets() == ()


@pytest.mark.parametrize("value", ["soon", '{"a": 1}', '[["a"]]', '[[1, 2]]', '[["a", "nan"]]', '[["a", true]]'])
def test_edited_targets_are_an_error_that_names_the_field(
    apiserver: FakeApiServer, api_client: client.ApiClient, value: str
) -> None:
    apiserver.seed(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "moves", "namespace": "gpu-autoscaler"},
         "data": {"moveTimes": "[1.5]", "movedFor": value}}
    )
    with pytest.raises(PortError, match=r"data\.movedFor"):
        KubernetesMoveLedger(api_client, "gpu-autoscaler", "moves").read()
