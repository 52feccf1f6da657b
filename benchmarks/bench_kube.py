#!/usr/bin/env python3
"""One controller tick's Kubernetes read + write path against the fake API server, at cluster scale.

    python benchmarks/bench_kube.py            # 5,000 GPU nodes, 20,000 pods, 7 ticks
    python benchmarks/bench_kube.py --quick    # 500 nodes, 2,000 pods, 3 ticks (the test suite runs this)

A tick here is what ``autoscaler run`` does against the API each tick: list and validate the GPUScalingPolicies,
take a cluster snapshot (Deployments, Pods, Nodes, PDBs, PriorityClasses - every list paginated), then act: scale
some Deployments, evict some training pods (some blocked by a PDB), resize the burst node pool, an Event per action
and the status of every policy that changed. The fake API server runs in its own process, as a real one would.

Reported: API calls per tick (read / write), seconds per tick (median, and the read and write parts), peak Python
memory of one tick (tracemalloc) and the client process's max RSS. The server is a fake: absolute times say what
the client costs plus a local, unoptimised server, not what a production apiserver answers in.

Last full run (2 shared vCPUs, Python 3.11, kubernetes client 37.0.2): 144 API calls per tick (55 reads: 40 pod
pages + 10 node pages + 5 other lists; 89 writes for 10 scales with their Events and status, 15 eviction attempts,
one node-pool resize), 1.50 s per tick median (1.35 s reading, 0.15 s writing; 1.8 s max; up to ~4.4 s while
other test suites loaded the machine), 88 MiB peak Python memory in a tick, 316 MiB client max RSS. One page of
500 pods: 0.025 s as raw JSON, 0.158 s through the client's typed models.

Stop 36 (pods and nodes converted page by page, ``Pager.converted``; two runs of each tree interleaved on the same
loaded machine): 152 API calls per tick (63 reads, 89 writes); peak Python memory in a tick 94.7 -> 27.5 MiB, client
max RSS 332 -> 157 MiB; seconds per tick (median) 1.20 / 1.95 before, 1.25 / 1.48 after: the same within noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SERVICES = 100  # inference Deployments, each with a GPUScalingPolicy
GPUS_PER_NODE = 8
TRAINING_GANG = 8  # pods per training job


@dataclass
class Shape:
    nodes: int
    pods: int
    ticks: int
    scales: int = 10
    evictions: int = 5


def build_objects(shape: Shape) -> list[dict[str, Any]]:
    """A cluster: GPU nodes in two pools, inference pods behind Deployments, training gangs (JobSets)."""
    from tests.kube import objects as o

    objs: list[dict[str, Any]] = [
        o.policy_crd(),
        o.jobset_crd(),
        o.machine_deployment_crd(),
        o.machine_deployment("gpu-burst", replicas=shape.nodes // 10, max_size=shape.nodes),
        o.priority_class("inference", 1000),
        o.priority_class("training", 100),
        o.priority_class("batch-low", 10, global_default=True),
    ]
    for i in range(shape.nodes):
        objs.append(o.node(f"gpu-{i:05d}", GPUS_PER_NODE, pool="gpu-burst" if i % 10 == 0 else "base"))
    inference_pods = shape.pods // 2
    per_service = max(1, inference_pods // SERVICES)
    for s in range(SERVICES):
        name = f"svc-{s:03d}"
        objs.append(o.deployment(name, "inference", replicas=per_service))
        objs.append(o.gpu_policy(name, "inference", maxReplicas=per_service * 4))
        objs.append(o.pdb(name, "inference", selector={"app": name}, disruptions_allowed=1, current=per_service))
        for r in range(per_service):
            objs.append(
                o.deployment_pod(
                    name,
                    r,
                    "inference",
                    node_name=f"gpu-{(s * per_service + r) % shape.nodes:05d}",
                    priority_class="inference",
                    priority=1000,
                )
            )
    training_pods = shape.pods - per_service * SERVICES
    for j in range(training_pods // TRAINING_GANG):
        job = f"train-{j:04d}"
        objs.append(o.jobset(job, "training"))
        # Every 4th job is protected by a PDB that allows nothing: its evictions come back 429 (BLOCKED).
        if j % 4 == 0:
            objs.append(
                o.pdb(
                    job,
                    "training",
                    selector={"jobset.sigs.k8s.io/jobset-name": job},
                    disruptions_allowed=0,
                    current=TRAINING_GANG,
                )
            )
        for r in range(TRAINING_GANG):
            objs.append(
                o.pod(
                    f"{job}-w{r}",
                    "training",
                    gpus=GPUS_PER_NODE,
                    priority_class="training",
                    priority=100,
                    node_name=f"gpu-{(j * TRAINING_GANG + r) % shape.nodes:05d}",
                    labels={"jobset.sigs.k8s.io/jobset-name": job},
                    annotations={"gpuautoscaler.dev/last-checkpoint": "2026-01-01T00:00:00Z"},
                )
            )
    return objs


def _serve(shape: Shape, conn: Any) -> None:
    """Server process: seed and serve until the parent closes the pipe."""
    from tests.kube.fake_apiserver import FakeApiServer

    server = FakeApiServer()
    started = time.monotonic()
    count = server.seed(build_objects(shape))
    server.start()
    conn.send({"url": server.url, "objects": count, "seed_s": time.monotonic() - started})
    with contextlib.suppress(EOFError):  # the parent died: stop as well
        conn.recv()  # blocks until the parent is done
    server.stop()


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/_fake/stats", timeout=30) as resp:
        return dict(json.loads(resp.read()))


@dataclass
class TickResult:
    seconds: float
    read_s: float
    write_s: float
    read_calls: int
    write_calls: int
    policies: int
    pods: int
    nodes: int
    evicted: int
    blocked: int


class Tick:
    """The adapters of one controller and what it does each tick."""

    def __init__(self, kubeconfig: Path) -> None:
        from autoscaler.adapters.kubernetes import (
            KubeClusterReader,
            KubeClusterWriter,
            MachineDeploymentNodePools,
            PolicyLoader,
            ReaderConfig,
            WriterConfig,
            load_api_client,
        )

        api = load_api_client("kubeconfig", kubeconfig)
        self.reader = KubeClusterReader(api, ReaderConfig(request_timeout_s=60))
        self.writer = KubeClusterWriter(api, WriterConfig(request_timeout_s=60, reporting_instance="bench"))
        self.policies = PolicyLoader(api, request_timeout_s=60)
        self.pools = MachineDeploymentNodePools(api, "capi-system", request_timeout_s=60)
        self.api = api
        self.n = 0

    def run(self, shape: Shape, url: str) -> TickResult:
        from autoscaler.adapters.kubernetes import ConditionUpdate, LastAction, StatusUpdate
        from autoscaler.core.model import ScaleDeployment
        from autoscaler.core.reasons import Reason
        from autoscaler.ports import EvictionOutcome

        self.n += 1
        now = time.time()
        before = _stats(url)["requests"]
        started = time.perf_counter()
        policy_set = self.policies.load()
        snapshot = self.reader.snapshot(now)
        read_s = time.perf_counter() - started
        after_read = _stats(url)["requests"]

        write_started = time.perf_counter()
        services = sorted(policy_set.valid, key=lambda p: p.name)[: shape.scales]
        replicas = {d.name: d.spec_replicas for d in snapshot.deployments}
        for policy in services:
            target = replicas[policy.service.name] + (1 if self.n % 2 else -1)
            self.writer.scale_deployment("inference", policy.service.name, target)
            action = ScaleDeployment(
                "inference",
                policy.service.name,
                target,
                replicas[policy.service.name],
                Reason.METRIC_ABOVE_TARGET,
                "bench",
            )
            self.writer.emit_event(
                "Deployment", "inference", policy.service.name, "MetricAboveTarget", f"scaled to {target}"
            )
            self.writer.update_policy_status(
                "inference",
                policy.name,
                StatusUpdate(
                    current_replicas=target,
                    desired_replicas=target,
                    last_action=LastAction.from_action(action, now),
                    conditions=(ConditionUpdate("Ready", True, "Active", "ok"),),
                ),
                generation=policy.generation,
                now=now,
            )
        victims = [p for p in snapshot.pods if p.namespace == "training"][: shape.evictions * 3]
        evicted = blocked = 0
        for pod in victims:
            if evicted >= shape.evictions:
                break
            outcome = self.writer.evict_pod(pod.namespace, pod.name)
            if outcome is EvictionOutcome.EVICTED:
                evicted += 1
                self.writer.emit_event("Pod", pod.namespace, pod.name, "PreemptForInference", "freed GPUs")
            elif outcome is EvictionOutcome.BLOCKED:
                blocked += 1
        self.pools.scale("gpu-burst", self.pools.node_count("gpu-burst") + (1 if self.n % 2 else -1))
        write_s = time.perf_counter() - write_started
        after = _stats(url)["requests"]
        return TickResult(
            seconds=time.perf_counter() - started,
            read_s=read_s,
            write_s=write_s,
            read_calls=after_read - before,
            write_calls=after - after_read,
            policies=len(policy_set.valid),
            pods=len(snapshot.pods),
            nodes=len(snapshot.nodes),
            evicted=evicted,
            blocked=blocked,
        )


def measure_typed_page(tick: Tick) -> tuple[float, float]:
    """Seconds to get one 500-pod page as raw JSON vs through the client's typed models (why the reader is raw)."""
    import json as _json

    from kubernetes import client

    core = client.CoreV1Api(tick.api)
    started = time.perf_counter()
    _json.loads(core.list_pod_for_all_namespaces(limit=500, _preload_content=False).data)
    raw = time.perf_counter() - started
    started = time.perf_counter()
    core.list_pod_for_all_namespaces(limit=500)
    typed = time.perf_counter() - started
    return raw, typed


