"""Settings of the Prometheus metrics adapter (environment prefix ``AUTOSCALER_PROMETHEUS_``).

Defaults follow dcgm-exporter (metric and label names) and vLLM (application metrics); every name and every query
template can be changed, so the adapter also works with Triton, TGI, a relabelled dcgm-exporter or Thanos/Mimir.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from autoscaler.adapters.promql import LABEL_NAME, METRIC_NAME, POD_TO_DEPLOYMENT_RE, PromQLError, check_template

# Placeholders every query template may use. All are trusted (they come from these settings, not from users).
TEMPLATE_PLACEHOLDERS: dict[str, str] = {
    "metric": "the family's metric name setting",
    "selector": "label matchers: the *_matchers setting, plus the service's own matchers in history queries",
    "window": "rate_window_seconds as a PromQL duration",
    "staleness": "staleness_seconds as a PromQL duration",
    "quantile": "latency_quantile",
    "namespace_label": "the namespace label of the family (dcgm_namespace_label or app_namespace_label)",
    "pod_label": "the pod label of the family (dcgm_pod_label or app_pod_label)",
    "deployment_label": "deployment_label",
    "scrape_copy_labels": "scrape_copy_labels, label names joined by ', ' (may be empty)",
    "pod_regex": "RE2 regex capturing the Deployment name from a pod name (<deployment>-<hash>-<suffix>); names "
    "cut to 63 characters by generateName (Deployment names of more than 46 characters) do not match it",
}
# Per-service overrides (GPUScalingPolicy spec.queries) may also use these, escaped by the adapter.
SERVICE_PLACEHOLDERS: tuple[str, ...] = ("namespace", "name")
# The trusted values every query shares, and so the only ones an override is rendered with: the others (metric,
# selector, namespace_label, pod_label) are one family's. The load-time check of an override
# (OVERRIDE_PLACEHOLDERS) and its rendering (PrometheusSettings.template_values) both read this table: an
# override the load lets through must never be refused for an unknown placeholder at every tick.
_SHARED_VALUES: dict[str, Callable[[PrometheusSettings], str]] = {
    "window": lambda s: duration(s.rate_window_seconds),
    "staleness": lambda s: duration(s.staleness_seconds),
    "quantile": lambda s: repr(s.latency_quantile),
    "deployment_label": lambda s: s.deployment_label,
    "scrape_copy_labels": lambda s: s.scrape_copy_labels,
    "pod_regex": lambda s: POD_TO_DEPLOYMENT_RE,
}
OVERRIDE_PLACEHOLDERS: tuple[str, ...] = tuple(_SHARED_VALUES)

# A pod's metrics are often collected more than once: a PodMonitor beside a ServiceMonitor, the prometheus.io/scrape
# job beside either, two Prometheus replicas read through a Thanos querier that does not deduplicate. Each copy then
# carries every series of the pod, and a plain sum per pod counted the pod once per copy (twice the replicas). So
# each copy is summed on its own (a pod's own series, vLLM's finished_reason or model_name, all add up) and the
# largest copy counts: max rather than avg, because a copy that missed scrapes or began within the window reads low.
# The copies are told apart by the labels of the scrape configuration and of the Prometheus that collected them, not
# by the target's (instance, endpoint): two targets of one pod in one job are two sources whose counts add, and the
# query stays right with the Deployment label in place of the pod label (one copy then spans the Deployment's pods).
DEFAULT_SCRAPE_COPY_LABELS = "job, service, prometheus, prometheus_replica"
DEFAULT_REQUEST_RATE_QUERY = (
    "max by ({namespace_label}, {pod_label}) (sum by ({namespace_label}, {pod_label}, {scrape_copy_labels}) "
    "(rate({metric}{selector}[{window}])))"
)
DEFAULT_QUEUE_DEPTH_QUERY = (
    "max by ({namespace_label}, {pod_label}) (sum by ({namespace_label}, {pod_label}, {scrape_copy_labels}) "
    "(last_over_time({metric}{selector}[{staleness}])))"
)

# The default latency query: one batched query, the Deployment derived from each pod's name. Copies need no care
# here: with every pod collected as often as its siblings, each bucket is multiplied alike, which leaves the quantile
# where it was (a pod collected more often than the others would only weigh more in it).
DEFAULT_LATENCY_QUERY = (
    "histogram_quantile({quantile}, sum by ({namespace_label}, {deployment_label}, le) (label_replace("
    'rate({metric}{selector}[{window}]), "{deployment_label}", "$1", "{pod_label}", "{pod_regex}")))'
)
# With the default, a Deployment whose pods' names generateName may cut (a name of more than 46 characters: no
# regex can read the Deployment back from such a pod name) is asked on its own: the quantile over the buckets of
# its own pods, {selector} holding its namespace and its pods' name regex (promql.deployment_pods_re). These
# per-service queries are batched with ``or`` like the per-service overrides.
SERVICE_LATENCY_QUERY = "histogram_quantile({quantile}, sum by (le) (rate({metric}{selector}[{window}])))"


# The longest duration a ``*_seconds`` setting may have: longer is a mistake, and 1e300 s breaks at run time as inf
# does (a request deadline or a Lease time past what a datetime can hold).
MAX_DURATION_SECONDS = 366 * 86_400.0


def duration_in_range(value: Any, field_name: str | None) -> Any:
    """``value``, or ValueError when a ``*_seconds`` setting is longer than ``MAX_DURATION_SECONDS``."""
    duration = bool(field_name) and str(field_name).endswith("_seconds") and isinstance(value, int | float)
    if duration and value > MAX_DURATION_SECONDS:
        raise ValueError(f"must be at most {MAX_DURATION_SECONDS:,.0f} seconds (a year)")
    return value


def path_not_empty(value: Any, instead: str = "unset it instead") -> Any:
    """``value``, or ValueError when a file-path setting is given empty: ``Path("")`` is ``Path(".")``, and the
    working directory was then read as the file (at every request, the error naming no setting)."""
    if isinstance(value, str | Path) and not str(value).strip():
        raise ValueError(f"must not be empty ({instead})")
    return value


def _numeric_only(annotation: Any) -> bool:
    """Whether a field's type is a number (``int``, ``float``, optionally None): a boolean there is a mistake."""
    if annotation in (int, float):
        return True
    args = [a for a in get_args(annotation) if a is not type(None)]
    return get_origin(annotation) in (Union, UnionType) and bool(args) and all(a in (int, float) for a in args)


