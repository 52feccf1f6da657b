"""The differential test of the two GPUScalingPolicy validators on a real kube-apiserver: every document of
tests/kube/test_crd_parity.py (the table, the expected differences, the corpus generated from the CRD's schema) is
created in a namespace with the CRD installed as deploy/ ships it, and parsed by the controller's ``validate_policy``
both as sent and as the apiserver stored it (read back: pruned, defaulted, its nulls kept or dropped -- what the
controller lists). Both verdicts must agree and name the same field; what the apiserver stores the parser reads as
the same policy as the document sent. A difference not listed in EXPECTED_DIFFERENCES fails, and so does a listed
one that is gone.

The last test is the upgrade: objects stored under the looser CRD of before (fractional periodSeconds, any
targetRef.apiVersion, any adoptHpa) become InvalidSpec when the controller loads them, and keep updating -- their
status included -- thanks to the apiserver's validation ratcheting (an unchanged invalid field is not refused on
update; Kubernetes 1.30 and later by default).
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from kubernetes import client

from autoscaler.adapters.kubernetes import INVALID_SPEC, KubeClusterWriter, PolicyLoader, WriterConfig
from autoscaler.adapters.kubernetes.policies import InvalidPolicy, LoadedPolicy, validate_policy
from autoscaler.adapters.kubernetes.status import condition
from autoscaler.policy import API_GROUP, API_VERSION, PLURAL
from tests.kube.test_crd_parity import (
    CASES,
    EXPECTED_DIFFERENCES,
    Case,
    document,
    generated_corpus,
    parser_fields,
    related,
    yaml_text,
)
from tests.realkube.control_plane import REPO, ApiError, ControlPlane
from tests.realkube.test_faults_real import install_crd

pytestmark = [pytest.mark.integration, pytest.mark.realkube]

POLICIES = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{ns}}/{PLURAL}"
CRD_FILE = REPO / "deploy" / "base" / "crd-gpuscalingpolicies.yaml"
UNKNOWN_FIELD = re.compile(r'unknown field \\?"([^"\\]+)\\?"')  # in a message, or a Warning header (quotes escaped)


@dataclass
class Outcome:
    """What the apiserver and the parser said about one document."""

    accepted: bool
    fields: list[str]  # the fields the apiserver named in its refusal (or its warnings)
    message: str
    stored: dict[str, Any] | None  # the object as read back after the create
    sent: LoadedPolicy | InvalidPolicy  # the parser on the document as sent
    read: LoadedPolicy | InvalidPolicy | None  # the parser on what the apiserver stored
    warnings: list[str] = field(default_factory=list)
    parser_fields: list[str] = field(default_factory=list)  # every field the parser finds at fault in what was sent

    def api_text(self) -> str:
        return "accept" if self.accepted else f"refused ({', '.join(self.fields)}): {self.message[:300]}"


def _send(cp: ControlPlane, ns: str, case: Case, name: str) -> tuple[int, Any, list[str]]:
    """POST the document as JSON (what a client library sends) or as YAML text (what kubectl's YAML becomes, read by
    the apiserver's own YAML decoder); APF's 429 of a busy apiserver is retried."""
    if case.yaml is not None:
        data, content_type = yaml_text(case, name).encode(), "application/yaml"
    else:
        body = document(case, name, ns)
        body["metadata"] = {"name": name}
        data, content_type = json.dumps(body).encode(), "application/json"
    params = urllib.parse.urlencode({"fieldValidation": case.field_validation})
    url = f"{cp.server}{POLICIES.format(ns=ns)}?{params}"
    headers = {
        "Authorization": f"Bearer {cp.tokens['admin']}",
        "Accept": "application/json",
        "Content-Type": content_type,
    }
    context = ssl.create_default_context(cafile=str(cp.ca_file))
    for attempt in range(20):
        request = urllib.request.Request(url, data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=15, context=context) as resp:
                return resp.status, json.loads(resp.read()), resp.headers.get_all("Warning") or []
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            if exc.code == 429 and attempt < 19:
                time.sleep(0.5)
                continue
            try:
                return exc.code, json.loads(raw), []
            except ValueError:
                return exc.code, raw.decode(errors="replace"), []
    raise AssertionError("unreachable")


def submit(cp: ControlPlane, ns: str, case: Case) -> Outcome:
    name = f"p-{secrets.token_hex(4)}"
    sent = validate_policy(document(case, name, ns))
    status, body, warnings = _send(cp, ns, case, name)
    if status == 201:
        stored = cp.get(f"{POLICIES.format(ns=ns)}/{name}")
        fields = [f for w in warnings for f in UNKNOWN_FIELD.findall(w)]
        return Outcome(True, fields, "", stored, sent, validate_policy(stored), warnings)
    assert status in (400, 422), (status, body)  # refused as invalid, never an error of the apiserver
    message = body.get("message", "") if isinstance(body, dict) else str(body)
    causes = (body.get("details") or {}).get("causes") or [] if isinstance(body, dict) else []
    fields = [c["field"] for c in causes if c.get("field")] + UNKNOWN_FIELD.findall(message)
    return Outcome(False, fields, message, None, sent, None, parser_fields=parser_fields(document(case, name, ns)))


def disagreement(outcome: Outcome, field: str | None = None) -> str | None:
    """Why the two verdicts disagree (None when they agree); ``field``: the one the apiserver must name."""
    sent, read = outcome.sent, outcome.read
    if outcome.accepted:
        if not isinstance(read, LoadedPolicy):
            return f"stored, and what was stored the controller refuses: {read.text if read else '?'}"
        if not isinstance(sent, LoadedPolicy):
            return f"the apiserver accepts it (warnings: {outcome.warnings}), the parser refuses it: {sent.text}"
        if sent.spec != read.spec:
            return f"the stored object is another policy: sent {sent.spec!r}, read back {read.spec!r}"
        return None if field is None else f"accepted, expected a refusal naming {field}"
    if isinstance(sent, LoadedPolicy):
        return f"the apiserver refuses it ({outcome.api_text()}), the parser accepts it"
    if field is not None and not any(related(field, f) for f in outcome.fields):
        return f"the apiserver does not name {field}: {outcome.api_text()}"
    named = outcome.parser_fields
    if not any(related(p, f) for p in named for f in outcome.fields):
        return f"the parser names {named} ({sent.text}), the apiserver {outcome.fields}: {outcome.message[:300]}"
    return None


@pytest.fixture(scope="module")
def parity_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """One namespace for the whole corpus (hundreds of objects), the CRD installed as deploy/ ships it."""
    install_crd(control_plane)
    name = f"rk-crd-parity-{secrets.token_hex(3)}"
    control_plane.create_namespace(name)
    try:
        yield name
    finally:
        control_plane.delete_namespace(name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_apiserver_and_the_parser_agree(control_plane: ControlPlane, parity_namespace: str, name: str) -> None:
    case = CASES[name]
    outcome = submit(control_plane, parity_namespace, case)
    problem = disagreement(outcome, case.field)
    assert problem is None, f"{name}: {problem}"
    if case.field is not None:
        # both messages name the field: the apiserver's cause, the parser's "<field>: <why>"
        assert isinstance(outcome.sent, InvalidPolicy) and outcome.sent.text.startswith(f"{outcome.sent.field}: ")


@pytest.mark.parametrize("name", sorted(EXPECTED_DIFFERENCES))
def test_each_expected_difference_is_still_there(control_plane: ControlPlane, parity_namespace: str, name: str) -> None:
    """Exactly as recorded: when one is gone (a fix on either side), move it to CASES."""
    difference = EXPECTED_DIFFERENCES[name]
    outcome = submit(control_plane, parity_namespace, difference.case)
    if difference.apiserver == "accept":
        assert outcome.accepted, outcome.api_text()
        # what the controller lists, it accepts: the difference never becomes an InvalidSpec at run time
        assert isinstance(outcome.read, LoadedPolicy), outcome.read
    else:
        assert not outcome.accepted and difference.apiserver in outcome.fields, outcome.api_text()
    parsed = outcome.sent
    assert ("accept" if isinstance(parsed, LoadedPolicy) else parsed.field) == difference.parser, parsed
    if difference.case.field_validation != "Strict":
        # the apiserver warned about what it pruned, naming the field the parser refuses
        assert difference.parser in outcome.fields, outcome.warnings


def test_the_generated_corpus_agrees(control_plane: ControlPlane, parity_namespace: str) -> None:
    """Every field of the CRD's schema mutated one at a time (null, absent, wrong type, each side of each bound and
    CEL rule, enum case, length, pattern, unknown fields) in an otherwise valid policy."""
    corpus = generated_corpus()
    problems = []
    accepted = 0
    for name, case in corpus.items():
        outcome = submit(control_plane, parity_namespace, case)
        accepted += outcome.accepted
        problem = disagreement(outcome)
        if problem is not None:
            problems.append(f"{name}: {problem}")
    assert not problems, "\n".join(problems)
    assert 0 < accepted < len(corpus)  # both verdicts are in it


# ---- the upgrade: objects stored under the looser CRD of before -------------------------------------------------


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]  # type: ignore[no-any-return]


def _looser(spec: dict[str, Any]) -> None:
    """The schema of the CRD before this tightening: periodSeconds any number in (0, 1800], any apiVersion, any
    adoptHpa."""
    props = spec["properties"]
    for direction in ("scaleUp", "scaleDown"):
        policy = props["behavior"]["properties"][direction]["properties"]["policies"]["items"]["properties"]
        policy["periodSeconds"] = {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1800}
    props["targetRef"]["properties"]["apiVersion"].pop("enum")
    props["adoptHpa"].pop("pattern")
    props["adoptHpa"].pop("maxLength")


def _with_schema(cp: ControlPlane, ns: str, change: Callable[[dict[str, Any]], None] | None, probe: Case) -> None:
    """Put the CRD's spec schema changed by ``change`` (None: as deploy/ ships it) and wait until the apiserver
    validates with it (``probe`` admitted by the changed schema, refused by the shipped one)."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    shipped = _schema(crd)
    current = cp.get(path)
    spec = json.loads(json.dumps(shipped))
    if change is not None:
        change(spec)
    current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = spec
    cp.request("PUT", path, current)
    body = document(probe, f"probe-{secrets.token_hex(3)}", ns)
    body["metadata"].pop("namespace")

    def admitted() -> bool:
        try:
            cp.request("POST", POLICIES.format(ns=ns), body, params={"dryRun": "All"})
        except ApiError as err:
            assert err.status == 422, err
            return False
        return True

    want = change is not None
    cp.wait(f"the CRD {'loosened' if want else 'as shipped'}", lambda: admitted() == want or None, timeout_s=30)


