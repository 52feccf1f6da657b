"""Benchmark (issue 15, item 2): latency of the kube-scheduler extender per call, and its memory.

A synthetic cluster snapshot -- ``--nodes`` nodes of 8 GPUs (A100 / H100 / L40S), ``--pods`` GPU pods of 1, 2, 4
and 8 GPUs packed first-fit onto them (2,000 pods take about 70 % of the GPUs), a quarter with a GPU type -- and a
stream of ``--calls`` ``filter`` and ``prioritize`` requests, each for a pod of 1..8 GPUs, some with a type, every
node a candidate (the scheduler sends at most its feasible nodes; with ``percentageOfNodesToScore`` left adaptive it
scores about 42 % of 1,000). Per call, median and p99 in milliseconds of ``Extender.handle`` (JSON decode, advice, JSON
encode: all the controller does for a request; the network is not in it), for:

- ``fgd (view cached)`` -- the extender as shipped: the per-snapshot part (GPU nodes, task mix) built once per
  snapshot, reused by every request until the next tick's snapshot, and FGD computed once per distinct node state
  (``fgd_scores``);
- ``fgd, every node scored`` -- the same view cache, FGD computed for every node (``fgd_scores_per_node``);
- ``fgd (no cache)`` -- the baseline: FGD for every node, and the view rebuilt from the snapshot for every request;
- ``most-free (cached)`` -- a trivial scorer (most free GPUs first) with the same cache: what the protocol and
  parsing cost on their own;
- ``FGD+`` -- the project's own scorer (``autoscaler.core.placement_score.score_nodes``) through the same swap point,
  once per node state and for every node;

then the one-off view build per snapshot, a few hundred calls through the real HTTP server (keep-alive, as the
scheduler's client), and the peak memory (tracemalloc) of building the view and answering.

    python -m benchmarks.bench_extender [--nodes 1000] [--pods 2000] [--calls 400] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from autoscaler.core.cluster import ClusterSnapshot, DeploymentInfo, NodeInfo, PodInfo
from autoscaler.core.extender import (
    ExtenderConfig,
    PlacementView,
    Scorer,
    fgd_scores,
    fgd_scores_per_node,
    once_per_node_state,
)
from autoscaler.core.fragmentation import GpuNode, Task, TaskMix
from autoscaler.core.placement_score import score_nodes
from autoscaler.extender_http import Extender, ExtenderServer

TYPES = (("NVIDIA-A100-SXM4-80GB", 0.6), ("NVIDIA-H100-80GB-HBM3", 0.3), ("NVIDIA-L40S", 0.1))
SHAPES = ((1, 0.45), (2, 0.2), (4, 0.2), (8, 0.15))
NOW = 1_700_000_000.0


def synthetic_snapshot(nodes: int, pods: int, seed: int = 7) -> ClusterSnapshot:
    rng = random.Random(seed)
    kinds = [t for t, _ in TYPES]
    node_infos = tuple(
        NodeInfo(f"gpu-{i:05d}", 8, rng.choices(kinds, [w for _, w in TYPES])[0], None, True) for i in range(nodes)
    )
    free = {n.name: 8 for n in node_infos}
    order = [n.name for n in node_infos]
    deployments = tuple(
        DeploymentInfo("ml", f"svc-{t[:4].lower()}-{k}", 1, 1, gpu_product=t) for k, t in enumerate(kinds)
    )
    product_of = {n.name: n.gpu_product for n in node_infos}
    pod_infos: list[PodInfo] = []
    for i in range(pods):
        gpus = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])[0]
        start = rng.randrange(len(order))
        host = next(
            (
                order[(start + j) % len(order)]
                for j in range(len(order))
                if free[order[(start + j) % len(order)]] >= gpus
            ),
            None,
        )
        if host is None:
            continue
        free[host] -= gpus
        owner = None
        if rng.random() < 0.25:  # a Deployment's replica, selecting its node's type
            owner = next(d.name for d in deployments if d.gpu_product == product_of[host])
        pod_infos.append(
            PodInfo("ml", f"p-{i}", host, gpus, 0, "Running", True, "Deployment" if owner else None, owner)
        )
    return ClusterSnapshot(NOW, deployments=deployments, pods=tuple(pod_infos), nodes=node_infos)


def request_bodies(snapshot: ClusterSnapshot, calls: int, seed: int = 11) -> list[bytes]:
    rng = random.Random(seed)
    names = [n.name for n in snapshot.nodes]
    bodies = []
    for i in range(calls):
        gpus = rng.choice((1, 2, 4, 8))
        spec: dict[str, Any] = {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            "schedulerName": "gpu-placement",
        }
        if rng.random() < 0.3:
            spec["nodeSelector"] = {"nvidia.com/gpu.product": rng.choice(TYPES)[0]}
        pod = {"metadata": {"name": f"new-{i}", "namespace": "ml"}, "spec": spec}
        bodies.append(json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode())
    return bodies


def most_free(nodes: Sequence[GpuNode], task: Task, mix: TaskMix) -> list[int | None]:
    del mix
    return [None if node.whole_free_gpus < task.gpu_count else 100 * node.whole_free_gpus // 8 for node in nodes]


class Uncached(Extender):
    """The baseline: the per-snapshot view rebuilt for every request."""

    def view(self) -> PlacementView | None:
        snapshot = self._snapshots()
        return None if snapshot is None else PlacementView.of(snapshot)


def time_calls(extender: Extender, bodies: Sequence[bytes]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for body in bodies:
        for verb in ("filter", "prioritize"):
            started = time.perf_counter()
            status, _ = extender.handle(verb, body)
            out[verb].append((time.perf_counter() - started) * 1e3)
            assert status == 200
    return out


def summary(ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": statistics.median(ordered), "p99_ms": p99, "max_ms": ordered[-1], "calls": len(ordered)}


def run(nodes: int, pods: int, calls: int, http_calls: int) -> dict[str, Any]:
    snapshot = synthetic_snapshot(nodes, pods)
    bodies = request_bodies(snapshot, calls)
    config = ExtenderConfig(max_snapshot_age_s=1e9)
    clock: Callable[[], float] = lambda: NOW  # noqa: E731
    used = sum(p.gpus for p in snapshot.pods)
    results: dict[str, Any] = {
        "nodes": nodes,
        "gpus": nodes * 8,
        "pods": len(snapshot.pods),
        "gpus_taken": used,
        "request_bytes": len(bodies[0]),
    }

    builds = []
    for _ in range(5):
        started = time.perf_counter()
        view = PlacementView.of(snapshot)
        builds.append((time.perf_counter() - started) * 1e3)
    results["view_build_ms"] = statistics.median(builds)
    results["mix_classes"] = len(view.mix.classes)

    variants: list[tuple[str, type[Extender], Scorer, int]] = [
        ("fgd (view cached)", Extender, fgd_scores, len(bodies)),
        ("fgd, every node scored", Extender, fgd_scores_per_node, max(10, len(bodies) // 4)),
        ("fgd (no cache)", Uncached, fgd_scores_per_node, max(10, len(bodies) // 10)),
        ("most-free (cached)", Extender, most_free, len(bodies)),
        ("FGD+ score_nodes (cached)", Extender, once_per_node_state(score_nodes), len(bodies)),
        ("FGD+, every node scored", Extender, score_nodes, max(10, len(bodies) // 4)),
    ]
    results["variants"] = {}
    for name, cls, scorer, n in variants:
        extender = cls(lambda: snapshot, config, clock=clock, scorer=scorer)
        extender.handle("filter", bodies[0])  # warm: the cached variants build their view here
        timings = time_calls(extender, bodies[:n])
        results["variants"][name] = {verb: summary(ms) for verb, ms in timings.items()}

    # through the real HTTP server, one keep-alive connection
    server = ExtenderServer(Extender(lambda: snapshot, config, clock=clock), "127.0.0.1", 0)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        over_http: dict[str, list[float]] = {"filter": [], "prioritize": []}
        for body in bodies[:http_calls]:
            for verb in ("filter", "prioritize"):
                started = time.perf_counter()
                conn.request("POST", f"/scheduler/{verb}", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                over_http[verb].append((time.perf_counter() - started) * 1e3)
                assert response.status == 200
        conn.close()
    finally:
        server.stop()
    results["http"] = {verb: summary(ms) for verb, ms in over_http.items()}

    tracemalloc.start()
    extender = Extender(lambda: snapshot, config, clock=clock)
    for body in bodies[:20]:
        extender.handle("prioritize", body)
        extender.handle("filter", body)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    results["peak_memory_mib"] = peak / 2**20
    return results


def report(results: dict[str, Any]) -> str:
    lines = [
        f"snapshot: {results['nodes']} nodes x 8 GPUs = {results['gpus']} GPUs, {results['pods']} GPU pods holding "
        f"{results['gpus_taken']} GPUs ({100 * results['gpus_taken'] / results['gpus']:.0f} %), task mix of "
        f"{results['mix_classes']} classes; each request names all {results['nodes']} nodes "
        f"({results['request_bytes'] / 1024:.0f} KiB)",
        f"view build (once per snapshot): {results['view_build_ms']:.1f} ms",
        "",
        f"{'per call, ms (in-process)':<28}{'filter med':>11}{'p99':>9}{'prioritize med':>16}{'p99':>9}{'calls':>7}",
    ]
    for name, verbs in results["variants"].items():
        f, p = verbs["filter"], verbs["prioritize"]
        lines.append(
            f"{name:<28}{f['median_ms']:>11.2f}{f['p99_ms']:>9.2f}{p['median_ms']:>16.2f}{p['p99_ms']:>9.2f}"
            f"{int(p['calls']):>7}"
        )
    f, p = results["http"]["filter"], results["http"]["prioritize"]
    lines.append(
        f"{'fgd cached, over HTTP':<28}{f['median_ms']:>11.2f}{f['p99_ms']:>9.2f}{p['median_ms']:>16.2f}"
        f"{p['p99_ms']:>9.2f}{int(p['calls']):>7}"
    )
    lines.append(f"peak memory (view + 20 calls of each verb, tracemalloc): {results['peak_memory_mib']:.1f} MiB")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=400, help="requests per variant (each: filter + prioritize)")
    parser.add_argument("--http-calls", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="smoke run: 50 nodes, 120 pods, 10 calls")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.calls, args.http_calls = 50, 120, 10, 5
    results = run(args.nodes, args.pods, args.calls, args.http_calls)
    print(report(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
