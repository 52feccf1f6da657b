"""Controller settings: ``AUTOSCALER_*`` environment variables, a YAML/JSON file, and command-line overrides.

Precedence, highest first: command-line flags > environment > config file > defaults. Nested groups use ``__`` in
the environment (``AUTOSCALER_LEADER_ELECTION__LEASE_NAME``) and a nested mapping in the file
(``leader_election: {lease_name: ...}``). Every error names the setting the way the user wrote it, e.g.
``AUTOSCALER_TICK_INTERVAL_SECONDS (tick_interval_seconds): must be > 0``, so a bad Deployment manifest is fixed
from the log line alone.
"""

from __future__ import annotations

import contextvars
import difflib
import importlib
import inspect
import ipaddress
import json
import os
import re
import reprlib
import socket
import typing
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

from autoscaler.adapters.prometheus_settings import (
    PrometheusSettings,
    duration_in_range,
    no_boolean_number,
    path_not_empty,
)
from autoscaler.policy import DNS_LABEL, DNS_SUBDOMAIN, LABEL_VALUE_MAX
from autoscaler.yaml_input import YamlProblem, decode_utf8, load_yaml

ENV_PREFIX = "AUTOSCALER_"
ENV_NESTED_DELIMITER = "__"
# The Prometheus adapter's settings are a BaseSettings of their own with a flat prefix (AUTOSCALER_PROMETHEUS_URL);
# they nest here under ``prometheus`` in the file, and keep their own environment names.
PROMETHEUS_GROUP = "prometheus"
PROMETHEUS_ENV_PREFIX = "AUTOSCALER_PROMETHEUS_"
CONFIG_FILE_ENV = "AUTOSCALER_CONFIG_FILE"
# Bind addresses that take a port on every interface (and "::" the IPv4 ones too, as Linux binds it dual-stack).
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]"})
# A tick reads the whole cluster and Prometheus: more often than this is a busy loop, never a faster controller.
MIN_TICK_INTERVAL_SECONDS = 1.0
# The same floor for the other interval jobs (refit, forecast update, rebalance pass): each reads Prometheus or the
# cluster, and 0.001 s was accepted and ran them in a busy loop.
MIN_JOB_INTERVAL_SECONDS = 1.0
# What the API server takes as a namespace (RFC 1123 label) and as a Lease name (RFC 1123 subdomain, 253 characters;
# a dry-run controller's Lease adds "-dry-run"). Anything else was accepted here and refused on every request.
NAMESPACE_PATTERN = f"^{DNS_LABEL}$"
NAMESPACE_MAX = 63
DRY_RUN_LEASE_SUFFIX = "-dry-run"
# A burst pool is the value of its nodes' pool label (a label value, not empty: an empty one names no pool), and a
# MachineDeployment is an object (an RFC 1123 subdomain). Another name was accepted and matched no node, or every
# resize of the pool was refused by the API server, tick after tick.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_OBJECT_NAME = re.compile(DNS_SUBDOMAIN)
OBJECT_NAME_MAX = 253
LEASE_NAME_MAX = 253 - len(DRY_RUN_LEASE_SUFFIX)
# AUTOSCALER_* variables that are not settings but are read elsewhere; every other unknown AUTOSCALER_* name is an
# error (a typo would otherwise be ignored and the default used).
NOT_SETTINGS: dict[str, str] = {
    "AUTOSCALER_TRACES": "directory of the public traces (autoscaler/sim/placement.py, benchmarks/bench_forecast.py)",
    "AUTOSCALER_SHARED_TRACES": "directory of the shared traces for the trace tests (tests/traces)",
}
# What Kubernetes (and Docker links) put into a pod's environment for every Service of its namespace: a Service
# named autoscaler-x gives AUTOSCALER_X_SERVICE_HOST, AUTOSCALER_X_PORT=tcp://..., AUTOSCALER_X_PORT_80_TCP_ADDR...
# Not settings, and no choice of the user's: ignored rather than refused, or such a Service would stop the controller.
_SERVICE_LINK = re.compile(
    r"[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)"
)
_SERVICE_LINK_PORT = re.compile(r"(tcp|udp|sctp)://\S+", re.IGNORECASE)
# Input quoted in an error is cut to this many characters: a YAML alias bomb of 800 bytes expands to 100 MB of text.
ECHO_LIMIT = 200
# Lines of one error message: a list of thousands of bad items names its first ones.
MAX_LISTED_PROBLEMS = 30
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class SettingsError(ValueError):
    """Invalid configuration; the message names every bad setting (env var and file key)."""


def _pod_namespace() -> str:
    """The namespace the controller runs in: downward API env, then the service-account mount, then ``default``."""
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _default_identity() -> str:
    # POD_NAME is unique in a cluster. Outside one, two processes on the same host must still differ, or both would
    # believe they hold the Lease; client-go appends a UUID for the same reason.
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _echo(value: Any) -> str:
    """``repr(value)`` for an error message, at most ``ECHO_LIMIT`` characters, computed without expanding it."""
    text = _ECHO.repr(value)
    return text if len(text) <= ECHO_LIMIT else text[: ECHO_LIMIT - 3] + "..."


