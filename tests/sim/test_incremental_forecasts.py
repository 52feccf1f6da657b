"""The simulator's forecasts with the incremental updates (issue 14) give the same run as learning from scratch."""

from __future__ import annotations

from pathlib import Path

import pytest

import autoscaler.sim.run as run_module
from autoscaler.sim.engine import simulate
from autoscaler.sim.registry import make_policy
from autoscaler.sim.run import build_services
from autoscaler.sim.scenario import load_scenario
from forecast.base import OrderHints


def _run(days: float) -> tuple[float, float, int, dict[str, int], list[float]]:
    scenario, base = load_scenario(Path(run_module.__file__).parent / "scenarios" / "default.yaml")
    services, start, steps = build_services(scenario, base)
    steps = min(steps, int(days * 86_400 / scenario.step_seconds))
    policy = make_policy(
        "predictive",
        forecasting=scenario.forecasting.to_config(),
        node_boot_s=300.0,
        metrics_delay_s=scenario.metrics_delay_seconds,
    )
    run = simulate(
        policy, services, scenario.node_pools, start, scenario.step_seconds, steps, scenario.metrics_delay_seconds
    )
    errors = list(getattr(run.policy_object, "pinball", []))
    return run.requests_in_slo_steps, run.gpu_seconds, run.scale_actions, dict(run.reasons), errors


def test_the_default_scenario_runs_the_same_without_kept_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1.2 days: the baseline's fall-back to naive on the first day, its daily season after, hourly refits
    incremental = _run(1.2)
    original = OrderHints.advance

    def forget(self: OrderHints, series: object, first_index: int) -> None:
        original(self, series, first_index)  # type: ignore[arg-type]
        self.invalidate()

    monkeypatch.setattr(OrderHints, "advance", forget)
    from_scratch = _run(1.2)
    assert incremental == from_scratch  # every figure, every decision reason, every forecast's pinball loss


def _scenario_run(days: float) -> tuple[float, float, int, dict[str, int], float]:
    from autoscaler.sim.run import run_scenario

    scenario, base = load_scenario(Path(run_module.__file__).parent / "scenarios" / "default.yaml")
    scenario = scenario.model_copy(update={"duration_seconds": days * 86_400})
    run = run_scenario(scenario, base, ["predictive"]).runs["predictive"]
    return run.requests_in_slo_steps, run.gpu_seconds, run.scale_actions, dict(run.reasons), run.burst_gpu_seconds


def test_fitting_only_the_levels_the_tick_reads_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator fits a model whose levels are learnt apart (``levels_independent``) at the service's quantile
    and the median the capacity arbitration reads (``core.arbitrate.EXPECTED_LEVEL``), not the whole band the
    controller fits. 1.2 days with the packaged capacity arbitration: its consolidation reads the median from the
    23rd hour on (a level left out raised ValueError there); every figure must be as with the band."""
    from forecast.baselines import LastValue, SeasonalNaive
    from forecast.phase import PhaseNaive

    fewer = _scenario_run(1.2)
    for cls in (LastValue, SeasonalNaive, PhaseNaive):
        monkeypatch.setattr(cls, "levels_independent", False)
    with_band = _scenario_run(1.2)
    assert fewer == with_band
