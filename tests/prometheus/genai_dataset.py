"""DCGM- and vLLM-shaped Prometheus history generated from a real trace: Alibaba GenAI 2026 (stable diffusion).

The trace gives, per pod (``container_ip``), GPU duty cycle and gateway QPS on a 57 s grid. We keep 12 busy pods
for the first 12 hours (``data/genai_subset.csv.gz``, extracted by ``python genai_dataset.py --extract`` from
``../shared/traces/alibaba-genai-v2026``) and turn them into what dcgm-exporter and a vLLM server would have
exported: utilisation = duty cycle, engine activity, framebuffer used/free, a request counter, a queue gauge and a
latency histogram. Every expected value a test compares with is computed here, in Python, from the same trace.

Extra series exercise validation on the real server: a ``broken`` service (one GPU exported twice, one NaN, one
out-of-range value), an idle GPU with no pod, and ``probe_metric`` series whose label values are hostile PromQL.
"""

from __future__ import annotations

import csv
import gzip
import math
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from promserver import OpenMetricsWriter

HERE = Path(__file__).resolve().parent
SUBSET = HERE / "data" / "genai_subset.csv.gz"
SOURCE = HERE.parents[2] / "shared" / "traces" / "alibaba-genai-v2026"

GRID = 57.0  # the trace's sampling interval, seconds
RATE_WINDOW_S = 4 * GRID  # exactly 4 intervals: rate() over it needs no extrapolation, so expectations are exact
LOOKBACK_S = 300.0  # Prometheus' default --query.lookback-delta
NAMESPACE = "genai"
SERVICES = ("sd-xl", "sd-turbo", "sd-lora")
PODS_PER_SERVICE = 4
TEMPLATE_HASH = {"sd-xl": "7d9f8b6c5", "sd-turbo": "5c8d7f9b4", "sd-lora": "6b4f5d8c7", "broken": "84c6d5b9f"}
POD_SUFFIXES = ("x2x4b", "qz7kd", "m9f2w", "t5h8c")
MODEL = "NVIDIA A100-SXM4-80GB"
FB_TOTAL_MIB = 81920.0
BUCKETS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, math.inf)
HOSTILE_VALUES = (
    'a"} or vector(1) or up{x="',
    "a.b|c\\d\nf",
    ".*",
)
HOSTILE_DECOYS = ("aXb|c\\d\nf", "anything")


@dataclass(frozen=True)
class TracePod:
    service: str
    name: str
    node: str
    gpu: str
    container: str

    @property
    def uuid(self) -> str:
        return f"GPU-{self.node}-{self.gpu}"


