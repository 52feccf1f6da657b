"""How well can any causal policy do? A generous lower bound on GPU-hours for a share of requests within the SLO.

The oracle knows every future step; a real policy learns the demand only ``metrics_delay`` after it happens and must
ask for replicas one cold start before they serve. On demand that moves in steps at the edges of fixed windows (a
change period, see ``forecast.phase.detect_change_period``), the ``window_margin_bound`` policy is given everything
else for free:

* inside a window whose level it has already observed when the replicas had to be requested, it knows the demand of
  every step exactly (it provisions the oracle's replicas, ``need``);
* in the first steps of a window, before any of it could be observed at request time, it provisions ``need`` at
  ``margin`` times the last demand it observed: a fixed multiplicative margin for the unknown jump;
* pods cost GPUs from the moment they are requested (as in the simulator), with no rate limit or stabilisation.

A real policy knows less, so for each share of requests within the SLO, the GPU-hours this policy needs (relative to
the oracle, costed the same way) bound what a causal policy with a fixed margin can reach. Margins that depend on
recent volatility do somewhat better; the benchmark reports the fixed-margin curve and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from autoscaler.sim.policies import SimService, _forward_window_max


@dataclass(frozen=True)
class BoundPoint:
    margin: float  # multiplier on the last observed demand for steps in a not-yet-observed window
    slo_attainment: float  # share of requests in steps whose latency quantile meets the SLO
    gpu_hours_vs_oracle: float


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
    steps = rates.size
    need = np.fromiter((service.need(float(r)) for r in rates), dtype=np.int64, count=steps)
    lead_steps = math.ceil(service.policy.cold_start_s / step_s)
    oracle_cost = float(_forward_window_max(need, lead_steps + 1).sum())
    # Replicas ready at step i were requested at the end of step i - lead - 1, on the demand of `delay` steps earlier.
    seen = np.maximum(np.arange(steps) - lead_steps - 1 - round(metrics_delay_s / step_s), 0)
    window = np.floor((start + np.arange(steps) * step_s) / period_s).astype(np.int64)
    known = window[seen] == window
    points = []
    for margin in margins:
        guessed = np.fromiter(
            (service.need(float(r) * margin) for r in rates[seen[~known]]), dtype=np.int64, count=int((~known).sum())
        )
        ready = need.copy()
        ready[~known] = guessed
        ok = ready >= need
        slo = float((rates * ok).sum() / rates.sum()) if rates.sum() > 0 else 1.0
        cost = float(_forward_window_max(ready, lead_steps + 1).sum())
        points.append(BoundPoint(float(margin), slo, cost / oracle_cost if oracle_cost else math.nan))
    return points


def cheapest_at(points: Iterable[BoundPoint], slo_attainment: float) -> BoundPoint | None:
    """The point with the fewest GPU-hours among those reaching ``slo_attainment``, or None."""
    reaching = [p for p in points if p.slo_attainment >= slo_attainment]
    return min(reaching, key=lambda p: p.gpu_hours_vs_oracle, default=None)
