"""deploy/overlays/scheduler-extender: every document validates, the controller serves the extender on the port the
Service, the NetworkPolicy and the KubeSchedulerConfiguration name, and the extender entry is the one this project
relies on (node names only, ignorable, GPU pods only, a short timeout). The real kube-scheduler loads the same file
in tests/realkube/test_scheduler_extender.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.settings import SchedulerExtenderSettings
from tests.kube.test_deploy import DEPLOY, NOT_IN_K8S_SCHEMAS, _k8s_validate, find, kustomize

OVERLAY = DEPLOY / "overlays" / "scheduler-extender"
CONFIG_FILE = OVERLAY / "kube-scheduler-config.yaml"


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return kustomize(OVERLAY)


def scheduler_config(path: Path = CONFIG_FILE) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_every_document_validates(overlay: list[dict[str, Any]]) -> None:
    for doc in overlay:
        if doc["kind"] not in NOT_IN_K8S_SCHEMAS:
            _k8s_validate(doc)


def test_the_extender_entry() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpu-placement"]
    (ext,) = config["extenders"]
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert ext["httpTimeout"] == "1s" and 1 <= ext["weight"] <= 10
    assert "bindVerb" not in ext and "preemptVerb" not in ext
    assert ext["urlPrefix"] == "http://gpu-autoscaler.gpu-autoscaler.svc:8081/scheduler"


def test_ports_line_up(overlay: list[dict[str, Any]]) -> None:
    dep = find(overlay, "Deployment", "gpu-autoscaler")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AUTOSCALER_SCHEDULER_EXTENDER__ENABLED"] == "true"
    port = int(env["AUTOSCALER_SCHEDULER_EXTENDER__PORT"])
    assert port == SchedulerExtenderSettings().port
    assert {"name": "extender", "containerPort": port, "protocol": "TCP"} in container["ports"]
    service = find(overlay, "Service", "gpu-autoscaler")
    assert {"name": "extender", "port": port, "targetPort": "extender", "protocol": "TCP"} in service["spec"]["ports"]
    assert service["spec"]["ports"][0]["name"] == "http"  # the ServiceMonitor's port stays first
    assert f".svc:{port}/" in scheduler_config()["extenders"][0]["urlPrefix"]
    policy = find(overlay, "NetworkPolicy", "gpu-autoscaler")
    rule = policy["spec"]["ingress"][-1]
    assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpu-placement-scheduler"}}}]


def test_the_scheduler_runs_the_shipped_config(overlay: list[dict[str, Any]]) -> None:
    dep = find(overlay, "Deployment", "gpu-placement-scheduler")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--config=/etc/gpu-placement/kube-scheduler-config.yaml" in container["command"]
    assert pod["serviceAccountName"] == "gpu-placement-scheduler"
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-placement-scheduler"
    config_map = next(d for d in overlay if d["kind"] == "ConfigMap")
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]  # the generated, hashed name
    assert yaml.safe_load(config_map["data"]["kube-scheduler-config.yaml"]) == scheduler_config()
    bindings = {d["roleRef"]["name"] for d in overlay if d["kind"] in ("ClusterRoleBinding", "RoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader"} <= bindings
    lease = find(overlay, "Role", "gpu-placement-scheduler-lease")
    assert scheduler_config()["leaderElection"]["resourceName"] in lease["rules"][1]["resourceNames"]
