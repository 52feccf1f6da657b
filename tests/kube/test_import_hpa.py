"""``autoscaler import-hpa`` on the HPA examples of the Kubernetes documentation, from files, standard input and a live
API server, and the imported policies replayed against the HPA's own rules.

The examples are those of kubernetes.io: the walkthrough's ``php-apache`` HPA (CPU at 50 %), the walkthrough's
multiple-metrics HPA (CPU, a Pods metric, an Object metric on an Ingress), and the "Configurable scaling behavior"
policies of the HPA concepts page (scale-down by 4 pods or 10 % per minute; the defaulted behaviour block; a disabled
scale-down). What the documentation says those policies do is the reference the replay is checked against.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.adapters.kubernetes.hpa import HpaImportError, import_hpa, metric_kind_for
from autoscaler.adapters.kubernetes.policies import LoadedPolicy, validate_policy
from autoscaler.core.decide import decide_service
from autoscaler.core.model import MetricKind, PodMetrics, ServiceObservation, ServicePolicy, ServiceState
from tests.kube.fake_apiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[2]

WALKTHROUGH = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: php-apache
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: php-apache
  minReplicas: 1
  maxReplicas: 10
  metrics:
  - type: Resource
    resource:
      name: cpu
      target:
        type: Utilization
        averageUtilization: 50
"""

MULTIPLE_METRICS = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: php-apache
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: php-apache
  minReplicas: 1
  maxReplicas: 10
  metrics:
  - type: Resource
    resource:
      name: cpu
      target:
        type: Utilization
        averageUtilization: 50
  - type: Pods
    pods:
      metric:
        name: packets-per-second
      target:
        type: AverageValue
        averageValue: 1k
  - type: Object
    object:
      metric:
        name: requests-per-second
      describedObject:
        apiVersion: networking.k8s.io/v1
        kind: Ingress
        name: main-route
      target:
        type: Value
        value: 10k
