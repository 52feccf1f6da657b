"""Earned headroom: how hot a forecasting service may run, from its forecast's measured quality (issue 14).

A GPUScalingPolicy's target (say 3.2 of the 3.5 req/s a replica serves) is only safe when a forecast floor supplies
the headroom the target leaves out. A new service has no history to forecast from, and a service whose forecast
has gone bad has none it can trust: both would run hot on a reactive path that is a cold start late. So the target
is earned, per service:

- until the forecast has enough live scores to judge its quantile (``LEARNING``: ``min_scored``, and at least
  1 / (1 - quantile), the scores in which the quantile allows one miss: 100 for a P99, whose coverage 30 scores
  cannot tell, since one miss in them is already 3.3 x the allowed), when it is stale or judged unreliable, or
  when it is not used at all: the service runs at ``untrusted ratio x target`` (0.75 by default: the packaged spec's 3.2
  req/s becomes 2.4, about 69 % of the replica's 3.5 req/s saturation, the headroom of an HPA at its customary
  70 % utilisation);
- with enough scores, the trust is how well the forecast's provisioned quantile *covered* the demand that then
  arrived: at most ``full_trust_miss_ratio`` (2.5) x (1 - quantile) of the values above it means full trust
  (``EARNED``, the spec's target); ``no_trust_miss_ratio`` (5) x or more means none (``DEGRADED``); in between,
  the target is interpolated (``PARTIAL``). The coverage is over the accountability window (6 hours by default),
  so the target loosens again within hours when a forecast degrades, and the service earns it back the same way.

A controller that has not run its first refit yet (it just started, or took the Lease over: its first tick always
runs before its first refit) does not know how much trust a service had earned; it *holds* a service without a usable
forecast (``HeadroomConfig.hold_unfitted``): the spec's target and no scale-down until that refit has run, instead of
reading every earned service as untrusted and scaling it up by a third at each rollout.

The ratio applies to the *reactive* path only (``ReplicaFloor.target_ratio``, read by ``core.decide``): the forecast
floor keeps turning demand into replicas at the full target. A floor that under-covers is what the reactive path's
extra headroom makes up for; scaling the floor too would count the same doubt twice. For the same reason, a
``PARTIAL`` service (some trust earned: ``ReplicaFloor.trust`` > 0) whose floor asks for at least what the metric
asks for at the full target runs the reactive path at the full target that tick: the floor covers the demand seen,
and the reduced target's extra replicas would come on top of it. Without any trust (learning, degraded, untrusted)
the reduced target stays (applied there too, a new service's first hour lost up to 11 points of requests within
SLO on the trace matrix).

The longer scale-down window holds the *reactive* path's recommendations (``core.decide``): while a floor is
applied, its own recommendations are held for the spec's window only, its cost of coming back being its ``hold``
(what the forecast needs again within the lead time). Holding a doubted forecast's peaks for the HPA's 300 s made it
dearer than a trusted one: on ServeGen the hedge before each 10-minute window edge was held through most of the
window (23 % of its ticks are partial or degraded; held for the spec's window, the default scenario at 90 s uses
1.285x the oracle's GPU-hours instead of 1.299x, at 99.64 % of requests within SLO instead of 99.67 %).

Pure: the numbers come from the published forecast (``PublishedForecast.coverage`` and ``coverage_samples``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from autoscaler.core.model import ForecastMode, ServicePolicy


class HeadroomState(StrEnum):
    LEARNING = "learning"  # too few live scores to judge the forecast: the untrusted target
    EARNED = "earned"  # the forecast covered its quantile: the spec's target
    PARTIAL = "partial"  # between: an interpolated target
    DEGRADED = "degraded"  # the forecast missed far too often: the untrusted target
    UNTRUSTED = "untrusted"  # the forecast is stale or unreliable, or there is none: the untrusted target


@dataclass(frozen=True, slots=True)
class HeadroomConfig:
    """How trust in a forecast turns into a target. Both miss ratios are multiples of the misses the quantile
    allows (1 - quantile): with P99, 2.5 means full trust up to 2.5 % of the values above the forecast.
    The defaults were chosen on the packaged ServeGen scenario (14 days): 1.5 / 3 kept 99.82 % of requests within
    SLO at 1.362x the oracle's GPU-hours, 2.5 / 5 kept 99.74 % at 1.311x (the HPA: 99.29 % at 1.323x)."""

    # live scored forecasts needed before coverage is judged, count (and at least 1 / (1 - quantile), see _judged)
    min_scored: int = 30
    # Without trust, a scale-down also waits as long as an HPA's does by default (its 300 s window), seconds
    untrusted_down_window_s: float = 300.0
    full_trust_miss_ratio: float = 2.5  # at or below this many times the allowed misses: full trust, ratio
    no_trust_miss_ratio: float = 5.0  # at or above: no trust, ratio
    # True while the controller has not run its first refit (it just started, or took the Lease over): a service
    # without a usable forecast then *holds* (see ``earned_headroom``) rather than being read as untrusted
    hold_unfitted: bool = False
    # the most live scores the accountability window can hold (one per forecast step), count; None: no bound known
    max_scored: int | None = None

    def __post_init__(self) -> None:
        if self.min_scored < 1:
            raise ValueError("min_scored must be at least 1")
        if not 0.0 < self.full_trust_miss_ratio < self.no_trust_miss_ratio:
            raise ValueError("need 0 < full_trust_miss_ratio < no_trust_miss_ratio")
        if self.max_scored is not None and self.max_scored < 0:
            raise ValueError("max_scored must be None or at least 0")


