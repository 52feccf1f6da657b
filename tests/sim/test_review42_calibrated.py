"""Review 42 of issue 14's calibrated excess in the simulator (``autoscaler/sim/predictive.py``): the sorted window
of excess ratios as forecasts are queued out of target order (``_expect``: the lead grows by a node boot and falls
back), and the share it publishes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from autoscaler.core.headroom import calibrated_excess
from autoscaler.core.model import MetricKind, ServicePolicy
from autoscaler.sim.policies import SimService
from autoscaler.sim.predictive import ForecastingConfig, PredictivePolicy, _expect


def _service() -> SimService:
    policy = ServicePolicy("ml", "chat", metric=MetricKind.REQUEST_RATE, target=2.0, max_replicas=40)
    return SimService(policy, np.full(10, 10.0), throughput=3.0, base_latency_s=1.0, slo_s=2.0, quantile=0.95)


@pytest.mark.parametrize("delay", [0.0, 30.0])
def test_targets_queued_out_of_order_expire_by_their_own_time(delay: float) -> None:
    """One forecast a 15 s tick at now + lead, the lead 90 s or 90 + 120 s (node boot) at random: targets arrive
    out of order. The calibration window stays in target order (what is scored is always after what was), so its
    expiry from the front drops exactly the scores older than the window, and the share equals the core's
    ``calibrated_excess`` over the same scores at every judgement -- and equals the coverage's own window."""
    rng = random.Random(11)
    config = ForecastingConfig(accountability_s=3600.0)
    policy = PredictivePolicy(config, metrics_delay_s=delay)
    policy.reset([_service()], 15.0)
    state = policy.per_service[0]
    queued: dict[float, tuple[float, float]] = {}  # target -> (median, upper)
    scored: list[tuple[float, float, float, float]] = []  # (target, actual, median, upper)
    for tick in range(2000):
        now = 15.0 * (tick + 1)
        lead = 90.0 + (120.0 if rng.random() < 0.3 else 0.0)
        target = now + lead + rng.random()  # distinct targets
        median = 10.5 + rng.random()
        upper = median + (0.0 if rng.random() < 0.02 else rng.choice([0.5, 2.0]))
        queued[target] = (median, upper)
        _expect(state.pending_scores, (target, upper, upper, median))
        actual = 10.0 + rng.uniform(-1.0, 1.0)
        before = {p[0] for p in state.pending_scores}
        policy._observe(state, now, actual, 0.99)
        after = {p[0] for p in state.pending_scores}
        scored.extend((t, actual, *queued[t]) for t in sorted(before - after))
        times = [t for t, _ in state.calibration]
        assert times == sorted(times)
        if tick % 7 == 0:
            policy._judge(state, 0.99, now)
            kept = [(a, m, u) for t, a, m, u in scored if t >= now - config.accountability_s]
            want = calibrated_excess(kept, 0.99, config.min_scored_samples)[0]
            assert state.excess_share == pytest.approx(want)
            assert len(state.calibration_sorted) == len(kept) == state.scored
            assert state.calibration_sorted == sorted(state.calibration_sorted)
    assert state.excess_share < 1.0