"""


def with_behavior(behavior: dict[str, Any], metrics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc = yaml.safe_load(WALKTHROUGH)
    doc["metadata"]["namespace"] = "ml"
    doc["spec"]["maxReplicas"] = 100
    doc["spec"]["behavior"] = behavior
    if metrics is not None:
        doc["spec"]["metrics"] = metrics
    return doc


# "Scaling policies": at most 4 pods or 10 % per minute, the larger (selectPolicy Max by default)
SCALE_DOWN_POLICIES = {
    "scaleDown": {
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 60},
            {"type": "Percent", "value": 10, "periodSeconds": 60},
        ]
    }
}
# "Default Behavior" as the documentation prints it
DEFAULT_BEHAVIOR = {
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    },
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15},
            {"type": "Pods", "value": 4, "periodSeconds": 15},
        ],
        "selectPolicy": "Max",
    },
}
DISABLE_SCALE_DOWN = {"scaleDown": {"selectPolicy": "Disabled"}}
GPU_METRIC = [
    {
        "type": "Pods",
        "pods": {"metric": {"name": "DCGM_FI_DEV_GPU_UTIL"}, "target": {"type": "AverageValue", "averageValue": "70"}},
    }
]


def service_policy(manifest: dict[str, Any]) -> ServicePolicy:
    loaded = validate_policy(manifest)
    assert isinstance(loaded, LoadedPolicy), loaded
    return loaded.service


def replay(policy: ServicePolicy, start: int, util: float, seconds: float, step: float = 15.0) -> list[int]:
    """Ticks every ``step`` seconds at a constant per-pod GPU utilisation, after a long warm history."""
    state, replicas, out = ServiceState(((-10_000.0, start),)), start, []
    now = 0.0
    while now <= seconds:
        obs = ServiceObservation(policy.key, replicas, replicas, pods=PodMetrics(replicas, util * replicas))
        decision, state = decide_service(policy, obs, state, now)
        replicas = decision.desired_replicas
        out.append(replicas)
        now += step
    return out


# ---- the documentation's examples ----------------------------------------------------------------------------------


def test_walkthrough_cpu_hpa_needs_a_metric_and_keeps_the_rest() -> None:
    doc = yaml.safe_load(WALKTHROUGH)
    with pytest.raises(HpaImportError, match=r"spec\.metrics: no metric this controller can read"):
        import_hpa(doc)
    imported = import_hpa(doc, (MetricKind.GPU_UTILIZATION, 50.0))
    spec = imported.manifest["spec"]
    assert spec["targetRef"]["name"] == "php-apache" and (spec["minReplicas"], spec["maxReplicas"]) == (1, 10)
    assert spec["metric"] == {"type": "gpu_utilization", "target": 50.0}
    assert spec["behavior"] == {"hpaWithoutBehavior": True}  # the HPA had no behavior block
    assert any("Resource cpu: no equivalent" in n for n in imported.notes)
    assert imported.manifest["metadata"] == {"name": "php-apache", "namespace": "default"}


def test_walkthrough_policy_reproduces_a_behaviour_less_hpa() -> None:
    """Upstream, without a behavior block: a scale-up is capped at max(2 x current, 4) per sync (1 -> 4 -> 8 -> 10
    at maxReplicas), and a scale-down waits for the 300 s window, then goes all the way at once."""
    policy = service_policy(import_hpa(yaml.safe_load(WALKTHROUGH), (MetricKind.GPU_UTILIZATION, 50.0)).manifest)
    assert policy.behavior is False
    assert replay(policy, 1, 100.0 * 10, 45)[:3] == [4, 8, 10]
    cold = dataclasses.replace(policy)
    state, replicas, seen = ServiceState(((0.0, 10),)), 10, []
    for tick in range(25):
        now = tick * 15.0
        obs = ServiceObservation(cold.key, replicas, replicas, pods=PodMetrics(replicas, 5.0 * replicas))
        decision, state = decide_service(cold, obs, state, now)
        replicas = decision.desired_replicas
        seen.append((now, replicas))
    # upstream keeps a sample at exactly now - window (it drops only those strictly before): 10 through 300 s
    assert all(r == 10 for t, r in seen if t <= 300) and dict(seen)[315.0] == 1


def test_multiple_metrics_lists_what_has_no_equivalent() -> None:
    doc = yaml.safe_load(MULTIPLE_METRICS)
    with pytest.raises(HpaImportError, match="no metric this controller can read"):
        import_hpa(doc)
    imported = import_hpa(doc, (MetricKind.REQUEST_RATE, 1000.0))
    notes = "\n".join(imported.notes)
    assert "spec.metrics[0]: Resource cpu: no equivalent" in notes
    assert "spec.metrics[1]: Pods metric 'packets-per-second': not a signal this controller reads" in notes
    assert "spec.metrics[2]: Object metric on a Ingress: no equivalent" in notes
    assert imported.manifest["spec"]["metric"] == {"type": "request_rate", "target": 1000.0}


def test_several_readable_metrics_use_the_first_and_say_so() -> None:
    metrics = [
        *GPU_METRIC,
        {
            "type": "External",
            "external": {
                "metric": {"name": "vllm:num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "500m"},
            },
        },
    ]
    imported = import_hpa(with_behavior(DEFAULT_BEHAVIOR, metrics))
    assert imported.manifest["spec"]["metric"] == {"type": "gpu_utilization", "target": 70.0}
    assert any("queue_depth=0.5: not used" in n for n in imported.notes)


def test_scale_down_policies_reproduce_the_documented_rate() -> None:
    """The documentation: "the first policy allows at most 4 replicas to be scaled down in one minute, the second
    at most 10 % of the current replicas; the policy with the largest change is selected, so the second is only used
    above 40 replicas". From 80 replicas with no load (and a history older than the 300 s window): 10 % a minute,
    truncated as upstream's int32(start x 0.9) (80 -> 72 -> 64 -> 57 -> 51 -> 45 -> 40), then 4 a minute once 10 %
    is less (40 -> 36 -> 32 -> 28 -> 24)."""
    imported = import_hpa(with_behavior(SCALE_DOWN_POLICIES, GPU_METRIC))
    assert imported.manifest["spec"]["behavior"] == {
        "scaleDown": {
            "policies": [
                {"type": "Pods", "value": 4, "periodSeconds": 60},
                {"type": "Percent", "value": 10, "periodSeconds": 60},
            ]
        }
    }
    policy = service_policy(imported.manifest)
    seen = replay(policy, 80, 1.0, 60 * 12)
    per_minute = seen[3::4]  # the replicas at the end of each minute
    assert per_minute[:10] == [72, 64, 57, 51, 45, 40, 36, 32, 28, 24]


def test_default_behavior_block_and_disabled_scale_down() -> None:
    policy = service_policy(import_hpa(with_behavior(DEFAULT_BEHAVIOR, GPU_METRIC)).manifest)
    assert policy.behavior is True
    # max(+4 pods, +100 %) per 15 s: 1 -> 5 -> 10 -> 20 -> 40
    assert replay(policy, 1, 70.0 * 100, 45) == [5, 10, 20, 40]
    frozen = service_policy(import_hpa(with_behavior(DISABLE_SCALE_DOWN, GPU_METRIC)).manifest)
    assert set(replay(frozen, 30, 1.0, 600)) == {30}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", MetricKind.GPU_UTILIZATION),
        ("dcgm_fi_prof_gr_engine_active", MetricKind.ENGINE_ACTIVE),
        ("vllm:num_requests_waiting", MetricKind.QUEUE_DEPTH),
        ("http_requests_per_second", MetricKind.REQUEST_RATE),
        ("tgi_queue_size", MetricKind.QUEUE_DEPTH),
        ("vllm:request_success_total", MetricKind.REQUEST_RATE),
        ("packets-per-second", None),
        ("cpu", None),
        # A time is neither a queue length nor a rate, whatever else its name says (each was once queue_depth).
        ("vllm:request_queue_time_seconds", None),
        ("tgi_request_queue_duration", None),
        ("nv_inference_queue_duration_us", None),
        ("queue_latency_ms", None),
        ("QueueWaitTime", None),
        ("http_request_duration_seconds_total", None),
    ],
)
def test_metric_names(name: str, kind: MetricKind | None) -> None:
    assert metric_kind_for(name) is kind


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "Deployment"}, "kind/apiVersion: 'Deployment'"),
        ({"spec": {"scaleTargetRef": {"kind": "StatefulSet", "name": "x"}, "maxReplicas": 3}}, "only Deployments"),
        ({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}}}, "spec.maxReplicas: required"),
        ({"metadata": {}}, "metadata.name: required"),
    ],
)
def test_bad_input_names_the_field(change: dict[str, Any], message: str) -> None:
    doc = {**yaml.safe_load(WALKTHROUGH), **change}
    with pytest.raises(HpaImportError, match=message):
        import_hpa(doc, (MetricKind.GPU_UTILIZATION, 50.0))


def setting(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the field at ``path`` (dots; list indices as numbers) set to ``value``."""
    doc = copy.deepcopy(doc)  # with_behavior() shares the module's example blocks
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


