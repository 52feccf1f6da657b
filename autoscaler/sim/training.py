"""The simulator's training side (issue 12): the scenario's training jobs as ``SimJob`` s, the controller's
capacity arbitration settings from the scenario's node pools and ``capacity`` block, and the rebalancer's (issue 15)
from its ``rebalance`` block."""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from autoscaler.core.arbitrate import CapacityConfig
from autoscaler.core.burst import BurstPool
from autoscaler.core.rebalance import RebalanceConfig
from autoscaler.core.victims import TrainingRules
from autoscaler.sim.cluster import SimJob
from autoscaler.sim.scenario import NodePool, Scenario, ScenarioError, generated_job_name

# Runtimes in a runtimes file, at most (the packaged Philly sample has 2,000).
MAX_RUNTIMES = 1_000_000


def read_runtimes(path: Path) -> np.ndarray:
    """Runtimes (seconds) of a one-column file with a header line, gzip or plain; refuses anything else."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as stream:
            lines = stream.read(64 * 1024 * 1024).splitlines()
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise ScenarioError(f"training.generate.runtimes: cannot read {path}: {error}") from None
    values = []
    for number, line in enumerate(lines[1 : MAX_RUNTIMES + 1], start=2):
        text = line.strip().split(",")[0]
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ScenarioError(f"{path}:{number}: runtime {text!r} is not a number") from None
        if not np.isfinite(value) or value < 0:
            raise ScenarioError(f"{path}:{number}: runtime {value!r} is not a finite number >= 0")
        values.append(value)
    if not values:
        raise ScenarioError(f"training.generate.runtimes: {path} has no runtimes")
    return np.asarray(values, dtype=np.float64)


def build_jobs(scenario: Scenario, base_dir: Path, start: float, runtimes_path: Path | None = None) -> list[SimJob]:
    """The scenario's training jobs, listed then generated; times from the run's ``start``."""
    training = scenario.training
    if training is None:
        return []
    jobs = [
        SimJob(
            training.namespace, job.name, job.pods, job.gpus_per_pod, job.priority, job.work_seconds,
            job.checkpoint_seconds, start + job.submit_seconds, training.min_runtime_seconds, job.preemptible,
            job.restart_seconds,
        )
        for job in training.jobs
    ]
    generator = training.generate
    if generator is not None:
        assert runtimes_path is not None, "the caller resolves training.generate.runtimes"
        runtimes = read_runtimes(runtimes_path)
        rng = np.random.default_rng(generator.seed)
        weights = np.asarray(generator.pods_weights or [1.0] * len(generator.pods), dtype=np.float64)
        submit = start
        for index in range(generator.count):
            work = float(min(rng.choice(runtimes), generator.max_work_seconds))
            pods = int(rng.choice(generator.pods, p=weights / weights.sum()))
            jobs.append(
                SimJob(
                    training.namespace, generated_job_name(index), pods, generator.gpus_per_pod, generator.priority,
                    max(work, 1.0), generator.checkpoint_seconds, submit, training.min_runtime_seconds, True,
                    generator.restart_seconds,
                )
            )
            submit += float(rng.exponential(generator.mean_interarrival_seconds))
    if training.rebalance_allowed:
        for job in jobs:
            job.rebalance_allowed = True
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):  # refused at load already (Training._unique_names); a scenario built in code
        raise ScenarioError("training.jobs: job names must be unique (generated jobs are named gen-NNNN)")
    return jobs


def capacity_config(scenario: Scenario, pools: Sequence[NodePool] | None = None) -> CapacityConfig:
    """The controller's capacity arbitration as the scenario configures it: its burst pools, its costs."""
    capacity = scenario.capacity
    burst = [
        BurstPool(
            pool.name, pool.gpus_per_node, pool.gpu_type, pool.boot_seconds, pool.price_per_gpu_hour,
            nodes=pool.nodes, min_nodes=pool.nodes, max_nodes=pool.node_limit, priority=pool.priority,
        )
        for pool in (pools if pools is not None else scenario.node_pools)
        if pool.burst
    ]
    min_runtime = scenario.training.min_runtime_seconds if scenario.training is not None else 600.0
    return CapacityConfig(
        training=TrainingRules(
            preemptible_below_priority=capacity.preemptible_below_priority, min_runtime_s=min_runtime
        ),
        pools=tuple(burst),
        expanders=tuple(capacity.expanders),
        spend_cap_per_hour=capacity.spend_cap_per_hour,
        training_gpu_hour_value=capacity.training_gpu_hour_value,
        slo_risk_per_gpu_hour=capacity.slo_risk_per_gpu_hour,
        assumed_shortfall_s=capacity.assumed_shortfall_seconds,
        shortfall_confirm_s=capacity.shortfall_confirm_seconds,
        burst_idle_cooldown_s=capacity.burst_idle_cooldown_seconds,
        resume_after_s=capacity.resume_after_seconds,
        consolidate_horizon_s=capacity.consolidate_horizon_seconds,
        choose_scale_down_replicas=capacity.choose_scale_down_replicas,
    )


def rebalance_config(scenario: Scenario, pools: Sequence[NodePool] | None = None) -> RebalanceConfig:
    """The rebalancer as the scenario's ``rebalance`` block configures it: the burst pools to empty are the
    scenario's burst pools, and training may not be placed on them (they are tainted for inference)."""
    block = scenario.rebalance
    burst = frozenset(pool.name for pool in (pools if pools is not None else scenario.node_pools) if pool.burst)
    return RebalanceConfig(
        interval_s=block.interval_seconds,
        max_moves_per_pass=block.max_moves_per_pass,
        max_moves_per_hour=block.max_moves_per_hour,
        min_gain_per_move=block.min_gain_per_move,
        checkpoint_max_age_s=block.checkpoint_max_age_seconds,
        burst_pools=burst,
        burst_empty_below=block.burst_empty_below,
        training_excluded_pools=burst,
        retry_after_s=block.retry_after_seconds,
        retry_after_max_s=block.retry_after_max_seconds,
        put_back_checks=block.put_back_checks,
        put_back_hold_s=block.put_back_hold_seconds,
        put_back_watch_s=block.put_back_watch_seconds,
        spare_replicas_only=block.spare_replicas_only,
    )
