"""A PNG of a simulation: demand, ready replicas per policy, and latency against the SLO (first service); with
training in the scenario, GPUs by use (inference, training, free, burst) over time for the capacity policies, with
the GPUs stranded by fragmentation when they were measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoscaler.sim.run import SimulationResult

# Long runs are drawn at this many points per line at most (max within each bucket, so spikes stay visible).
MAX_POINTS = 2000


def _bucket_max(values: np.ndarray, buckets: int) -> np.ndarray:
    if len(values) <= buckets:
        return values
    size = int(np.ceil(len(values) / buckets))
    padded = np.full(size * int(np.ceil(len(values) / size)), np.nan)
    padded[: len(values)] = values
    return np.asarray(np.nanmax(padded.reshape(-1, size), axis=1))


def _bucket_mean(values: np.ndarray, buckets: int) -> np.ndarray:
    if len(values) <= buckets:
        return values
    size = int(np.ceil(len(values) / buckets))
    padded = np.full(size * int(np.ceil(len(values) / size)), np.nan)
    padded[: len(values)] = values
    return np.asarray(np.nanmean(padded.reshape(-1, size), axis=1))


# The policies whose GPUs-by-use panel is drawn when the scenario has training (in this order, when run).
CAPACITY_POLICIES = ("predictive", "kube-preemption", "burst-only")


def plot(result: SimulationResult, path: Path, service_index: int = 0) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none is needed for a file
    import matplotlib.pyplot as plt

    service = result.services[service_index]
    hours = np.arange(result.steps) * result.step_s / 3600.0
    x = _bucket_max(hours, MAX_POINTS)
    capacity = [
        name for name in CAPACITY_POLICIES
        if result.scenario.training is not None and name in result.runs and result.runs[name].node_gpus is not None
    ]
    rows = 3 + len(capacity)
    fig, axes = plt.subplots(rows, 1, figsize=(13, 3 * rows), sharex=True, constrained_layout=True)
    axes[0].plot(x, _bucket_max(service.rates, MAX_POINTS), color="black", linewidth=0.8)
    axes[0].set_ylabel("demand (req/s)")
    axes[0].set_title(f"{result.scenario.name}: {service.policy.key}")
    for name, run in result.runs.items():
        timeline = run.timelines[service_index]
        axes[1].plot(x, _bucket_max(timeline.ready.astype(float), MAX_POINTS), linewidth=0.9, label=name)
        latency = np.minimum(timeline.latency_s, service.slo_s * 20)  # infinite latency drawn at the top
        axes[2].plot(x, _bucket_max(latency, MAX_POINTS), linewidth=0.7, label=name)
    axes[1].set_ylabel("ready replicas")
    axes[1].legend(loc="upper left", ncols=len(result.runs))
    axes[2].axhline(service.slo_s, color="red", linestyle="--", linewidth=1.0, label="SLO")
    axes[2].set_yscale("log")
    axes[2].set_ylabel(f"P{round(service.quantile * 100)} latency (s)")
    axes[2].legend(loc="upper left", ncols=len(result.runs) + 1)
    for row, name in enumerate(capacity, start=3):
        run = result.runs[name]
        assert run.node_gpus is not None and run.training_gpus is not None
        assert run.inference_gpus is not None and run.burst_gpus is not None
        inference = _bucket_mean(run.inference_gpus.astype(float), MAX_POINTS)
        training = _bucket_mean(run.training_gpus.astype(float), MAX_POINTS)
        total = _bucket_mean(run.node_gpus.astype(float), MAX_POINTS)
        burst = _bucket_mean(run.burst_gpus.astype(float), MAX_POINTS)
        free = np.maximum(0.0, total - inference - training)
        axes[row].stackplot(
            x, inference, training, free, labels=["inference", "training", "free"],
            colors=["tab:blue", "tab:orange", "0.85"],
        )
        axes[row].plot(x, total - burst, color="black", linewidth=0.8, label="on-prem GPUs (above: burst)")
        if run.stranded_gpus is not None:
            stranded = _bucket_mean(run.stranded_gpus.astype(float), MAX_POINTS)
            axes[row].plot(x, stranded, color="tab:red", linewidth=0.8, label="stranded (free, no waiting pod fits)")
        axes[row].set_ylabel(f"GPUs: {name}")
        axes[row].legend(loc="upper left", ncols=5)
    axes[rows - 1].set_xlabel("hours since trace start (lines: max over each bucket; GPU areas: mean)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
