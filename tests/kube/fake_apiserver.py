"""A fake Kubernetes API server that follows the real REST semantics for what the autoscaler's adapters use.

Why it still exists next to the real control plane (tests/realkube: etcd, kube-apiserver, controller-manager,
scheduler, kwok, and since issue 13 item 6 a fault-injecting proxy in front of the apiserver, realkube/fault_proxy.py):

- Speed. A server starts in about 1 ms per test, so the adapter unit tests (tests/kube) run in seconds; the real
  plane needs about 5 s to start per session plus a namespace, real objects and waits for the controllers per test.
- Exact, still states. ``seed`` stores any object with any status (a Deployment's ready replicas, pods Running on
  nodes that do not exist, a PDB's ``disruptionsAllowed`` with no disruption controller, Job conditions, two
  policies created in the same second) and nothing rewrites it; ``update_object`` lets a test write as "another
  client" at an exact point between an adapter's read and its write (a genuine resourceVersion conflict);
  ``simulate_deployments`` keeps pods fixed so the fault suite's Prometheus-side cases (runtime/test_faults.py) and
  runtime/test_e2e.py see only the controller's writes. On the real plane the controllers and kwok move all this.
- Scale. benchmarks/bench_kube.py seeds 500 nodes and 2,000 pods in-process and counts requests (``/_fake/stats``):
  against the real apiserver on two cores the benchmark would measure the apiserver, not the adapters.
- No Go toolchain. ``SKIP_REALKUBE=1`` local runs, and machines without Go >= 1.26 or the module proxy, cannot
  build the real plane (a cold build is about 1,100 CPU-seconds). In CI (``.ci/run`` -> ``scripts/test.sh``) the
  real plane is always built and its absence is a failure, so there the fake buys speed and determinism, not
  coverage: every adapter path it serves also runs against the real apiserver (realkube/test_real_apiserver.py,
  test_rbac.py, test_adapter_faults_real.py, test_faults_real.py, test_e2e_real.py).

What the real plane made unnecessary was removed (issue 13, item 6): fault injection (``inject``/``slow``: status
codes, Retry-After, slow answers, dropped connections; now the proxy, with the tests that used it moved to
realkube/test_adapter_faults_real.py and realkube/test_faults_real.py), bearer-token authentication (the real
authenticator and RBAC: realkube/test_rbac.py), discovery and ``/version`` (only kubectl used them: ``kubectl apply
-k`` runs on the real plane), strategic-merge and JSON patches (the adapters send merge patches only), manual
continue-token expiry (a 410 through the proxy) and the subprocess mode.

Semantics implemented (each checked against the upstream apiserver behaviour):
- paths ``/api/v1/...`` and ``/apis/{group}/{version}/...``, namespaced and cluster-wide;
- list with ``limit``/``continue`` served from a consistent snapshot (like etcd at the list's resourceVersion),
  ``remainingItemCount`` (omitted with selectors), ``410 Expired`` for continue tokens of lists no longer kept
  (``continue_ttl_s``, ``max_list_snapshots``); ``labelSelector`` (=, ==, !=, in, notin, exists, !exists) and
  ``fieldSelector`` (=, ==, != on the fields the real server supports per kind);
- create (201, 409 AlreadyExists, generateName), get, replace (PUT, with or without Content-Type), merge patch
  (the only patch type the adapters send; 415 for the others), delete;
- ``resourceVersion`` bumped on every real write and left alone by no-op writes; a ``resourceVersion`` in a PUT or
  PATCH body is a precondition (409 Conflict when stale); custom resources refuse unconditional PUT (422);
- a ``metadata.uid`` in a PUT body (main resource, status or scale) is a precondition: another object's uid is 409
  "Precondition failed: UID in precondition", checked before the resourceVersion; a merge patch of the main resource
  that changes the uid is 422 (field is immutable), a status or scale patch ignores it (as the real server does);
- ``metadata.generation`` bumped on spec changes; status subresources (main-resource writes keep status, status
  writes keep everything else); scale subresources (``autoscaling/v1`` Scale) for Deployments, StatefulSets and
  custom resources that declare one (Cluster API MachineDeployment);
- CustomResourceDefinitions: posting or seeding one registers its kind; objects are defaulted, pruned and validated
  against its openAPIV3Schema (422 with field causes);
- ``POST pods/{name}/eviction`` with the eviction handler's rules: terminal, pending and terminating pods are deleted
  without a PDB check; two PDBs -> 500; ``disruptionsAllowed`` 0 or a PDB not yet observed -> 429 with a
  ``DisruptionBudget`` cause; otherwise the PDB budget is decremented and the pod deleted (201 Status Success);
- Events (core/v1 and events.k8s.io/v1, validated like the real server: 422 when required fields are missing);
- Leases (create 409 AlreadyExists, update with a stale resourceVersion 409 Conflict) through the generic rules.

Not implemented: watch (400, loudly), server-side apply (415), discovery, authentication, CEL validation rules,
admission webhooks, RBAC.

Test hooks (Python API on the server object): ``seed``/``seed_yaml``, ``get``/``objects``/``update_object``/
``delete_object``, a request log (``requests``, ``request_count``, ``/_fake/stats``) and ``write_kubeconfig``.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

JSON = dict[str, Any]

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
_CORE_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
_EVENT_FIELDS = frozenset(
    {
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "reason",
        "reportingController",
        "type",
    }
)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- errors -------------------------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answer: becomes a ``kind: Status`` body with this HTTP code."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSON | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = dict(headers or {})

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.resource_name} "{name}" not found', rt.details(name))


def _conflict(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.resource_name} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        rt.details(name),
    )


def _storage_key(rt: ResourceType, ns: str, name: str) -> str:
    """The object's etcd key, as the real apiserver names it in a storage error: custom resources under
    ``/registry/<group>/<plural>``, built-in kinds under their resource's own prefix (the few that differ listed)."""
    prefixes = {
        ("", "nodes"): "minions",
        ("", "services"): "services/specs",
        ("apiextensions.k8s.io", "customresourcedefinitions"): "apiextensions.k8s.io/customresourcedefinitions",
    }
    prefix = f"{rt.group}/{rt.plural}" if rt.custom else prefixes.get(rt.key, rt.plural)
    return f"/registry/{prefix}/{ns}/{name}" if rt.namespaced else f"/registry/{prefix}/{name}"


