"""Benchmark one observation tick of the Prometheus adapter at cluster scale, against a real Prometheus.

Default: 2,000 inference services on 5,000 nodes x 8 GPUs (40,000 GPUs), backfilled with promtool with a short
synthetic history (dcgm-exporter series for every GPU, vLLM-style request counter, queue gauge and latency
histogram for every inference pod). Prints queries per tick, seconds per tick (median of several ticks), the
series parsed and peak memory of this process during the ticks and of Prometheus.

    .venv/bin/python benchmarks/bench_observe.py            # full size (minutes: generation + backfill)
    .venv/bin/python benchmarks/bench_observe.py --quick    # 100 services on 250 nodes, a few seconds

Needs Debian's ``prometheus`` package (prometheus and promtool on PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "prometheus"))

from promserver import PrometheusServer, backfill, binaries

from autoscaler.adapters.prometheus import PrometheusMetricsSource
from autoscaler.adapters.prometheus_settings import PrometheusSettings
from autoscaler.adapters.promql import POD_HASH_ALPHABET
from autoscaler.core.model import ServicePolicy

MODEL = "NVIDIA A100-SXM4-80GB"
BUCKETS = ("0.25", "0.5", "1.0", "2.0", "4.0", "+Inf")
INFERENCE_SHARE = 0.8  # of the GPUs; the rest run training gangs or sit idle
GPUS_PER_POD = 2


@dataclass(frozen=True)
class Size:
    services: int
    nodes: int
    gpus_per_node: int
    minutes: int
    step_s: int
    namespaces: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


FULL = Size(services=2000, nodes=5000, gpus_per_node=8, minutes=30, step_s=15, namespaces=20)
QUICK = Size(services=100, nodes=250, gpus_per_node=8, minutes=10, step_s=15, namespaces=5)


def encode(n: int, width: int) -> str:
    """A deterministic Kubernetes-style hash string (pod-template-hash alphabet)."""
    out = []
    for _ in range(width):
        n, r = divmod(n, len(POD_HASH_ALPHABET))
        out.append(POD_HASH_ALPHABET[r])
    return "".join(out)


def layout(size: Size) -> tuple[list[ServicePolicy], list[tuple[str, str, str | None, str | None]]]:
    """Services, and every GPU as (node, gpu index, namespace, pod): inference pods first, then training, idle."""
    services = [ServicePolicy(f"team-{i % size.namespaces:02d}", f"svc-{i:04d}") for i in range(size.services)]
    inference_gpus = int(size.gpus * INFERENCE_SHARE) // (size.services * GPUS_PER_POD) * size.services * GPUS_PER_POD
    pods_per_service = inference_gpus // (size.services * GPUS_PER_POD)
    owners: list[tuple[str | None, str | None]] = []
    for i, service in enumerate(services):
        template_hash = encode(i * 7919 + 13, 9)
        for p in range(pods_per_service):
            pod = f"{service.name}-{template_hash}-{encode(i * 131 + p, 5)}"
            owners += [(service.namespace, pod)] * GPUS_PER_POD
    training = (size.gpus - len(owners)) // 2
    for g in range(training):  # gangs of 8-GPU workers: StatefulSet-style names, not Deployment pods
        owners.append(("training", f"gang-{g // 64:03d}-worker-{(g // 8) % 8}"))
    owners += [(None, None)] * (size.gpus - len(owners))
    gpus = [
        (f"node-{k // size.gpus_per_node:05d}", str(k % size.gpus_per_node), ns, pod)
        for k, (ns, pod) in enumerate(owners)
    ]
    return services, gpus


def write_openmetrics(path: Path, size: Size, gpus: list[tuple[str, str, str | None, str | None]]) -> int:
    end = 1_800_000_000
    times = list(range(end - size.minutes * 60, end + 1, size.step_s))
    lines = 0
    with path.open("w", buffering=1 << 20) as f:
        families = (
            ("DCGM_FI_DEV_GPU_UTIL", lambda k, j: (k * 37 + j * 3) % 101),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda k, j: ((k * 37 + j * 3) % 101) / 100),
            ("DCGM_FI_DEV_FB_USED", lambda k, j: 20000 + (k * 13 + j) % 40000),
            ("DCGM_FI_DEV_FB_FREE", lambda k, j: 61920 - (k * 13 + j) % 40000),
        )
        for name, value in families:
            f.write(f"# HELP {name} dcgm\n# TYPE {name} gauge\n")
            for k, (node, gpu, ns, pod) in enumerate(gpus):
                labels = (
                    f'gpu="{gpu}",UUID="GPU-{k:08x}-0000-0000-0000-000000000000",device="nvidia{gpu}",'
                    f'modelName="{MODEL}",Hostname="{node}",'
                )
                if pod:
                    labels += f'namespace="{ns}",pod="{pod}",container="main",'
                labels += f'job="dcgm-exporter",instance="{node}:9400"'
                prefix = f"{name}{{{labels}}} "
                f.write("".join(f"{prefix}{value(k, j)} {t}\n" for j, t in enumerate(times)))
                lines += len(times)
        pods = sorted({(ns, pod) for _, _, ns, pod in gpus if pod and not pod.startswith("gang-")})
        f.write("# HELP vllm:request_success requests\n# TYPE vllm:request_success counter\n")
        for k, (ns, pod) in enumerate(pods):
            prefix = f'vllm:request_success_total{{namespace="{ns}",pod="{pod}"}} '
            qps = 1 + k % 9
            f.write("".join(f"{prefix}{qps * size.step_s * j} {t}\n" for j, t in enumerate(times)))
            lines += len(times)
        f.write("# HELP vllm:num_requests_waiting queue\n# TYPE vllm:num_requests_waiting gauge\n")
        for k, (ns, pod) in enumerate(pods):
            prefix = f'vllm:num_requests_waiting{{namespace="{ns}",pod="{pod}"}} '
            f.write("".join(f"{prefix}{(k + j) % 5} {t}\n" for j, t in enumerate(times)))
            lines += len(times)
        f.write("# HELP vllm:e2e_request_latency_seconds latency\n# TYPE vllm:e2e_request_latency_seconds histogram\n")
        for k, (ns, pod) in enumerate(pods):
            qps = 1 + k % 9
            for b, le in enumerate(BUCKETS):
                share = min(1.0, 0.3 + 0.15 * b)
                prefix = f'vllm:e2e_request_latency_seconds_bucket{{namespace="{ns}",pod="{pod}",le="{le}"}} '
                f.write("".join(f"{prefix}{qps * size.step_s * j * share} {t}\n" for j, t in enumerate(times)))
                lines += len(times)
        f.write("# EOF\n")
    return lines


def vm_hwm_mib(pid: int | str = "self") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS


def run(size: Size, ticks: int, workdir: Path) -> dict[str, object]:
    found = binaries()
    if found is None:
        raise SystemExit("prometheus/promtool not found: apt-get install -y --no-install-recommends prometheus")
    prometheus, promtool = found
    services, gpus = layout(size)
    stages: dict[str, float] = {}

    marker = workdir / "size.json"
    data_info: dict[str, int]
    if marker.exists() and json.loads(marker.read_text())["size"] == asdict(size):
        data_info = json.loads(marker.read_text())["data"]  # --workdir reuse: same size, skip the slow part
    else:
        shutil.rmtree(workdir / "data", ignore_errors=True)
        started = time.perf_counter()
        openmetrics = workdir / "bench.om"
        samples = write_openmetrics(openmetrics, size, gpus)
        stages["generate_s"] = time.perf_counter() - started
        om_bytes = openmetrics.stat().st_size
        stages["backfill_s"] = backfill(promtool, openmetrics, workdir / "data")
        openmetrics.unlink()
        data_info = {"samples_backfilled": samples, "openmetrics_bytes": om_bytes}
        marker.write_text(json.dumps({"size": asdict(size), "data": data_info}))

    server = PrometheusServer(prometheus, workdir / "data").start(timeout=120)
    try:
        # generous timeout: a tick at this size is one big answer per family, not a slow server
        settings = PrometheusSettings(url=server.url, timeout_seconds=120, retries=0)
        source = PrometheusMetricsSource(settings)
        now = 1_800_000_000.0
        source.observe(services, now)  # warm-up: first touch of the blocks, page cache
        reset_peak_rss()
        rss_before = vm_hwm_mib()
        seconds, queries, series, cpu = [], [], [], []
        for _ in range(ticks):
            cpu_before = time.process_time()
            obs = source.observe(services, now)
            cpu.append(time.process_time() - cpu_before)  # this process only (all threads): the client's cost
            seconds.append(source.last_stats.seconds)
            queries.append(source.last_stats.queries)
            series.append(source.last_stats.series)
        peak = vm_hwm_mib()
        stale = [o for o in obs.services.values() if o.stale_reasons]
        result: dict[str, object] = {
            "services": size.services,
            "nodes": size.nodes,
            "gpus": size.gpus,
            "history_minutes": size.minutes,
            "step_s": size.step_s,
            "samples_backfilled": data_info["samples_backfilled"],
            "openmetrics_mib": round(data_info["openmetrics_bytes"] / 2**20, 1),
            **{k: round(v, 2) for k, v in stages.items()},
            "queries_per_tick": queries[-1],
            "series_per_tick": series[-1],
            "seconds_per_tick_median": round(statistics.median(seconds), 3),
            "seconds_per_tick_all": [round(s, 3) for s in seconds],
            "client_cpu_seconds_per_tick_median": round(statistics.median(cpu), 3),
            "gpus_observed": len(obs.gpus),
            "services_stale": len(stale),
            "first_stale_reason": stale[0].stale_reasons[0] if stale else None,
            "peak_rss_mib_during_ticks": round(peak, 1) if peak else None,
            "rss_mib_before_ticks": round(rss_before, 1) if rss_before else None,
            "max_rss_mib_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "prometheus_peak_rss_mib": vm_hwm_mib(server.proc.pid) if server.proc else None,
        }
        source.close()
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small size (100 services, 250 nodes x 8 GPUs)")
    parser.add_argument("--services", type=int, help="inference services")
    parser.add_argument("--nodes", type=int, help="GPU nodes")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs per node")
    parser.add_argument("--minutes", type=int, help="history backfilled, minutes")
    parser.add_argument("--step", type=int, help="sample interval of the history, seconds")
    parser.add_argument("--ticks", type=int, default=5, help="measured ticks (after one warm-up)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument(
        "--workdir", type=Path, help="keep the generated data here and reuse it next time (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    size = Size(
        services=args.services or base.services,
        nodes=args.nodes or base.nodes,
        gpus_per_node=args.gpus_per_node or base.gpus_per_node,
        minutes=args.minutes or base.minutes,
        step_s=args.step or base.step_s,
        namespaces=base.namespaces,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-observe-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(size, args.ticks, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["services_stale"] == 0 and result["gpus_observed"] == size.gpus else 1


if __name__ == "__main__":
    sys.exit(main())
