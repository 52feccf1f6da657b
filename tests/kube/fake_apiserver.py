"""A fake Kubernetes API server that follows the real REST semantics for what the autoscaler uses.

Why not a mock of the client: the adapter is only trustworthy if the official ``kubernetes`` client, with its real
paths, verbs, content types and error handling, talks HTTP to something that answers like an API server. This
server runs on ``127.0.0.1`` (``http.server.ThreadingHTTPServer``, no dependency) in the test process, in a
subprocess (``python -m tests.kube.fake_apiserver``) or behind ``autoscaler run`` in an end-to-end test.

Semantics implemented (each checked against the upstream apiserver behaviour):
- paths ``/api/v1/...`` and ``/apis/{group}/{version}/...``, namespaced and cluster-wide; discovery basics;
- list with ``limit``/``continue`` served from a consistent snapshot (like etcd at the list's resourceVersion),
  ``remainingItemCount`` (omitted with selectors), ``410 Expired`` for expired tokens; ``labelSelector`` (=, ==, !=,
  in, notin, exists, !exists) and ``fieldSelector`` (=, ==, != on the fields the real server supports per kind);
- create (201, 409 AlreadyExists, generateName), get, replace (PUT, with or without Content-Type), patch
  (json-patch, merge-patch, strategic-merge-patch; 415 for strategic merge on custom resources), delete;
- ``resourceVersion`` bumped on every real write and left alone by no-op writes; a ``resourceVersion`` in a PUT or
  PATCH body is a precondition (409 Conflict when stale); custom resources refuse unconditional PUT (422);
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

Not implemented: watch (400, loudly), server-side apply (415), CEL validation rules, admission webhooks, RBAC.

Test hooks (Python API on the server object): ``seed``/``seed_yaml``, ``get``/``objects``/``update_object``,
``inject`` (status codes, ``Retry-After``, slow answers, dropped connections, N-times failures), ``expire_continue_
tokens``, a request log (``requests``, ``request_count``) and ``write_kubeconfig``.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import secrets
import signal
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

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
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


# Lists the apiserver merges by key under strategic merge patch (patchMergeKey in the Go types we touch).
_SMP_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
}


def strategic_merge_patch(target: Any, patch: Any, field_name: str = "") -> Any:
    """Strategic merge patch for the built-in types: merge patch, plus keyed list merge and ``$patch`` directives."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue  # $retainKeys, $setElementOrder: ordering hints that do not change content here
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, key)
        return result
    if isinstance(patch, list) and field_name in _SMP_MERGE_KEYS and isinstance(target, list):
        key = _SMP_MERGE_KEYS[field_name]
        merged = [dict(item) if isinstance(item, dict) else item for item in target]
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                merged.append(copy.deepcopy(item))
                continue
            index = next(
                (i for i, cur in enumerate(merged) if isinstance(cur, dict) and cur.get(key) == item[key]), None
            )
            if item.get("$patch") == "delete":
                if index is not None:
                    merged.pop(index)
            elif index is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[index] = strategic_merge_patch(merged[index], item, field_name)
        return merged
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, ops: list[JSON]) -> Any:
    """RFC 6902 JSON patch; ValueError on a failed ``test`` or a bad path."""
    doc = copy.deepcopy(target)

    def parent(parts: list[str]) -> tuple[Any, str]:
        node = doc
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node, parts[-1]

    def get(path: str) -> Any:
        node = doc
        for part in _pointer(path):
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def add(path: str, value: Any) -> None:
        nonlocal doc
        parts = _pointer(path)
        if not parts:
            doc = value
            return
        node, last = parent(parts)
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), value)
        else:
            node[last] = value

    def remove(path: str) -> Any:
        node, last = parent(_pointer(path))
        return node.pop(int(last)) if isinstance(node, list) else node.pop(last)

    for op in ops:
        try:
            kind, path = op["op"], op["path"]
            if kind == "add":
                add(path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(path)
            elif kind == "replace":
                remove(path)
                add(path, copy.deepcopy(op["value"]))
            elif kind == "move":
                add(path, remove(op["from"]))
            elif kind == "copy":
                add(path, copy.deepcopy(get(op["from"])))
            elif kind == "test":
                if get(path) != op["value"]:
                    raise ValueError(f"testing value {path} failed")
            else:
                raise ValueError(f"unknown operation {kind!r}")
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"error applying {op}: {exc!r}") from None
    return doc


# ---- faults and request log ---------------------------------------------------------------------------------------


