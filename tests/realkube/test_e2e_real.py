"""End to end against the real control plane (issue 13, item 5): the whole loop with nothing of ours imitating
Kubernetes.

Real: etcd, kube-apiserver, kube-controller-manager (Deployment -> ReplicaSet -> Pod), kube-scheduler binding the
pods onto kwok GPU nodes, kwok running them; Prometheus (the Debian binary) scraping; ``autoscaler run`` as a
subprocess configured through the environment, with leader election on against the real Lease API, reading the
GPUScalingPolicy CRD from ``deploy/base``. Fake: only the GPUs and the application: one HTTP exporter on 127.0.0.1
publishing dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` and vLLM's ``vllm:num_requests_waiting`` /
``vllm:request_success_total`` for the Deployment's *real* pods (their names and nodes read from the API at every
scrape), from a fixed total demand shared by the pods that are Running, so scaling up really lowers the per-pod
utilisation.

The test makes its own two kwok nodes with a GPU product no other test selects, so other tests' pods cannot take
the GPUs it counts. Every wait is bounded; the controller, Prometheus and the exporter are stopped in finalizers and
the nodes deleted. The timeline (seconds from the controller's start) is printed.

The world, the exporter and the readers are shared with the other controller tests (controller_world.py).
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from tests.realkube.control_plane import ControlPlane
from tests.realkube.controller_world import (
    DEPLOYMENT,
    IDLE,
    OVERLOADED,
    Timeline,
    World,
    all_pods,
    bound,
    conditions,
    events,
    get_deployment,
    managers,
    n_or_none,
    open_world,
    policy,
    policy_obj,
    prom_pods,
    ready,
    running_pods,
    spec_replicas,
    status_at,
)
from tests.runtime.controller_process import Controller

pytestmark = [pytest.mark.integration, pytest.mark.realkube]


@pytest.fixture
def world(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[World]:
    with open_world(control_plane, namespace, tmp_path) as w:
        yield w


def test_whole_loop_prometheus_controller_scheduler_kwok(world: World) -> None:
    w, cp = world, world.cp

    # -- the Deployment's two pods placed by the real scheduler and Running on the test's nodes --
    first = cp.wait("the 2 initial pods Running", lambda: n_or_none(running_pods(w), 2))
    assert set(first.values()) <= set(w.nodes), first
    cp.wait("Deployment ready 2/2", lambda: ready(w) == 2 or None)
    w.exporter.demand = OVERLOADED
    cp.wait("Prometheus to scrape both pods", lambda: prom_pods(w) == set(first) or None, timeout_s=60)
    cp.request("POST", f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{w.namespace}/{PLURAL}", policy())

    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{w.namespace}/leases/gpu-autoscaler"
    identity = f"e2e-ctrl-{secrets.token_hex(2)}"
    timeline = Timeline()
    timeline.watch("Lease acquired", lambda: cp.get(lease_path)["spec"].get("holderIdentity") == identity)
    timeline.watch("first action: Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4)
    timeline.watch("4 pods bound by kube-scheduler", lambda: bound(w, 4) is not None)
    timeline.watch("4 pods Running on kwok GPU nodes", lambda: len(running_pods(w)) == 4)
    timeline.watch("Deployment ready 4/4", lambda: ready(w) == 4)
    timeline.watch("Event MetricAboveTarget", lambda: bool(events(w, "MetricAboveTarget")))
    timeline.watch("GPUScalingPolicy status: current 4", lambda: status_at(w, 4) is not None)
    timeline.watch("Prometheus has the 4 pods' series", lambda: len(prom_pods(w)) == 4)
    timeline.thread.start()
    ctrl = Controller(
        identity,
        cp.admin_kubeconfig,
        w.prometheus.url,
        w.tmp_path,
        extra_env={
            "POD_NAMESPACE": w.namespace,  # the Lease lives (and is deleted) with the test's namespace
            "AUTOSCALER_NAMESPACES": w.namespace,
            # the leader writes only while last renewal + this is within the 3 s lease (LeaderElector.may_write)
            "AUTOSCALER_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "2",
        },
    )
    w.started.append(ctrl)
    timeline.mark("`autoscaler run` started")

    def wait(what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        try:
            return cp.wait(what, probe, timeout_s=timeout_s, interval_s=0.25)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{ctrl.log()}\n--- prometheus ---\n{w.prometheus.log_tail()}") from None

    try:
        # -- leader election against the real Lease API --
        wait("the Lease", lambda: cp.get(lease_path)["spec"].get("holderIdentity") == identity or None, 60)

        # -- overloaded: 2 pods at 85 % against 50 % -> 4 replicas, through the scale subresource --
        wait("the Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4 or None, 60)
        scale_writers = {m for m, sub in managers(get_deployment(w)) if sub == "scale"}
        assert scale_writers == {"gpu-autoscaler"}, managers(get_deployment(w))  # the controller's User-Agent
        placed = wait("4 pods bound by kube-scheduler", lambda: bound(w, 4), 60)
        running = wait("4 pods Running", lambda: n_or_none(running_pods(w), 4), 60)
        assert set(running.values()) <= set(w.nodes), running
        for pod in placed:
            conds = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
            assert conds.get("PodScheduled") == "True", pod["status"]
            assert pod["spec"].get("schedulerName") == "default-scheduler", pod["spec"]
        wait("Deployment ready 4/4", lambda: ready(w) == 4 or None, 60)

        status = wait("GPUScalingPolicy status current 4", lambda: status_at(w, 4), 30)
        assert status["desiredReplicas"] == 4, status
        assert status["lastAction"]["reason"] == "metric_above_target", status
        assert (status["lastAction"]["fromReplicas"], status["lastAction"]["toReplicas"]) == (2, 4), status
        assert conditions(status).get("Ready") == "True", status
        assert conditions(status).get("MetricsStale") == "False", status
        status_writers = {m for m, sub in managers(policy_obj(w)) if sub == "status"}
        assert status_writers == {"gpu-autoscaler"}, managers(policy_obj(w))

        [scaled] = wait("Event MetricAboveTarget", lambda: events(w, "MetricAboveTarget") or None, 30)
        assert scaled["regarding"]["kind"] == "Deployment" and scaled["regarding"]["name"] == DEPLOYMENT, scaled
        assert "from 2 to 4" in scaled["note"] and scaled["type"] == "Normal", scaled

        # -- steady: 4 pods at 42.5 % -> ceil(4 x 0.85) = 4, nothing more (no second write, no second Event) --
        wait("Prometheus to see the 4 pods", lambda: prom_pods(w) == set(running) or None, 60)
        time.sleep(3)
        assert spec_replicas(w) == 4, ctrl.log()
        assert len(events(w, "MetricAboveTarget")) == 1, events(w, "MetricAboveTarget")
        applied = {"kind": "ScaleDeployment", "reason": "metric_above_target", "dry_run": "false", "result": "applied"}
        assert ctrl.metric("gpu_autoscaler_actions_total", **applied) == 1, ctrl.log()

        # -- idle: 4 pods at 5 % -> 1 replica after the 2 s stabilisation; the extra pods go away --
        timeline.watch("Deployment scaled 4 -> 1", lambda: spec_replicas(w) == 1)
        timeline.watch("Event MetricBelowTarget", lambda: bool(events(w, "MetricBelowTarget")))
        timeline.watch("pods down to 1 Running", lambda: len(all_pods(w)) == 1 and len(running_pods(w)) == 1)
        timeline.watch("GPUScalingPolicy status: current 1", lambda: status_at(w, 1) is not None)
        w.exporter.demand = IDLE
        timeline.mark("metrics say idle")
        wait("the Deployment scaled 4 -> 1", lambda: spec_replicas(w) == 1 or None, 60)
        wait("pods down to 1", lambda: (len(all_pods(w)) == 1 and len(running_pods(w)) == 1) or None, 60)
        down = wait("GPUScalingPolicy status current 1", lambda: status_at(w, 1), 30)
        assert down["lastAction"]["reason"] == "metric_below_target", down
        assert (down["lastAction"]["fromReplicas"], down["lastAction"]["toReplicas"]) == (4, 1), down
        [below] = wait("Event MetricBelowTarget", lambda: events(w, "MetricBelowTarget") or None, 30)
        assert "from 4 to 1" in below["note"], below

        # -- SIGTERM: clean exit, the Lease released --
        assert ctrl.stop(signal.SIGTERM) == 0, ctrl.log()
        timeline.mark("controller exited on SIGTERM")
        assert not cp.get(lease_path)["spec"].get("holderIdentity"), cp.get(lease_path)
    finally:
        timeline.stop.set()
        timeline.thread.join(timeout=5)
        print(
            "\nend-to-end timeline (seconds from `autoscaler run` start; upper bounds: the end of "
            "the ~0.1 s poller cycle that first saw each):"
        )
        print("\n".join(timeline.lines()))
    print(f"scale subresource written by {sorted(scale_writers)}; policy status by {sorted(status_writers)}")