def _uid_precondition_failed(rt: ResourceType, ns: str, name: str, sent: str, stored: str) -> ApiError:
    """409 for a PUT whose ``metadata.uid`` is not the stored object's: the real apiserver takes a uid in an update's
    body as a precondition (``rest.DefaultUpdatedObjectInfo``), checked by the storage layer before the
    resourceVersion (so it wins over a stale one, and over the 422 of a custom resource's missing resourceVersion).
    Body as kube-apiserver writes it (checked in tests/realkube/test_review32_real.py)."""
    details = rt.details(name)
    if not rt.group:
        details.pop("group")  # StatusDetails.group is omitempty
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.resource_name} "{name}": StorageError: invalid object, Code: 4, '
        f"Key: {_storage_key(rt, ns, name)}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
        f"UID in precondition: {sent}, UID in object meta: {stored}",
        details,
    )


def _uid_immutable(rt: ResourceType, name: str, sent: str) -> ApiError:
    """422 for a patch of the main resource that changes ``metadata.uid``: a patch carries no precondition (its
    updated-object info has no object to take one from), the uid is only validated as immutable. The real apiserver
    names the field twice for a custom resource (the object-meta and the custom-resource validation both report it),
    once for a built-in kind. Status and scale patches ignore the uid (their strategies keep the stored metadata).
    Body as kube-apiserver writes it (checked in tests/realkube/test_review32_real.py)."""
    message = f'Invalid value: "{sent}": field is immutable'
    cause = {"reason": "FieldValueInvalid", "message": message, "field": "metadata.uid"}
    qualified = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    details: JSON = {"name": name, "group": rt.group, "kind": rt.kind, "causes": [cause] * (2 if rt.custom else 1)}
    if not rt.group:
        details.pop("group")
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: metadata.uid: {message}', details)


def _invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 like the apiserver's field.ErrorList: ``causes`` are (field, message)."""
    summary = ", ".join(f"{f}: {m}" for f, m in causes)
    details = rt.details(name)
    details["causes"] = [{"reason": "FieldValueInvalid", "message": f"{f}: {m}", "field": f} for f, m in causes]
    return ApiError(422, "Invalid", f'{rt.kind} "{name}" is invalid: {summary}', details)


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


# ---- resource types -----------------------------------------------------------------------------------------------


@dataclass
class ResourceType:
    group: str
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    # (spec replicas path, status replicas path, label selector path); dotted paths like ".spec.replicas"
    scale: tuple[str, str, str | None] | None = None
    custom: bool = False  # a CRD: no strategic merge patch, no unconditional update, schema validation
    schema: JSON | None = None
    field_selectors: frozenset[str] = frozenset()
    validator: Callable[[JSON], list[tuple[str, str]]] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def resource_name(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str) -> JSON:
        return {"name": name, "group": self.group, "kind": self.plural}

    def api_version(self, version: str | None = None) -> str:
        v = version or self.versions[0]
        return f"{self.group}/{v}" if self.group else v


def _validate_scale_replicas(obj: JSON) -> list[tuple[str, str]]:
    replicas = (obj.get("spec") or {}).get("replicas")
    if replicas is None:
        return []
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        return [("spec.replicas", f"Invalid value: {json.dumps(replicas)}: must be an integer")]
    if replicas < 0:
        return [("spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0")]
    return []


_EVENT_TYPES = '"Normal", "Warning"'


def _validate_event_v1(obj: JSON) -> list[tuple[str, str]]:
    """events.k8s.io/v1 create validation (ValidateEventCreate for v1)."""
    errs: list[tuple[str, str]] = []
    for key in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
        if not obj.get(key):
            errs.append((key, "Required value"))
    if obj.get("type") not in ("Normal", "Warning"):
        errs.append(("type", f"Unsupported value: {json.dumps(obj.get('type'))}: supported values: {_EVENT_TYPES}"))
    if len(obj.get("note") or "") > 1024:
        errs.append(("note", "Too long: may not be longer than 1024"))
    for key in ("reason", "action"):
        if len(obj.get(key) or "") > 128:
            errs.append((key, "Too long: may not be longer than 128"))
    series = obj.get("series")
    if series is not None:
        if (series.get("count") or 0) < 2:
            errs.append(("series.count", "Invalid value: should be at least 2"))
        if not series.get("lastObservedTime"):
            errs.append(("series.lastObservedTime", "Required value"))
    regarding = obj.get("regarding") or {}
    ns = (obj.get("metadata") or {}).get("namespace")
    if regarding.get("namespace") and ns and regarding["namespace"] != ns:
        errs.append(("regarding.namespace", "Invalid value: does not match event.namespace"))
    return errs


def _validate_core_event(obj: JSON) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    involved = obj.get("involvedObject") or {}
    ns = (obj.get("metadata") or {}).get("namespace")
    if involved.get("namespace") and ns and involved["namespace"] != ns:
        errs.append(("involvedObject.namespace", "Invalid value: does not match event.namespace"))
    if obj.get("type") not in (None, "", "Normal", "Warning"):
        errs.append(("type", f"Unsupported value: {json.dumps(obj.get('type'))}: supported values: {_EVENT_TYPES}"))
    return errs


