"""Cluster configuration: in-cluster or kubeconfig, and errors that say which setting to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes import KubeConfigError, load_api_client
from autoscaler.ports import PortError
from tests.kube.fake_apiserver import FakeApiServer


def test_kubeconfig_argument_env_and_context(
    apiserver: FakeApiServer, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = load_api_client("kubeconfig", kubeconfig)
    assert api.configuration.host == apiserver.url
    assert api.configuration.retries.read == 0  # no silent re-sends of a timed-out request
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert client.CoreV1Api(load_api_client()).list_node().items == []  # auto: falls back to $KUBECONFIG
    with pytest.raises(KubeConfigError, match="AUTOSCALER_KUBERNETES__CONTEXT"):
        load_api_client("kubeconfig", kubeconfig, context="nope")


def test_errors_name_what_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeConfigError, match=r"does not exist.*AUTOSCALER_KUBERNETES__KUBECONFIG"):
        load_api_client("kubeconfig", tmp_path / "missing.yaml")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nowhere"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="no in-cluster service account"):
        load_api_client("auto")
    with pytest.raises(KubeConfigError, match=r"in-cluster config failed.*CONFIG_MODE=kubeconfig"):
        load_api_client("in-cluster")
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("just a string")
    with pytest.raises(PortError):  # a KubeConfigError is a PortError: the runtime reports it the same way
        load_api_client("kubeconfig", garbage)
    with pytest.raises(KubeConfigError, match="unknown mode"):
        load_api_client("magic")  # type: ignore[arg-type]