# A value of the wrong type where the HPA has an object (or a list, or a string): each used to end in a traceback
# (AttributeError: 'list' object has no attribute 'get') or, for metadata.name, in a policy named 5.
WRONG_TYPES: list[tuple[str, Any, str]] = [
    ("spec.behavior", [], "spec.behavior: must be an object, not a list ([])"),
    ("spec.metrics", ["x"], "spec.metrics[0]: must be an object, not a string ('x')"),
    ("spec.metrics", {"type": "Pods"}, "spec.metrics: must be a list, not an object"),
    ("spec.metrics.0", None, "spec.metrics[0]: must be an object, not null"),
    ("spec", [1], "spec: must be an object, not a list ([1])"),
    ("metadata", [1], "metadata: must be an object, not a list ([1])"),
    ("spec.scaleTargetRef", [1], "spec.scaleTargetRef: must be an object, not a list ([1])"),
    ("spec.metrics.0.pods", [1], "spec.metrics[0].pods: must be an object, not a list ([1])"),
    ("spec.metrics.0.pods.metric", "gpu", "spec.metrics[0].pods.metric: must be an object, not a string ('gpu')"),
    ("spec.metrics.0.pods.metric.name", 7, "spec.metrics[0].pods.metric.name: must be a string, not a number (7)"),
    ("spec.metrics.0.pods.target", "70", "spec.metrics[0].pods.target: must be an object, not a string ('70')"),
    ("spec.metrics.0.pods.target.averageValue", 10**400, "spec.metrics[0].pods.target.averageValue: 1000"),
    ("spec.behavior.scaleUp", [1], "spec.behavior.scaleUp: must be an object, not a list ([1])"),
    ("spec.behavior.scaleUp.policies", ["x"], "spec.behavior.scaleUp.policies[0]: must be an object, not a string"),
    ("spec.behavior.scaleUp.policies", {"type": "Pods"}, "spec.behavior.scaleUp.policies: must be a list, not an"),
    ("metadata.name", 5, "metadata.name: must be a string, not a number (5)"),
    ("metadata.name", ["web"], "metadata.name: must be a string, not a list (['web'])"),
    ("metadata.namespace", True, "metadata.namespace: must be a string, not a boolean (True)"),
    ("spec.scaleTargetRef.name", ["web"], "spec.scaleTargetRef.name: must be a string, not a list (['web'])"),
    ("spec.scaleTargetRef.apiVersion", 1, "spec.scaleTargetRef.apiVersion: must be a string, not a number (1)"),
]