def builtin_types() -> list[ResourceType]:
    scale_dep = (".spec.replicas", ".status.replicas", None)
    return [
        ResourceType("", ("v1",), "namespaces", "Namespace", namespaced=False, status_subresource=True),
        ResourceType(
            "",
            ("v1",),
            "nodes",
            "Node",
            namespaced=False,
            status_subresource=True,
            field_selectors=frozenset({"spec.unschedulable"}),
        ),
        ResourceType("", ("v1",), "pods", "Pod", status_subresource=True, field_selectors=_POD_FIELDS),
        ResourceType(
            "", ("v1",), "events", "Event", field_selectors=_CORE_EVENT_FIELDS, validator=_validate_core_event
        ),
        ResourceType("", ("v1",), "services", "Service", status_subresource=True),
        ResourceType("", ("v1",), "configmaps", "ConfigMap"),
        ResourceType(
            "apps",
            ("v1",),
            "deployments",
            "Deployment",
            status_subresource=True,
            scale=scale_dep,
            validator=_validate_scale_replicas,
        ),
        ResourceType(
            "apps",
            ("v1",),
            "statefulsets",
            "StatefulSet",
            status_subresource=True,
            scale=scale_dep,
            validator=_validate_scale_replicas,
        ),
        ResourceType("apps", ("v1",), "replicasets", "ReplicaSet", status_subresource=True, scale=scale_dep),
        ResourceType("batch", ("v1",), "jobs", "Job", status_subresource=True),
        ResourceType("policy", ("v1",), "poddisruptionbudgets", "PodDisruptionBudget", status_subresource=True),
        ResourceType("scheduling.k8s.io", ("v1",), "priorityclasses", "PriorityClass", namespaced=False),
        ResourceType("coordination.k8s.io", ("v1",), "leases", "Lease"),
        ResourceType(
            "autoscaling", ("v2",), "horizontalpodautoscalers", "HorizontalPodAutoscaler", status_subresource=True
        ),
        ResourceType(
            "events.k8s.io", ("v1",), "events", "Event", field_selectors=_EVENT_FIELDS, validator=_validate_event_v1
        ),
        ResourceType(
            "apiextensions.k8s.io",
            ("v1",),
            "customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            status_subresource=True,
        ),
    ]


