"""How well could a policy that does not know the future do? Reference policies for GPU-hours at a given SLO share.

The oracle knows every future step; a real policy learns the demand only ``metrics_delay`` after it happens and must
ask for replicas one cold start before they serve. On demand that moves in steps at the edges of fixed windows (a
change period, see ``forecast.phase.detect_change_period``), the ``window_margin_bound`` policy is given everything
else for free:

* inside a window whose level it has already observed when the replicas had to be requested, it knows the demand of
  every step exactly (it provisions the oracle's replicas, ``need``);
* in the first steps of a window, before any of it could be observed at request time, it provisions ``need`` at
  ``margin`` times the last demand it observed: a fixed multiplicative margin for the unknown jump;
* pods cost GPUs from the moment they are requested (as in the simulator), with no rate limit or stabilisation.

It is a reference, not a lower bound: it knows more than any real policy inside a window, but its fixed margin at
edges is cruder than margins that adapt (the predictive policy beats it at long cold starts). For each share of
requests within the SLO it gives the GPU-hours it needs, relative to the oracle and costed the same way.

Both policies here assume window edges at multiples of ``period_s`` counted from the Unix epoch (as
``forecast.phase`` does), which holds for the packaged ServeGen trace. Steps before anything could be observed count
as not yet seen.

``tuned_observed_policy`` is the realistic counterpart: a causal policy that knows only the demand it has observed
when it must request replicas, provisions a margin on it inside a window, and at an unseen edge a margin that
follows mean reversion and recent jump volatility, with every parameter tuned *in hindsight* on the trace itself. No
real policy can tune on the future, so its cost at a target SLO is an optimistic estimate of what this family of
policies reaches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.sim.latency import latency_and_share
from autoscaler.sim.policies import SimService, _forward_window_max, metrics_delay_steps


@dataclass(frozen=True)
class BoundPoint:
    margin: float  # multiplier on the last observed demand for steps in a not-yet-observed window
    slo_attainment: float  # share of requests in steps whose latency quantile meets the SLO
    gpu_hours_vs_oracle: float


@dataclass(frozen=True)
class _Timing:
    """What both reference policies share: the oracle's replicas and cost, and which step's demand a policy had seen
    when it had to request the replicas ready at each step, and whether that step lay in the same window."""

    need: np.ndarray  # replicas meeting the SLO at each step's demand (``maxReplicas`` where none does)
    servable: np.ndarray  # bool: ``need`` replicas do meet the SLO (not where demand outgrows ``maxReplicas``)
    lead_steps: int
    oracle_cost: float  # replica-steps, costed from the request, as the simulator costs pods
    seen: np.ndarray  # index of the step whose demand was the newest observed at request time
    window: np.ndarray  # window index of each step, counted from the first step's window
    known: np.ndarray  # bool: the step's window had already been observed at request time

    def cost(self, ready: np.ndarray) -> float:
        """GPU-hours of ``ready`` replicas per step, relative to the oracle's (pods held from their request)."""
        cost = float(_forward_window_max(ready, self.lead_steps + 1).sum())
        return cost / self.oracle_cost if self.oracle_cost else math.nan


def _timing(service: SimService, start: float, step_s: float, metrics_delay_s: float, period_s: float) -> _Timing:
    rates = service.rates
    steps = rates.size
    need = np.fromiter((service.need(float(r)) for r in rates), dtype=np.int64, count=steps)
    lead_steps = math.ceil(service.policy.cold_start_s / step_s)
    index = np.arange(steps)
    # Replicas ready at step i were requested at the end of step i - lead - 1, on the demand of `delay` steps earlier.
    requested_on = index - lead_steps - 1 - metrics_delay_steps(metrics_delay_s, step_s)
    seen = np.maximum(requested_on, 0)
    window = np.floor((start + index * step_s) / period_s).astype(np.int64)
    window -= window[0]
    known = (window[seen] == window) & (requested_on >= 0)
    # The simulator scores a step whose demand not even maxReplicas serve a miss, whatever the replicas.
    servable = np.fromiter(
        (
            latency_and_share(
                int(n), float(r), service.throughput, service.base_latency_s, service.quantile, service.slo_s
            )[0]
            <= service.slo_s
            for n, r in zip(need, rates, strict=True)
        ),
        dtype=bool,
        count=steps,
    )
    oracle_cost = float(_forward_window_max(need, lead_steps + 1).sum())
    return _Timing(need, servable, lead_steps, oracle_cost, seen, window, known)


def _slo_attainment(rates: np.ndarray, ready: np.ndarray, timing: _Timing) -> float:
    """Share of requests in steps whose ``ready`` replicas meet the SLO: at least the replicas it needs, where
    any number does."""
    total = float(rates.sum())
    met = (ready >= timing.need) & timing.servable
    return float((rates * met).sum() / total) if total > 0 else 1.0


