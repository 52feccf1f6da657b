"""``autoscaler run`` as a subprocess, configured through the environment like a Deployment would be, and a bounded
wait. Shared by the end-to-end test and the fault suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.prometheus.promserver import free_port

REPO = Path(__file__).resolve().parents[2]
LEASE = {"duration": 3, "renew": 2, "retry": 0.5}


def wait_until(condition: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:  # the thing polled may not be up yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs()}")
        time.sleep(0.2)


class Controller:
    """``autoscaler run`` in a subprocess, configured through the environment like a Deployment would be."""

    def __init__(
        self,
        identity: str,
        kubeconfig: Path,
        prometheus_url: str,
        workdir: Path,
        args: tuple[str, ...] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.identity = identity
        self.port = free_port()
        self.log_path = workdir / f"{identity}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOSCALER_", "KUBERNETES_"))}
        env.update(
            {
                "POD_NAME": identity,
                "POD_NAMESPACE": "default",
                "PYTHONPATH": str(REPO),
                "AUTOSCALER_TICK_INTERVAL_SECONDS": "1",
                "AUTOSCALER_TICK_STALL_SECONDS": "30",
                "AUTOSCALER_SHUTDOWN_GRACE_SECONDS": "5",
                "AUTOSCALER_LOG_LEVEL": "INFO",
                "AUTOSCALER_HTTP__BIND_ADDRESS": "127.0.0.1",
                "AUTOSCALER_HTTP__PORT": str(self.port),
                "AUTOSCALER_KUBERNETES__CONFIG_MODE": "kubeconfig",
                "AUTOSCALER_KUBERNETES__KUBECONFIG": str(kubeconfig),
                "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "2",
                "AUTOSCALER_LEADER_ELECTION__LEASE_DURATION_SECONDS": str(LEASE["duration"]),
                "AUTOSCALER_LEADER_ELECTION__RENEW_DEADLINE_SECONDS": str(LEASE["renew"]),
                "AUTOSCALER_LEADER_ELECTION__RETRY_PERIOD_SECONDS": str(LEASE["retry"]),
                "AUTOSCALER_PROMETHEUS_URL": prometheus_url,
                "AUTOSCALER_PROMETHEUS_TIMEOUT_SECONDS": "1",
                "AUTOSCALER_PROMETHEUS_RETRIES": "0",
            }
        )
        env.update(extra_env or {})
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autoscaler.cli", "run", *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self, chars: int = 6000) -> str:
        try:
            return f"--- {self.identity} log ---\n" + self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return f"--- {self.identity}: no log ---"

    def get(self, path: str) -> tuple[int, str]:
        try:
            # 10 s: the process answers at once, but on a loaded machine a 2 s read timeout failed a test that only
            # wanted to read a gauge
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample of the controller's own /metrics, or None when absent."""
        status, text = self.get("/metrics")
        assert status == 200, text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode


def wait_for_leader(ctrl: Controller, timeout: float = 60) -> None:
    """Until the controller holds the Lease and has finished its first tick (whatever its result), so that a fault
    window counts ticks that saw the fault. The deadlines are generous (they include the process's start-up and, with
    an API fault, a first tick of request timeouts on a loaded 2-core machine); a controller up in time returns
    at once."""
    wait_until(
        lambda: ctrl.metric("gpu_autoscaler_leader", identity=ctrl.identity) == 1, timeout, "leadership", ctrl.log
    )
    wait_until(
        lambda: sum(ctrl.metric("gpu_autoscaler_ticks_total", result=r) or 0 for r in ("ok", "hold", "error")) >= 1,
        60,
        "the first tick",
        ctrl.log,
    )


@dataclass(frozen=True)
class FaultRow:
    """One line of the fault suite's table (printed at the end of the run)."""

    fault: str
    replicas_during: list[int]
    first_action: str
    recovery_s: float | None


FAULT_TABLE: list[FaultRow] = []