def _cut(text: str, limit: int = 4 * ECHO_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ECHO = reprlib.Repr()
_ECHO.maxlevel, _ECHO.maxdict, _ECHO.maxlist, _ECHO.maxtuple, _ECHO.maxset = 3, 8, 8, 8, 8
_ECHO.maxstring = _ECHO.maxother = ECHO_LIMIT


def _name(*loc: str) -> str:
    """How a cross-field error names a setting: env var and file key (the error has no single location)."""
    return f"{env_name(loc)} ({'.'.join(loc)})"


def _json_object(value: Any) -> Any:
    """A mapping given as JSON text (the environment), decoded; anything else (a file's mapping) as it is.

    JSON-valued settings are ``NoDecode`` and decoded here, in validation, so that a syntax error is a validation
    error naming the setting; decoded by pydantic-settings' env source, it escaped as a traceback (exit 1).
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc}); expected a JSON object") from None


class _Group(BaseModel):
    # allow_inf_nan=False: inf or NaN in a duration breaks at run time (datetime overflow, a Lease it cannot write)
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return no_boolean_number(cls, value, info)

    @field_validator("*")
    @classmethod
    def _durations_in_range(cls, value: Any, info: ValidationInfo) -> Any:
        return duration_in_range(value, info.field_name)


class LeaderElectionSettings(_Group):
    """A ``coordination.k8s.io/v1`` Lease decides which replica acts; the others stand by."""

    enabled: bool = Field(
        True, description="elect a leader through a Lease; false = this process always acts (single replica only)"
    )
    lease_name: str = Field(
        "gpu-autoscaler",
        min_length=1,
        max_length=LEASE_NAME_MAX,
        pattern=f"^{DNS_SUBDOMAIN}$",
        description="name of the Lease object (dry-run controllers use <name>-dry-run, never the real one)",
    )
    lease_namespace: str = Field(
        default_factory=_pod_namespace,
        min_length=1,
        max_length=NAMESPACE_MAX,
        pattern=NAMESPACE_PATTERN,
        description="namespace of the Lease (default: POD_NAMESPACE, the service-account namespace, or default)",
    )
    identity: str = Field(
        default_factory=_default_identity,
        min_length=1,
        description="holder identity written into the Lease (default: POD_NAME, or hostname_<random>)",
    )
    lease_duration_seconds: float = Field(
        15.0, gt=0, description="seconds a follower waits after the last renewal it saw before taking over"
    )
    renew_deadline_seconds: float = Field(
        10.0, gt=0, description="seconds the leader keeps acting without a successful renewal; then it stops"
    )
    retry_period_seconds: float = Field(
        2.0, ge=0.1, description="seconds between acquire/renew attempts, at least 0.1 (each is a request to the API)"
    )
    label_leader_pod: bool = Field(
        False,
        description="the leader labels its own pod (POD_NAME in POD_NAMESPACE) gpuautoscaler.dev/leader=<lease name> "
        "and takes the label off any other pod of that namespace, so that a Service can select the leader alone "
        "(deploy/overlays/scheduler-extender); needs list and patch of pods in that namespace",
    )

    @model_validator(mode="after")
    def _ordering(self) -> LeaderElectionSettings:
        # The leader must stop acting (renew deadline) before a follower may take over (lease duration), and it
        # must get several renewal attempts within its deadline; client-go enforces the same ordering.
        group = ("leader_election",)
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise ValueError(
                f"{_name(*group, 'renew_deadline_seconds')} ({self.renew_deadline_seconds:g}) must be < "
                f"{_name(*group, 'lease_duration_seconds')} ({self.lease_duration_seconds:g})"
            )
        if self.retry_period_seconds * 1.2 >= self.renew_deadline_seconds:
            raise ValueError(
                f"{_name(*group, 'retry_period_seconds')} ({self.retry_period_seconds:g}) x 1.2 must be < "
                f"{_name(*group, 'renew_deadline_seconds')} ({self.renew_deadline_seconds:g})"
            )
        return self


_HOST_NAME = re.compile(DNS_SUBDOMAIN, re.IGNORECASE)


def _bind_address(value: str) -> str:
    """``value`` if a server can bind it: empty (every interface), an IP address (an IPv6 one may be bracketed) or a
    host name. Anything else failed at start-up ("Name or service not known", exit 1), naming no setting."""
    text = value.strip()
    if not text:
        return value
    bracketed = text.startswith("[") and text.endswith("]")
    try:
        address = ipaddress.ip_address(text[1:-1] if bracketed else text)
    except ValueError:
        address = None
    if address is not None and (not bracketed or address.version == 6):
        return value
    if not bracketed and len(text) <= 253 and _HOST_NAME.fullmatch(text) and not text.replace(".", "").isdigit():
        return value
    raise ValueError(
        f"{_echo(value)} is not an IP address or host name (0.0.0.0 listens on every IPv4 interface, :: on every one)"
    )


BindAddress = Annotated[str, AfterValidator(_bind_address)]


def _pool_name(value: str) -> str:
    if len(value) > LABEL_VALUE_MAX or not _LABEL_VALUE.fullmatch(value):
        raise ValueError(
            f"{_echo(value)} is not a node pool name: the value of its nodes' pool label (letters, digits, '-', '_' "
            f"and '.', starting and ending with a letter or digit, at most {LABEL_VALUE_MAX} characters)"
        )
    return value


def _is_object_name(value: str) -> bool:
    return len(value) <= OBJECT_NAME_MAX and _OBJECT_NAME.fullmatch(value) is not None


def _machine_deployment_name(value: str) -> str:
    if not _is_object_name(value):
        raise ValueError(
            f"{_echo(value)} is not a MachineDeployment name (lower-case letters, digits, '-' and '.', starting and "
            f"ending with a letter or digit, at most {OBJECT_NAME_MAX} characters)"
        )
    return value


PoolName = Annotated[str, AfterValidator(_pool_name)]
MachineDeploymentName = Annotated[str, AfterValidator(_machine_deployment_name)]


class HttpSettings(_Group):
    """The controller's own HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``."""

    enabled: bool = Field(True, description="serve /metrics, /healthz and /readyz")
    bind_address: BindAddress = Field(
        "",
        description="address to listen on (empty = every interface, IPv6 and IPv4 where the host has IPv6, else IPv4; "
        "0.0.0.0 = every IPv4 interface only)",
    )
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0 = any free port, for tests)")


class SchedulerExtenderSettings(_Group):
    """Placement advice for kube-scheduler: its HTTP extender (``POST /scheduler/filter``, ``/scheduler/prioritize``),
    answered from the latest cluster snapshot on a port of its own (deploy/overlays/scheduler-extender)."""

    enabled: bool = Field(False, description="serve the kube-scheduler extender (filter, prioritize)")
    bind_address: BindAddress = Field(
        "",
        description="address to listen on (empty = every interface, IPv6 and IPv4 where the host has IPv6, else IPv4; "
        "0.0.0.0 = every IPv4 interface only)",
    )
    port: int = Field(8081, ge=0, le=65535, description="TCP port of the extender (0 = any free port, for tests)")
    max_snapshot_age_seconds: float = Field(
        60.0,
        gt=0,
        description="seconds a cluster snapshot may be old before the extender fails open (every node passes, "
        "every score 0); must be above the tick interval (refused at start-up otherwise)",
    )
    scorer: Literal["fgd", "fgd-plus"] = Field(
        "fgd",
        description="how prioritize ranks nodes: fgd (the published fragmentation gradient descent) or fgd-plus "
        "(FGD plus fill fragmentation, quantised; +0.2 points of GPU allocation on openb, benchmarks/bench_fgd.py)",
    )


class KubernetesSettings(_Group):
    """How to reach the Kubernetes API."""

    config_mode: Literal["auto", "in-cluster", "kubeconfig"] = Field(
        "auto", description="auto: in-cluster when a service account is mounted, else kubeconfig"
    )
    kubeconfig: Path | None = Field(None, description="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    context: str | None = Field(None, description="kubeconfig context (default: its current-context)")
    request_timeout_seconds: float = Field(10.0, gt=0, description="timeout of every API request, seconds")

    @field_validator("kubeconfig", mode="before")
    @classmethod
    def _kubeconfig_not_empty(cls, value: Any) -> Any:
        # as an empty path, "auto" took the working directory for a kubeconfig instead of the in-cluster service
        # account, and start-up failed reading a directory (exit 1, a crash loop naming no setting)
        return path_not_empty(value, "unset it for $KUBECONFIG, ~/.kube/config or in-cluster")


class NodePoolSettings(_Group):
    """Where burst node pools are resized (only used once plans contain node-pool actions)."""

    provider: Literal["none", "clusterapi"] = Field(
        "none", description="none: node-pool actions are logged, never applied; clusterapi: MachineDeployment scale"
    )
    namespace: str = Field(
        "default",
        min_length=1,
        max_length=NAMESPACE_MAX,
        pattern=NAMESPACE_PATTERN,
        description="namespace of the Cluster API MachineDeployments",
    )
    pools: Annotated[dict[PoolName, MachineDeploymentName], NoDecode] = Field(
        default_factory=dict,
        description="node-pool label value -> MachineDeployment name (JSON in env; empty = same name)",
    )

    @field_validator("pools", mode="before")
    @classmethod
    def _pools_json(cls, value: Any) -> Any:
        return _json_object(value)


class BurstPoolSettings(_Group):
    """One burst node pool the capacity arbitration may grow (its nodes carry the pool label's value ``name``)."""

    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per node")
    gpu_type: str | None = Field(None, description="GPU product of its nodes (nvidia.com/gpu.product); None = any")
    boot_seconds: float = Field(300.0, ge=0, le=86400, description="node request to allocatable GPUs, seconds")
    price_per_gpu_hour: float = Field(0.0, ge=0, description="price of one of its GPUs for an hour, in the currency")
    min_nodes: int = Field(0, ge=0, description="never fewer nodes (the MachineDeployment's own bounds apply too)")
    max_nodes: int = Field(0, ge=0, description="never more nodes")
    priority: int = Field(0, description="for the priority expander: higher first")
    min_billing_seconds: float = Field(60.0, ge=0, description="a node is paid for at least this long, seconds")

    @model_validator(mode="after")
    def _node_bounds(self) -> BurstPoolSettings:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})")
        return self