@pytest.mark.parametrize(("path", "value", "message"), WRONG_TYPES, ids=[f"{c[0]}={c[1]!r}"[:40] for c in WRONG_TYPES])
def test_a_value_of_the_wrong_type_names_the_field(path: str, value: Any, message: str) -> None:
    doc = setting(with_behavior(DEFAULT_BEHAVIOR, GPU_METRIC), path, value)
    with pytest.raises(HpaImportError) as caught:
        import_hpa(doc)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_huge_value_is_quoted_short() -> None:
    bomb: list[Any] = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9  # 9**9 strings if printed in full
    doc = setting(with_behavior(DEFAULT_BEHAVIOR, GPU_METRIC), "spec.behavior.scaleUp.policies", [bomb])
    with pytest.raises(HpaImportError) as caught:
        import_hpa(doc)
    assert len(str(caught.value)) < 200


def test_a_bad_quantity_names_the_field() -> None:
    metrics = [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
                "target": {"type": "AverageValue", "averageValue": "lots"},
            },
        }
    ]
    with pytest.raises(HpaImportError, match=r"spec.metrics\[0\].pods.target.averageValue: 'lots' is not a quantity"):
        import_hpa(with_behavior(DEFAULT_BEHAVIOR, metrics))


# ---- the command ----------------------------------------------------------------------------------------------------


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "import-hpa", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_command_from_a_file_writes_a_policy_the_controller_accepts(tmp_path: Path) -> None:
    path = tmp_path / "hpa.yaml"
    path.write_text(WALKTHROUGH)
    done = cli(str(path), "--metric", "gpu_utilization=50")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Imported from HorizontalPodAutoscaler default/php-apache")
    assert "# no equivalent: spec.metrics[0]: Resource cpu" in done.stdout
    assert "Resource cpu: no equivalent" in done.stderr
    assert isinstance(validate_policy(yaml.safe_load(done.stdout)), LoadedPolicy)


