"""The process around the controller: apscheduler jobs (tick, refit, rebalance), leader election (and the leader's
pod label), the HTTP ``/metrics``, ``/healthz`` and ``/readyz`` endpoints, signals and a clean shutdown; and the log
format.

``Runtime`` runs ``Controller.run_once`` as its tick job, only while this replica leads (it hands the controller its
``can_act``, asked before every write); ``autoscaler.app.build_runtime`` builds one from settings.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from autoscaler.controller import Controller, TickReport
from autoscaler.ports import WriteGuard, WriteNotAllowed
from autoscaler.telemetry import HttpServer, Telemetry

if TYPE_CHECKING:
    from autoscaler.adapters.kubernetes_lease import LeaderElector
    from autoscaler.extender_http import ExtenderServer, LatestSnapshot

log = logging.getLogger("autoscaler")


def noop_job(now: float) -> None:
    """Placeholder job (the rebalance job lands in a later issue)."""


# A wall clock that moved this much more than the monotonic clock between two leader ticks stepped forward (an NTP
# step, a VM resumed): every window the core measures on it aged by the step at once. Smaller steps age them by less
# than two ticks.
CLOCK_STEP_FORWARD_S = 30.0
CLOCK_STEP_S = 1.0  # a wall clock that moved this much less than the monotonic clock since the last check stepped back
# A job due this soon is left to run as scheduled when the clock steps back (it runs within this margin anyway, and
# the scheduler may be running it right now: rescheduling it then could run it twice).
_DUE_MARGIN_S = 1.0
# A tick held before it read the policies and the cluster (``Controller._hold``): nothing for a refit to fit.
_READ_HOLDS = ("policy_read", "cluster_read")


class LeaderPodLabel(Protocol):
    """The leader's label on its own pod (``adapters.kubernetes.leader_label``): a Service selecting it reaches the
    leader alone. Both raise ``PortError`` when a request fails."""

    def mark_leader(self, can_write: WriteGuard) -> None:
        """Label this replica's pod, then take the label off every other pod carrying it (each write guarded)."""
        ...

    def unmark(self) -> None:
        """Take the label off this replica's pod only."""
        ...


