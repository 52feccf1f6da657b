"""Start real Prometheus servers for tests and benchmarks: backfill with promtool first, then serve on 127.0.0.1.

Shared by ``tests/prometheus/conftest.py`` and ``benchmarks/bench_observe.py`` (which puts this folder on sys.path).
Debian's Prometheus is 2.42: timestamps in OpenMetrics are seconds, each series' samples must ascend, a family's
lines stay together, the file ends with ``# EOF`` and has no blank line (each of these fails silently or loudly).
"""

from __future__ import annotations

import http.client
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

EMPTY_CONFIG = "global: {scrape_interval: 15s, evaluation_interval: 15s}\n"


def binaries() -> tuple[str, str] | None:
    """(prometheus, promtool) paths, or None when the Debian package is not installed."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    return (prometheus, promtool) if prometheus and promtool else None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_prometheus() -> str:
    """The prometheus binary; without it the test is skipped, or fails under CI (CI must not go green by skipping)."""
    import pytest

    found = binaries()
    if found is None:
        message = "prometheus is not installed: apt-get install -y --no-install-recommends prometheus"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


def scrape_config(exporter_port: int, job: str = "dcgm") -> str:
    """Scrape one exporter on 127.0.0.1 every second, keeping its namespace/pod labels (``honor_labels``, what the
    GPU Operator's ServiceMonitor does)."""
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: {job}\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()
_RNG = random.Random()  # its own: a test seeding the random module must not make two sessions pick alike
_PORTS_FROM = 20000  # and up to the start of the kernel's ephemeral range


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range is 32768-60999


def _bindable(port: int) -> bool:
    # no SO_REUSEADDR: a port still in TIME_WAIT, or bound on any address, counts as taken
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a server that binds it later, often a process still starting up.

    Not a port from ``bind(("127.0.0.1", 0))``: that one lies in the kernel's ephemeral range, from which the kernel
    also picks the source port of every outgoing connection, so in the seconds before the server binds it (a
    Prometheus, an etcd, an ``autoscaler run`` importing its modules) a connection of this machine (the tests poll
    the apiserver with a new connection per request) can take it, and the server exits with "address already in
    use". A port below the ephemeral range is only ever taken by an explicit bind. Each port is handed out once per
    session: two servers never get the same one, and a server restarted on its own port (Prometheus, kube-apiserver)
    finds it free. Without room below the ephemeral range, the kernel's choice (still never handed out twice)."""
    end = _ephemeral_start()
    with _HANDED_OUT_LOCK:
        if end - _PORTS_FROM >= 2000:
            for _ in range(500):
                port = _RNG.randrange(_PORTS_FROM, end)
                if port not in _HANDED_OUT and _bindable(port):
                    _HANDED_OUT.add(port)
                    return port
        for _ in range(500):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no free port on 127.0.0.1")


def label_text(labels: dict[str, str]) -> str:
    """OpenMetrics label set, values escaped (backslash, quote, newline)."""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())


class OpenMetricsWriter:
    """Write families one after the other; ``sample`` lines of one series must come in ascending time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("w")
        self._family: str | None = None
        self.samples = 0

    def family(self, name: str, kind: str, help_text: str = "") -> None:
        self._family = name
        self._file.write(f"# HELP {name} {help_text or name}\n# TYPE {name} {kind}\n")

    def series(self, name: str, labels: dict[str, str], points: Iterable[tuple[float, float]]) -> None:
        prefix = f"{name}{{{label_text(labels)}}} " if labels else f"{name} "
        lines = []
        for t, v in points:
            lines.append(f"{prefix}{format_value(v)} {format_time(t)}\n")
        self._file.writelines(lines)
        self.samples += len(lines)

    def write_raw(self, text: str) -> None:
        self._file.write(text)

    def close(self) -> None:
        self._file.write("# EOF\n")
        self._file.close()


def format_value(v: float) -> str:
    if v != v:
        return "NaN"
    if v == float("inf"):
        return "+Inf"
    if v == float("-inf"):
        return "-Inf"
    return repr(float(v))


def format_time(t: float) -> str:
    return str(int(t)) if float(t).is_integer() else f"{t:.3f}"


def backfill(promtool: str, openmetrics: Path, data_dir: Path) -> float:
    """Blocks from an OpenMetrics file into ``data_dir``; returns seconds taken."""
    started = time.perf_counter()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=24h",
            str(openmetrics),
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.perf_counter() - started


class PrometheusServer:
    """One Prometheus process on a free loopback port with its own data dir; stop() kills it by its pid."""

    def __init__(self, binary: str, data_dir: Path, config: str = EMPTY_CONFIG, port: int | None = None) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.config = config
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"prometheus-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0, extra_args: Sequence[str] = ()) -> PrometheusServer:
        # 60 s: a start (or a restart replaying its WAL, or loading backfilled blocks) on a loaded 2-core machine;
        # a ready server returns at once
        config_path = self.data_dir.parent / f"prometheus-{self.port}.yml"
        config_path.write_text(self.config)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=100y",  # retention counts from the newest block, not the clock
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"prometheus not ready after {timeout}s: {self.log_tail()}")

    def ready(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            conn.request("GET", "/-/ready")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class LoopbackGetServer:
    """A threaded HTTP server on a free 127.0.0.1 port that hands every GET to ``handle`` (canned answers, proxies)."""

    def __init__(self, handle: Callable[[BaseHTTPRequestHandler], None]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        # bound here, on a port the kernel picks: no window in which another socket could take it
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