class GenaiDataset:
    def __init__(self, subset: Path = SUBSET) -> None:
        duty: dict[str, dict[float, float]] = defaultdict(dict)
        qps: dict[str, dict[float, float]] = defaultdict(dict)
        with gzip.open(subset, "rt", newline="") as f:
            for row in csv.DictReader(f):
                target = duty if row["kind"] == "duty" else qps
                target[row["container"]][float(row["timestamp"])] = float(row["value"])
        containers = sorted(duty, key=lambda c: (-len(qps.get(c, {})), c))[: len(SERVICES) * PODS_PER_SERVICE]
        self.pods: list[TracePod] = []
        for i, container in enumerate(containers):
            service = SERVICES[i // PODS_PER_SERVICE]
            suffix = POD_SUFFIXES[i % PODS_PER_SERVICE]
            self.pods.append(
                TracePod(
                    service, f"{service}-{TEMPLATE_HASH[service]}-{suffix}", f"node-{i // 2:02d}", str(i % 2), container
                )
            )
        self.util = {p.name: dict(sorted(duty[p.container].items())) for p in self.pods}
        self.qps = {p.name: qps.get(p.container, {}) for p in self.pods}
        times = sorted({t for series in self.util.values() for t in series})
        self.start, self.end = times[0], times[-1]
        self.grid = [self.start + k * GRID for k in range(int((self.end - self.start) / GRID) + 1)]

    # ---- expectations ------------------------------------------------------------------------------------------

    def pods_of(self, service: str) -> list[TracePod]:
        return [p for p in self.pods if p.service == service]

    def util_at(self, pod: str, t: float) -> float | None:
        """What an instant query returns: the last sample at or before t, within the lookback."""
        best = None
        for ts, v in self.util[pod].items():
            if ts <= t:
                best = (ts, v)
            else:
                break
        if best is None or t - best[0] > LOOKBACK_S:
            return None
        return best[1]

    def qps_at(self, pod: str, t: float) -> float:
        return self.qps[pod].get(t, 0.0)  # the gateway reports nothing in a minute without requests

    def request_rate(self, service: str, t: float) -> float:
        """rate(counter[228s]) at a grid time = mean QPS of the 4 intervals ending at t, summed over pods."""
        steps = [t - k * GRID for k in range(4)]
        return sum(sum(self.qps_at(p.name, s) for s in steps) / 4 for p in self.pods_of(service))

    def queue(self, pod: str, t: float) -> float:
        util = self.util_at(pod, t) or 0.0
        return float(math.floor(self.qps_at(pod, t) * util / 5))

    def latency(self, service: str, t: float, q: float) -> float:
        """histogram_quantile(q, sum by (le) (rate(bucket[228s]))) as Prometheus 2.42 computes it."""
        rates = [0.0] * len(BUCKETS)
        for pod in self.pods_of(service):
            counts_now = self._bucket_counts(pod.name, t)
            counts_then = self._bucket_counts(pod.name, t - RATE_WINDOW_S)
            for i in range(len(BUCKETS)):
                rates[i] += (counts_now[i] - counts_then[i]) / RATE_WINDOW_S
        return histogram_quantile(q, list(zip(BUCKETS, rates, strict=True)))

    def active_times(self, minimum_rate: float = 0.05) -> list[float]:
        """Grid times (with a full rate window behind them) where every service has traffic."""
        out = []
        for t in self.grid[8:]:
            if all(self.request_rate(s, t) >= minimum_rate for s in SERVICES) and all(
                self.util_at(p.name, t) is not None for p in self.pods
            ):
                out.append(t)
        return out

    # ---- generated series --------------------------------------------------------------------------------------

    @staticmethod
    def median_latency(util: float) -> float:
        return 0.3 + 0.02 * util  # seconds; a busier GPU serves slower

    def _increments(self, pod: str) -> Iterable[tuple[float, float, float]]:
        """(t, requests in the interval ending at t, median latency) on the grid."""
        for t in self.grid:
            yield t, self.qps_at(pod, t) * GRID, self.median_latency(self.util_at(pod, t) or 0.0)

    def _bucket_counts(self, pod: str, t: float) -> list[float]:
        cache = self.__dict__.setdefault("_bucket_cache", {})
        if pod not in cache:
            running = [0.0] * len(BUCKETS)
            series: dict[float, list[float]] = {}
            for ts, n, median in self._increments(pod):
                for i, le in enumerate(BUCKETS):
                    running[i] += n * _cdf(le, median)
                series[ts] = list(running)
            cache[pod] = series
        return cache[pod][t]

    def write_openmetrics(self, path: Path) -> int:
        w = OpenMetricsWriter(path)

        def gpu_labels(p: TracePod) -> dict[str, str]:
            return {
                "gpu": p.gpu,
                "UUID": p.uuid,
                "device": f"nvidia{p.gpu}",
                "modelName": MODEL,
                "Hostname": p.node,
                "namespace": NAMESPACE,
                "pod": p.name,
                "container": "main",
                "job": "dcgm-exporter",
            }

        gauges = {
            "DCGM_FI_DEV_GPU_UTIL": lambda u: u,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda u: u / 100.0,
            "DCGM_FI_DEV_FB_USED": lambda u: fb_used(u),
            "DCGM_FI_DEV_FB_FREE": lambda u: FB_TOTAL_MIB - fb_used(u),
        }
        broken = [f"broken-{TEMPLATE_HASH['broken']}-{s}" for s in POD_SUFFIXES[:3]]
        for name, fn in gauges.items():
            w.family(name, "gauge")
            for p in self.pods:
                w.series(name, gpu_labels(p), [(t, fn(v)) for t, v in self.util[p.name].items()])
            # the broken service on node-09: GPU 0 exported by two jobs, GPU 1 NaN, GPU 2 out of range
            for gpu, pod in enumerate(broken):
                labels = {
                    "gpu": str(gpu),
                    "UUID": f"GPU-node-09-{gpu}",
                    "modelName": MODEL,
                    "Hostname": "node-09",
                    "namespace": NAMESPACE,
                    "pod": pod,
                    "job": "dcgm-exporter",
                }
                util = {0: 40.0, 1: math.nan, 2: 150.0}[gpu]
                value = fn(util) if name == "DCGM_FI_DEV_GPU_UTIL" else fn(50.0)
                w.series(name, labels, [(t, value) for t in self.grid])
                if gpu == 0 and name == "DCGM_FI_DEV_GPU_UTIL":
                    w.series(name, {**labels, "job": "dcgm-exporter-copy"}, [(t, 42.0) for t in self.grid])
            idle = {
                "gpu": "3",
                "UUID": "GPU-node-09-3",
                "modelName": MODEL,
                "Hostname": "node-09",
                "job": "dcgm-exporter",
            }
            w.series(name, idle, [(t, fn(0.0)) for t in self.grid])

        w.family("vllm:request_success", "counter")
        for p in self.pods:
            total, points = 0.0, []
            for t, n, _ in self._increments(p.name):
                total += n
                points.append((t, total))
            w.series("vllm:request_success_total", {"namespace": NAMESPACE, "pod": p.name}, points)
        w.family("vllm:num_requests_waiting", "gauge")
        for p in self.pods:
            w.series(
                "vllm:num_requests_waiting",
                {"namespace": NAMESPACE, "pod": p.name},
                [(t, self.queue(p.name, t)) for t in self.grid],
            )
        w.family("vllm:e2e_request_latency_seconds", "histogram")
        for p in self.pods:
            for i, le in enumerate(BUCKETS):
                le_text = "+Inf" if le == math.inf else repr(le)
                w.series(
                    "vllm:e2e_request_latency_seconds_bucket",
                    {"namespace": NAMESPACE, "pod": p.name, "le": le_text},
                    [(t, self._bucket_counts(p.name, t)[i]) for t in self.grid],
                )
        w.family("probe_metric", "gauge")
        for value in (*HOSTILE_VALUES, *HOSTILE_DECOYS):
            w.series("probe_metric", {"name": value}, [(t, 1.0) for t in self.grid])
        w.close()
        return w.samples


def fb_used(util: float) -> float:
    return 12000.0 + 600.0 * (util if util == util else 50.0)


def _cdf(le: float, median: float) -> float:
    if le == math.inf:
        return 1.0
    return 1.0 - math.exp(-le * math.log(2) / median)  # exponential latency with that median


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus 2.42 ``bucketQuantile`` on (upper bound, cumulative count) pairs."""
    buckets = sorted(buckets)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    counts = [c for _, c in buckets]
    for i in range(1, len(counts)):  # ensureMonotonic
        counts[i] = max(counts[i], counts[i - 1])
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], counts[b]
    if b > 0:
        start = buckets[b - 1][0]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def extract(source: Path = SOURCE, out: Path = SUBSET, hours: float = 12.0) -> None:
    """Cut the committed subset from the full trace: 12 pods with the most QPS samples, the first ``hours``."""
    import pandas as pd

    duty = pd.read_csv(source / "pod_gpu_duty_cycle_anon.tar.gz", compression="tar")
    qps = pd.read_csv(source / "qps.tar.gz", compression="tar")
    qps = qps[qps.request_type == "Generative Requests"]
    top = qps.groupby("container_ip").size().sort_values(ascending=False).index[: len(SERVICES) * PODS_PER_SERVICE]
    t0 = duty.timestamp_anon.min()
    t1 = t0 + hours * 3600
    rows = []
    for kind, frame in (("duty", duty), ("qps", qps)):
        part = frame[frame.container_ip.isin(top) & (frame.timestamp_anon >= t0) & (frame.timestamp_anon < t1)]
        for r in part.sort_values(["container_ip", "timestamp_anon"]).itertuples():
            rows.append((kind, int(r.timestamp_anon), r.container_ip, r.value))
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("kind", "timestamp", "container", "value"))
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--extract"]:
        extract()
    else:
        print(__doc__)
