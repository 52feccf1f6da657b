"""Leader election and outages with real processes against the real control plane (issue 13, item 3).

``test_two_processes_one_lease``: two ``autoscaler run`` processes, same settings, leader election on, each with
its own replica identity and its own token (a TokenRequest token bound to a stand-in Pod of its name, as the kubelet
gives each pod of a Deployment; the apiserver's audit log then names the pod behind every request). Exactly one
holds the Lease and only that one writes (scale subresource, policy status, Events, the Lease itself); the leader
is SIGKILLed (no release), the other takes the Lease once it has expired and then acts on a changed metric. The
audit log is the witness: no successful write by a replica that did not hold the Lease at the time, at any time.

``test_apiserver_restart_under_a_running_controller``: the controller lists on every tick (no watch: the audit log
shows no watch request), so "relist" is its next tick. kube-apiserver is killed for several ticks while the metrics
say scale down, then started again (same port and etcd). What the controller does, asserted: it stays up (healthz
200) and keeps ticking; every tick holds (the policies cannot be read) and nothing is applied; the Lease cannot be
renewed, so after the renew deadline it steps down (``gpu_autoscaler_leader`` 0, standby ticks). When the apiserver is
back, its first successful write is the Lease renewal (it still is the holder), it leads again and, a fresh leader,
waits one scale-down window (the takeover grace) before it scales down.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realkube.control_plane import ControlPlane
from tests.realkube.controller_world import (
    IDLE,
    OVERLOADED,
    STEADY,
    Request,
    Timeline,
    World,
    audit_requests,
    controller_replicas,
    create_policy,
    events,
    get_deployment,
    leader_gauge,
    lease_holder,
    lease_path,
    managers,
    open_world,
    policy_obj,
    spec_replicas,
    start_controller,
    status_at,
    wait_steady,
)
from tests.runtime.controller_process import LEASE, Controller

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

# Scheduling and request latency on a loaded 2-core machine (two controller processes, the whole control plane and
# Prometheus), on top of the lease timings in the bounds below: 1.5 s of it left a slow moment failing the test.
SLACK_S = 3.0


@pytest.fixture
def world(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[World]:
    with open_world(control_plane, namespace, tmp_path) as w:
        yield w


def sa_prefix(w: World) -> str:
    return f"system:serviceaccount:{w.namespace}:"


def acting_writes(requests: list[Request]) -> list[Request]:
    """Successful writes other than the Lease's: what a replica does because it leads."""
    return [r for r in requests if r.write and r.ok and r.resource != "leases"]


def lease_writes(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.write and r.ok and r.resource == "leases"]


def ticks(ctrl: Controller, result: str) -> float:
    return ctrl.metric("gpu_autoscaler_ticks_total", result=result) or 0