def window_margin_bound(
    service: SimService,
    start: float,
    step_s: float,
    metrics_delay_s: float,
    period_s: float,
    margins: Iterable[float],
) -> list[BoundPoint]:
    """The fixed-margin causal policy above, for each margin (see the module docstring)."""
    rates = service.rates
    timing = _timing(service, start, step_s, metrics_delay_s, period_s)
    unseen = ~timing.known
    points = []
    for margin in margins:
        ready = timing.need.copy()
        ready[unseen] = np.fromiter(
            (service.need(float(r) * margin) for r in rates[timing.seen[unseen]]),
            dtype=np.int64,
            count=int(unseen.sum()),
        )
        points.append(BoundPoint(float(margin), _slo_attainment(rates, ready, timing), timing.cost(ready)))
    return points


def cheapest_at(points: Iterable[BoundPoint], slo_attainment: float) -> BoundPoint | None:
    """The point with the fewest GPU-hours among those reaching ``slo_attainment``, or None."""
    reaching = [p for p in points if p.slo_attainment >= slo_attainment]
    return min(reaching, key=lambda p: p.gpu_hours_vs_oracle, default=None)


@dataclass(frozen=True)
class TunedPoint:
    slo_attainment: float
    gpu_hours_vs_oracle: float
    params: dict[str, float] = field(default_factory=dict)
    changes: int = 0  # changes of the replica count over the run (the scaling actions it would write)


def tuned_observed_policy(
    service: SimService,
    start: float,
    step_s: float,
    metrics_delay_s: float,
    period_s: float,
    target_slo: float,
    inside_margins: Sequence[float] = (1.0, 1.04, 1.08, 1.12, 1.16, 1.20, 1.25),
    edge_intercepts: Sequence[float] = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35),
    edge_reversion: Sequence[float] = (0.0, -0.3, -0.6),
    edge_volatility: Sequence[float] = (0.0, 1.0, 2.0),
    trailing_windows: int = 6,
    volatility_windows: int = 12,
    hold_steps: Sequence[int] = (0,),
    max_changes: int | None = None,
) -> TunedPoint | None:
    """The cheapest member of the observed-demand policy family (module docstring) reaching ``target_slo``, or None.

    Inside a window already seen at request time: ``need(m * observed)``. At an unseen edge:
    ``need(observed * exp(a + b * deviation + z * volatility))``, where deviation is the log of the observed demand
    minus the mean log level of the last ``trailing_windows`` complete windows, and volatility the RMS of the last
    ``volatility_windows`` window-to-window log changes; all known at request time.

    ``hold_steps``: scale-down stabilisation windows tried, in steps (each step's replicas are the most the family
    asked for over the last ``hold`` steps, as the HPA's window holds its recommendations; 0: none);
    ``max_changes``: only members whose replica count changes at most this many times count (issue 14's budget of
    scaling actions).
    """
    rates = service.rates
    timing = _timing(service, start, step_s, metrics_delay_s, period_s)
    seen, window = timing.seen, timing.window
    inside, edge = np.flatnonzero(timing.known), np.flatnonzero(~timing.known)
    level = np.log(np.maximum(np.bincount(window, weights=rates) / np.maximum(np.bincount(window), 1), 1e-9))
    jumps = np.diff(level, prepend=level[0])
    last_complete = window[seen[edge]] - 1  # -1: no window complete yet (no deviation, no volatility)
    mean_level = np.array([level[max(0, k - trailing_windows + 1) : k + 1].mean() for k in range(level.size)])
    volatility = np.array(
        [
            math.sqrt(float(np.mean(jumps[max(1, k - volatility_windows + 1) : k + 1] ** 2))) if k >= 1 else 0.0
            for k in range(level.size)
        ]
    )
    observed_edge = rates[seen[edge]]
    none_complete = last_complete < 0
    last_complete = np.maximum(last_complete, 0)
    deviation = np.where(none_complete, 0.0, np.log(np.maximum(observed_edge, 1e-9)) - mean_level[last_complete])
    edge_volatility_now = np.where(none_complete, 0.0, volatility[last_complete])
    cache: dict[float, int] = {}

    def need_at(rate: float) -> int:
        key = math.ceil(rate * 1000.0) / 1000.0  # rounded up: never a replica fewer than the exact rate needs
        if key not in cache:
            cache[key] = service.need(key)
        return cache[key]

    best: TunedPoint | None = None
    ready = np.empty(rates.size, dtype=np.int64)
    for inside_margin in inside_margins:
        ready[inside] = [need_at(float(r) * inside_margin) for r in rates[seen[inside]]]
        for a, b, z in itertools.product(edge_intercepts, edge_reversion, edge_volatility):
            margin = np.exp(a + b * deviation + z * edge_volatility_now)
            ready[edge] = [need_at(float(r * m)) for r, m in zip(observed_edge, margin, strict=True)]
            for hold in hold_steps:
                held = _backward_window_max(ready, hold + 1)
                changes = int(np.count_nonzero(np.diff(held)))
                if max_changes is not None and changes > max_changes:
                    continue
                slo = _slo_attainment(rates, held, timing)
                if slo < target_slo:
                    continue
                cost = timing.cost(held)
                if best is None or cost < best.gpu_hours_vs_oracle:
                    params = {
                        "inside_margin": inside_margin,
                        "edge_intercept": a,
                        "edge_reversion": b,
                        "edge_volatility": z,
                        "hold_steps": float(hold),
                    }
                    best = TunedPoint(slo, cost, params, changes)
    return best