def run(shape: Shape, *, typed_comparison: bool = True, out: Callable[[str], None] = print) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(shape, child), daemon=True)
    proc.start()
    try:
        info = parent.recv()
        out(f"fake API server: {info['objects']:,} objects seeded in {info['seed_s']:.1f}s at {info['url']}")
        with tempfile.TemporaryDirectory() as tmp:
            from tests.kube.fake_apiserver import write_kubeconfig

            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", info["url"])
            tick = Tick(kubeconfig)
            tick.run(shape, info["url"])  # warm-up: connection pool, pydantic validators of the client
            results = [tick.run(shape, info["url"]) for _ in range(shape.ticks)]
            tracemalloc.start()
            tick.run(shape, info["url"])
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            typed = measure_typed_page(tick) if typed_comparison else None
    finally:
        parent.send("stop")
        proc.join(timeout=30)
        if proc.is_alive():
            proc.terminate()
    med = statistics.median
    summary = {
        "shape": asdict(shape),
        "policies": results[0].policies,
        "gpu_pods_read": results[0].pods,
        "gpu_nodes_read": results[0].nodes,
        "api_calls_per_tick": med([r.read_calls + r.write_calls for r in results]),
        "read_calls_per_tick": med([r.read_calls for r in results]),
        "write_calls_per_tick": med([r.write_calls for r in results]),
        "seconds_per_tick_median": med([r.seconds for r in results]),
        "seconds_per_tick_max": max(r.seconds for r in results),
        "read_seconds_median": med([r.read_s for r in results]),
        "write_seconds_median": med([r.write_s for r in results]),
        "evicted_per_tick": med([r.evicted for r in results]),
        "blocked_per_tick": med([r.blocked for r in results]),
        "peak_python_mib_one_tick": peak / 2**20,
        "client_max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if typed is not None:
        summary["one_page_500_pods_raw_json_s"], summary["one_page_500_pods_typed_models_s"] = typed
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="500 nodes, 2,000 pods, 3 ticks")
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--pods", type=int)
    parser.add_argument("--ticks", type=int)
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    shape = Shape(500, 2000, 3) if args.quick else Shape(5000, 20000, 7)
    shape.nodes = args.nodes or shape.nodes
    shape.pods = args.pods or shape.pods
    shape.ticks = args.ticks or shape.ticks
    summary = run(shape, typed_comparison=not args.quick)
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