class CapacitySettings(_Group):
    """Capacity arbitration (issue 12): preempt low-priority training gang by gang, add burst nodes, give back.
    Off by default: preemption stops other teams' work, so a cluster opts in."""

    enabled: bool = Field(False, description="arbitrate capacity (preempt training, grow burst pools, give back)")
    preempt: bool = Field(True, description="may stop training gangs (false: burst only)")
    burst: bool = Field(True, description="may grow burst pools (false: preempt only)")
    preemptible_below_priority: int = Field(
        1000,
        description="training gangs with a lower PriorityClass value may be preempted (never serving replicas -- "
        'Deployment, StatefulSet, ... pods -- unless every pod is labelled gpuautoscaler.dev/preemptible: "true")',
    )
    min_runtime_seconds: float = Field(
        600.0, ge=0, description="a gang is never stopped before it has run this long, seconds"
    )
    training_gpu_hour_value: float = Field(
        2.0, ge=0, description="what one training GPU-hour is worth (lost or delayed work), currency per GPU-hour"
    )
    slo_risk_per_gpu_hour: float = Field(
        20.0,
        ge=0,
        description="cost of one GPU-hour of inference demand left without a GPU (during a node's boot; and a "
        "forecast shortfall that would cost less than this left unserved is waited out while latency meets the "
        "SLO), currency per GPU-hour",
    )
    assumed_shortfall_seconds: float = Field(
        1800.0, gt=0, description="how long a shortfall lasts when no usable forecast says, seconds"
    )
    shortfall_confirm_seconds: float = Field(
        30.0,
        ge=0,
        le=3600.0,
        description="a shortfall no usable forecast vouches for stops training or buys nodes only once the service "
        "has been short this long (a one-sample spike stops nothing; its replicas are still asked for), 0: at once, "
        "seconds",
    )
    burst_idle_cooldown_seconds: float = Field(
        600.0, ge=0, description="a spare burst node is given back after this long, seconds"
    )
    provision_timeout_seconds: float = Field(
        900.0,
        gt=0,
        le=86400.0,
        description="a burst node the provider counts but that has not registered as a Node after this long (or "
        "twice its pool's bootSeconds, if longer) is not coming: no capacity on its way, given back (its Machine, one "
        "per pool and tick, never below the pool's minimum), its pool not grown again while any is left nor during "
        "the back-off (Cluster Autoscaler's --max-node-provision-time), seconds",
    )
    provision_backoff_seconds: float = Field(
        300.0,
        ge=0,
        le=86400.0,
        description="a pool whose requested nodes went past the provision timeout is not grown again for this long "
        "from that moment, doubled with each such failure in a row (Cluster Autoscaler's "
        "--initial-node-group-backoff-duration), seconds",
    )
    provision_backoff_max_seconds: float = Field(
        1800.0,
        ge=0,
        le=86400.0,
        description="the longest that back-off grows to; a failure 3 hours after the previous one counts as the first "
        "again (Cluster Autoscaler's --max-node-group-backoff-duration), seconds",
    )
    give_back_retry_seconds: float = Field(
        180.0,
        ge=0,
        le=86400.0,
        description="after a burst node's give-back failed to be written, none of its pool's nodes is given back "
        "again for this long (Cluster Autoscaler's --scale-down-delay-after-failure), seconds",
    )
    resume_after_seconds: float = Field(
        300.0, ge=0, description="a suspended gang's GPUs are free this long before it is resumed, seconds"
    )
    resume_horizon_seconds: float = Field(
        1800.0,
        ge=0,
        description="the forecast must keep a resumed gang's GPUs free this long (or its min runtime), seconds",
    )
    consolidate_horizon_seconds: float = Field(
        1800.0,
        ge=0,
        description="a busy burst node is emptied onto the cluster's own nodes when stopping lower-priority training "
        "for its replicas costs less than keeping the node this long, seconds (0: only under-used nodes go back)",
    )
    choose_scale_down_replicas: bool = Field(
        False,
        description="while lower-priority GPU work waits, mark the replicas a scale-down removes -- those on the nodes "
        "with the most free GPUs -- with a low controller.kubernetes.io/pod-deletion-cost (and "
        "gpuautoscaler.dev/deletion-cost-by) so that the ReplicaSet deletes them first: whole nodes free for training "
        "without an eviction, and the next rise takes them back (more gangs stopped); needs pods/patch, "
        "a Deployment with a deletion cost set by anyone else is never marked",
    )
    expanders: Annotated[list[Literal["least-waste", "cheapest", "priority"]], NoDecode] = Field(
        default_factory=lambda: ["least-waste", "cheapest"],  # type: ignore[arg-type]
        description="burst pool choice, chained: each breaks the ties of the one before (comma-separated in env)",
    )
    spend_cap_per_hour: float | None = Field(None, ge=0, description="burst spend at most this per hour")
    burst_pools: Annotated[dict[PoolName, BurstPoolSettings], NoDecode] = Field(
        default_factory=dict, description="pool name -> its settings (JSON in env)"
    )

    @field_validator("burst_pools", mode="before")
    @classmethod
    def _pools_json(cls, value: Any) -> Any:
        return _json_object(value)

    @model_validator(mode="after")
    def _backoff_order(self) -> CapacitySettings:
        if self.provision_backoff_max_seconds < self.provision_backoff_seconds:
            raise ValueError(
                f"provision_backoff_max_seconds ({self.provision_backoff_max_seconds:g}) must be >= "
                f"provision_backoff_seconds ({self.provision_backoff_seconds:g}): the back-off only grows"
            )
        return self

    @field_validator("expanders", mode="before")
    @classmethod
    def _expanders(cls, value: Any) -> Any:
        return _split_namespaces(value)

    @field_validator("expanders")
    @classmethod
    def _some_expander(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one expander: least-waste, cheapest or priority")
        return value

    def to_config(self) -> Any:
        """The core's ``CapacityConfig``, or None when arbitration is off."""
        if not self.enabled:
            return None
        from autoscaler.core.arbitrate import CapacityConfig
        from autoscaler.core.burst import BurstPool
        from autoscaler.core.victims import TrainingRules

        pools = tuple(
            BurstPool(
                name, p.gpus_per_node, p.gpu_type, p.boot_seconds, p.price_per_gpu_hour, 0, p.min_nodes, p.max_nodes,
                p.priority, p.min_billing_seconds,
            )
            for name, p in sorted(self.burst_pools.items())
        )
        return CapacityConfig(
            training=TrainingRules(
                preemptible_below_priority=self.preemptible_below_priority, min_runtime_s=self.min_runtime_seconds
            ),
            pools=pools,
            expanders=tuple(self.expanders),
            spend_cap_per_hour=self.spend_cap_per_hour,
            training_gpu_hour_value=self.training_gpu_hour_value,
            slo_risk_per_gpu_hour=self.slo_risk_per_gpu_hour,
            assumed_shortfall_s=self.assumed_shortfall_seconds,
            shortfall_confirm_s=self.shortfall_confirm_seconds,
            burst_idle_cooldown_s=self.burst_idle_cooldown_seconds,
            provision_timeout_s=self.provision_timeout_seconds,
            provision_backoff_s=self.provision_backoff_seconds,
            provision_backoff_max_s=self.provision_backoff_max_seconds,
            give_back_retry_s=self.give_back_retry_seconds,
            resume_after_s=self.resume_after_seconds,
            resume_horizon_s=self.resume_horizon_seconds,
            consolidate_horizon_s=self.consolidate_horizon_seconds,
            preempt=self.preempt,
            burst=self.burst,
            choose_scale_down_replicas=self.choose_scale_down_replicas,
        )


class RebalanceSettings(_Group):
    """The rebalancer (issue 15): bounded pod moves that make room for waiting GPU work that fits nowhere, and empty
    under-used burst nodes before their give-back. Off by default: a move evicts a running pod (a replica restarts
    with a cold start), so a cluster opts in. Passes run every ``rebalance_interval_seconds``, on the leader only."""

    enabled: bool = Field(False, description="plan and make rebalance moves (false: no pass runs)")
    max_moves_per_pass: int = Field(2, ge=0, le=100, description="pods evicted in one pass at most, pods")
    max_moves_per_hour: int = Field(8, ge=0, le=1000, description="pods evicted over any hour at most, pods")
    min_gain_per_move: float = Field(
        2.0, ge=0, description="GPUs made usable per pod moved, at least, GPUs per pod (Karpenter-like worth-it test)"
    )
    checkpoint_max_age_seconds: float = Field(
        600.0, ge=0, description="a training gang labelled movable moves only if checkpointed this recently, seconds"
    )
    burst_empty_below: float = Field(
        0.5, ge=0, le=1, description="a burst node under this share of its GPUs in use is emptied, fraction 0-1"
    )
    retry_after_seconds: float = Field(
        1800.0, ge=0, description="a target whose moves were made is not moved for again within this, seconds"
    )
    retry_after_max_seconds: float = Field(
        14400.0,
        ge=0,
        description=(
            "each further pass of moves for a target still waiting doubles retry_after_seconds, up to this, seconds "
            "(a spreading scheduler puts moved replicas back; set it to retry_after_seconds for a fixed wait)"
        ),
    )
    put_back_checks: int = Field(
        3,
        ge=0,
        le=100,
        description=(
            "after this many targets moved for in a row whose room was refilled (their target still waiting and "
            "fitting nowhere at a later pass: a spreading scheduler puts moved replicas back), no move is made for "
            "put_back_hold_seconds, count (0: never held)"
        ),
    )
    put_back_hold_seconds: float = Field(
        14400.0, ge=0, description="how long moves are held after put_back_checks refilled rooms in a row, seconds"
    )
    put_back_watch_seconds: float = Field(
        900.0,
        ge=0,
        description=(
            "a target moved for that still fits where its moves made room is watched this long; fitting still, the "
            "room was kept (not refilled), seconds"
        ),
    )
    training_on_burst_pools: bool = Field(
        False,
        description=(
            "pending training may be given room on the burst pools (false: they are for inference; no gang goes "
            "there). Training this controller suspended is resumed only onto the cluster's own nodes either way, so "
            "no room is gathered for it on a burst node"
        ),
    )
    spare_replicas_only: bool = Field(
        True,
        description=(
            "move a Deployment's replica only when the latest tick recommended fewer replicas than it runs (a move "
            "takes one away for a cold start); false: also when it needs every replica, more GPUs gathered for "
            "training at some latency"
        ),
    )
    ledger_configmap: str = Field(
        "gpu-autoscaler-rebalance-moves",
        max_length=253,
        pattern=f"^({DNS_SUBDOMAIN})?$",
        description=(
            "ConfigMap (in leader_election.lease_namespace) recording the evictions of the last hour, so that "
            "max_moves_per_hour holds across restarts and changes of leader; empty = in memory only"
        ),
    )

    @model_validator(mode="after")
    def _moves(self) -> RebalanceSettings:
        if self.max_moves_per_pass > self.max_moves_per_hour:
            raise ValueError(
                f"{_name('rebalance', 'max_moves_per_pass')} ({self.max_moves_per_pass}) must be <= "
                f"{_name('rebalance', 'max_moves_per_hour')} ({self.max_moves_per_hour})"
            )
        if self.retry_after_max_seconds < self.retry_after_seconds:
            raise ValueError(
                f"{_name('rebalance', 'retry_after_max_seconds')} ({self.retry_after_max_seconds:g}) must be >= "
                f"{_name('rebalance', 'retry_after_seconds')} ({self.retry_after_seconds:g}): the wait only grows"
            )
        if self.enabled and self.max_moves_per_pass == 0:
            # Every pass would plan, hold the controller's lock and move nothing; a plan without moves is what
            # dry_run (or autoscaler plan) is for.
            raise ValueError(
                f"{_name('rebalance', 'enabled')} with {_name('rebalance', 'max_moves_per_pass')} (0) can move no "
                f"pod: raise it, or turn the rebalancer off (dry_run shows the moves it would make)"
            )
        return self

    def to_config(self, interval_seconds: float, burst_pools: Iterable[str]) -> Any:
        """The core's ``RebalanceConfig``, or None when the rebalancer is off."""
        if not self.enabled:
            return None
        from autoscaler.core.rebalance import RebalanceConfig

        pools = frozenset(burst_pools)
        return RebalanceConfig(
            interval_s=interval_seconds,
            max_moves_per_pass=self.max_moves_per_pass,
            max_moves_per_hour=self.max_moves_per_hour,
            min_gain_per_move=self.min_gain_per_move,
            checkpoint_max_age_s=self.checkpoint_max_age_seconds,
            burst_pools=pools,
            burst_empty_below=self.burst_empty_below,
            training_excluded_pools=frozenset() if self.training_on_burst_pools else pools,
            retry_after_s=self.retry_after_seconds,
            retry_after_max_s=self.retry_after_max_seconds,
            spare_replicas_only=self.spare_replicas_only,
            put_back_checks=self.put_back_checks,
            put_back_hold_s=self.put_back_hold_seconds,
            put_back_watch_s=self.put_back_watch_seconds,
        )


AUTO_MODEL = "auto"


def _model_names() -> dict[str, str]:
    from forecast.registry import available_models

    return available_models()


# The quantile levels a forecaster is built with to check it at load (the refit job adds the policy's own level).
_CHECK_LEVELS = (0.1, 0.5, 0.9)


def _forecaster_class(name: str) -> type:
    """The class of forecaster ``name`` (a registry name or ``package.module:Class``); ValueError if there is none."""
    if ":" not in name:
        from forecast.registry import make_model

        return type(make_model(name))
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # anything its import raises: the refit job would meet the same
        raise ValueError(f"cannot import module {_echo(module_name)}: {type(exc).__name__}: {_cut(str(exc))}") from None
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        raise ValueError(f"module {_echo(module_name)} has no class {_echo(class_name)}")
    return found


def _parameters(cls: type) -> list[str]:
    """The constructor parameters of a forecaster that ``model_params`` may set."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a class without a readable signature
        return []
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in keyword and p.name != "quantiles"]


def _build_forecaster(name: str, cls: type, params: Mapping[str, Any]) -> None:
    """Build the forecaster as the refit job does (``autoscaler.forecasting.build_model``), to refuse what it would."""
    if ":" in name:
        cls(**{"quantiles": _CHECK_LEVELS, **params})
        return
    from forecast.registry import make_model

    make_model(name, **params)


class ForecastSettings(_Group):
    """The refit job that fits every forecasting service's request-rate model, and how the tick uses the fits.

    Policies opt in with ``spec.forecast.mode`` (shadow or active). Fits run in their own job every
    ``refit_interval_seconds``, never inside a tick; the tick only reads the latest published fit.
    """

    model: str = Field(
        "phase_naive",  # chosen by backtest on every shared serving trace (benchmarks/bench_default_model.py)
        min_length=1,
        description="forecaster: a name from `autoscaler backtest --help` (last_value, seasonal_naive, holt_winters, "
        "quantile_gbm...), 'auto' (per-series choice by backtest against seasonal naive), or module:Class",
    )
    model_params: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="constructor parameters of the forecaster (JSON object in env)"
    )
    auto_candidates: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [
            "seasonal_naive", "last_value", "phase_naive", "count_level", "holt_winters", "quantile_gbm"
        ],
        description="models 'auto' chooses from, comma-separated (seasonal_naive is always one: the baseline)",
    )
    selection_interval_seconds: float = Field(
        86_400.0, gt=0, description="seconds between two per-series model selections when model is 'auto'"
    )
    history_seconds: float = Field(
        7 * 86_400.0, gt=0, description="training window of request-rate history read from Prometheus, seconds"
    )
    step_seconds: float = Field(
        60.0, ge=1, description="resolution of the history and of the forecast, seconds (at least 1)"
    )
    horizon_seconds: float = Field(
        3_600.0, gt=0, description="how far ahead each fit forecasts, seconds (must exceed the refit interval)"
    )
    min_history_seconds: float = Field(
        3_600.0, ge=0, description="no fit before a service has this much history (seconds of valid samples)"
    )
    update_interval_seconds: float = Field(
        60.0,
        ge=0,
        description="between refits, re-condition each latest fit on the history that arrived since (the model's "
        "update: parameters kept, cheap) this often, seconds; 0 = off (a fit is read until the next refit)",
    )
    workers: int = Field(
        2, ge=1, le=64, description="worker processes fitting series in parallel (1 = fit in the controller process)"
    )
    fit_timeout_seconds: float = Field(
        120.0, gt=0, description="a single series' fit is abandoned after this many seconds (previous fit kept)"
    )
    stale_after_periods: float = Field(
        3.0,
        ge=1,
        description="a fit older than this many refit intervals is stale: reactive only (forecast_stale); at least 1 "
        "(a fit must last until the next refit)"
    )
    reliability_max_ratio: float = Field(
        1.0,
        gt=0,
        description="forecast_unreliable when the recent pinball loss at the provisioned quantile is above this "
        "multiple of the seasonal-naive baseline's on the same values (ratio)",
    )
    min_scored_samples: int = Field(
        30,
        ge=1,
        description="scored forecast values needed before a forecast is trusted (count); its coverage also waits for "
        "1 / (1 - quantile) of them, the scores in which the quantile allows one miss (100 for a P99)",
    )
    accountability_window_seconds: float = Field(
        21_600.0, gt=0, description="forecast error is judged on values that arrived in this window, seconds"
    )
    bootstrap_origins: int = Field(
        4,
        ge=0,
        description="backtest origins scored when a service has no live scores yet (restart, new service), so a "
        "forecast can earn trust from its history at once; 0 = wait for live scores (count)",
    )
    node_boot_seconds: float = Field(
        300.0,
        ge=0,
        description="added to the lead time when the cluster lacks free GPUs for the forecast's extra replicas "
        "(GPU node boot until allocatable), seconds",
    )
    scale_down_hold_leads: float = Field(
        2.0,
        ge=1,
        le=10,
        description="with a usable forecast a scale-down never goes below what the forecast needs from now to now + "
        "this many lead times: 1 = until a replica asked for now could serve; 2 = also the replicas the forecast "
        "floor would add back within a cold start, before a replacement could even have started (lead times)",
    )
    contended_hold_seconds: float = Field(
        1800.0,
        ge=0,
        le=86400,
        description="while lower-priority GPU work waits (pending GPU pods, workloads suspended by this controller "
        "or queued by Kueue), a scale-down that would free a node enough for it keeps what the forecast needs this "
        "much past the lead time, as far as the forecast reaches, when the replicas wanted back would then not fit "
        "elsewhere: taking GPUs back from training before its next checkpoint loses its work (0: lead time only), "
        "seconds",
    )
    calibrated_excess: bool = Field(
        True,
        description="the forecast floor provisions the share of the quantile's excess over the median that the "
        "live scores of the accountability window needed to cover that quantile (split-conformal; never more than "
        "the quantile itself): a P99 that over-covers is narrowed, one that under-covers is kept (false: the "
        "quantile as fitted) (on/off)",
    )

    @field_validator("auto_candidates", mode="before")
    @classmethod
    def _candidates(cls, value: Any) -> Any:
        return _split_namespaces(value)

    @field_validator("update_interval_seconds")
    @classmethod
    def _update_minimum(cls, value: float) -> float:
        if 0 < value < MIN_JOB_INTERVAL_SECONDS:
            raise ValueError(f"must be 0 (off) or >= {MIN_JOB_INTERVAL_SECONDS:g}")
        return value

    @field_validator("model_params", mode="before")
    @classmethod
    def _params_json(cls, value: Any) -> Any:
        return _json_object(value)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value == AUTO_MODEL or ":" in value or value in _model_names():
            return value
        raise ValueError(
            f"unknown forecaster {_echo(value)}; one of {AUTO_MODEL}, {', '.join(_model_names())}, or module:Class"
        )

    @model_validator(mode="after")
    def _buildable_model(self) -> ForecastSettings:
        """Build the forecaster once, as the refit job will: a class that cannot be imported or a parameter it does
        not take is a settings error at load (exit 2), not a failed fit at the first refit (as the simulator's
        scenario loader checks ``modelParams``)."""
        model, params = _name("forecast", "model"), _name("forecast", "model_params")
        if self.model == AUTO_MODEL:
            if self.model_params:
                raise ValueError(
                    f"{params}: not used with {model} 'auto' (every candidate keeps its defaults); name one model "
                    "or remove them"
                )
            return self
        if "quantiles" in self.model_params:
            raise ValueError(f"{params}: quantiles come from each policy's spec.forecast.quantile, not from here")
        if not self.model_params and ":" not in self.model:
            return self  # a registered forecaster with its defaults builds (and its import costs a second)
        try:
            cls = _forecaster_class(self.model)
        except ValueError as exc:
            raise ValueError(f"{model}: {exc}") from None
        from autoscaler.sim.scenario import _checked_model_params  # converts and type-checks as the scenario does

        try:
            checked = _checked_model_params(cls, self.model_params, quoted=True)
            _build_forecaster(self.model, cls, checked)
        except (ValueError, TypeError) as exc:
            problem = _cut(str(exc).removeprefix("modelParams."))
            if isinstance(exc, TypeError):  # an unexpected keyword argument: say which ones it takes
                problem += f"; it takes {', '.join(_parameters(cls)) or 'none'}"
            raise ValueError(f"{params}: {problem} (forecaster {_echo(self.model)})") from None
        self.model_params = checked
        return self

    @field_validator("auto_candidates")
    @classmethod
    def _known_candidates(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in _model_names()]
        if unknown:
            raise ValueError(f"unknown forecaster(s) {', '.join(unknown)}; one of {', '.join(_model_names())}")
        return value

    @model_validator(mode="after")
    def _windows(self) -> ForecastSettings:
        if self.min_history_seconds > self.history_seconds:
            raise ValueError(
                f"{_name('forecast', 'min_history_seconds')} ({self.min_history_seconds:g}) must be <= "
                f"{_name('forecast', 'history_seconds')} ({self.history_seconds:g})"
            )
        if self.horizon_seconds < self.step_seconds or self.history_seconds < 2 * self.step_seconds:
            raise ValueError(
                f"{_name('forecast', 'horizon_seconds')} and {_name('forecast', 'history_seconds')} must hold at "
                f"least one and two {_name('forecast', 'step_seconds')} ({self.step_seconds:g})"
            )
        # Not refused although a window holding fewer forecast steps than a verdict needs judges nothing on live
        # scores (one per step): settings that started the controller yesterday must not crash-loop it after an
        # upgrade. Each such service's headroom says it can never earn trust, and names these settings.
        return self


def _split_namespaces(value: Any) -> Any:
    """Accept ``a,b`` or ``["a", "b"]`` from the environment, a list from the file."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON ({exc}); expected a JSON array or a comma-separated list") from None
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Everything ``autoscaler run`` and ``autoscaler plan`` need to know."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        validate_default=True,
        case_sensitive=False,
        allow_inf_nan=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return no_boolean_number(cls, value, info)

    @field_validator("*")
    @classmethod
    def _durations_in_range(cls, value: Any, info: ValidationInfo) -> Any:
        return duration_in_range(value, info.field_name)

    config_file: Path | None = Field(
        None, description="YAML or JSON file with these settings (also --config); the environment overrides it"
    )
    tick_interval_seconds: float = Field(
        15.0,
        gt=0,
        description=f"seconds between control ticks, at least {MIN_TICK_INTERVAL_SECONDS:g} s (HPA sync: 15 s)",
    )
    refit_interval_seconds: float = Field(
        900.0, gt=0, description="seconds between forecast refits (runs in its own job, never inside a tick)"
    )
    rebalance_interval_seconds: float = Field(300.0, gt=0, description="seconds between rebalance passes")
    tick_stall_seconds: float = Field(
        120.0, gt=0, description="/healthz fails when the tick loop has not finished an iteration for this many s"
    )
    shutdown_grace_seconds: float = Field(
        10.0, ge=0, description="seconds to let a running tick or rebalance pass finish on SIGTERM before exiting"
    )
    dry_run: bool = Field(
        False, description="compute and report every plan (log, metrics, Events marked dry run); write nothing else"
    )
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="namespaces whose GPUScalingPolicies are watched, comma-separated (empty = all namespaces)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    log_format: Literal["text", "json"] = Field("text", description="text for humans, json for log pipelines")
    # validated from {} rather than built by a factory: its defaults come from the pod (POD_NAMESPACE, POD_NAME), and
    # an error in one must name the setting it fills (leader_election.lease_namespace), which a factory's does not
    leader_election: LeaderElectionSettings = Field(default_factory=dict)  # type: ignore[assignment]
    http: HttpSettings = Field(default_factory=HttpSettings)
    scheduler_extender: SchedulerExtenderSettings = Field(default_factory=SchedulerExtenderSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    node_pools: NodePoolSettings = Field(default_factory=NodePoolSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    rebalance: RebalanceSettings = Field(default_factory=RebalanceSettings)
    forecast: ForecastSettings = Field(default_factory=ForecastSettings)
    prometheus: PrometheusSettings = Field(
        default_factory=PrometheusSettings,
        description="the Prometheus adapter (env AUTOSCALER_PROMETHEUS_*, file key prometheus)",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("namespaces", mode="before")
    @classmethod
    def _namespaces(cls, value: Any) -> Any:
        return _split_namespaces(value)

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, value: list[str]) -> list[str]:
        # A name no namespace can have listed nothing (or failed) on every tick: its policies were never seen.
        bad = [name for name in value if len(name) > NAMESPACE_MAX or not re.fullmatch(DNS_LABEL, name)]
        if bad:
            listed = ", ".join(_echo(name) for name in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            verb = "is not a namespace name" if len(bad) == 1 else "are not namespace names"
            raise ValueError(
                f"{listed} {verb} (lower-case letters, digits and '-', at most {NAMESPACE_MAX} characters); "
                "give a comma-separated list or a JSON array"
            )
        return value

    @field_validator("tick_interval_seconds")
    @classmethod
    def _tick_minimum(cls, value: float) -> float:
        if value < MIN_TICK_INTERVAL_SECONDS:  # after gt=0, whose message (must be > 0) stays for 0 and below
            raise ValueError(f"must be >= {MIN_TICK_INTERVAL_SECONDS:g}")
        return value

    @field_validator("refit_interval_seconds", "rebalance_interval_seconds")
    @classmethod
    def _job_minimum(cls, value: float) -> float:
        if value < MIN_JOB_INTERVAL_SECONDS:  # after gt=0, as for the tick
            raise ValueError(f"must be >= {MIN_JOB_INTERVAL_SECONDS:g}")
        return value

    @model_validator(mode="after")
    def _horizon_after_refit(self) -> Settings:
        # Every fit must last until the next one, or the forecast runs out between two refits.
        if self.forecast.horizon_seconds <= self.refit_interval_seconds:
            raise ValueError(
                f"{_name('forecast', 'horizon_seconds')} ({self.forecast.horizon_seconds:g}) must be > "
                f"{_name('refit_interval_seconds')} ({self.refit_interval_seconds:g})"
            )
        return self

    @model_validator(mode="after")
    def _writes_fit_in_the_lease(self) -> Settings:
        # The leader writes only while the time since its last renewal plus a request's timeout is within the lease
        # duration (LeaderElector.may_write); renewals come every retry period, so a leader that could not fit one
        # request between two renewals would never write.
        le, timeout = self.leader_election, self.kubernetes.request_timeout_seconds
        if le.enabled and timeout + le.retry_period_seconds >= le.lease_duration_seconds:
            raise ValueError(
                f"{_name('kubernetes', 'request_timeout_seconds')} ({timeout:g}) + "
                f"{_name('leader_election', 'retry_period_seconds')} ({le.retry_period_seconds:g}) must be < "
                f"{_name('leader_election', 'lease_duration_seconds')} ({le.lease_duration_seconds:g}): "
                "the leader stops writing a request timeout before its Lease could pass to another replica"
            )
        return self

    @model_validator(mode="after")
    def _lease_name_fits_a_label(self) -> Settings:
        # The leader's pod label carries the Lease name (the dry-run one included) as its value, which Kubernetes
        # limits to 63 characters: a longer name would fail every label write, silently but for a counter.
        le = self.leader_election
        lease = le.lease_name + (DRY_RUN_LEASE_SUFFIX if self.dry_run else "")
        if le.label_leader_pod and len(lease) > LABEL_VALUE_MAX:
            raise ValueError(
                f"{_name('leader_election', 'label_leader_pod')} is on, and the Lease name {lease!r} "
                f"({_name('leader_election', 'lease_name')}{', with the dry-run suffix' if self.dry_run else ''}) "
                f"is {len(lease)} characters: the leader's pod label carries it, at most {LABEL_VALUE_MAX}"
            )
        return self

    @model_validator(mode="after")
    def _one_server_per_port(self) -> Settings:
        # Both servers bound to one port: the second bind failed at start-up ("Address already in use"), naming no
        # setting. Port 0 is any free port (never the same); a wildcard address takes the port on every address.
        http, extender = self.http, self.scheduler_extender
        if not (http.enabled and extender.enabled) or http.port == 0 or http.port != extender.port:
            return self
        addresses = {http.bind_address.strip().lower(), extender.bind_address.strip().lower()}
        if len(addresses) == 1 or addresses & WILDCARD_ADDRESSES:
            raise ValueError(
                f"{_name('scheduler_extender', 'port')} and {_name('http', 'port')} are both {http.port}, with both "
                f"servers enabled on overlapping addresses ({extender.bind_address!r} and {http.bind_address!r}): "
                "the second could not bind the port (Address already in use); give the extender a port of its own"
            )
        return self

    @model_validator(mode="after")
    def _extender_snapshot_outlives_a_tick(self) -> Settings:
        # The extender's snapshot is the latest tick's: a maximum age at or below the tick interval makes it fail
        # open for part of every interval, silently.
        extender = self.scheduler_extender
        if extender.enabled and extender.max_snapshot_age_seconds <= self.tick_interval_seconds:
            raise ValueError(
                f"{_name('scheduler_extender', 'max_snapshot_age_seconds')} ({extender.max_snapshot_age_seconds:g}) "
                f"must be > {_name('tick_interval_seconds')} ({self.tick_interval_seconds:g}): the extender answers "
                "from the latest tick's snapshot, and would fail open for part of every tick interval"
            )
        return self

    @model_validator(mode="after")
    def _burst_pools_the_provider_resizes(self) -> Settings:
        # The Cluster API provider resizes a burst pool through the MachineDeployment node_pools.pools names for it,
        # or the one of its own name without that mapping; one it cannot name failed every tick ("node pool 'x' is
        # not configured", a 404) while the arbitration kept choosing the pool.
        if not self.capacity.enabled or self.node_pools.provider != "clusterapi":
            return self
        mapping, burst, pools = self.node_pools.pools, _name("capacity", "burst_pools"), _name("node_pools", "pools")
        if mapping:
            missing = [name for name in sorted(self.capacity.burst_pools) if name not in mapping]
            if missing:
                raise ValueError(
                    f"{burst}: pool(s) {', '.join(_echo(name) for name in missing[:5])} have no MachineDeployment in "
                    f"{pools} (node_pools.provider clusterapi resizes a pool through it): add them, or remove them "
                    "from the burst pools"
                )
            return self
        unnamed = [name for name in sorted(self.capacity.burst_pools) if not _is_object_name(name)]
        if unnamed:
            raise ValueError(
                f"{burst}: pool(s) {', '.join(_echo(name) for name in unnamed[:5])} cannot be MachineDeployment names "
                f"(lower-case letters, digits, '-' and '.'), which they are without {pools}: map each pool to its "
                "MachineDeployment there"
            )
        return self

    @model_validator(mode="after")
    def _stall_after_tick(self) -> Settings:
        if self.tick_stall_seconds <= self.tick_interval_seconds:
            raise ValueError(
                f"{_name('tick_stall_seconds')} ({self.tick_stall_seconds:g}) must be > "
                f"{_name('tick_interval_seconds')} ({self.tick_interval_seconds:g})"
            )
        # A tick waits for one Prometheus query through all its retries before it gives up on the rest: each try
        # up to the timeout, and before each retry a sleep (the backoff, or a Retry-After) also capped at the timeout.
        # A stall bound within that failed /healthz (and the livenessProbe restarted the controller) during an outage
        # the controller is meant to hold through.
        prometheus = self.prometheus
        worst = prometheus.timeout_seconds * (1 + 2 * prometheus.retries)
        if self.tick_stall_seconds <= worst:
            raise ValueError(
                f"{_name('tick_stall_seconds')} ({self.tick_stall_seconds:g}) must be > "
                f"{_name('prometheus', 'timeout_seconds')} ({prometheus.timeout_seconds:g}) x (1 + 2 x "
                f"{_name('prometheus', 'retries')} ({prometheus.retries})): a tick waiting on an unanswering "
                "Prometheus (every try timing out, every retry after its longest sleep) would fail /healthz"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FileSource(settings_cls)


# The config file's content for the Settings() call in progress. A context variable (not a class attribute) so that
# two loads in two threads, as in tests, never see each other's file.
_FILE_DATA: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "autoscaler_config_file", default=None
)


class _FileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get() or {})


class _DictSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = dict(values)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping (JSON is YAML) of UTF-8 text without duplicate keys, with errors that say which file
    and why."""
    where = f"{CONFIG_FILE_ENV} / --config: {path}"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"{CONFIG_FILE_ENV} / --config: cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = decode_utf8(raw)
    except YamlProblem as exc:
        raise SettingsError(f"{where} is {exc.problem}; settings are a YAML or JSON file") from None
    try:
        data = load_yaml(text)  # safe, and a key given twice is an error
    except YamlProblem as exc:
        at = f" (line {exc.line}, column {exc.column})" if exc.line is not None else ""
        raise SettingsError(f"{where} is not valid YAML/JSON: {_cut(exc.problem)}{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{where} must hold a mapping, got {type(data).__name__}")
    # pydantic-settings passes the top-level keys on as keyword arguments: one that is not a string stopped start-up
    # with "TypeError: keywords must be strings" (a traceback, exit 1)
    problems = [_not_a_setting_name(key) for key in data if not isinstance(key, str)]
    if problems:
        raise SettingsError(f"invalid settings in {path}:\n  " + "\n  ".join(problems[:MAX_LISTED_PROBLEMS]))
    return data


def _not_a_setting_name(key: Any) -> str:
    if isinstance(key, bool):
        written = "an unquoted yes, no, on, off, true or false"
        return f"{str(key).lower()}: not a setting name: YAML reads {written} as the boolean {str(key).lower()}"
    return f"{_echo(key)}: not a setting name (a {type(key).__name__}, where setting names are strings)"


def env_name(loc: tuple[str | int, ...]) -> str:
    """The environment variable of a settings location, ``("http", "port")`` -> ``AUTOSCALER_HTTP__PORT``."""
    if len(loc) > 1 and loc[0] == PROMETHEUS_GROUP:
        return PROMETHEUS_ENV_PREFIX + "_".join(str(part).upper() for part in loc[1:])
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(str(part).upper() for part in loc)


def _prometheus_settings(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> PrometheusSettings:
    """PrometheusSettings with the same precedence as the rest: overrides > AUTOSCALER_PROMETHEUS_* > file."""

    class _WithFile(PrometheusSettings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, env_settings, _DictSource(settings_cls, file_values)

    built = _WithFile(**overrides)
    return PrometheusSettings.model_construct(
        **{name: getattr(built, name) for name in PrometheusSettings.model_fields}
    )


def _known_below(annotation: Any, parts: list[str]) -> bool:
    """Whether ``parts`` (an environment variable's ``__``-separated rest) names a setting inside ``annotation``:
    a field of a group, a key of a mapping (``AUTOSCALER_NODE_POOLS__POOLS__A100``) and what its value holds."""
    if not parts:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(parts[0].lower())
        return field is not None and _known_below(field.annotation, parts[1:])
    if typing.get_origin(annotation) is dict:
        return bool(parts[0]) and _known_below(typing.get_args(annotation)[1], parts[1:])
    return annotation is Any


def _unknown_variable(key: str, value: str) -> str | None:
    """The error line of an ``AUTOSCALER_*`` variable that is no setting, or None when it is one (or is read
    elsewhere: ``NOT_SETTINGS``, Kubernetes service links)."""
    name = key.upper()
    if name in NOT_SETTINGS or _SERVICE_LINK.fullmatch(name):
        return None
    if name.endswith("_PORT") and _SERVICE_LINK_PORT.fullmatch(value):
        return None
    rest = name.removeprefix(ENV_PREFIX)
    group = PROMETHEUS_GROUP.upper()
    if rest == group or rest.startswith(group + ENV_NESTED_DELIMITER):
        return None  # reported with their own advice
    if rest.startswith(group + "_"):
        field = rest.removeprefix(group + "_").lower()
        if field in PrometheusSettings.model_fields:
            return None
        key_name = f"{PROMETHEUS_GROUP}.{field}"
    else:
        parts = rest.split(ENV_NESTED_DELIMITER)
        if parts[0].lower() != PROMETHEUS_GROUP and _known_below(Settings, parts):
            return None
        key_name = ".".join(part.lower() for part in parts)
    known = [row[0] for row in settings_table()] + [env_name((n,)) for n in Settings.model_fields if n != group.lower()]
    guess = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    hint = f"; did you mean {guess[0]}?" if guess else "; see `autoscaler run --list-settings`"
    return f"{_cut(key, ECHO_LIMIT)} ({_cut(key_name, ECHO_LIMIT)}): unknown setting (typo?){hint}"


def prometheus_environment_problems() -> list[str]:
    """``_environment_problems`` of the ``AUTOSCALER_PROMETHEUS*`` variables alone, for commands that read only the
    Prometheus settings (``autoscaler observe``): a typo there (``AUTOSCALER_PROMETHEUS_TIMEOUT``) must not run the
    command with the default either."""
    return _environment_problems(ENV_PREFIX + PROMETHEUS_GROUP.upper())


def _environment_problems(prefix: str = ENV_PREFIX) -> list[str]:
    """Mistakes in the environment that would not reach validation, one line each, among the variables whose name
    starts with ``prefix``.

    An ``AUTOSCALER_*`` variable that names no setting is an error, as an unknown key of the file is: pydantic-settings
    ignores it, so a typo (``AUTOSCALER_TICK_INTERVAL``) would start the controller with the default.
    A whole group may be given as one JSON object (``AUTOSCALER_HTTP='{"port": 9000}'``, merged with the
    ``AUTOSCALER_HTTP__*`` variables); pydantic-settings decodes it before validation, so its syntax is checked here.
    The Prometheus group has no such form: its settings are flat variables of their own (``AUTOSCALER_PROMETHEUS_URL``).
    """
    problems: list[str] = []
    group_prefix = ENV_PREFIX + PROMETHEUS_GROUP.upper()
    doubled = sorted(k for k in os.environ if k.upper().startswith(group_prefix + ENV_NESTED_DELIMITER))
    if doubled:
        problems.append(
            f"{', '.join(doubled)}: the Prometheus settings use a single underscore, e.g. {PROMETHEUS_ENV_PREFIX}URL"
        )
    for key, value in sorted(os.environ.items()):
        if key.upper().startswith(prefix):
            unknown = _unknown_variable(key, value)
            if unknown is not None:
                problems.append(unknown)
    problems += _json_and_key_by_key(prefix)
    groups = {
        env_name((name,)): (name, info.annotation)
        for name, info in Settings.model_fields.items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
    }
    for key, value in sorted(os.environ.items()):
        if key.upper() not in groups or not key.upper().startswith(prefix):
            continue
        name, group = groups[key.upper()]
        if name == PROMETHEUS_GROUP:
            problems.append(
                f"{key}: not a setting; use the {PROMETHEUS_ENV_PREFIX}* variables, e.g. {PROMETHEUS_ENV_PREFIX}URL"
            )
            continue
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            example = env_name((name, next(iter(group.model_fields))))
            problems.append(
                f"{key} ({name}): not valid JSON ({exc}); expected a JSON object of the group's settings, "
                f"or set them one by one, e.g. {example}"
            )
    return problems


def _json_mappings(model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The locations of the mapping settings given as JSON in the environment (``NoDecode`` dicts such as
    ``capacity.burst_pools``)."""
    found: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if name != PROMETHEUS_GROUP:
                found += _json_mappings(annotation, (*prefix, name))
        elif typing.get_origin(annotation) is dict and NoDecode in info.metadata:
            found.append((*prefix, name))
    return found


def _json_and_key_by_key(prefix: str) -> list[str]:
    """A mapping setting given both as JSON (``AUTOSCALER_CAPACITY__BURST_POOLS='{...}'``) and key by key
    (``AUTOSCALER_CAPACITY__BURST_POOLS__H100__MAX_NODES``): the JSON value replaces the mapping, the key-by-key
    variables would be dropped without a word. Refused, naming both."""
    names = {key.upper(): key for key in os.environ if key.upper().startswith(prefix)}
    problems = []
    for loc in _json_mappings():
        whole = env_name(loc)
        if whole not in names:
            continue
        keyed = sorted(names[n] for n in names if n.startswith(whole + ENV_NESTED_DELIMITER))
        if keyed:
            listed = ", ".join(_cut(k, ECHO_LIMIT) for k in keyed[:3])
            if len(keyed) > 3:
                listed += f" and {len(keyed) - 3} more"
            problems.append(
                f"{names[whole]} ({'.'.join(loc)}) and {listed}: the mapping is given both as JSON and key by key, "
                f"and the JSON would replace it; give it one way (all in {whole}, or every key as {whole}__<KEY>...)"
            )
    return problems


def _describe_source_error(error: SourceError) -> str:
    """A pydantic-settings source error (a value it could not decode) as one line, with its cause."""
    cause = error.__cause__
    return f"invalid settings:\n  {error}" + (f": {cause}" if cause is not None else "")


def describe_validation_error(error: ValidationError, prefix: tuple[str, ...] = ()) -> str:
    """One line per problem, naming the env var and the file key (``a.b``) of the offending setting."""
    lines = []
    for item in error.errors():
        # "[key]": pydantic's mark of an error in a mapping's key, which the part before it names already
        loc = prefix + tuple(
            part
            for part in item["loc"]
            if not (isinstance(part, str) and (part.startswith("function-") or part == "[key]"))
        )
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown setting (typo?)"
        if item["type"] == "finite_number":
            message = "must be a finite number"
        if item["type"] in ("greater_than", "greater_than_equal", "less_than_equal"):
            op, bound = {
                "greater_than": (">", "gt"),
                "greater_than_equal": (">=", "ge"),
                "less_than_equal": ("<=", "le"),
            }[item["type"]]
            message = f"must be {op} {item['ctx'][bound]:g}"
        message = _cut(message)
        if ENV_PREFIX in message:
            lines.append(message)  # a cross-field check that already names its settings
        elif loc:
            key = _cut(".".join(str(part) for part in loc), ECHO_LIMIT)
            lines.append(f"{_cut(env_name(loc), ECHO_LIMIT)} ({key}): {message} (got {_echo(item.get('input'))})")
        else:
            lines.append(message)
    if len(lines) > MAX_LISTED_PROBLEMS:
        lines[MAX_LISTED_PROBLEMS:] = [f"... and {len(lines) - MAX_LISTED_PROBLEMS:,} more"]
    return "invalid settings:\n  " + "\n  ".join(lines)


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Settings from defaults < ``config_file`` (or ``$AUTOSCALER_CONFIG_FILE``) < environment < ``overrides``.

    ``overrides`` are the command-line flags; ``None`` values are ignored so that an absent flag never masks the
    environment. Raises ``SettingsError`` naming every bad setting.
    """
    path_text = config_file if config_file is not None else os.environ.get(CONFIG_FILE_ENV)
    path = Path(path_text) if path_text else None
    data = read_config_file(path) if path is not None else {}
    data.pop("config_file", None)
    init = {key: value for key, value in overrides.items() if value is not None}
    if path is not None:
        init["config_file"] = path
    where = f"\n  (read from the command line, the environment and {path})" if path is not None else ""
    problems = _environment_problems()
    if problems:
        raise SettingsError("invalid settings:\n  " + "\n  ".join(problems))
    prometheus_file = data.pop(PROMETHEUS_GROUP, None)
    if prometheus_file is None:  # `prometheus:` with every key commented out
        prometheus_file = {}
    if not isinstance(prometheus_file, dict):  # `prometheus: []` or `false` too: not read as no settings at all
        raise SettingsError(
            f"invalid settings:\n  {PROMETHEUS_GROUP}: must be a mapping in {path} (got {_echo(prometheus_file)})"
        )
    try:
        init[PROMETHEUS_GROUP] = _prometheus_settings(prometheus_file, init.pop(PROMETHEUS_GROUP, None) or {})
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, prefix=(PROMETHEUS_GROUP,)) + where) from None
    except SourceError as exc:  # any value a source cannot decode is still a settings error (exit 2), not a crash
        raise SettingsError(_describe_source_error(exc) + where) from None
    token = _FILE_DATA.set(data)
    try:
        return Settings(**init)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc) + where) from None
    except SourceError as exc:
        raise SettingsError(_describe_source_error(exc) + where) from None
    finally:
        _FILE_DATA.reset(token)


def settings_table() -> list[tuple[str, str, str, str]]:
    """(env var, file key, default, description) of every setting, for ``--help`` and the README."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            loc = (*prefix, name)
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, loc)
                continue
            default = "(computed)" if info.default_factory is not None else repr(info.default)
            if info.default_factory is list:
                default = "[]"
            rows.append((env_name(loc), ".".join(loc), default, info.description or ""))

    walk(Settings, ())
    return rows