def _backward_window_max(values: np.ndarray, window: int) -> np.ndarray:
    """out[i] = max(values[i - window + 1 : i + 1]) (shorter at the start)."""
    return _forward_window_max(values[::-1], window)[::-1]


@dataclass(frozen=True)
class ChangeBudget:
    """What holding at least ``lower`` with at most ``changes_allowed`` changes of the replica count costs, in
    replica-steps, bracketed: ``upper`` is a schedule found (``upper_changes`` changes, within the budget), ``lower``
    a bound no schedule within the budget can beat (Lagrangian duality: for every penalty p per change, any schedule
    with at most K changes costs at least min over schedules of (cost + p x changes) - p x K)."""

    changes_allowed: int
    upper: float
    upper_changes: int
    lower: float


def _level_runs(lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runs of equal values of ``lower``: (value, length) of each. A schedule never needs to change level inside
    a run (a fall moved to the run's start, a rise to its end, costs no more and stays feasible), so the run-level
    problem has the same optimum as the step-level one, in far fewer stages."""
    edges = np.flatnonzero(np.diff(lower)) + 1
    starts = np.concatenate(([0], edges))
    lengths = np.diff(np.concatenate((starts, [lower.size])))
    return lower[starts], lengths


def cheapest_schedules(lower: np.ndarray, change_costs: Sequence[float]) -> list[tuple[float, int]]:
    """For each penalty per change (replica-steps), the schedule of replica counts >= ``lower`` at every step that
    minimises replica-steps + penalty x changes: its (replica-steps, changes). Exact dynamic programme over levels
    0..max(lower), all penalties at once; the first step's level is free (not a change). A change is taken only when
    strictly cheaper than holding, and of equal final totals the one with fewer changes is reported."""
    values = np.asarray(lower, dtype=np.int64)
    if values.size == 0:
        return [(0.0, 0) for _ in change_costs]
    if (values < 0).any():
        raise ValueError("lower must not be negative")
    run_values, run_lengths = _level_runs(values)
    levels = np.arange(int(values.max()) + 1, dtype=np.float64)
    penalties = np.asarray(change_costs, dtype=np.float64)[:, None]
    # Each state (penalty, level) carries its total with the penalties and the changes on its path; a level below
    # the run's value is infeasible (infinite total).
    infeasible = np.inf
    total = np.where(levels >= run_values[0], levels * run_lengths[0], infeasible)[None, :].repeat(len(penalties), 0)
    changes = np.zeros_like(total)
    rows = np.arange(len(penalties))
    for value, length in zip(run_values[1:], run_lengths[1:], strict=True):
        best = np.argmin(total, axis=1)
        switch_total = total[rows, best][:, None] + penalties
        switch = switch_total < total
        total = np.where(switch, switch_total, total)
        changes = np.where(switch, changes[rows, best][:, None] + 1, changes)
        feasible = levels >= value
        total = np.where(feasible, total + levels * length, infeasible)
    out = []
    for row, penalty in enumerate(penalties[:, 0]):
        at = np.flatnonzero(total[row] == total[row].min())
        pick = int(at[np.argmin(changes[row, at])])
        count = int(changes[row, pick])
        out.append((float(total[row, pick] - penalty * count), count))
    return out


def change_budget(
    lower: np.ndarray, changes_allowed: Sequence[int], change_costs: Sequence[float]
) -> list[ChangeBudget]:
    """Bracket the cheapest schedule >= ``lower`` with at most each of ``changes_allowed`` changes (``ChangeBudget``),
    from the schedules at ``change_costs`` (a denser set of penalties brackets more tightly; 0 is always tried, and
    gives the schedule equal to ``lower``)."""
    costs = sorted({0.0, *map(float, change_costs)})
    solved = cheapest_schedules(lower, costs)
    out = []
    for allowed in changes_allowed:
        within = [(cost, count) for cost, count in solved if count <= allowed]
        upper, upper_changes = min(within, default=(math.inf, -1))
        pairs = zip(costs, solved, strict=True)
        bound = max(cost + penalty * count - penalty * allowed for penalty, (cost, count) in pairs)
        out.append(ChangeBudget(int(allowed), upper, upper_changes, float(bound)))
    return out