@dataclass
class Fault:
    """One injected fault. ``path`` is a regular expression searched in the request target (path and query).

    ``status`` None means "answer normally, but only after ``delay_s``" (a slow server: the write still happens,
    the client may time out first). ``times`` None means forever. ``skip`` lets the first N matches through.
    """

    method: str = "*"
    path: str = ""
    status: int | None = 500
    times: int | None = 1
    delay_s: float = 0.0
    retry_after: int | None = None
    reason: str | None = None
    message: str | None = None
    drop_connection: bool = False
    skip: int = 0
    hits: int = 0  # requests this fault affected

    def matches(self, method: str, target: str) -> bool:
        return (self.method in ("*", method)) and re.search(self.path, target) is not None


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: Mapping[str, str]
    content_type: str | None
    body: Any
    status: int  # 0: the connection was dropped (fault injection)
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

    ``token``: when set, requests must carry ``Authorization: Bearer <token>`` (else 401).
    ``simulate_deployments``: a minimal deployment controller - status replicas follow spec.replicas at once.
    ``continue_ttl_s`` / ``max_list_snapshots``: how long / how many paginated lists stay continuable.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        simulate_deployments: bool = False,
        continue_ttl_s: float = 300.0,
        max_list_snapshots: int = 64,
        record_requests: bool = True,
    ) -> None:
        self._host = host
        self._requested_port = port
        self.token = token
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
        self.faults: list[Fault] = []
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

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default", token: str | None = None) -> Path:
        return write_kubeconfig(path, self.url, token=token or self.token or "test-token", namespace=namespace)

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

    # -- faults --

    def inject(
        self,
        method: str = "*",
        path: str = "",
        status: int | None = 500,
        *,
        times: int | None = 1,
        delay_s: float = 0.0,
        retry_after: int | None = None,
        reason: str | None = None,
        message: str | None = None,
        drop_connection: bool = False,
        skip: int = 0,
    ) -> Fault:
        """Add a fault: the next ``times`` requests matching ``method`` and the ``path`` regex get it."""
        fault = Fault(method.upper(), path, status, times, delay_s, retry_after, reason, message, drop_connection, skip)
        with self._lock:
            self.faults.append(fault)
        return fault

    def slow(self, method: str = "*", path: str = "", seconds: float = 1.0, *, times: int | None = None) -> Fault:
        """Answer normally but late (the request is processed after the delay)."""
        return self.inject(method, path, None, times=times, delay_s=seconds)

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def expire_continue_tokens(self) -> None:
        """Forget every paginated list, as after an etcd compaction: the next ``continue`` gets 410 Expired."""
        with self._lock:
            self._snapshots.clear()

    def _take_fault(self, method: str, target: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times is not None and fault.times <= 0:
                    continue
                if not fault.matches(method, target):
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                if fault.times is not None:
                    fault.times -= 1
                fault.hits += 1
                return fault
        return None

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
        if self.token is not None and headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {}, ApiError(401, "Unauthorized", "Unauthorized").status()
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
        if segments == ["version"]:
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake", "platform": "linux/amd64"}
        if segments[0] == "api":
            group, rest = "", segments[1:]
        elif segments[0] == "apis":
            group, rest = (segments[1] if len(segments) > 1 else None), segments[2:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if group is None or not rest:
            return self._discovery(group)
        version, rest = rest[0], rest[1:]
        if not rest:
            return self._resource_list(group, version)
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

    def _discovery(self, group: str | None) -> tuple[int, JSON]:
        with self._lock:
            types = list(self._types.values())
        if group == "":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        groups: dict[str, list[str]] = {}
        for rt in types:
            if rt.group:
                for v in rt.versions:
                    if v not in groups.setdefault(rt.group, []):
                        groups[rt.group].append(v)
        return 200, {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in sorted(groups.items())
            ],
        }

    def _resource_list(self, group: str, version: str) -> tuple[int, JSON]:
        with self._lock:
            types = [rt for rt in self._types.values() if rt.group == group and version in rt.versions]
        if not types:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resources = []
        for rt in types:
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["create", "delete", "get", "list", "patch", "update"],
                }
            )
            if rt.status_subresource:
                resources.append(
                    {
                        "name": f"{rt.plural}/status",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rt.scale:
                resources.append(
                    {
                        "name": f"{rt.plural}/scale",
                        "namespaced": rt.namespaced,
                        "kind": "Scale",
                        "group": "autoscaling",
                        "version": "v1",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return 200, {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}".lstrip("/"),
            "resources": resources,
        }

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
        with self._lock:
            cur = self._current(rt, ns, name)
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
        if ctype == JSON_PATCH:
            if not isinstance(patch, list):
                raise _bad_request("json patch must be a list of operations")
            try:
                result = json_patch(target, patch)
            except ValueError as exc:
                raise ApiError(
                    422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
                ) from None
        elif ctype == MERGE:
            result = merge_patch(target, patch)
        elif ctype == SMP:
            if rt.custom and not scale:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - "
                    f"accepted media types include: {JSON_PATCH}, {MERGE}, {APPLY}",
                )
            result = strategic_merge_patch(target, patch)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - "
                f"accepted media types include: {JSON_PATCH}, {MERGE}, {SMP}",
            )
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
        fault = self.api._take_fault(method, self.path)
        if fault is not None:
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.drop_connection:
                self._log(method, body, 0, start)
                self.close_connection = True
                return
        if fault is not None and fault.status is not None:
            err = ApiError(
                fault.status,
                fault.reason or _REASONS.get(fault.status, "InternalError"),
                fault.message or f"injected fault: {fault.status}",
                headers={"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None,
            )
            status, headers, payload = err.code, err.headers, err.status()
        else:
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


def main(argv: list[str] | None = None) -> int:
    """Run the fake server in its own process: ``python -m tests.kube.fake_apiserver --seed objs.yaml``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", action="append", default=[], help="YAML file of objects to seed (repeatable)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig pointing at the server to this path")
    parser.add_argument("--token", help="require this bearer token")
    parser.add_argument("--simulate-deployments", action="store_true")
    args = parser.parse_args(argv)
    server = FakeApiServer(args.host, args.port, token=args.token, simulate_deployments=args.simulate_deployments)
    for seed in args.seed:
        server.seed_yaml(Path(seed))
    server.start()
    if args.kubeconfig:
        server.write_kubeconfig(args.kubeconfig)
    print(server.url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