def test_command_from_stdin_several_documents_and_json(tmp_path: Path) -> None:
    two = WALKTHROUGH + "\n---\n" + yaml.safe_dump(with_behavior(SCALE_DOWN_POLICIES, GPU_METRIC))
    done = cli("-", "--metric", "gpu_utilization=60", "-o", "json", stdin=two)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["kind"] == "List" and [i["spec"]["metric"]["target"] for i in doc["items"]] == [60.0, 60.0]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("--metric", "gpu_utilization=50"), None, "give a FILE, or --namespace and --name"),
        (("-", "--metric", "cpu=50"), WALKTHROUGH, "--metric: 'cpu=50' is not TYPE=TARGET"),
        (("-", "--metric", "gpu_utilization=-1"), WALKTHROUGH, "the target must be a positive number"),
        (("-",), WALKTHROUGH, "no metric this controller can read"),
        (("-",), "{not: [yaml", "-: not valid YAML or JSON: "),
        (("-",), "", "no HPA in it"),
        (
            ("-", "--metric", "gpu_utilization=50"),
            WALKTHROUGH.replace("minReplicas: 1", "minReplicas: 1\n  behavior: []"),
            "spec.behavior: must be an object, not a list ([])",
        ),
        (("-",), WALKTHROUGH.replace("name: php-apache\nspec", "name: 5\nspec"), "metadata.name: must be a string"),
        (("-",), "kind: List\nitems: {a: 1}\n", "-: document 1: items: a List's items must be a list"),
        (("-",), "[" * 100_000, "-: not valid YAML or JSON: nested too deeply"),
    ],
)
def test_command_errors_exit_2_naming_the_problem(args: tuple[str, ...], stdin: str | None, message: str) -> None:
    done = cli(*args, stdin=stdin)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_command_writes_the_importable_hpas_and_names_the_others(tmp_path: Path) -> None:
    good = with_behavior(SCALE_DOWN_POLICIES, GPU_METRIC)
    bad = setting(with_behavior(SCALE_DOWN_POLICIES, GPU_METRIC), "spec.behavior", [])
    bad["metadata"]["name"] = "broken"
    third = setting(with_behavior(SCALE_DOWN_POLICIES, GPU_METRIC), "metadata.name", "third")
    path = tmp_path / "hpas.yaml"
    path.write_text(yaml.safe_dump_all([good, bad, third]))
    done = cli(str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "document 2: spec.behavior: must be an object, not a list ([])" in done.stderr
    assert "2 of 3 HPAs written" in done.stderr
    written = [d for d in yaml.safe_load_all(done.stdout)]
    assert [d["metadata"]["name"] for d in written] == ["php-apache", "third"]
    assert all(isinstance(validate_policy(d), LoadedPolicy) for d in written)
    as_json = cli(str(path), "-o", "json")
    assert as_json.returncode == 2
    assert [i["metadata"]["name"] for i in json.loads(as_json.stdout)["items"]] == ["php-apache", "third"]
    # In a List, the item is named too; and when none can be imported, nothing is written.
    listed = cli("-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [bad, bad]}))
    assert listed.returncode == 2 and listed.stdout == ""
    assert "document 1 items[1]: spec.behavior: must be an object" in listed.stderr


def test_command_help_says_what_happens_to_several_hpas() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", "import-hpa", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    text = " ".join(done.stdout.split())
    assert "each importable one is written" in text and "the exit code is then 2" in text


def test_command_on_a_directory_exits_2(tmp_path: Path) -> None:
    done = cli(str(tmp_path))
    assert done.returncode == 2 and "is a directory" in done.stderr and "Traceback" not in done.stderr


def test_command_reads_a_live_hpa_and_can_adopt_it(tmp_path: Path) -> None:
    server = FakeApiServer().start()
    try:
        hpa = with_behavior(DEFAULT_BEHAVIOR, GPU_METRIC)
        hpa["status"] = {"currentReplicas": 3, "desiredReplicas": 4}
        server.seed(hpa)
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        done = cli("-n", "ml", "--name", "php-apache", "--kubeconfig", str(kubeconfig), "--adopt")
        assert done.returncode == 0, done.stderr
        manifest = yaml.safe_load(done.stdout)
        assert manifest["spec"]["adoptHpa"] == "php-apache"
        loaded = validate_policy(manifest)
        assert isinstance(loaded, LoadedPolicy) and loaded.spec.adopt_hpa == "php-apache"
        missing = cli("-n", "ml", "--name", "absent", "--kubeconfig", str(kubeconfig))
        assert missing.returncode == 1 and "HTTP 404" in missing.stderr and "Traceback" not in missing.stderr
    finally:
        server.stop()


# ---- review: v1 annotations, versions, integer types, names, duplicate keys, empty metrics ---------------------------

V1_FROM_V2 = {
    # What a kube-apiserver serves as autoscaling/v1 for an autoscaling/v2 HPA on DCGM_FI_DEV_GPU_UTIL with
    # scale-down Disabled: no targetCPUUtilizationPercentage, the v2-only fields in annotations.
    "apiVersion": "autoscaling/v1",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {
        "name": "llm",
        "namespace": "ml",
        "annotations": {
            "autoscaling.alpha.kubernetes.io/metrics": json.dumps(
                [{"type": "Pods", "pods": {"metricName": "DCGM_FI_DEV_GPU_UTIL", "targetAverageValue": "70"}}]
            ),
            "autoscaling.alpha.kubernetes.io/behavior": json.dumps(
                {"ScaleUp": None, "ScaleDown": {"SelectPolicy": "Disabled"}}
            ),
            "autoscaling.alpha.kubernetes.io/conditions": "[]",
            "autoscaling.alpha.kubernetes.io/current-metrics": "[]",
        },
    },
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "minReplicas": 2,
        "maxReplicas": 20,
    },
}


def without_annotations(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for key in keys:
        del doc["metadata"]["annotations"][f"autoscaling.alpha.kubernetes.io/{key}"]
    return doc


@pytest.mark.parametrize(
    ("doc", "refused"),
    [
        (V1_FROM_V2, "metrics"),
        (without_annotations(V1_FROM_V2, "metrics"), "behavior"),
        (without_annotations(V1_FROM_V2, "behavior"), "metrics"),
    ],
    ids=["both", "behavior only", "metrics only"],
)
def test_a_v1_hpa_with_its_v2_fields_in_annotations_is_refused(doc: dict[str, Any], refused: str) -> None:
    """Read as plain v1, this HPA used to import as "CPU 80 %" and, with --metric, as hpaWithoutBehavior: true -- a
    policy that scales down where the HPA never does."""
    for override in (None, (MetricKind.GPU_UTILIZATION, 70.0)):
        with pytest.raises(HpaImportError) as caught:
            import_hpa(doc, override)
        message = str(caught.value)
        assert message.startswith(f"metadata.annotations[autoscaling.alpha.kubernetes.io/{refused}]: "), message
        assert "kubectl get hpa.v2.autoscaling llm -n ml -o yaml" in message


def test_a_v1_hpa_with_only_status_annotations_imports() -> None:
    doc = without_annotations(V1_FROM_V2, "metrics", "behavior")
    doc["spec"]["targetCPUUtilizationPercentage"] = 60
    imported = import_hpa(doc, (MetricKind.GPU_UTILIZATION, 70.0))
    assert imported.manifest["spec"]["behavior"] == {"hpaWithoutBehavior": True}
    assert imported.notes == ["spec.targetCPUUtilizationPercentage 60: CPU has no equivalent (use --metric)"]


def test_a_v1_hpa_without_metric_names_its_cpu_field() -> None:
    doc = without_annotations(V1_FROM_V2, "metrics", "behavior")
    doc["spec"]["targetCPUUtilizationPercentage"] = 60
    with pytest.raises(HpaImportError) as caught:
        import_hpa(doc)
    message = str(caught.value)
    assert message.startswith("spec.targetCPUUtilizationPercentage 60: CPU has no equivalent; give a metric with")
    assert "spec.metrics" not in message  # v1 has no such field


def test_v2beta2_is_imported_as_v2() -> None:
    v2 = with_behavior(SCALE_DOWN_POLICIES, GPU_METRIC)
    v2beta2 = {**v2, "apiVersion": "autoscaling/v2beta2"}
    assert import_hpa(v2beta2).manifest == import_hpa(v2).manifest
    with pytest.raises(HpaImportError, match=r"apiVersion: 'autoscaling/v2beta1': not supported .* kubectl get hpa"):
        import_hpa({**v2, "apiVersion": "autoscaling/v2beta1"})


def test_command_refuses_a_v1_hpa_with_annotations() -> None:
    done = cli("-", "--metric", "gpu_utilization=70", stdin=yaml.safe_dump(V1_FROM_V2))
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert "kubectl get hpa.v2.autoscaling llm -n ml -o yaml" in done.stderr


def pods_metric(name: str, average: str = "1") -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": average}},
    }


def test_the_kind_taken_from_a_name_is_always_said() -> None:
    metrics = [pods_metric("vllm:num_requests_waiting", "5"), *GPU_METRIC, pods_metric("http_requests_per_second")]
    imported = import_hpa(with_behavior(DEFAULT_BEHAVIOR, metrics))
    assert imported.inferred == [
        "spec.metrics[0]: Pods metric 'vllm:num_requests_waiting' taken as queue_depth (from its name): check that "
        "its average per pod is a number of requests waiting, per replica",
        "spec.metrics[1]: Pods metric 'DCGM_FI_DEV_GPU_UTIL' taken as gpu_utilization (from its name): check that "
        "its average per pod is GPU utilisation in percent",
        "spec.metrics[2]: Pods metric 'http_requests_per_second' taken as request_rate (from its name): check that "
        "its average per pod is requests per second, per replica",
    ]
    done = cli("-", stdin=yaml.safe_dump(with_behavior(DEFAULT_BEHAVIOR, metrics)))
    assert done.returncode == 0, done.stderr
    assert "# inferred: spec.metrics[0]: Pods metric 'vllm:num_requests_waiting' taken as queue_depth" in done.stdout
    assert "ml/php-apache: spec.metrics[0]: Pods metric 'vllm:num_requests_waiting' taken as queue_dep" in done.stderr


@pytest.mark.parametrize(
    "name", ["vllm:request_queue_time_seconds", "tgi_request_queue_duration", "nv_inference_queue_duration_us"]
)
def test_a_latency_named_queue_is_not_a_queue_length(name: str) -> None:
    doc = with_behavior(DEFAULT_BEHAVIOR, [pods_metric(name, "500m")])
    with pytest.raises(HpaImportError) as caught:
        import_hpa(doc)
    assert f"Pods metric {name!r}: a time or latency by its name, not queue_depth" in str(caught.value)
    imported = import_hpa(doc, (MetricKind.GPU_UTILIZATION, 70.0))
    assert imported.manifest["spec"]["metric"] == {"type": "gpu_utilization", "target": 70.0}
    assert imported.inferred == []


# Integer fields given as strings, booleans or floats: each used to be written out as given ("2", true), which the
# policy's lax validation accepted and the CRD's schema refuses.
NOT_INTEGERS: list[tuple[str, Any, str]] = [
    ("spec.minReplicas", "2", "spec.minReplicas: must be an integer, not a string ('2')"),
    ("spec.minReplicas", True, "spec.minReplicas: must be an integer, not a boolean (True)"),
    ("spec.minReplicas", 2.0, "spec.minReplicas: must be an integer, not 2.0"),
    ("spec.maxReplicas", "20", "spec.maxReplicas: must be an integer, not a string ('20')"),
    ("spec.maxReplicas", None, "spec.maxReplicas: required integer"),
    (
        "spec.behavior.scaleDown.stabilizationWindowSeconds",
        "60",
        "spec.behavior.scaleDown.stabilizationWindowSeconds: must be an integer, not a string ('60')",
    ),
    (
        "spec.behavior.scaleDown.policies.0.value",
        "4",
        "spec.behavior.scaleDown.policies[0].value: must be an integer, not a string ('4')",
    ),
    (
        "spec.behavior.scaleDown.policies.0.value",
        True,
        "spec.behavior.scaleDown.policies[0].value: must be an integer, not a boolean (True)",
    ),
    (
        "spec.behavior.scaleDown.policies.0.periodSeconds",
        "60",
        "spec.behavior.scaleDown.policies[0].periodSeconds: must be an integer, not a string ('60')",
    ),
    (
        "spec.behavior.scaleDown.policies.0.periodSeconds",
        None,
        "spec.behavior.scaleDown.policies[0].periodSeconds: required integer",
    ),
    (
        "spec.behavior.scaleDown.selectPolicy",
        1,
        "spec.behavior.scaleDown.selectPolicy: must be a string, not a number (1)",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), NOT_INTEGERS, ids=[f"{c[0]}={c[1]!r}" for c in NOT_INTEGERS])
def test_an_integer_field_of_another_type_names_the_field(path: str, value: Any, message: str) -> None:
    doc = with_behavior(copy.deepcopy(DEFAULT_BEHAVIOR), GPU_METRIC)
    doc["spec"]["minReplicas"] = 2
    doc["spec"]["behavior"]["scaleDown"]["policies"] = [{"type": "Pods", "value": 4, "periodSeconds": 60}]
    with pytest.raises(HpaImportError) as caught:
        import_hpa(setting(doc, path, value))
    assert str(caught.value) == message


def test_the_integers_written_are_integers() -> None:
    doc = with_behavior(copy.deepcopy(DEFAULT_BEHAVIOR), GPU_METRIC)
    doc["spec"]["minReplicas"] = None  # null: the default, 1
    spec = import_hpa(doc).manifest["spec"]
    assert spec["minReplicas"] == 1 and spec["maxReplicas"] == 100
    rules = [spec["behavior"]["scaleUp"], spec["behavior"]["scaleDown"]]
    numbers = [spec["minReplicas"], spec["maxReplicas"]] + [r["stabilizationWindowSeconds"] for r in rules]
    numbers += [p[k] for r in rules for p in r["policies"] for k in ("value", "periodSeconds")]
    assert all(type(n) is int for n in numbers), numbers


BAD_NAMES: list[tuple[str, Any, str]] = [
    ("metadata.name", "llm\nmode: x", "metadata.name: 'llm\\nmode: x' is not a valid name (a DNS-1123 subdomain"),
    ("metadata.name", "LLM", "metadata.name: 'LLM' is not a valid name"),
    ("metadata.name", "llm_1", "metadata.name: 'llm_1' is not a valid name"),
    ("metadata.name", "-llm", "metadata.name: '-llm' is not a valid name"),
    ("metadata.name", "a" * 254, "metadata.name: 'aaaa"),
    ("metadata.name", "", "metadata.name: required"),
    ("metadata.namespace", "ml.prod", "metadata.namespace: 'ml.prod' is not a valid name (a DNS-1123 label"),
    ("metadata.namespace", "ml\n", "metadata.namespace: 'ml\\n' is not a valid name"),
    ("metadata.namespace", "a" * 64, "metadata.namespace: 'aaaa"),
    ("spec.scaleTargetRef.name", "Web", "spec.scaleTargetRef.name: 'Web' is not a valid name"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_NAMES, ids=[f"{c[0]}={c[1]!r}"[:40] for c in BAD_NAMES])
def test_a_name_kubernetes_refuses_is_refused(path: str, value: Any, message: str) -> None:
    with pytest.raises(HpaImportError) as caught:
        import_hpa(setting(with_behavior(DEFAULT_BEHAVIOR, GPU_METRIC), path, value))
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_longest_names_are_accepted() -> None:
    doc = setting(with_behavior(DEFAULT_BEHAVIOR, GPU_METRIC), "metadata.name", "a." * 126 + "b")
    doc["metadata"]["namespace"] = "n" * 63
    assert import_hpa(doc).manifest["metadata"] == {"name": "a." * 126 + "b", "namespace": "n" * 63}
    doc["metadata"]["namespace"] = ""  # kubectl's default namespace
    assert import_hpa(doc).manifest["metadata"]["namespace"] == "default"


@pytest.mark.parametrize(
    "metric",
    [
        {"type": "Resource", "resource": {"name": "cpu\nextra: 1"}},
        {"type": "Object", "object": {"describedObject": {"kind": "Ingress\r\nextra: 1"}}},
        {
            "type": "External",
            "external": {"metric": {"name": "DCGM_FI_DEV_GPU_UTIL"}, "target": {"type": "Value\u2028extra: 1"}},
        },
    ],
    ids=["Resource name", "Object kind", "External target type"],
)
def test_comments_stay_one_line(metric: dict[str, Any]) -> None:
    """A line break in a name written into a ``#`` comment used to make the rest of it YAML: keys of the policy."""
    doc = with_behavior(DEFAULT_BEHAVIOR, [metric, *GPU_METRIC])
    done = cli("-", stdin=yaml.safe_dump(doc))
    assert done.returncode == 0, done.stderr
    header = done.stdout.split("apiVersion:", 1)[0]
    assert header.count("\n") == len(header.splitlines()) and all(line.startswith("# ") for line in header.splitlines())
    assert yaml.safe_load(done.stdout) == import_hpa(doc).manifest  # nothing added to the policy
    assert "extra: 1" in header  # escaped, on the comment's line
    assert all(line.startswith("autoscaler import-hpa: ") for line in done.stderr.splitlines())


DUPLICATE_KEY = """\
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: llm, namespace: ml}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  minReplicas: 2
  maxReplicas: 8
  metrics:
  - type: Pods
    pods:
      metric: {name: DCGM_FI_DEV_GPU_UTIL}
      target: {type: AverageValue, averageValue: "70"}
  maxReplicas: 80
"""


def test_command_refuses_a_key_given_twice(tmp_path: Path) -> None:
    """``yaml.safe_load_all`` kept the last one silently (maxReplicas 80); ``kubectl apply`` refuses the file."""
    done = cli("-", "-o", "json", stdin=DUPLICATE_KEY)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert "-: not valid YAML or JSON: found duplicate key 'maxReplicas' (line 13, column 3)" in done.stderr
    path = tmp_path / "hpa.yaml"
    path.write_text(DUPLICATE_KEY)
    from_file = cli(str(path))
    assert from_file.returncode == 2 and f"{path}: not valid YAML or JSON: found duplicate key" in from_file.stderr


def test_command_names_the_first_byte_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "hpa.yaml"
    path.write_bytes(WALKTHROUGH.encode().replace(b"php-apache\nspec", b"php-\xffapache\nspec"))
    done = cli(str(path), "--metric", "gpu_utilization=50")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{path}: not UTF-8 text (byte 0xff at line 5, column 13)" in done.stderr
    path.write_bytes(b"\xef\xbb\xbf" + WALKTHROUGH.encode())  # a byte-order mark alone is fine
    assert cli(str(path), "--metric", "gpu_utilization=50").returncode == 0


@pytest.mark.parametrize(("metrics", "state"), [(None, "absent"), ([], "empty")])
def test_no_metrics_is_cpu_at_80_percent_and_says_so(metrics: list[Any] | None, state: str) -> None:
    doc = copy.deepcopy(with_behavior(DEFAULT_BEHAVIOR))
    doc["spec"]["metrics"] = metrics
    imported = import_hpa(doc, (MetricKind.GPU_UTILIZATION, 70.0))
    assert imported.notes == [
        f"spec.metrics {state}: the HPA defaults to CPU at 80 %, which has no equivalent (use --metric)"
    ]