DEFAULT_HEADROOM = HeadroomConfig()


def scores_needed(quantile: float, min_scored: int) -> int:
    """Scored values before the coverage of ``quantile`` is judged: ``min_scored``, and at least 1 / (1 - quantile),
    the values in which the quantile allows one miss (30 scores of a P99 expect 0.3 misses: the first one, 3.3 x the
    allowed, swung a new service from the full target to the untrusted one within minutes)."""
    allowed = max(1.0 - quantile, 1e-9)
    return max(min_scored, math.ceil(1.0 / allowed - 1e-9))


def judges_coverage(actual: float) -> bool:
    """Whether a scored value is evidence of how well a quantile covers the demand: only demand above 0 is. Every
    forecast covers no demand (a rate or a utilisation is never below 0), whatever its quantile, so an idle minute
    says nothing of the upper tail; counted as covered, the idle half of a window (a service unused at night) halved
    the misses of the busy half, and a forecast that missed its rises twice as often as allowed earned full trust and
    a narrow calibrated excess. Such values still count for the verdict (a forecast of demand where none came is
    penalised by its pinball loss)."""
    return actual > 0.0


def excess_ratio(actual: float, median: float, upper: float) -> float:
    """How much of a forecast's excess over its median (``upper - median``) the demand that arrived needed:
    r = (actual - median) / (upper - median); without a band, -inf when the median covered it, else +inf."""
    excess = upper - median
    if excess > 1e-9:
        return (actual - median) / excess
    return -math.inf if actual <= median else math.inf


def calibrated_share(ordered_ratios: Sequence[float], quantile: float, min_scored: int) -> float:
    """``calibrated_excess`` on the scores' ratios (``excess_ratio``) already sorted ascending: the simulator keeps
    them sorted as scores come and go, so the share is one index, not a sort per update."""
    n = len(ordered_ratios)
    if n < scores_needed(quantile, min_scored):
        return 1.0
    rank = math.ceil((n + 1) * quantile - 1e-9)
    if rank > n:
        return 1.0
    share = ordered_ratios[rank - 1]
    if share == math.inf:
        return 1.0
    return min(1.0, max(0.0, share))


def calibrated_excess(
    scores: Iterable[tuple[float, float, float]], quantile: float, min_scored: int
) -> tuple[float, int]:
    """The share of the provisioned quantile's excess over the median the floor needs, measured (issue 14), and the
    scores behind it. ``scores``: (actual, median, provisioned quantile) of the forecasts scored in the
    accountability window. The spec's quantile is the coverage the service needs; each score's
    r = (actual - median) / (quantile - median) is how much of the excess that value needed, and the conformal
    ceil((n + 1) q)-th smallest r is the least share that covered a q share of them (split-conformal calibration of
    the band's width). A forecast whose quantile over-covered (a P99 above 99.9 % of the demand) provisions at that
    share, at most the whole excess: one that under-covers keeps its quantile, and the reactive path's reduced
    target (``earned_headroom``) makes up for it, as the module's docstring says (the same doubt is not counted
    twice). 1 (the quantile itself) until ``scores_needed`` values are scored, and when the order statistic is
    beyond the scores (too few for the quantile) or is an actual above a zero excess."""
    ratios = sorted(excess_ratio(actual, median, upper) for actual, median, upper in scores)
    return calibrated_share(ratios, quantile, min_scored), len(ratios)


@dataclass(frozen=True, slots=True)
class Headroom:
    """The target ratio one service runs at this tick, and why."""

    ratio: float  # multiplier on the spec's target for the reactive path, in [untrusted ratio, 1]
    state: HeadroomState
    detail: str
    trust: float  # 0..1
    coverage: float | None = None  # share of scored demand at or below the provisioned quantile
    scored: int = 0
    down_window_s: float = 0.0  # the scale-down window is at least this, seconds (0: the spec's)


def _trust(
    policy: ServicePolicy,
    *,
    coverage: float | None,
    scored: int,
    usable: bool,
    why_unusable: str = "",
    config: HeadroomConfig = DEFAULT_HEADROOM,
) -> Headroom:
    fp = policy.forecast
    assert fp is not None
    if fp.untrusted_target_ratio >= 1.0:
        # Off: the full target and the spec's window whatever the forecast, but the state still says what the
        # forecast is (plan, status and the state gauge must not call a stale or absent forecast earned).
        judged = _judged(
            policy, 1.0, coverage=coverage, scored=scored, usable=usable, why_unusable=why_unusable, config=config
        )
        off = f"earned headroom off (untrustedTargetRatio 1); {judged.detail}"
        return Headroom(1.0, judged.state, off, 1.0, coverage, scored)
    return _judged(
        policy,
        fp.untrusted_target_ratio,
        coverage=coverage,
        scored=scored,
        usable=usable,
        why_unusable=why_unusable,
        config=config,
    )


