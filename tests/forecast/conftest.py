from __future__ import annotations

import numpy as np
import pytest

STEP_S = 600.0
# 2023-11-13 00:00 UTC, a Monday: calendar features see real days of the week.
START = 1_699_833_600.0


def daily_series(days: float = 5.0, step_s: float = STEP_S, noise: float = 5.0, seed: int = 0) -> np.ndarray:
    """Request rate with a daily cycle (trough at night) plus Gaussian noise, never negative."""
    n = int(days * 86_400 / step_s)
    t = np.arange(n) * step_s
    rng = np.random.default_rng(seed)
    y = 100.0 + 50.0 * np.sin(2 * np.pi * t / 86_400) + rng.normal(0.0, noise, n)
    return np.maximum(y, 0.0)


@pytest.fixture
def series() -> np.ndarray:
    return daily_series()
