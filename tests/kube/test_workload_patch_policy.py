"""deploy/base/admissionpolicy.yaml as rendered: the ValidatingAdmissionPolicy that confines the controller's patches
(what the real kube-apiserver does with it: tests/realkube/test_workload_patch_policy_real.py).

Checked here, without a cluster: every overlay renders the policy and its binding cluster-scoped and valid against the
Kubernetes 1.30 schemas (the first release serving admissionregistration.k8s.io/v1 policies); the matchCondition
names the ServiceAccount the controller's Deployment runs as, in every overlay, and follows an overlay of the user's
that moves and renames the install when it repeats the base's replacements (and does not when it does not: the
documented limitation); every object any of the controller's roles lets it patch is matched; and what the policy
lets through is exactly what the adapters write (the suspension field of each workload kind and the annotation and
label keys, taken from the adapters' own constants).
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoscaler.adapters.kubernetes.leader_label import LEADER_LABEL
from autoscaler.adapters.kubernetes.nodepool import DELETE_MACHINE_ANNOTATION, MARKED_BY_ANNOTATION
from autoscaler.adapters.kubernetes.reader import DELETION_COST_BY_ANNOTATION, POD_DELETION_COST_ANNOTATION
from autoscaler.adapters.kubernetes.workloads import OUR_ANNOTATIONS, WORKLOAD_KINDS
from tests.kube.test_deploy import DEPLOY, K8S_VERSION, kustomize

OVERLAYS = ["base", "overlays/dry-run", "overlays/production", "overlays/scheduler-extender"]
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# Writes no admission policy needs to confine: Events (reports), and the controller's own Lease and move-ledger
# ConfigMap, named in its namespaced Role. Subresources (scale, status, eviction) carry no pod template.
UNCONFINED = {("", "events"), ("events.k8s.io", "events"), ("coordination.k8s.io", "leases"), ("", "configmaps")}


def policy_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    [policy] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    [binding] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    return policy, binding


def controller_user(docs: list[dict[str, Any]]) -> str:
    """The username the controller's pods authenticate as: its Deployment's namespace and ServiceAccount."""
    controller = {"app.kubernetes.io/name": "gpu-autoscaler", "app.kubernetes.io/component": "controller"}
    [deployment] = [
        d for d in docs if d["kind"] == "Deployment" and controller.items() <= d["metadata"]["labels"].items()
    ]
    return (
        f"system:serviceaccount:{deployment['metadata']['namespace']}:"
        f"{deployment['spec']['template']['spec']['serviceAccountName']}"
    )


MATCH = re.compile(r"request\.userInfo\.username == ((?:'[^']*'(?: \+ )?)+)")


def matched_user(policy: dict[str, Any]) -> str:
    """The username the matchCondition compares with: the concatenation of its string literals."""
    [condition] = policy["spec"]["matchConditions"]
    found = MATCH.fullmatch(condition["expression"])
    assert found, condition["expression"]
    return "".join(re.findall(r"'([^']*)'", found.group(1)))


def variable(policy: dict[str, Any], name: str) -> str:
    [expression] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(expression)


CHOICE = re.compile(r"\s*request\.resource\.resource (==|in) ('[^']*'|\[[^\]]*\]) \? ('[^']*'|\[[^\]]*\]) :")


def choose(expression: str, resource: str) -> Any:
    """Evaluate a chain ``request.resource.resource ==/in X ? A : ... : Z`` of literals for ``resource``."""
    rest = expression
    while found := CHOICE.match(rest):
        op, operand, value = found.group(1), ast.literal_eval(found.group(2)), ast.literal_eval(found.group(3))
        if (op == "==" and resource == operand) or (op == "in" and resource in operand):
            return value
        rest = rest[found.end() :]
    return ast.literal_eval(rest.strip())


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: kustomize(DEPLOY / overlay) for overlay in OVERLAYS}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_the_policy_for_its_controller(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    import kubernetes_validate

    docs = rendered[overlay]
    policy, binding = policy_of(docs)
    for doc in (policy, binding):
        assert "namespace" not in doc["metadata"], doc["kind"]  # cluster-scoped
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    # Fail is safe only because no error can come before the matchCondition: no params to look up (a param informer
    # not synced is an error for every request the rules match, anyone's), no selectors.
    assert spec["failurePolicy"] == "Fail" and "paramKind" not in spec and "paramRef" not in binding["spec"]
    assert set(spec["matchConstraints"]) == {"resourceRules"}
    assert matched_user(policy) == controller_user(docs)
    for validation in spec["validations"]:
        assert validation["reason"] == "Forbidden" and validation["message"].startswith("gpu-autoscaler may")


def test_the_validator_knows_the_policy_kinds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The schema check above is not vacuous: a misspelt field of the policy is an error."""
    import kubernetes_validate

    policy, _ = policy_of(rendered["base"])
    typo = yaml.safe_load(yaml.safe_dump(policy))
    typo["spec"]["matchCondition"] = typo["spec"].pop("matchConditions")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