def _judged(
    policy: ServicePolicy,
    floor_ratio: float,
    *,
    coverage: float | None,
    scored: int,
    usable: bool,
    why_unusable: str,
    config: HeadroomConfig,
) -> Headroom:
    fp = policy.forecast
    assert fp is not None
    # a floor ratio of 1 is earned headroom off: the verdict must not name a reduced target that is not applied
    untrusted = f"target x {floor_ratio:g} until the forecast earns trust" if floor_ratio < 1.0 else "full target"
    if not usable:
        return Headroom(floor_ratio, HeadroomState.UNTRUSTED, f"{why_unusable}: {untrusted}", 0.0, coverage, scored)
    allowed = max(1.0 - fp.quantile, 1e-9)
    needed = scores_needed(fp.quantile, config.min_scored)
    if coverage is None or not math.isfinite(coverage) or scored < needed:
        detail = f"{scored} of {needed} live scores: {untrusted}"
        if config.max_scored is not None and needed > config.max_scored:
            # one score per forecast step: the window can never hold what the quantile needs
            detail = (
                f"P{fp.quantile * 100:g} needs {needed} scored values and the accountability window holds at most "
                f"{config.max_scored} (forecast.accountability_window_seconds / forecast.step_seconds): it can never "
                f"earn trust; lengthen that window or lower spec.forecast.quantile; {detail}"
            )
        return Headroom(floor_ratio, HeadroomState.LEARNING, detail, 0.0, coverage, scored)
    # rounded: a coverage of exactly 2.5 x (5 x) the allowed misses is full (no) trust as documented, not a hair off
    # it from the binary fractions (P90's 25 % misses came out 2.5000000000000004 x: "partial", and a window 1e-14 s
    # longer than the spec's)
    miss_ratio = round(max(0.0, 1.0 - coverage) / allowed, 9)
    full, none = config.full_trust_miss_ratio, config.no_trust_miss_ratio
    trust = min(1.0, max(0.0, (none - miss_ratio) / (none - full)))
    ratio = floor_ratio + trust * (1.0 - floor_ratio)
    covered = f"P{fp.quantile * 100:g} covered {coverage:.1%} of {scored} scored"
    if trust >= 1.0:
        return Headroom(1.0, HeadroomState.EARNED, f"{covered}: full target", 1.0, coverage, scored)
    if trust <= 0.0:
        return Headroom(floor_ratio, HeadroomState.DEGRADED, f"{covered}: {untrusted}", 0.0, coverage, scored)
    target = f"target x {ratio:.2f}" if ratio < 1.0 else "full target"
    return Headroom(ratio, HeadroomState.PARTIAL, f"{covered}: {target}", trust, coverage, scored)


@functools.lru_cache(maxsize=4096)  # pure, and its inputs change once a minute at most: a tick reads the last answer
def earned_headroom(
    policy: ServicePolicy,
    *,
    coverage: float | None,
    scored: int,
    usable: bool,
    why_unusable: str = "",
    config: HeadroomConfig = DEFAULT_HEADROOM,
) -> Headroom:
    """The headroom of one ACTIVE forecasting service. ``usable``: the latest fit is fresh and judged reliable.
    Without full trust the scale-down window also grows, towards ``untrusted_down_window_s`` as trust falls: a new
    service starts no tighter than an HPA, in target and in how soon it gives replicas back (the reactive path's
    replicas: a usable floor's are held for the spec's window, see the module's docstring).

    ``config.hold_unfitted`` (a controller that has not run its first refit: it just started or took the Lease over)
    makes a service without a usable forecast *hold*: the spec's target and no scale-down (an unbounded scale-down
    window) until that refit has run. Its replicas were sized by the previous leader on a trust this one has not
    judged yet; reading it as untrusted scaled every earned service up by a third at each restart or change of
    leader, and gave the replicas back once the refit had restored the trust."""
    if config.hold_unfitted and not usable:
        detail = (
            f"{why_unusable}: the controller has not run its first refit since it started (or took over): the "
            "replicas are held (the spec's target, no scale-down) until it has"
        )
        return Headroom(1.0, HeadroomState.UNTRUSTED, detail, 0.0, coverage, scored, math.inf)
    headroom = _trust(policy, coverage=coverage, scored=scored, usable=usable, why_unusable=why_unusable, config=config)
    spec_window = policy.scale_down.stabilisation_s
    if headroom.trust >= 1.0 or spec_window >= config.untrusted_down_window_s:
        return headroom
    window = spec_window + (1.0 - headroom.trust) * (config.untrusted_down_window_s - spec_window)
    h = headroom
    return Headroom(h.ratio, h.state, h.detail, h.trust, h.coverage, h.scored, window)


def wants_headroom(policy: ServicePolicy) -> bool:
    """Only a service whose forecast is ACTIVE earns its headroom: in shadow mode nothing may change."""
    return policy.forecast is not None and policy.forecast.mode is ForecastMode.ACTIVE