def crd_resource_type(crd: JSON) -> ResourceType:
    """The resource type a CustomResourceDefinition (apiextensions.k8s.io/v1) declares."""
    spec = crd["spec"]
    names = spec["names"]
    versions = [v for v in spec.get("versions", []) if v.get("served", True)]
    if not versions:
        raise _bad_request(f"CustomResourceDefinition {crd['metadata']['name']} serves no version")
    storage = next((v for v in versions if v.get("storage")), versions[0])
    subresources = storage.get("subresources") or {}
    scale = subresources.get("scale")
    return ResourceType(
        group=spec["group"],
        versions=tuple(v["name"] for v in versions),
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        status_subresource="status" in subresources,
        scale=(scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath"))
        if scale
        else None,
        custom=True,
        schema=(storage.get("schema") or {}).get("openAPIV3Schema"),
    )


# ---- structural schema: defaulting, pruning, validation (a subset of apiextensions' rules) ------------------------


def validate_structural(value: Any, schema: JSON, path: str = "") -> tuple[Any, list[tuple[str, str]]]:
    """Default, prune and validate ``value`` against an openAPIV3Schema, like the apiserver does for CRs.

    Returns the defaulted/pruned value and a list of (field path, message). Also used by tests to check example
    objects against the generated CRD schema.
    """
    errors: list[tuple[str, str]] = []
    return _walk(value, schema, path, errors, top=True), errors


def _walk(value: Any, schema: JSON, path: str, errors: list[tuple[str, str]], top: bool = False) -> Any:
    shown = path or "<root>"
    if value is None:
        if not schema.get("nullable"):
            errors.append((shown, f'Invalid value: "null": {shown} in body must be of type {schema.get("type")}'))
        return value
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errors.append((shown, f"Invalid value: {json.dumps(value)}: must be an integer or a string"))
        return value
    kind = schema.get("type")
    type_ok = {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        None: True,
    }.get(kind, True)
    if not type_ok:
        errors.append((shown, f"Invalid value: {json.dumps(value)}: {shown} in body must be of type {kind}"))
        return value
    if kind == "object" or (kind is None and isinstance(value, dict)):
        props: JSON | None = schema.get("properties")
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        out: JSON = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if top and key in ("apiVersion", "kind", "metadata"):
                out[key] = item  # never pruned, validated by the server itself
            elif props is not None and key in props:
                out[key] = _walk(item, props[key], sub, errors)
            elif isinstance(additional, dict):
                out[key] = _walk(item, additional, sub, errors)
            elif preserve or (props is None and additional is None and kind is None):
                out[key] = item
            # else: pruned, exactly as the apiserver drops unknown fields of a structural schema
        for key, sub_schema in (props or {}).items():
            if key not in out and "default" in sub_schema:
                out[key] = copy.deepcopy(sub_schema["default"])
                out[key] = _walk(out[key], sub_schema, f"{path}.{key}" if path else key, errors)
        for key in schema.get("required", []):
            if key not in out:
                errors.append((f"{path}.{key}" if path else key, "Required value"))
        value = out
    elif kind == "array":
        items = schema.get("items")
        if items:
            value = [_walk(v, items, f"{path}[{i}]", errors) for i, v in enumerate(value)]
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append((shown, f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append((shown, f"Invalid value: {len(value)}: must have at least {schema['minItems']} items"))
    elif kind == "string":
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                (shown, f"Invalid value: {json.dumps(value)}: should be at least {schema['minLength']} chars long")
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append((shown, f"Too long: may not be longer than {schema['maxLength']}"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append((shown, f"Invalid value: {json.dumps(value)}: should match '{schema['pattern']}'"))
    elif kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None:
            if schema.get("exclusiveMinimum") and not value > low:
                errors.append((shown, f"Invalid value: {value}: {shown} in body should be greater than {low}"))
            elif value < low:
                errors.append(
                    (shown, f"Invalid value: {value}: {shown} in body should be greater than or equal to {low}")
                )
        if high is not None:
            if schema.get("exclusiveMaximum") and not value < high:
                errors.append((shown, f"Invalid value: {value}: {shown} in body should be less than {high}"))
            elif value > high:
                errors.append(
                    (shown, f"Invalid value: {value}: {shown} in body should be less than or equal to {high}")
                )
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append((shown, f"Unsupported value: {json.dumps(value)}: supported values: {allowed}"))
    return value


# ---- selectors ----------------------------------------------------------------------------------------------------


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``in (a,b)`` parentheses."""
    terms, depth, current = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    terms.append("".join(current).strip())
    return [t for t in terms if t]


_SET_TERM = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$")


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over a labels mapping; raises ApiError 400 on a malformed selector."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_terms(selector):
        m = _SET_TERM.match(term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
            continue
        for op in ("!=", "==", "="):
            if op in term:
                key, _, value = term.partition(op)
                key, value = key.strip(), value.strip()
                if not key:
                    raise _bad_request(f"unable to parse requirement: {term!r}")
                if op == "!=":
                    checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
                else:
                    checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
                break
        else:
            if term.startswith("!"):
                missing = term[1:].strip()
                checks.append(lambda labels, k=missing: k not in labels)
            elif re.match(r"^[A-Za-z0-9./_-]+$", term):
                checks.append(lambda labels, k=term: k in labels)
            else:
                raise _bad_request(f"unable to parse requirement: {term!r}")
    return lambda labels: all(check(labels) for check in checks)


def _get_path(obj: JSON, dotted: str) -> Any:
    current: Any = obj
    for part in dotted.strip(".").split("."):
        if not isinstance(current, dict):
            return None
        current = current.get(part)
    return current


_MISSING = object()


def _at_path(obj: Any, field_path: str) -> Any:
    """The value at an error's field path (``spec.a[0].b``), or a sentinel when absent."""
    node = obj
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", field_path):
        if index:
            if not isinstance(node, list) or int(index) >= len(node):
                return _MISSING
            node = node[int(index)]
        else:
            if not isinstance(node, dict) or name not in node:
                return _MISSING
            node = node[name]
    return node


def _set_path(obj: JSON, dotted: str, value: Any) -> None:
    parts = dotted.strip(".").split(".")
    current = obj
    for part in parts[:-1]:
        current = current.setdefault(part, {})
    current[parts[-1]] = value


def _field_value(obj: JSON, name: str) -> str:
    value = _get_path(obj, name)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str, rt: ResourceType) -> Callable[[JSON], bool]:
    checks: list[Callable[[JSON], bool]] = []
    allowed = {"metadata.name", "metadata.namespace"} | set(rt.field_selectors)
    for term in _split_terms(selector):
        for op in ("!=", "==", "="):
            if op in term:
                name, _, value = term.partition(op)
                name, value = name.strip(), value.strip()
                break
        else:
            raise _bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        if name not in allowed:
            raise _bad_request(f"field label not supported: {name}")
        if op == "!=":
            checks.append(lambda o, n=name, v=value: _field_value(o, n) != v)
        else:
            checks.append(lambda o, n=name, v=value: _field_value(o, n) == v)
    return lambda obj: all(check(obj) for check in checks)


# ---- patches ------------------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- request log ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: Mapping[str, str]
    content_type: str | None
    body: Any
    status: int
    duration_s: float
    time: float = field(default_factory=time.time)


@dataclass
class _ListSnapshot:
    items: list[JSON]
    resource_version: str
    query_key: tuple[Any, ...]
    created: float


# ---- the server ---------------------------------------------------------------------------------------------------


class FakeApiServer:
    """In-memory API server. Start with ``start()`` or as a context manager; ``url`` is the base URL.

    ``simulate_deployments``: a minimal deployment controller - status replicas follow spec.replicas at once.
    ``continue_ttl_s`` / ``max_list_snapshots``: how long / how many paginated lists stay continuable.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        simulate_deployments: bool = False,
        continue_ttl_s: float = 300.0,
        max_list_snapshots: int = 64,
        record_requests: bool = True,
    ) -> None:
        self._host = host
        self._requested_port = port
        self.simulate_deployments = simulate_deployments
        self.continue_ttl_s = continue_ttl_s
        self.max_list_snapshots = max_list_snapshots
        self.record_requests = record_requests
        self._lock = threading.RLock()
        self._rv = 0
        self._types: dict[tuple[str, str], ResourceType] = {}
        self._kinds: dict[tuple[str, str], ResourceType] = {}
        self._store: dict[tuple[str, str], dict[tuple[str, str], JSON]] = {}
        self._sorted_keys: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._snapshots: OrderedDict[str, _ListSnapshot] = OrderedDict()
        self.requests: list[RequestRecord] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for rt in builtin_types():
            self.register_type(rt)

    # -- lifecycle --

    def start(self) -> FakeApiServer:
        handler = type("_BoundHandler", (_Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer((self._host, self._requested_port), handler)
        self._httpd.daemon_threads = True
        # A short poll interval: stop() waits for it, and tests start and stop a server each.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace=namespace)

    # -- types --

    def register_type(self, rt: ResourceType) -> None:
        with self._lock:
            self._types[rt.key] = rt
            self._kinds[(rt.group, rt.kind)] = rt
            self._store.setdefault(rt.key, {})

    def register_crd(self, crd: JSON) -> ResourceType:
        rt = crd_resource_type(crd)
        self.register_type(rt)
        return rt

    def _type_for(self, api_version: str, kind: str) -> ResourceType:
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        rt = self._kinds.get((group, kind))
        if rt is None:
            raise KeyError(f"no resource type registered for {api_version} {kind} (seed its CRD first)")
        return rt

    # -- direct state access for tests (no HTTP, no faults) --

    def seed(self, *objects: JSON | Iterable[JSON]) -> int:
        """Store objects as they are (status included, no validation); CRDs register their kinds first.

        Returns how many objects were stored; read them back with ``get`` (uid, resourceVersion...).
        """
        flat: list[JSON] = []
        for item in objects:
            if isinstance(item, dict):
                flat.extend(item.get("items", []) if item.get("kind") == "List" else [item])
            else:
                flat.extend(item)
        # CRDs first, so that the custom objects in the same batch have a type
        flat.sort(key=lambda o: o.get("kind") != "CustomResourceDefinition")
        stored = 0
        with self._lock:
            for obj in flat:
                obj = copy.deepcopy(obj)
                rt = self._type_for(obj["apiVersion"], obj["kind"])
                meta = obj.setdefault("metadata", {})
                if rt.namespaced:
                    meta.setdefault("namespace", "default")
                else:
                    meta.pop("namespace", None)
                self._fill_metadata(meta)
                key = (meta.get("namespace", ""), meta["name"])
                if key not in self._store[rt.key]:
                    self._sorted_keys.pop(rt.key, None)
                self._store[rt.key][key] = obj
                if rt.kind == "CustomResourceDefinition":
                    self.register_crd(obj)
                stored += 1
        return stored

    def seed_yaml(self, source: str | Path) -> int:
        """Seed every document of a YAML file (path) or string."""
        text = Path(source).read_text() if isinstance(source, Path) or "\n" not in str(source) else str(source)
        return self.seed([doc for doc in yaml.safe_load_all(text) if doc])

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> JSON | None:
        with self._lock:
            rt = self._type_for(api_version, kind)
            obj = self._store[rt.key].get(((namespace or "default") if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[JSON]:
        with self._lock:
            rt = self._type_for(api_version, kind)
            return [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._store[rt.key].items())
                if namespace is None or ns == namespace
            ]

    def update_object(self, obj: JSON) -> JSON:
        """Replace an object as another client would (bumps resourceVersion); for tests that race the adapter."""
        with self._lock:
            rt = self._type_for(obj["apiVersion"], obj["kind"])
            meta = obj["metadata"]
            key = (meta.get("namespace", "default") if rt.namespaced else "", meta["name"])
            cur = self._store[rt.key].get(key)
            new = copy.deepcopy(obj)
            if cur is not None:
                for k in ("uid", "creationTimestamp"):
                    new["metadata"][k] = cur["metadata"].get(k)
            self._fill_metadata(new["metadata"])
            new["metadata"]["resourceVersion"] = self._next_rv()
            if key not in self._store[rt.key]:
                self._sorted_keys.pop(rt.key, None)
            self._store[rt.key][key] = new
            return copy.deepcopy(new)

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        with self._lock:
            rt = self._type_for(api_version, kind)
            self._store[rt.key].pop(((namespace or "default") if rt.namespaced else "", name), None)
            self._sorted_keys.pop(rt.key, None)

    @property
    def resource_version(self) -> int:
        return self._rv

    # -- request log --

    def request_count(self, method: str | None = None, path: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (method is None or r.method == method.upper()) and (path is None or re.search(path, r.path))
            )

    def clear_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    def _record(self, record: RequestRecord) -> None:
        if self.record_requests:
            with self._lock:
                self.requests.append(record)

    # -- internals --

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _fill_metadata(self, meta: JSON) -> None:
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_rv()

    def _sorted(self, rt: ResourceType) -> list[tuple[str, str]]:
        keys = self._sorted_keys.get(rt.key)
        if keys is None:
            keys = sorted(self._store[rt.key])
            self._sorted_keys[rt.key] = keys
        return keys

    def handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], JSON]:
        """Serve one request; returns (status, extra headers, JSON body)."""
        parts = urlsplit(target)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            result = self._route(method, path, query, headers, body)
            return result[0], {}, result[1]
        except ApiError as exc:
            return exc.code, exc.headers, exc.status()

    def _route(
        self, method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str], body: bytes
    ) -> tuple[int, JSON]:
        segments = [unquote(s) for s in path.split("/") if s]
        if path.startswith("/_fake/"):
            return self._fake_endpoint(method, segments[1:])
        if not segments or segments[0] in ("healthz", "readyz", "livez"):
            return 200, {"status": "ok"}
        if segments[0] == "api":
            group, rest = "", segments[1:]
        elif segments[0] == "apis":
            group, rest = (segments[1] if len(segments) > 1 else None), segments[2:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if group is None or len(rest) < 2:  # discovery: kubectl's business, not the adapters'
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        version, rest = rest[0], rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        if len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        with self._lock:
            rt = self._types.get((group, plural))
        if rt is None or version not in rt.versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and namespace is None and name is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rt.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip() or None
        payload: Any = None
        if body:
            try:
                payload = yaml.safe_load(body) if ctype == APPLY else json.loads(body)
            except ValueError as exc:
                raise _bad_request(f"the body of the request is not valid JSON: {exc}") from None
        if name is None:
            if method == "GET":
                return self._list(rt, version, namespace, query)
            if method == "POST":
                return self._create(rt, version, namespace or "", payload, dry_run="dryRun" in query)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on a collection by the fake")
        ns = namespace or ""
        if sub == "status" and not rt.status_subresource:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub in (None, "status"):
            if method == "GET":
                return 200, self._read(rt, version, ns, name)
            if method == "PUT":
                return self._update(rt, version, ns, name, payload, sub)
            if method == "PATCH":
                return self._patch(rt, version, ns, name, payload, ctype, sub)
            if method == "DELETE" and sub is None:
                return self._delete(rt, version, ns, name, payload)
        elif sub == "scale" and rt.scale is not None:
            if method == "GET":
                with self._lock:
                    return 200, self._scale_of(rt, self._current(rt, ns, name))
            if method in ("PUT", "PATCH"):
                return self._write_scale(rt, ns, name, payload, ctype if method == "PATCH" else None)
        elif sub == "eviction" and rt.key == ("", "pods") and method == "POST":
            return self._evict(ns, name, payload, dry_run="dryRun" in query)
        raise ApiError(405, "MethodNotAllowed", f"{method} {path} is not supported by the fake")

    def _fake_endpoint(self, method: str, segments: list[str]) -> tuple[int, JSON]:
        """Test-only endpoints for a server running in another process."""
        if segments == ["stats"] and method == "GET":
            with self._lock:
                by_method: dict[str, int] = {}
                for r in self.requests:
                    by_method[r.method] = by_method.get(r.method, 0) + 1
                return 200, {"requests": len(self.requests), "byMethod": by_method, "resourceVersion": self._rv}
        if segments == ["reset"] and method == "POST":
            self.clear_requests()
            return 200, {"requests": 0}
        raise ApiError(404, "NotFound", "unknown fake endpoint")

    # -- read --

    def _current(self, rt: ResourceType, ns: str, name: str) -> JSON:
        obj = self._store[rt.key].get((ns, name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    def _read(self, rt: ResourceType, version: str, ns: str, name: str) -> JSON:
        with self._lock:
            return self._current(rt, ns, name)  # stored objects are replaced, never mutated: safe to serialise

    def _list(
        self, rt: ResourceType, version: str, namespace: str | None, query: Mapping[str, str]
    ) -> tuple[int, JSON]:
        if query.get("watch") in ("true", "1"):
            raise _bad_request("watch is not supported by the fake API server")
        label_sel = query.get("labelSelector") or ""
        field_sel = query.get("fieldSelector") or ""
        query_key = (namespace, label_sel, field_sel)
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise _bad_request(f"invalid limit {query.get('limit')!r}") from None
        token = query.get("continue")
        with self._lock:
            if token:
                snap_id, offset = self._decode_continue(token)
                snap = self._snapshots.get(snap_id)
                if snap is None or time.monotonic() - snap.created > self.continue_ttl_s:
                    self._snapshots.pop(snap_id, None)
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can "
                        "start a new list without the continue parameter.",
                    )
                if snap.query_key != query_key:
                    raise _bad_request("continue key does not match the list's selectors and namespace")
                items, rv = snap.items, snap.resource_version
            else:
                label_match = parse_label_selector(label_sel) if label_sel else None
                field_match = parse_field_selector(field_sel, rt) if field_sel else None
                store = self._store[rt.key]
                items = []
                for key in self._sorted(rt):
                    if namespace is not None and key[0] != namespace:
                        continue
                    obj = store[key]
                    if label_match and not label_match((obj.get("metadata") or {}).get("labels") or {}):
                        continue
                    if field_match and not field_match(obj):
                        continue
                    items.append(obj)
                rv, offset, snap_id = str(self._rv), 0, ""
            meta: JSON = {"resourceVersion": rv}
            page = items[offset : offset + limit] if limit > 0 else items[offset:]
            end = offset + len(page)
            if end < len(items):
                if not snap_id:
                    snap_id = secrets.token_hex(8)
                    self._snapshots[snap_id] = _ListSnapshot(items, rv, query_key, time.monotonic())
                    while len(self._snapshots) > self.max_list_snapshots:
                        self._snapshots.popitem(last=False)
                meta["continue"] = self._encode_continue(snap_id, end, rv)
                if not label_sel and not field_sel:
                    meta["remainingItemCount"] = len(items) - end
        # Typed lists from the real server carry no apiVersion/kind per item; custom resources do.
        if not rt.custom:
            page = [{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")} for obj in page]
        return 200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version(), "metadata": meta, "items": page}

    @staticmethod
    def _encode_continue(snap_id: str, offset: int, rv: str) -> str:
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": int(rv), "id": snap_id, "start": offset})
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @staticmethod
    def _decode_continue(token: str) -> tuple[str, int]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            return str(data["id"]), int(data["start"])
        except (ValueError, KeyError, TypeError):
            raise _bad_request("continue key is not valid: incorrect encoded start resourceVersion") from None

    # -- write --

    def _prepare(self, rt: ResourceType, obj: JSON, name: str, old: JSON | None = None) -> JSON:
        """Schema (CRDs) and kind-specific validation; returns the defaulted, pruned object or raises 422.

        On update, errors in fields that did not change are dropped (CRD validation ratcheting, on by default
        since 1.30): an object stored before a schema got stricter can still have its status written.
        """
        errors: list[tuple[str, str]] = []
        if rt.custom and rt.schema:
            obj, errors = validate_structural(obj, rt.schema)
        if rt.validator:
            errors.extend(rt.validator(obj))
        if old is not None:
            errors = [(f, m) for f, m in errors if _at_path(obj, f) != _at_path(old, f)]
        if errors:
            raise _invalid(rt, name, errors)
        return obj

    def _create(
        self, rt: ResourceType, version: str, namespace: str, body: Any, dry_run: bool = False
    ) -> tuple[int, JSON]:
        if not isinstance(body, dict):
            raise _bad_request("the body of the request must be an object")
        if body.get("kind") and body["kind"] != rt.kind:
            raise _bad_request(f"the kind of the object ({body['kind']}) does not match the URL ({rt.kind})")
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = rt.api_version(version), rt.kind
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name") or ""
        if not name:
            raise _invalid(rt, "", [("metadata.name", "Required value: name or generateName is required")])
        if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
            raise _invalid(
                rt,
                name,
                [
                    (
                        "metadata.name",
                        f'Invalid value: "{name}": a lowercase RFC 1123 subdomain '
                        "must consist of lower case alphanumeric characters, '-' or '.'",
                    )
                ],
            )
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            meta.pop(key, None)
        if rt.status_subresource and rt.key != ("", "pods"):
            obj.pop("status", None)  # PrepareForCreate resets status when it has its own subresource
        obj = self._prepare(rt, obj, name)
        with self._lock:
            if (namespace if rt.namespaced else "", name) in self._store[rt.key]:
                raise ApiError(409, "AlreadyExists", f'{rt.resource_name} "{name}" already exists', rt.details(name))
            if dry_run:
                return 201, obj
            self._fill_metadata(obj["metadata"])
            self._store[rt.key][(namespace if rt.namespaced else "", name)] = obj
            self._sorted_keys.pop(rt.key, None)
            if rt.kind == "CustomResourceDefinition":
                self.register_crd(obj)
            return 201, obj

    def _commit(self, rt: ResourceType, cur: JSON, new: JSON, sub: str | None) -> JSON:
        """Finish an update of ``cur`` to ``new`` (lock held): subresource rules, generation, no-op detection."""
        if sub == "status":
            merged = dict(cur)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        else:
            new = dict(new)
            meta = dict(new.get("metadata") or {})
            for key in ("uid", "creationTimestamp", "namespace", "name"):
                if key in cur["metadata"]:
                    meta[key] = cur["metadata"][key]
            new["metadata"] = meta
            if rt.status_subresource:
                if "status" in cur:
                    new["status"] = cur["status"]
                else:
                    new.pop("status", None)
        new["apiVersion"], new["kind"] = cur.get("apiVersion", rt.api_version()), rt.kind
        new = self._prepare(rt, new, cur["metadata"]["name"], old=cur)
        meta = dict(new["metadata"])
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        meta["generation"] = cur["metadata"].get("generation", 1)
        new["metadata"] = meta
        if new == cur:
            return cur  # a no-op write stores nothing and keeps the resourceVersion, like the real server
        spec_changed = any(new.get(k) != cur.get(k) for k in set(new) | set(cur) if k not in ("metadata", "status"))
        if spec_changed and sub != "status":
            meta["generation"] = cur["metadata"].get("generation", 1) + 1
        meta["resourceVersion"] = self._next_rv()
        if self.simulate_deployments and rt.key == ("apps", "deployments"):
            replicas = (new.get("spec") or {}).get("replicas", 1)
            new["status"] = dict(
                new.get("status") or {},
                replicas=replicas,
                readyReplicas=replicas,
                availableReplicas=replicas,
                updatedReplicas=replicas,
                observedGeneration=meta["generation"],
            )
        self._store[rt.key][(meta.get("namespace", "") if rt.namespaced else "", meta["name"])] = new
        return new

    def _update(
        self, rt: ResourceType, version: str, ns: str, name: str, body: Any, sub: str | None
    ) -> tuple[int, JSON]:
        if not isinstance(body, dict):
            raise _bad_request("the body of the request must be an object")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise _bad_request(f"the name of the object ({body_name}) does not match the name on the URL ({name})")
        rv = (body.get("metadata") or {}).get("resourceVersion")
        uid = (body.get("metadata") or {}).get("uid")
        with self._lock:
            cur = self._current(rt, ns, name)
            if uid and uid != cur["metadata"].get("uid"):
                raise _uid_precondition_failed(rt, ns, name, str(uid), str(cur["metadata"].get("uid")))
            if not rv and rt.custom:
                raise _invalid(
                    rt, name, [("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")]
                )
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise _conflict(rt, name)
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})["name"] = name
            return 200, self._commit(rt, cur, new, sub)

    def _apply_patch(self, rt: ResourceType, target: JSON, patch: Any, ctype: str | None, scale: bool = False) -> JSON:
        """Merge patch only: the adapters send nothing else. Strategic merge and JSON patch are the real
        apiserver's (realkube); here they are 415, as strategic merge on a custom resource is there too."""
        if ctype != MERGE:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - the fake API server serves {MERGE} only "
                "(the adapters' only patch type; the real apiserver's others are exercised in tests/realkube)",
            )
        result = merge_patch(target, patch)
        if not isinstance(result, dict):
            raise _bad_request("the patch did not produce an object")
        return result

    def _patch(
        self, rt: ResourceType, version: str, ns: str, name: str, patch: Any, ctype: str | None, sub: str | None
    ) -> tuple[int, JSON]:
        with self._lock:
            cur = self._current(rt, ns, name)
            new = self._apply_patch(rt, copy.deepcopy(cur), patch, ctype)
            rv = (new.get("metadata") or {}).get("resourceVersion")
            if rv != cur["metadata"]["resourceVersion"]:
                raise _conflict(rt, name)  # a resourceVersion in the patch is a precondition
            uid = (new.get("metadata") or {}).get("uid")
            if sub is None and uid and uid != cur["metadata"].get("uid"):
                raise _uid_immutable(rt, name, str(uid))  # no precondition: a 422 (status patches ignore it)
            if (new.get("metadata") or {}).get("name") != name:
                raise _bad_request("the name of the object cannot be changed by a patch")
            return 200, self._commit(rt, cur, new, sub)

    def _delete(self, rt: ResourceType, version: str, ns: str, name: str, options: Any) -> tuple[int, JSON]:
        with self._lock:
            cur = self._current(rt, ns, name)
            pre = (options or {}).get("preconditions") or {}
            if pre.get("resourceVersion") and pre["resourceVersion"] != cur["metadata"]["resourceVersion"]:
                raise _conflict(rt, name)
            if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
                raise _conflict(rt, name)
            if (options or {}).get("dryRun"):
                return 200, cur
            del self._store[rt.key][(ns, name)]
            self._sorted_keys.pop(rt.key, None)
            self._rv += 1
            return 200, cur

    # -- scale subresource --

    def _scale_of(self, rt: ResourceType, obj: JSON) -> JSON:
        assert rt.scale is not None
        spec_path, status_path, selector_path = rt.scale
        meta = obj["metadata"]
        if selector_path:
            selector = _get_path(obj, selector_path) or ""
        else:
            labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        scale: JSON = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {},
            "status": {"replicas": _get_path(obj, status_path) or 0},
        }
        replicas = _get_path(obj, spec_path)
        if replicas is None and not rt.custom:
            replicas = 1  # the Deployment default
        if replicas is not None:
            scale["spec"]["replicas"] = replicas
        if selector:
            scale["status"]["selector"] = selector
        return scale

    def _write_scale(
        self, rt: ResourceType, ns: str, name: str, payload: Any, patch_type: str | None
    ) -> tuple[int, JSON]:
        assert rt.scale is not None
        with self._lock:
            cur = self._current(rt, ns, name)
            scale = self._scale_of(rt, cur)
            if patch_type is not None:
                new_scale = self._apply_patch(rt, copy.deepcopy(scale), payload, patch_type, scale=True)
            else:
                if not isinstance(payload, dict):
                    raise _bad_request("the body of the request must be an object")
                new_scale = payload
                uid = (payload.get("metadata") or {}).get("uid")
                if uid and uid != cur["metadata"].get("uid"):  # a PUT of the Scale: the parent's uid, a precondition
                    raise _uid_precondition_failed(rt, ns, name, str(uid), str(cur["metadata"].get("uid")))
            rv = (new_scale.get("metadata") or {}).get("resourceVersion")
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise _conflict(rt, name)
            replicas = (new_scale.get("spec") or {}).get("replicas")
            errors = _validate_scale_replicas(new_scale)
            if errors:
                raise _invalid(ResourceType("autoscaling", ("v1",), "scale", "Scale"), name, errors)
            new = copy.deepcopy(cur)
            _set_path(new, rt.scale[0], replicas if replicas is not None else 0)
            committed = self._commit(rt, cur, new, None)
            return 200, self._scale_of(rt, committed)

    # -- eviction --

    def _evict(self, ns: str, name: str, body: Any, dry_run: bool = False) -> tuple[int, JSON]:
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise _bad_request("not a Eviction object")
        if (body.get("metadata") or {}).get("name") != name:
            raise _bad_request("name in URL does not match name in Eviction object")
        options = body.get("deleteOptions") or {}
        dry_run = dry_run or bool(options.get("dryRun"))
        pods = self._types[("", "pods")]
        pdbs = self._types[("policy", "poddisruptionbudgets")]
        with self._lock:
            pod = self._current(pods, ns, name)
            # deleteOptions.preconditions hold for a dry run too (the store checks them before it would delete)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != pod["metadata"]["uid"]:
                raise _conflict(pods, name)
            status = pod.get("status") or {}
            phase = status.get("phase")
            # Terminal, pending and terminating pods have already caused (or cannot cause) a disruption.
            if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
                if not dry_run:
                    self._delete(pods, "v1", ns, name, options)
                return 201, _success()
            labels = pod["metadata"].get("labels") or {}
            matching = []
            for (pdb_ns, _), pdb in self._store[pdbs.key].items():
                if pdb_ns != ns:
                    continue
                selector = (pdb.get("spec") or {}).get("selector")
                match = _label_selector_predicate(selector)
                if match is not None and match(labels):
                    matching.append(pdb)
            if len(matching) > 1:
                return 500, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "code": 500,
                    "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                    "does not support.",
                }
            if matching:
                pdb = matching[0]
                pdb_status = dict(pdb.get("status") or self._pdb_status(pdb))
                pdb_name = pdb["metadata"]["name"]
                pod_ready = _pod_ready(pod)
                desired = pdb_status.get("desiredHealthy", 0)
                if not (not pod_ready and pdb_status.get("currentHealthy", 0) >= desired and desired > 0):
                    if pdb_status.get("observedGeneration", pdb["metadata"].get("generation", 1)) < pdb["metadata"].get(
                        "generation", 1
                    ):
                        raise _too_many(
                            f"The disruption budget {pdb_name} is still being processed by the server.", retry_after=10
                        )
                    if pdb_status.get("disruptionsAllowed", 0) <= 0:
                        raise _too_many(
                            f"The disruption budget {pdb_name} needs {desired} healthy pods and has "
                            f"{pdb_status.get('currentHealthy', 0)} currently"
                        )
                    if not dry_run:
                        pdb_status["disruptionsAllowed"] -= 1
                        disrupted = dict(pdb_status.get("disruptedPods") or {})
                        disrupted[name] = now_rfc3339()
                        pdb_status["disruptedPods"] = disrupted
                        new_pdb = dict(pdb, status=pdb_status)
                        self._commit(pdbs, pdb, new_pdb, "status")
            if not dry_run:
                self._delete(pods, "v1", ns, name, options)
            return 201, _success()

    def _pdb_status(self, pdb: JSON) -> JSON:
        """What the disruption controller would compute, for PDBs seeded without a status."""
        spec = pdb.get("spec") or {}
        ns = pdb["metadata"].get("namespace", "default")
        match = _label_selector_predicate(spec.get("selector"))
        pods = [
            p
            for (pns, _), p in self._store[("", "pods")].items()
            if pns == ns and match is not None and match(p["metadata"].get("labels") or {})
        ]
        expected = len(pods)
        healthy = sum(1 for p in pods if _pod_ready(p))

        def resolve(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-int(value[:-1]) * expected // 100)  # round up, like the controller
            return int(value)

        if "minAvailable" in spec:
            desired = resolve(spec["minAvailable"])
        elif "maxUnavailable" in spec:
            desired = max(0, expected - resolve(spec["maxUnavailable"]))
        else:
            desired = expected
        return {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": max(0, healthy - desired),
        }


def _success() -> JSON:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _too_many(cause: str, retry_after: int | None = None) -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {
            "causes": [{"reason": "DisruptionBudget", "message": cause}],
            **({"retryAfterSeconds": retry_after} if retry_after else {}),
        },
        headers={"Retry-After": str(retry_after)} if retry_after else None,
    )


def _pod_ready(pod: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions", [])
    )


def _label_selector_predicate(selector: JSON | None) -> Callable[[Mapping[str, str]], bool] | None:
    """metav1.LabelSelector -> predicate; None for an empty selector (which matches nothing for PDBs)."""
    if not selector:
        return None
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            terms.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    if not terms:
        return None
    return parse_label_selector(",".join(terms))


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's urllib3 pool expects

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; with Nagle on, the body waits for the client's delayed ACK
        # (~40 ms per request on keep-alive connections).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self) -> None:
        start = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        method = self.command
        status, headers, payload = self.api.handle(method, self.path, self.headers, body)
        data = json.dumps(payload, separators=(",", ":")).encode()
        # Logged before answering: a test that has its answer must find the request in the log.
        self._log(method, body, status, start)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (timeout); the write already happened

    def _log(self, method: str, body: bytes, status: int, start: float) -> None:
        parsed_body: Any = None
        if body:
            try:
                parsed_body = json.loads(body)
            except ValueError:
                parsed_body = body.decode(errors="replace")
        split = urlsplit(self.path)
        self.api._record(
            RequestRecord(
                method=method,
                path=unquote(split.path),
                query={k: v[-1] for k, v in parse_qs(split.query).items()},
                content_type=self.headers.get("Content-Type"),
                body=parsed_body,
                status=status,
                duration_s=time.monotonic() - start,
            )
        )

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def write_kubeconfig(
    path: str | Path, server_url: str, *, token: str = "test-token", namespace: str = "default"
) -> Path:
    """A kubeconfig for the official client: plain HTTP, bearer token, one context."""
    path = Path(path)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server_url}}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