def no_boolean_number(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """Refuse a YAML/JSON boolean for a numeric setting: pydantic reads ``true`` as 1 (``http: {port: true}``
    served on port 1, ``tick_interval_seconds: true`` ticked every second), as the scenario and the policy never do."""
    if isinstance(value, bool) and info.field_name is not None:
        field = model.model_fields.get(info.field_name)
        if field is not None and _numeric_only(field.annotation):
            raise ValueError(f"Input should be a number, not a boolean (got {str(value).lower()})")
    return value


class PrometheusSettings(BaseSettings):
    """How to reach Prometheus and what to ask it."""

    model_config = SettingsConfigDict(
        env_prefix="AUTOSCALER_PROMETHEUS_",
        extra="forbid",
        validate_default=True,
        case_sensitive=False,
        allow_inf_nan=False,  # inf or NaN in a duration or window breaks every query at run time
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return no_boolean_number(cls, value, info)

    @field_validator("*")
    @classmethod
    def _durations_in_range(cls, value: Any, info: ValidationInfo) -> Any:
        return duration_in_range(value, info.field_name)

    # ---- connection ---------------------------------------------------------------------------------------------
    url: str = Field(
        "http://prometheus:9090",
        description="base URL of the Prometheus HTTP API (http or https, no /api/v1 suffix); Thanos Query and "
        "Mimir/Cortex Prometheus-compatible endpoints work too",
    )
    bearer_token_file: Path | None = Field(
        None,
        description="file holding a bearer token sent as 'Authorization: Bearer'; re-read every tick so rotated "
        "service-account tokens keep working (e.g. /var/run/secrets/kubernetes.io/serviceaccount/token)",
    )
    basic_auth_username: str | None = Field(None, description="HTTP basic-auth user name")
    basic_auth_password: SecretStr | None = Field(None, description="HTTP basic-auth password (prefer the file)")
    basic_auth_password_file: Path | None = Field(
        None, description="file holding the HTTP basic-auth password, re-read every tick"
    )
    ca_bundle: Path | None = Field(
        None, description="PEM file of CA certificates to verify the server with (default: the system's)"
    )
    insecure_skip_verify: bool = Field(
        False, description="do not verify the server's TLS certificate (tests only: anybody can impersonate it)"
    )
    client_cert_file: Path | None = Field(None, description="PEM client certificate for mutual TLS")
    client_key_file: Path | None = Field(None, description="PEM private key of client_cert_file")
    extra_headers: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='extra HTTP headers, e.g. {"X-Scope-OrgID": "team-a"} for Mimir/Cortex tenants (JSON in env)',
    )
    timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="timeout of each HTTP request to Prometheus (connect and read), seconds"
    )
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="retries of a failed request (connection error, read timeout, 429/502/503/504), count; a "
        "connection failure or timeout skips the tick's remaining queries, so one outage costs one timeout",
    )
    retry_backoff_seconds: float = Field(
        0.5, ge=0, le=30, description="backoff factor between retries, seconds (urllib3: factor x 2^(retry-1))"
    )

    max_concurrent_queries: int = Field(
        4,
        ge=1,
        le=16,
        description="queries of one tick in flight at once, count (the first one always runs alone, as a probe)",
    )

    # ---- what counts as fresh -----------------------------------------------------------------------------------
    staleness_seconds: float = Field(
        120.0,
        ge=0.001,  # the smallest PromQL duration (1ms): below it the query said "0ms", which Prometheus refuses
        description="a GPU sample older than this at the tick's time is stale (held, never read as zero), seconds; "
        "keep it above dcgm-exporter's collect interval (30 s) plus the scrape interval",
    )
    check_sample_age: bool = Field(
        True,
        description="ask Prometheus for the age of every DCGM series (timestamp()) to apply staleness_seconds; "
        "exact for plain selectors, a no-op for aggregated gpu_query templates",
    )
    rate_window_seconds: float = Field(
        120.0,
        ge=0.001,  # the smallest PromQL duration (1ms): below it the query said "0ms", which Prometheus refuses
        description="range of rate() in application queries, seconds (at least 4 scrape intervals)",
    )
    latency_quantile: float = Field(
        0.95, gt=0, lt=1, description="latency quantile computed with histogram_quantile (0.95 = P95), ratio"
    )
    max_points_per_series: int = Field(
        11000,
        ge=2,
        le=11000,
        description="points per series in one range query; history is split into chunks of this size "
        "(Prometheus rejects more than 11,000), points",
    )
    max_query_length: int = Field(
        8000,
        ge=500,
        description="longest PromQL text sent in one request, URL-encoded characters (as a proxy's URL limit "
        "counts them); per-service query overrides are batched into as few queries as fit (URLs longer than ~8 kB "
        "are cut by many proxies)",
    )

    # ---- metric names (dcgm-exporter and vLLM defaults) ---------------------------------------------------------
    gpu_util_metric: str = Field("DCGM_FI_DEV_GPU_UTIL", description="GPU utilisation, percent 0-100")
    engine_active_metric: str = Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", description="graphics engine active, ratio 0-1 (DCGM profiling; optional)"
    )
    fb_used_metric: str = Field("DCGM_FI_DEV_FB_USED", description="framebuffer memory used, MiB")
    fb_free_metric: str = Field("DCGM_FI_DEV_FB_FREE", description="framebuffer memory free, MiB")
    request_count_metric: str = Field(
        "vllm:request_success_total",
        description="counter of finished requests per pod, requests (Triton: nv_inference_request_success)",
    )
    queue_depth_metric: str = Field(
        "vllm:num_requests_waiting",
        description="gauge of requests waiting per pod, requests (Triton: nv_inference_pending_request_count)",
    )
    latency_bucket_metric: str = Field(
        "vllm:e2e_request_latency_seconds_bucket",
        description="histogram buckets (with an 'le' label) of request latency in seconds",
    )

    # ---- label names --------------------------------------------------------------------------------------------
    node_label: str = Field(
        "Hostname", description="DCGM label naming the node (GPU Operator relabelling may give kubernetes_node)"
    )
    gpu_label: str = Field("gpu", description="DCGM label with the GPU index on its node")
    uuid_label: str = Field("UUID", description="DCGM label with the GPU UUID")
    model_label: str = Field("modelName", description="DCGM label with the GPU model name")
    gpu_instance_label: str = Field("GPU_I_ID", description="DCGM label with the MIG instance id, when MIG is on")
    dcgm_namespace_label: str = Field(
        "namespace",
        description="DCGM label with the namespace of the pod using the GPU (exported_namespace when Prometheus "
        "renamed dcgm-exporter's label because honorLabels is off)",
    )
    dcgm_pod_label: str = Field("pod", description="DCGM label with the pod using the GPU (or exported_pod)")
    app_namespace_label: str = Field("namespace", description="namespace label on application metrics")
    app_pod_label: str = Field("pod", description="pod label on application metrics")
    deployment_label: str = Field(
        "deployment",
        description="label that names the Deployment in aggregated application results (the default latency "
        "query derives it from the pod name with label_replace)",
    )
    scrape_copy_labels: str = Field(
        DEFAULT_SCRAPE_COPY_LABELS,
        description="label names, comma-separated: the labels in which copies of one pod's application series "
        "differ when the pod is collected more than once (a PodMonitor beside a ServiceMonitor: job, service; the "
        "prometheus.io/scrape job: job; one ServiceMonitor selecting two Services of the pod: service; Prometheus "
        "replicas behind Thanos without deduplication: prometheus_replica; two Prometheus servers: prometheus); "
        "the default queries sum each copy and count the largest. Not a target's labels (instance, endpoint): two "
        "targets of one pod in one job add up. Empty: every copy is summed",
    )

    # ---- per-service overrides (untrusted PromQL) ---------------------------------------------------------------
    confine_overrides_to_namespace: bool = Field(
        True,
        description="on/off: run a GPUScalingPolicy's spec.queries override (tick and forecast history) only when "
        'every selector in it carries an exact <app_namespace_label>="<the policy\'s namespace>" matcher, as '
        "prom-label-proxy confines a tenant; an override that does not is never sent: its policy is InvalidSpec "
        "when loaded (one that reaches a tick all the same holds its service on stale data with the reason). "
        "false lets any policy read any namespace's series with the controller's Prometheus credentials: only for "
        "single-tenant clusters whose overrides read series without that label (recording rules, external "
        "exporters)",
    )

    # ---- extra matchers (trusted PromQL) ------------------------------------------------------------------------
    dcgm_matchers: str = Field(
        "", description='extra label matchers for every DCGM query, PromQL, e.g. cluster="prod",job="dcgm-exporter"'
    )
    app_matchers: str = Field("", description="extra label matchers for every application query, PromQL")

    @field_validator("dcgm_matchers", "app_matchers")
    @classmethod
    def _matchers_parse(cls, value: str, info: ValidationInfo) -> str:
        """Pasted into every query's selector: one that does not parse makes Prometheus refuse every query at every
        tick (every service held on stale data), so it is refused here, where the setting can be named."""
        import promql_parser

        extra = value.strip().strip(",")
        if extra:
            try:
                promql_parser.parse(f"x{{{extra}}}")
            except ValueError as exc:
                raise ValueError(f"not PromQL label matchers ({exc}): e.g. cluster=\"prod\",job=~\"dcgm.*\"") from None
        return value

    # ---- query templates ----------------------------------------------------------------------------------------
    gpu_query: str = Field(
        "{metric}{selector}",
        description="instant query of one DCGM family (one series per GPU, with its DCGM labels); placeholders: "
        + ", ".join("{" + k + "}" for k in TEMPLATE_PLACEHOLDERS),
    )
    request_rate_query: str = Field(
        DEFAULT_REQUEST_RATE_QUERY,
        description="requests per second per pod (or per Deployment: the deployment label in place of the pod "
        "label); summed per service; each copy of a pod collected more than once summed on its own and the "
        "largest counted (scrape_copy_labels)",
    )
    queue_depth_query: str = Field(
        DEFAULT_QUEUE_DEPTH_QUERY,
        description="requests waiting per pod (or per Deployment); summed per service; copies as in "
        "request_rate_query; last_over_time drops samples older than staleness_seconds",
    )
    latency_query: str = Field(
        DEFAULT_LATENCY_QUERY,
        description="latency quantile per Deployment, seconds: one series per service, labelled with namespace "
        "and the deployment label (the default derives it from the pod name; while it is the default, a "
        "Deployment whose name is longer than 46 characters, whose pods' names may be cut to 63 characters, is "
        "asked on its own over its own pods instead: histogram_quantile of sum by (le))",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value

    @field_validator("extra_headers", mode="before")
    @classmethod
    def _headers_json(cls, value: Any, info: ValidationInfo) -> Any:
        # Decoded here (NoDecode), not by pydantic-settings' env source, whose JSON errors escape validation as a
        # traceback. The message names the variable itself: `autoscaler observe` has no other way to say it.
        # The value is never echoed: headers may carry credentials.
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            env = f"{cls.model_config.get('env_prefix', '')}{info.field_name}".upper()
            raise ValueError(
                f"{env} (prometheus.{info.field_name}): not valid JSON ({exc}); expected a JSON object of header "
                'names to values, e.g. {"X-Scope-OrgID": "team-a"}'
            ) from None

    @field_validator(
        "gpu_util_metric",
        "engine_active_metric",
        "fb_used_metric",
        "fb_free_metric",
        "request_count_metric",
        "queue_depth_metric",
        "latency_bucket_metric",
    )
    @classmethod
    def _metric_name(cls, value: str) -> str:
        if not METRIC_NAME.match(value):
            raise ValueError(f"not a Prometheus metric name: {value!r}")
        return value

    @field_validator(
        "node_label",
        "gpu_label",
        "uuid_label",
        "model_label",
        "gpu_instance_label",
        "dcgm_namespace_label",
        "dcgm_pod_label",
        "app_namespace_label",
        "app_pod_label",
        "deployment_label",
    )
    @classmethod
    def _label_name(cls, value: str) -> str:
        if not LABEL_NAME.match(value):
            raise ValueError(f"not a Prometheus label name: {value!r}")
        return value

    @field_validator("scrape_copy_labels", mode="before")
    @classmethod
    def _label_list(cls, value: Any) -> Any:
        # A settings file naturally holds a list, the environment comma-separated text; either is stored as the
        # text a PromQL grouping clause takes.
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list | tuple):
            return value  # pydantic's type error says what is wrong
        names = [str(name).strip() for name in value if str(name).strip()]
        bad = [name for name in names if not LABEL_NAME.match(name)]
        if bad:
            raise ValueError(f"not a Prometheus label name: {bad[0]!r} (give label names, comma-separated)")
        return ", ".join(names)

    @field_validator(
        "bearer_token_file", "basic_auth_password_file", "ca_bundle", "client_cert_file", "client_key_file",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _file_not_empty(cls, value: Any) -> Any:
        return path_not_empty(value)

    @field_validator("gpu_query", "request_rate_query", "queue_depth_query", "latency_query")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            check_template(value, TEMPLATE_PLACEHOLDERS)
        except PromQLError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _pairs(self) -> PrometheusSettings:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file must be set together")
        if self.basic_auth_password is not None and self.basic_auth_password_file is not None:
            raise ValueError("set basic_auth_password or basic_auth_password_file, not both")
        has_password = self.basic_auth_password is not None or self.basic_auth_password_file is not None
        if has_password and not self.basic_auth_username:
            raise ValueError("basic_auth_username is required with a basic-auth password")
        if self.bearer_token_file is not None and self.basic_auth_username:
            raise ValueError("set bearer_token_file or basic auth, not both")
        return self

    def template_values(self) -> dict[str, str]:
        """The trusted placeholder values common to every query (``selector``/labels are filled per family), all a
        per-service override is rendered with (:data:`OVERRIDE_PLACEHOLDERS`)."""
        return {name: value(self) for name, value in _SHARED_VALUES.items()}


def duration(seconds: float) -> str:
    """A PromQL duration literal: whole seconds as ``120s``, otherwise milliseconds."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"