def waiter(w: World, ctrls: list[Controller]) -> Callable[..., Any]:
    def wait(what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        try:
            return w.cp.wait(what, probe, timeout_s=timeout_s, interval_s=0.1)
        except Exception as exc:
            logs = "\n".join(c.log() for c in ctrls)
            raise AssertionError(f"{exc}\n{logs}\n--- prometheus ---\n{w.prometheus.log_tail()}") from None

    return wait


def test_two_processes_one_lease(world: World) -> None:
    w, cp = world, world.cp
    wait_steady(w, 2, OVERLOADED)
    create_policy(w)
    kubeconfigs = controller_replicas(w, ("ctrl-a", "ctrl-b"))
    timeline = Timeline()
    timeline.watch("Lease held", lambda: bool(lease_holder(w)))
    timeline.watch("Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4)
    timeline.thread.start()
    # Started together: both find no Lease and race to create it; the apiserver lets one create win (409 for the
    # other, which then stands by).
    ctrls = {name: start_controller(w, name, path) for name, path in kubeconfigs.items()}
    timeline.mark("both `autoscaler run` started")
    wait = waiter(w, list(ctrls.values()))
    try:
        holder = wait("a holder of the Lease", lambda: lease_holder(w) or None, 60)
        assert holder in ctrls, holder
        leader, follower = ctrls[holder], ctrls[next(n for n in ctrls if n != holder)]
        wait("the Deployment scaled 2 -> 4", lambda: spec_replicas(w) == 4 or None, 60)
        status = wait("the policy status: current 4", lambda: status_at(w, 4), 30)
        [up] = wait("Event MetricAboveTarget", lambda: events(w, "MetricAboveTarget") or None, 30)
        assert up["reportingInstance"] == leader.identity, up
        assert status["lastAction"]["reason"] == "metric_above_target", status
        # both processes report; only the holder says it leads
        wait("the follower serving /metrics as a standby", lambda: leader_gauge(follower) == 0 or None, 30)
        assert leader_gauge(leader) == 1, leader.log()
        assert follower.metric("gpu_autoscaler_ticks_total", result="standby"), follower.log()
        assert not follower.metric("gpu_autoscaler_ticks_total", result="ok"), follower.log()

        # -- SIGKILL the leader: no release, the Lease must expire first --
        leader.stop(signal.SIGKILL)
        killed = time.time()
        timeline.mark(f"leader {leader.identity} SIGKILLed")
        timeline.watch(f"Lease taken by {follower.identity}", lambda: lease_holder(w) == follower.identity)
        timeline.watch("Deployment scaled 4 -> 1", lambda: spec_replicas(w) == 1)
        wait("the follower to take the Lease", lambda: lease_holder(w) == follower.identity or None, 30)
        taken = time.time()
        # -- the new leader acts on a changed metric: idle -> 1 replica after its takeover grace (the 2 s window) --
        w.exporter.demand = IDLE
        timeline.mark("metrics say idle")
        wait("the new leader to scale 4 -> 1", lambda: spec_replicas(w) == 1 or None, 60)
        down = wait("the policy status: current 1", lambda: status_at(w, 1), 30)
        assert down["lastAction"]["reason"] == "metric_below_target", down
        [below] = wait("Event MetricBelowTarget", lambda: events(w, "MetricBelowTarget") or None, 30)
        assert below["reportingInstance"] == follower.identity, below
        assert leader_gauge(follower) == 1, follower.log()
        assert follower.stop(signal.SIGTERM) == 0, follower.log()
    finally:
        timeline.close("timeline (seconds from the start of both processes):")

    requests = audit_requests(cp, sa_prefix(w))
    assert {r.pod for r in requests} == set(ctrls), {r.pod for r in requests}
    assert all(r.agent.startswith("gpu-autoscaler/") for r in requests), {r.agent for r in requests}
    assert not [r for r in requests if r.verb == "watch"], "the controller lists; it never watches"
    # the Lease: the old leader's renewals all before its death; the new leader's first write to it only once the
    # Lease had gone unrenewed for a whole lease duration (by the apiserver's clock)
    old_renewals = [r for r in lease_writes(requests) if r.pod == leader.identity]
    new_lease_writes = [r for r in lease_writes(requests) if r.pod == follower.identity]
    assert old_renewals and max(r.received for r in old_renewals) < killed
    takeover = min(r.received for r in new_lease_writes)
    last_renewal = max(r.done for r in old_renewals)
    assert takeover - last_renewal >= LEASE["duration"], (takeover, last_renewal)
    # ... and soon: the follower sees the last renewal within one retry period and takes over at the first retry
    # after a lease duration of it
    takeover_s = takeover - killed
    assert takeover_s <= LEASE["duration"] + 2 * LEASE["retry"] + SLACK_S, takeover_s
    # every acting write by the holder of the moment: the old leader before its death, the new one after its takeover
    acting = acting_writes(requests)
    before = [r for r in acting if r.received < killed]
    after = [r for r in acting if r.received >= killed]
    assert before and {r.pod for r in before} == {leader.identity}, "\n".join(map(str, acting))
    assert after and {r.pod for r in after} == {follower.identity}, "\n".join(map(str, acting))
    assert min(r.received for r in after) >= takeover, "\n".join(map(str, acting))
    # the follower wrote nothing at all while it followed, not even the Lease (its one create lost the race: 409)
    early = [r for r in requests if r.pod == follower.identity and r.write and r.received < takeover]
    assert all(r.code == 409 for r in early), "\n".join(map(str, early))
    # no double write: the scale subresource was written exactly twice, 2 -> 4 by the first leader, 4 -> 1 by the next
    scale_writes = [(r.pod, r.verb) for r in acting if r.resource == "deployments/scale"]
    assert scale_writes == [(leader.identity, "patch"), (follower.identity, "patch")], scale_writes
    assert {m for m, sub in managers(get_deployment(w)) if sub == "scale"} == {"gpu-autoscaler"}
    status_writes = {r.pod for r in acting if r.resource == "gpuscalingpolicies/status"}
    assert status_writes == {leader.identity, follower.identity}, status_writes
    # SIGTERM of the last leader released the Lease
    assert lease_holder(w) == "", cp.get(lease_path(w.namespace))
    print(
        f"leader {leader.identity} SIGKILLed; {follower.identity} took the Lease {takeover_s:.2f}s later "
        f"(lease {LEASE['duration']}s, retry {LEASE['retry']}s; the Lease went unrenewed for "
        f"{takeover - last_renewal:.2f}s); the Lease seen taken {taken - killed:.2f}s after the kill"
    )
    print("acting writes:\n  " + "\n  ".join(map(str, acting)))
    assert policy_obj(w)["status"]["currentReplicas"] == 1


def test_apiserver_restart_under_a_running_controller(world: World) -> None:
    w, cp = world, world.cp
    window_s = 2  # the policy's scale-down window: the takeover grace of a new leader
    wait_steady(w, 2, STEADY)
    create_policy(w, scale_down_window_s=window_s)
    [kubeconfig] = controller_replicas(w, ("ctrl-r",)).values()
    ctrl = start_controller(w, "ctrl-r", kubeconfig)
    wait = waiter(w, [ctrl])
    timeline = Timeline()
    timeline.watch("Lease held", lambda: lease_holder(w) == ctrl.identity)
    timeline.thread.start()
    samples: list[tuple[float, float | None, int]] = []  # (time, leader gauge, healthz status)
    try:
        wait("the Lease", lambda: lease_holder(w) == ctrl.identity or None, 60)
        wait("two ticks that read everything", lambda: ticks(ctrl, "ok") >= 2 or None, 60)
        assert spec_replicas(w) == 2, ctrl.log()

        # -- the outage: kube-apiserver killed; then the metrics say "scale down to 1" --
        cp.stop_apiserver(kill=True)
        down_at = time.time()
        timeline.mark("kube-apiserver killed")
        w.exporter.demand = IDLE
        ok_before = ticks(ctrl, "ok")
        holds_before = ticks(ctrl, "hold")
        outage_s = 8.0
        while time.time() - down_at < outage_s:
            assert ctrl.proc.poll() is None, f"the controller exited with {ctrl.proc.returncode}\n{ctrl.log()}"
            healthz, _ = ctrl.get("/healthz")
            samples.append((time.time() - down_at, leader_gauge(ctrl), healthz))
            time.sleep(0.25)
        assert all(h == 200 for _, _, h in samples), samples
        stepped_down = next((t for t, g, _ in samples if g == 0), None)
        assert stepped_down is not None, (samples, ctrl.log())
        # it stops acting at the renew deadline after its last renewal (which was at most a retry period before)
        assert stepped_down <= LEASE["renew"] + LEASE["retry"] + SLACK_S, samples
        # (None: the gauge could not be read in that sample, which says nothing either way)
        assert all(g == 0 for t, g, _ in samples if t > stepped_down and g is not None), samples
        assert ticks(ctrl, "ok") == ok_before, ctrl.log()
        assert ticks(ctrl, "hold") > holds_before, ctrl.log()
        assert ticks(ctrl, "standby") >= 1, ctrl.log()
        assert (ctrl.metric("gpu_autoscaler_errors_total", component="leader_election") or 0) >= 1, ctrl.log()

        # -- the apiserver back: same port, same etcd --
        timeline.watch("Lease renewed again", lambda: leader_gauge(ctrl) == 1)
        timeline.watch("Deployment scaled 2 -> 1", lambda: spec_replicas(w) == 1)
        restart_at = time.time()
        ready_s = cp.start_apiserver()
        up_at = time.time()
        timeline.mark(f"kube-apiserver ready again ({ready_s:.1f}s to /readyz)")
        wait("the controller leading again", lambda: leader_gauge(ctrl) == 1 or None, 60)
        wait("the scale-down 2 -> 1", lambda: spec_replicas(w) == 1 or None, 60)
        status = wait("the policy status: current 1", lambda: status_at(w, 1), 30)
        assert status["lastAction"]["reason"] == "metric_below_target", status
        assert ctrl.proc.poll() is None, ctrl.log()
        assert ctrl.stop(signal.SIGTERM) == 0, ctrl.log()
    finally:
        timeline.close("timeline (seconds from the controller's start):")

    log = ctrl.log(200_000)
    assert "leader election: ctrl-r is no longer the leader" in log, log
    assert "hold: policy_read" in log, log
    assert "Traceback" not in log, log
    requests = audit_requests(cp, sa_prefix(w))
    assert not [r for r in requests if r.verb == "watch"], "the controller lists; it never watches"
    # nothing reached the apiserver while it was down, and nothing but the Lease renewal came first after it
    assert not [r for r in requests if down_at <= r.received < restart_at], "\n".join(map(str, requests))
    writes_after = [r for r in requests if r.write and r.ok and r.received >= down_at]
    assert writes_after and writes_after[0].resource == "leases", "\n".join(map(str, writes_after))
    renewed = writes_after[0].done
    scale = [r for r in acting_writes(requests) if r.resource == "deployments/scale"]
    assert len(scale) == 1 and scale[0].received >= down_at, "\n".join(map(str, scale))
    # a fresh leader waits one scale-down window (the takeover grace) before it takes replicas away
    assert scale[0].received - renewed >= window_s, (scale[0], renewed)
    # the same holder throughout: no transition, its own Lease renewed
    lease = cp.get(lease_path(w.namespace))
    assert (lease["spec"].get("leaseTransitions") or 0) == 0, lease
    print(
        f"apiserver down {up_at - down_at:.1f}s ({ready_s:.1f}s of it starting); the controller stepped down "
        f"{stepped_down:.2f}s into the outage, renewed its Lease {renewed - restart_at:.2f}s after the restart began, "
        f"scaled 2 -> 1 {scale[0].received - renewed:.2f}s after the renewal (window {window_s}s)"
    )
    shown = ", ".join(f"{t:.1f}s:{g:g}/{h}" for t, g, h in samples[::4] if g is not None)
    print(f"leader gauge / healthz during the outage: {shown}")