def test_objects_stored_before_the_tightening_are_invalid_spec_and_still_update(
    control_plane: ControlPlane, namespace: str, api_client: client.ApiClient
) -> None:
    cp, ns = control_plane, namespace
    install_crd(cp)
    fractional = {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 15.5}]}}}
    before = {
        "period": (fractional, "spec.behavior.scaleUp.policies[0].periodSeconds"),
        "apiversion": (
            {"targetRef": {"name": "apiversion", "apiVersion": "apps/v1beta2"}},
            "spec.targetRef.apiVersion",
        ),
        "adopt": ({"adoptHpa": "Web HPA"}, "spec.adoptHpa"),
    }
    _with_schema(cp, ns, _looser, Case(fractional))
    try:
        for name, (spec, _) in before.items():
            body = document(Case(spec), name, ns)
            body["metadata"].pop("namespace")
            cp.request("POST", POLICIES.format(ns=ns), body)
    finally:
        _with_schema(cp, ns, None, Case(fractional))

    # the controller: InvalidSpec naming the field, written through the status subresource (ratcheting lets the
    # apiserver take an update of an object whose unchanged spec its schema now refuses)
    loader = PolicyLoader(api_client, [ns])
    writer = KubeClusterWriter(api_client, WriterConfig(reporting_instance="crd-parity-test"))
    policies = loader.sync(writer, time.time())
    assert not policies.valid
    assert sorted((p.name, p.field) for p in policies.invalid) == sorted((n, f) for n, (_, f) in before.items())
    for name in before:
        stored = cp.get(f"{POLICIES.format(ns=ns)}/{name}")
        invalid = condition(stored.get("status"), INVALID_SPEC)
        assert invalid and invalid["status"] == "True", stored.get("status")

    merge = "application/merge-patch+json"
    # another field of the spec: ratcheted, accepted
    cp.request("PATCH", f"{POLICIES.format(ns=ns)}/period", {"spec": {"maxReplicas": 7}}, content_type=merge)
    # the invalid field changed to another invalid value: refused, naming it
    with pytest.raises(ApiError) as err:
        cp.request(
            "PATCH",
            f"{POLICIES.format(ns=ns)}/period",
            {"spec": {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 16.5}]}}}},
            content_type=merge,
        )
    assert err.value.status == 422
    assert any(c.get("field") == before["period"][1] for c in err.value.body["details"]["causes"]), err.value
    # fixed: the controller takes it again
    fixed = {"spec": {"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]}}}}
    cp.request("PATCH", f"{POLICIES.format(ns=ns)}/period", fixed, content_type=merge)
    policies = loader.sync(writer, time.time())
    assert [p.name for p in policies.valid] == ["period"]
