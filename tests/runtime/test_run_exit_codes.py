"""Exit codes of ``autoscaler run --once``, through the real command line in a subprocess: 1 when the Lease cannot be
read or written (the API server is unreachable or errs), 3 only when another replica holds an unexpired Lease.

The "errs" case (a 500 on the Lease read) runs against the real apiserver through the fault proxy:
tests/realkube/test_adapter_faults_real.py::test_api_server_error_on_the_lease_exits_1 (it reuses ``run_once``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.kube.fake_apiserver import FakeApiServer, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
LEASE = "gpu-autoscaler"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def run_once(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``autoscaler run --once`` configured like a Deployment would be. Prometheus is a closed port: the controller
    only warns about it and starts anyway, so the Lease is the first thing that can stop the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "POD_NAME": "me",
            "POD_NAMESPACE": "default",
            "AUTOSCALER_KUBERNETES__CONFIG_MODE": "kubeconfig",
            "AUTOSCALER_KUBERNETES__KUBECONFIG": str(kubeconfig),
            "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "2",
            "AUTOSCALER_PROMETHEUS_URL": f"http://127.0.0.1:{closed_port()}",
            "AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "1",
            "AUTOSCALER_PROMETHEUS_RETRIES": "0",
            "AUTOSCALER_FORECAST__WORKERS": "1",
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run", "--once", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


def lease(holder: str, renewed: datetime) -> dict[str, object]:
    stamp = renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "default"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        },
    }


def test_unreachable_api_server_exits_1_not_3(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{closed_port()}")
    result = run_once(kubeconfig)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    assert "could not reach the Kubernetes API to take the Lease" in result.stderr, result.stderr
    assert "another replica holds the Lease" not in result.stderr, result.stderr


def test_lease_held_by_another_replica_exits_3(apiserver: FakeApiServer, tmp_path: Path) -> None:
    apiserver.seed(lease("other-replica", datetime.now(UTC)))
    result = run_once(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 3, result.stderr
    assert "another replica holds the Lease (other-replica)" in result.stderr, result.stderr
    held = apiserver.get("coordination.k8s.io/v1", "Lease", LEASE, "default")
    assert held is not None and held["spec"]["holderIdentity"] == "other-replica"  # not taken, not released


def test_leader_pod_label_without_pod_name_exits_2(apiserver: FakeApiServer, tmp_path: Path) -> None:
    """The leader pod label on and no POD_NAME is configuration that will not fix itself: exit 2, as invalid settings
    do (it was 1, the code of a failed read, which a restart might cure)."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_", "KUBECONFIG"))}
    env.pop("POD_NAME", None)
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "POD_NAMESPACE": "default",
            "AUTOSCALER_KUBERNETES__CONFIG_MODE": "kubeconfig",
            "AUTOSCALER_KUBERNETES__KUBECONFIG": str(kubeconfig),
            "AUTOSCALER_PROMETHEUS_URL": f"http://127.0.0.1:{closed_port()}",
            "AUTOSCALER_LEADER_ELECTION__LABEL_LEADER_POD": "true",
            "AUTOSCALER_HTTP__PORT": "0",
            "AUTOSCALER_FORECAST__WORKERS": "1",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "POD_NAME is not set" in done.stdout + done.stderr