@pytest.mark.parametrize("with_replacements", [True, False])
def test_an_overlay_that_moves_and_renames_the_install(tmp_path: Path, with_replacements: bool) -> None:
    """A user's overlay on production with namespace:, namePrefix: and nameSuffix: renames the policy in its binding
    (kustomizeconfig.yaml); the matchCondition follows the ServiceAccount only when the overlay repeats the base's
    replacements -- without them it still names gpu-autoscaler/gpu-autoscaler and confines nobody."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    overlay: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "platform",
        "namePrefix": "acme-",
        "nameSuffix": "-gpu",
        "resources": ["../deploy/overlays/production"],
    }
    if with_replacements:
        overlay["replacements"] = base["replacements"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    docs = kustomize(tmp_path / "mine")
    policy, binding = policy_of(docs)
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == "acme-gpu-autoscaler-patch-scope-gpu"
    assert controller_user(docs) == "system:serviceaccount:platform:acme-gpu-autoscaler-gpu"
    if with_replacements:
        assert matched_user(policy) == controller_user(docs)
    else:
        assert matched_user(policy) == "system:serviceaccount:gpu-autoscaler:gpu-autoscaler"


def _rules_granted(docs: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    """The rules of every Role and ClusterRole bound to ``user`` (a ServiceAccount) in the rendered documents."""
    _, _, namespace, name = user.split(":")
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
    rules = []
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        subjects = binding.get("subjects") or []
        if not any(
            s["kind"] == "ServiceAccount" and (s["namespace"], s["name"]) == (namespace, name) for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        scope = "" if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        rules += roles[(ref["kind"], scope, ref["name"])]["rules"]
    return rules


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_the_controller_may_patch_is_confined(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[overlay]
    policy, _ = policy_of(docs)
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    matched = {
        (g, r) for rule in rules if "UPDATE" in rule["operations"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    writable = {
        (group, resource)
        for rule in _rules_granted(docs, controller_user(docs))
        if {"patch", "update"} & set(rule["verbs"])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if "/" not in resource
    }
    assert writable - UNCONFINED <= matched, sorted(writable - UNCONFINED - matched)
    # the deletion-cost marks of a scale-down's replicas (every overlay but dry-run), and the leader label's Role
    assert (("", "pods") in writable) == (overlay != "overlays/dry-run")


def test_the_policy_lets_through_exactly_what_the_adapters_write(rendered: dict[str, list[dict[str, Any]]]) -> None:
    policy, _ = policy_of(rendered["base"])
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {op for rule in rules for op in rule["operations"]} == {"UPDATE"}
    # every version of each kind; scope "*" written out (the server's default: a second kubectl apply changes nothing)
    assert all(rule["apiVersions"] == ["*"] and rule["scope"] == "*" for rule in rules)
    matched = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    kinds = {(k.group, k.plural) for k in WORKLOAD_KINDS.values()}
    assert matched == kinds | {("cluster.x-k8s.io", "machines"), ("", "pods")}

    flag, annotations, labels = (variable(policy, n) for n in ("flag", "ownAnnotations", "ownLabels"))
    for kind, spec in WORKLOAD_KINDS.items():
        # the one spec field the writer flips (spec.runPolicy.suspend: runPolicy, then only its "suspend")
        assert spec.path[0] == "spec" and choose(flag, spec.plural) == spec.path[1], kind
        if len(spec.path) == 3:
            assert spec.path[1:] == ("runPolicy", "suspend")
        assert choose(annotations, spec.plural) == list(OUR_ANNOTATIONS), kind
        assert choose(labels, spec.plural) == [], kind
    assert "k == 'suspend'" in policy["spec"]["validations"][0]["expression"]
    assert choose(flag, "machines") == choose(flag, "pods") == ""  # nothing in their spec
    assert choose(annotations, "machines") == [DELETE_MACHINE_ANNOTATION, MARKED_BY_ANNOTATION]
    assert choose(labels, "machines") == []
    # a scale-down's chosen replicas (writer.py set_pod_deletion_cost): the cost and our mark beside it, nothing else
    assert choose(annotations, "pods") == [POD_DELETION_COST_ANNOTATION, DELETION_COST_BY_ANNOTATION]
    assert choose(labels, "pods") == [LEADER_LABEL]