class RunAgain:
    """A job's "run again once this run ends". apscheduler's ``max_instances=1`` skips a run brought forward while
    one runs, and the next would wait a whole interval: asked while the job runs, the run is queued behind it, in the
    same job; asked while it does not run, the caller brings the job forward."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = False
        self._again = False

    def ask(self) -> bool:
        """Queue a run behind the running one: True; False when none runs (bring the job forward instead)."""
        with self._lock:
            if self._active:
                self._again = True
            return self._active

    def run(self, once: Callable[[int], None], go_on: Callable[[], bool]) -> None:
        """``once(0)``, then ``once(1)``, ... while a run was asked for meanwhile and ``go_on()`` still says so."""
        with self._lock:
            self._active, self._again = True, False
        try:
            rounds = 0
            while True:
                once(rounds)
                rounds += 1
                with self._lock:
                    if not self._again or not go_on():
                        return
                    self._again = False
        finally:
            with self._lock:
                self._active = False


class Runtime:
    """apscheduler jobs (tick, refit, rebalance), leader election, HTTP endpoints, clean shutdown."""

    def __init__(
        self,
        controller: Controller,
        telemetry: Telemetry,
        *,
        tick_interval_s: float = 15.0,
        refit_interval_s: float = 900.0,
        rebalance_interval_s: float = 300.0,
        tick_stall_s: float = 120.0,
        rebalance_stall_s: float | None = None,
        shutdown_grace_s: float = 10.0,
        elector: LeaderElector | None = None,
        refit: Callable[[float], None] = noop_job,
        rebalance: Callable[[float], object] = noop_job,
        forecast_update: Callable[[float], None] | None = None,
        forecast_update_interval_s: float = 60.0,
        http: tuple[str, int] | None = ("", 8080),
        clock: Callable[[], float] = time.time,
        on_stop: Callable[[], None] | None = None,
        extender: ExtenderServer | None = None,
        extender_snapshots: LatestSnapshot | None = None,
        leader_label: LeaderPodLabel | None = None,
        tick_scope: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.controller = controller
        # Entered around each tick's work once its stall timer starts (``app``: the Kubernetes reads' retry deadline,
        # so that a tick whose reads each succeed on their last try still ends within ``tick_stall_s``).
        self._tick_scope = tick_scope if tick_scope is not None else contextlib.nullcontext
        self.telemetry = telemetry
        self.elector = elector
        self._tick_interval = tick_interval_s
        self._refit_interval = refit_interval_s
        self._rebalance_interval = rebalance_interval_s
        self._stall = tick_stall_s
        # How long one rebalance pass may run before /healthz calls it hung (None: the tick's bound). A pass sends
        # many more Kubernetes requests than a tick waits for; ``autoscaler.app.rebalance_stall_seconds`` derives it.
        self._rebalance_stall = rebalance_stall_s if rebalance_stall_s is not None else tick_stall_s
        self._grace = shutdown_grace_s
        self._refit = refit
        self._on_stop = on_stop
        # The first refit waits for a tick: the tick reads the policies (and hands their PromQL overrides to the
        # metrics source) that the refit fits. Set again when this replica becomes the leader.
        self._refit_after_tick = True
        # A refit asked for while one runs (a new term's) runs right after it, in the same job.
        self._refit_queue = RunAgain()
        self._rebalance = rebalance
        self._forecast_update = forecast_update
        self._forecast_update_interval = forecast_update_interval_s
        self._clock = clock
        self._stopping = threading.Event()
        # A tick asked for while one runs (the takeover's, while a standby tick still reads) runs right after it.
        self._tick_queue = RunAgain()
        # one tick at a time, also when tick() is called beside the scheduler's job (its stall timer is one field)
        self._tick_running = threading.Lock()
        # The leader's tick (``Controller.run_once``) and the rebalance pass (``Controller.rebalance``) take the
        # controller's lock for all their reads and writes: one waits for the other. They take this lock first, so
        # that the wait happens here, before the tick's stall timer starts: a tick waiting for a slow pass is not a
        # stalled tick (the pass has a bound of its own, ``_rebalance_stall``).
        self._serial = threading.Lock()
        self._pass_started: float | None = None  # time.monotonic() when the running rebalance pass started
        # Jobs running now: all of them (interpreter exit would wait for them), and those that write to the cluster
        # (the tick, the rebalance pass), which shutdown waits for before it releases the Lease.
        self._jobs = threading.Condition()
        self._running = 0
        self._writing = 0
        self._heartbeat = time.monotonic()
        self._tick_started: float | None = None
        self.scheduler: Any = None
        self._clock_check_s = min(1.0, max(0.05, tick_interval_s / 2))
        self._last_leader_tick: tuple[float, float] | None = None  # (wall, monotonic) clocks of the last leader tick
        self._clock_watch: threading.Thread | None = None
        self.http: HttpServer | None = None
        if http is not None:
            self.http = HttpServer(telemetry, self.healthz, self.readyz, bind_address=http[0], port=http[1])
        # The scheduler extender (its own port) answers from the snapshot the tick reads through extender_snapshots;
        # a standby replica, which does not tick, reads one per tick interval for it (a Service may reach both; one
        # that selects the leader's pod label reaches the standby only once it leads, with a snapshot at hand).
        self.extender = extender
        self._extender_snapshots = extender_snapshots
        # The leader's pod label (leader_election.label_leader_pod), brought to what the replica's role wants by the
        # ticks (the leader's labels, a standby's unlabels) and by stop(); the elector's callbacks only note the
        # change, since a request there would hold up the Lease renewals. ``_label_synced`` is (leadership epoch,
        # labelled) of the last write that succeeded: nothing is written while it matches, and every change of
        # leadership starts a new epoch (a label written before may have been taken away by another leader since).
        self._leader_label = leader_label
        self._label_lock = threading.Lock()  # one label write at a time: stop()'s unlabel after a tick's label
        self._epochs = itertools.count(1)
        self._leadership_epoch = 0
        self._label_synced: tuple[int, bool] | None = None  # None: unknown (a restarted container's pod may have it)
        controller.can_act = self.can_act
        controller.can_finish = self.can_finish
        if elector is None:
            telemetry.set_leader(True)

    # -- leadership --

    def can_act(self) -> bool:
        """Whether to decide and write now: not stopping, and the leader with time for a write to land before a
        follower could take over (``LeaderElector.may_write``; the writer asks this before every request)."""
        if self._stopping.is_set():
            return False
        return self.elector is None or self.elector.may_write()

    def can_finish(self) -> bool:
        """``can_act()`` without the shutdown, for the writes that complete one already made (a gang's remaining
        evictions): ``stop()`` waits for the writing job within its grace and releases the Lease only after it."""
        return self.elector is None or self.elector.may_write()

    def on_started_leading(self) -> None:
        self._leadership_epoch = next(self._epochs)
        self.telemetry.set_leader(True)
        self.controller.start_acting(self._clock())
        self._refit_after_tick = True
        # Act now rather than at the next interval: after a handover the service has been unattended already. A
        # tick still running (a standby's) runs the leader's tick as soon as it ends; otherwise the job runs now.
        if not self._tick_queue.ask():
            self._bring_forward("tick")
        self._label_now()

    def _bring_forward(self, job: str) -> None:
        """Run a scheduled job now rather than at its next interval."""
        if self.scheduler is not None and self.scheduler.running:
            try:
                self.scheduler.modify_job(job, next_run_time=datetime.now(UTC))
            except Exception:  # the job may be gone during shutdown
                log.debug("could not bring the %s job forward", job, exc_info=True)

    def on_stopped_leading(self) -> None:
        self._leadership_epoch = next(self._epochs)
        self.telemetry.set_leader(False)
        self.controller.stop_acting()
        if self.extender is not None:
            # kube-scheduler's kept-alive connections stay on this endpoint whatever the leader-only Service
            # selects now: closed, its next call reconnects through the Service, to the new leader
            self.extender.close_connections()

    def _label_now(self) -> None:
        """Label the pod in a job of its own, now: the tick brought forward waits for a standby tick still running
        (a snapshot read for the extender, seconds on a large cluster), and apscheduler then skips it to the next
        interval, while the leader-only Service has no endpoint. The ticks label it too if this fails."""
        if self._leader_label is None or self.scheduler is None or not self.scheduler.running:
            return
        try:
            self.scheduler.add_job(self._label_job, id="leader_label", replace_existing=True)  # once, at once
        except Exception:  # the scheduler may be shutting down
            log.debug("could not start the leader label job", exc_info=True)

    def _label_job(self) -> None:
        # a writing job: stop() waits for it before releasing the Lease, as for a tick's writes
        with self._running_job(), self._writing_if_acting() as acting:
            if acting:
                self._sync_leader_label(leading=True)

    def _sync_leader_label(self, leading: bool) -> None:
        """Label this replica's pod as the leader's (``leading``) or unlabel it, unless the last write that succeeded
        in this leadership epoch did so already. Never raises: a failure is logged and counted, and the next tick
        tries again; the controller acts all the same."""
        label = self._leader_label
        if label is None:
            return
        with self._label_lock:
            epoch = self._leadership_epoch
            if self._label_synced == (epoch, leading):
                return
            try:
                if leading:
                    label.mark_leader(self.can_act)
                else:
                    label.unmark()
            except WriteNotAllowed:
                return  # no longer the leader: a standby tick unlabels the pod
            except Exception as exc:
                undone = "written" if leading else "removed"
                log.warning("leader pod label not %s (tried again at the next tick): %s", undone, exc)
                self.telemetry.error("leader_election")
                return
            self._label_synced = (epoch, leading)
            log.info("leader pod label %s", "written: this replica's pod is the leader's" if leading else "removed")

    def _unlabel_unless_leading(self) -> None:
        """A standby's tick: the label off its pod (it may have led before, or its container restarted in a pod
        that did). Not while stopping (``stop()`` does it), nor while the Lease is still held (``can_act`` may
        say no for a moment before a renewal: the label stays with the leader)."""
        if self._stopping.is_set() or self.elector is None or self.elector.is_leader():
            return
        self._sync_leader_label(leading=False)

    # -- jobs --

    @contextlib.contextmanager
    def _running_job(self) -> Iterator[None]:
        with self._jobs:
            self._running += 1
        try:
            yield
        finally:
            with self._jobs:
                self._running -= 1
                self._jobs.notify_all()

    @contextlib.contextmanager
    def _writing_if_acting(self) -> Iterator[bool]:
        """Yields ``can_act()``; while it is True the job counts as writing (``stop()`` waits for it).

        The job counts as writing *before* it asks: ``stop()`` sets ``_stopping`` and then reads the count, the job
        raises the count and then asks ``can_act()`` (which reads ``_stopping``), so either the job hears "no" or
        ``stop()`` sees it and waits. Asking first would let ``stop()`` release the Lease between a "yes" and the
        count (harmless only because every write asks again). A job that hears "no" (a standby's tick: a read for
        the scheduler extender) stops counting at once, so that a hung read does not hold up shutdown."""
        with self._jobs:
            self._writing += 1
        acting = False
        try:
            acting = self.can_act()
        finally:
            if not acting:
                self._not_writing()
        try:
            yield acting
        finally:
            if acting:
                self._not_writing()

    def _not_writing(self) -> None:
        with self._jobs:
            self._writing -= 1
            self._jobs.notify_all()

    def jobs_running(self) -> int:
        """How many jobs are running now (after ``stop()``: the ones that outlived the grace period)."""
        with self._jobs:
            return self._running

    def tick(self) -> None:
        """The tick job: one tick, then another at once when this replica became the leader while it ran (a
        standby's tick, reading for the scheduler extender, can take seconds on a large cluster: the takeover's tick
        brought forward would be skipped by apscheduler's max_instances=1 and wait a whole tick interval)."""
        self._tick_queue.run(lambda _: self._tick_once(), lambda: not self._stopping.is_set())

    def _tick_once(self) -> None:
        with self._running_job(), self._tick_running:
            try:
                with self._writing_if_acting() as acting:
                    if not acting:
                        # a standby (or stopping) replica only reads, for the scheduler extender: not a writing job
                        self._tick_started = time.monotonic()
                        self.telemetry.ticks.labels(result="standby").inc()
                        with self._tick_scope():
                            self._unlabel_unless_leading()
                            self._refresh_extender_snapshot()
                        return
                    # before the tick's reads: a Service that selects the leader's label has no endpoint until then
                    self._sync_leader_label(leading=True)
                    # A running rebalance pass holds the controller until it ends: the tick waits for it here,
                    # before its stall timer starts (the pass has its own bound in healthz()).
                    with self._serial:
                        self._tick_started = time.monotonic()
                        with self._tick_scope():
                            self._leader_tick()
            except Exception:  # run_once never raises; this is the last line of defence for the thread
                log.exception("tick job failed")
                self.telemetry.error("decide")
            finally:
                # the heartbeat first: healthz() that sees no tick running then sees this one's end
                self._heartbeat = time.monotonic()
                self._tick_started = None

    def _leader_tick(self) -> None:
        now, mono = self._clock(), time.monotonic()
        last, self._last_leader_tick = self._last_leader_tick, (now, mono)
        step = 0.0 if last is None else (now - last[0]) - (mono - last[1])
        if step > CLOCK_STEP_FORWARD_S:
            # The stabilisation windows, rate policies, grace periods and capacity timers are measured on the wall
            # clock: a step forward would expire them all at once (a scale-down on one sample, a burst node given
            # back at once). The controller starts over as a new leader would: no history, the takeover grace.
            log.warning(
                "the wall clock stepped forward %.0fs: the controller forgets its history and starts the takeover "
                "grace, as after a change of leader",
                step,
            )
            self.controller.clock_stepped_forward(now)
        self.controller.run_once(now)
        report = self.controller.last_report
        if report is not None and report.held_by == "policy_read":
            # held before it read the cluster: the scheduler extender still needs a fresh snapshot (the cluster may
            # read fine while the GPUScalingPolicies do not)
            self._refresh_extender_snapshot()
        if report is not None and self._refit_after_tick and read_the_policies(report):
            # only once a tick has read the policies: a refit brought forward by a tick held on a failed policy or
            # cluster read would fit nothing, and the next one is a whole refit interval away
            self._refit_after_tick = False
            # the running round (another term's) ends first, then this term's
            if not self._refit_queue.ask():
                self._bring_forward("refit")

    def _refresh_extender_snapshot(self) -> None:
        if self._extender_snapshots is None or self._stopping.is_set():
            return
        try:
            self._extender_snapshots.snapshot(self._clock())
        except Exception as exc:  # the extender fails open once the snapshot it has grows stale
            log.warning("could not read the cluster for the scheduler extender: %s", exc)
            self.telemetry.error("cluster_read")

    def _refit_rounds(self, now: float) -> None:
        """The refit job: one round, then another at once for each asked for while it ran (``_leader_tick``). A
        round that raises is logged and counted here, not in ``_job``: raised out of ``RunAgain.run``, it would drop
        the round queued behind it (a new term's first refit), which would then wait a whole refit interval."""

        def round_(rounds: int) -> None:
            try:
                self._refit(now if rounds == 0 else self._clock())
            except Exception:
                log.exception("refit job failed")
                self.telemetry.error("refit")

        self._refit_queue.run(round_, self.can_act)

    def _job(self, component: str, fn: Callable[[float], None]) -> Callable[[], None]:
        """A job that runs on the leader only and writes nothing to the cluster (the refit, the forecast update)."""

        def run() -> None:
            with self._running_job():
                if not self.can_act():
                    return  # acting jobs run on the leader only
                try:
                    fn(self._clock())
                except Exception:
                    log.exception("%s job failed", component)
                    self.telemetry.error(component)

        return run

    def rebalance_pass(self) -> None:
        """The rebalance job: on the leader only, a writing job (shutdown waits for it before releasing the Lease),
        and never beside a tick (``_serial``). Its time is bounded in ``healthz()`` by the pass's own bound."""
        with self._running_job(), self._writing_if_acting() as acting:
            if not acting:
                return
            with self._serial:
                if not self.can_act():
                    return  # stopping, or no longer the leader, by the time the tick it waited for ended
                self._pass_started = time.monotonic()
                try:
                    self._rebalance(self._clock())
                except Exception:
                    log.exception("rebalance job failed")
                    self.telemetry.error("rebalance")
                finally:
                    # the end of a pass is progress of the loop (a tick may have waited for it); the heartbeat
                    # first: healthz() that sees no pass running then sees this one's end
                    self._heartbeat = time.monotonic()
                    self._pass_started = None

    # -- the wall clock --

    def _watch_the_clock(self) -> None:
        """apscheduler times its interval jobs on the wall clock: stepped back (an NTP correction, a VM restored from
        a snapshot), it would run no job, the tick included, until the wall clock reached their next run times again,
        for as long as the step. Each check compares how far the wall clock moved with how far the monotonic clock
        (which never steps) did; when the wall clock stepped back, every job is moved back by the step, to the
        instant it was due at. (A step forward needs nothing: the jobs due run once, coalesced.)"""
        wall, mono = self._clock(), time.monotonic()
        while not self._stopping.wait(self._clock_check_s):
            wall_now, mono_now = self._clock(), time.monotonic()
            step = (wall_now - wall) - (mono_now - mono)
            wall, mono = wall_now, mono_now
            if step < -CLOCK_STEP_S and self.scheduler is not None and self.scheduler.running:
                try:
                    self._clock_stepped_back(-step)
                except Exception:  # the watch must outlive whatever the scheduler says during a shutdown
                    log.exception("could not reschedule the jobs after the wall clock stepped back")

    def _clock_stepped_back(self, step_s: float) -> None:
        """Move every job's next run back by ``step_s`` (never before now): each runs when it was due, none twice.

        A job due within ``_DUE_MARGIN_S`` is left alone: the scheduler may be running it right now (and computing
        its next run from this run), and it runs within the margin anyway."""
        log.warning("the wall clock stepped back %.1fs: the jobs are rescheduled to run when they were due", step_s)
        now = datetime.fromtimestamp(self._clock(), UTC)
        for job in self.scheduler.get_jobs():
            due = job.next_run_time
            if due is None or due <= now + timedelta(seconds=_DUE_MARGIN_S):
                continue
            try:
                self.scheduler.modify_job(job.id, next_run_time=max(now, due - timedelta(seconds=step_s)))
            except Exception:  # the job may be gone during shutdown
                log.debug("could not reschedule the %s job", job.id, exc_info=True)

    # -- health --

    def healthz(self) -> tuple[bool, str]:
        """Alive and not wedged: the tick loop finished an iteration recently and none is stuck.

        A rebalance pass and the leader's tick run one at a time; a tick waiting for a pass is not running (its
        stall timer starts once the pass has ended), and a pass has a bound of its own (``rebalance_stall_s``: many
        more Kubernetes requests than a tick waits for). While a pass runs within it, "no tick for" does not fire;
        a pass past it fails, since it holds every tick up."""
        now = time.monotonic()
        if self.scheduler is not None and not self.scheduler.running and not self._stopping.is_set():
            return False, "scheduler is not running"
        rebalancing = self._pass_started
        if rebalancing is not None and now - rebalancing > self._rebalance_stall:
            return False, (
                f"a rebalance pass has been running for {now - rebalancing:.0f}s (> {self._rebalance_stall:g}s)"
            )
        started = self._tick_started
        if started is not None and now - started > self._stall:
            return False, f"a tick has been running for {now - started:.0f}s (> {self._stall:g}s)"
        if started is None and rebalancing is None and now - self._heartbeat > self._stall:
            return False, f"no tick for {now - self._heartbeat:.0f}s (> {self._stall:g}s)"
        if rebalancing is not None:
            return True, f"tick loop alive (a rebalance pass is running: {now - rebalancing:.0f}s)"
        return True, "tick loop alive"

    def readyz(self) -> tuple[bool, str]:
        """Whether this replica does its part now (the standby watches the Lease, the leader ticks); when it does
        not, the probe's body says what stops it.

        Judged on the latest tick, not on whether one ever succeeded: that gate kept a leader Ready through any
        failure after its first good tick, and left one that took over during an outage NotReady until it ended
        (while its predecessor in the same outage was Ready). A tick held on its metrics alone, or services holding on
        stale ones, is the controller riding a Prometheus outage out as designed, which the metrics and alerts show:
        still Ready, with the cause in the body."""
        if self._stopping.is_set():
            return False, "shutting down"
        elector = self.elector
        if elector is not None and not elector.is_leader():
            if elector.last_attempt_ok:
                return True, f"standby follower (leader: {elector.holder or 'none'})"
            if elector.last_error is not None:
                return False, f"cannot read the Lease: {elector.last_error}"
            return False, "no Lease read yet"
        report = self.controller.last_report
        if report is None:
            return False, "no successful tick yet"
        why = report.held_because or "; ".join(report.errors) or report.result
        if not read_the_policies(report):
            return False, f"the latest tick could not read what it acts on: {why}"
        if report.result != "ok":
            return True, f"ticking, holding: {why}"
        if report.stale:
            # the Prometheus adapter turns an outage into stale services, not into a failed read
            key, reasons = next(iter(report.stale.items()))
            stale = len(report.stale)
            return True, f"ticking, {stale} service(s) held on stale data (first: {key}: {reasons[0]})"
        return True, "ticking"

    # -- lifecycle --

    def start(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        if self.http is not None:
            self.http.start()
            log.info("serving /metrics /healthz /readyz on port %d", self.http.port)
        if self.extender is not None:
            self.extender.start()
            log.info(
                "serving the scheduler extender (/scheduler/filter, /scheduler/prioritize) on port %d",
                self.extender.port,
            )
        if self.elector is not None:
            self.elector.start()
        # coalesce + max_instances=1: a slow tick delays the next one instead of stacking ticks up.
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}, timezone=UTC
        )
        first = datetime.now(UTC)
        self.scheduler.add_job(self.tick, "interval", seconds=self._tick_interval, id="tick", next_run_time=first)
        # The refit's first run is brought forward by the first tick that reads the policies (see tick()).
        self.scheduler.add_job(
            self._job("refit", self._refit_rounds), "interval", seconds=self._refit_interval, id="refit"
        )
        self.scheduler.add_job(self.rebalance_pass, "interval", seconds=self._rebalance_interval, id="rebalance")
        if self._forecast_update is not None and self._forecast_update_interval > 0:
            # between refits: re-condition the latest fits on new history (it skips itself while a refit runs)
            self.scheduler.add_job(
                self._job("refit", self._forecast_update),
                "interval",
                seconds=self._forecast_update_interval,
                id="forecast_update",
            )
        self.scheduler.start()
        self._heartbeat = time.monotonic()
        self._clock_watch = threading.Thread(target=self._watch_the_clock, name="autoscaler-clock", daemon=True)
        self._clock_watch.start()

    def stop(self) -> None:
        """Stop acting at once, let a running tick or rebalance pass finish (bounded by the grace period), then
        release the Lease for a fast handover.

        A job still writing after the grace may have a request in flight (the grace may be shorter than a request's
        timeout): the Lease is then left to expire rather than released, so that no standby acts beside it; the
        leader's own writes already stop a request timeout before the Lease could expire (``may_write``)."""
        log.info("shutting down")
        self._stopping.set()  # can_act() is False from here: an in-flight job starts no further write
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        with self._jobs:
            settled = self._jobs.wait_for(lambda: self._writing == 0, timeout=self._grace)
        if not settled:
            log.warning(
                "a tick or rebalance pass is still running after %gs: not releasing the Lease (a write may be in "
                "flight); a standby takes over when it expires",
                self._grace,
            )
        if self.elector is not None:
            self.elector.stop(release=settled)
        # after the release: the standby takes the Lease and labels its own pod while this one's label comes off
        self._sync_leader_label(leading=False)
        self.telemetry.set_leader(False)
        if self._on_stop is not None:
            try:
                self._on_stop()  # e.g. stop the forecast workers
            except Exception:
                log.exception("shutdown hook failed")
        if self.http is not None:
            self.http.stop()
        if self.extender is not None:
            self.extender.stop()

    def run_forever(self) -> int:
        """Start, block until SIGTERM/SIGINT, stop cleanly."""
        stop = threading.Event()

        def handle(signum: int, _frame: object) -> None:
            log.info("received %s", signal.Signals(signum).name)
            stop.set()

        previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not stop.wait(1.0):
                pass
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        return 0


def read_the_policies(report: TickReport) -> bool:
    """Whether the tick read the policies and the cluster (``Controller.policies_seen`` is then this tick's): a
    tick that went through, or held on its metrics only."""
    if report.result == "ok":
        return True
    return report.result == "hold" and report.held_by not in _READ_HOLDS


# ---- Logging ---------------------------------------------------------------------------------------------------------


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("apscheduler", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
