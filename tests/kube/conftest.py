"""Fixtures: a fake API server per test (started in ~1 ms), a kubeconfig pointing at it, and an ``ApiClient`` built
the way the controller builds it (``load_api_client``), so every test exercises the real client over HTTP.

Other suites (the runtime end-to-end test) can use them too: ``from tests.kube.conftest import *`` is not needed;
import ``FakeApiServer`` and ``write_kubeconfig`` from ``tests.kube.fake_apiserver`` directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from autoscaler.adapters.kubernetes.config import load_api_client
from tests.kube.fake_apiserver import FakeApiServer


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(apiserver: FakeApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig.yaml")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = load_api_client("kubeconfig", kubeconfig)
    try:
        yield api
    finally:
        api.close()
