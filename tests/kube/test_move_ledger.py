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
