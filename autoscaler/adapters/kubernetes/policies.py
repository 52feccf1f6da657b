"""GPUScalingPolicy objects from the cluster, each validated with the pydantic model.

An invalid object never stops the others: it is set aside with the field at fault, and ``report`` gives it an
``InvalidSpec`` condition (``Ready=False``) and one Warning Event naming the field. When it is fixed the condition
flips back. Two policies that scale the same Deployment: the established one keeps it and the other is invalid.
Established means, in this order: the owner of that Deployment at this loader's previous load (owning another one
does not count); a policy whose status says the controller has been acting on its current spec (``Ready=True`` observed
at its generation, no ``InvalidSpec``), which survives a controller restart; the older object. A newcomer -- also a
policy retargeted onto a Deployment another one scales -- never takes a Deployment over by its name or by a tie on
the creation second. ``report`` writes to the object that was read (its uid) at the generation that was validated.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from pydantic import ValidationError

from autoscaler.adapters.kubernetes._api import KubeApiError, Pager, parse_time
from autoscaler.adapters.kubernetes.status import INVALID_SPEC, READY, ConditionUpdate, StatusUpdate, condition
from autoscaler.adapters.kubernetes.writer import KubeClusterWriter
from autoscaler.core.model import ServicePolicy
from autoscaler.policy import API_GROUP, API_VERSION, KIND, PLURAL, GPUScalingPolicySpec, to_service_policy
from autoscaler.ports import PortError

log = logging.getLogger(__name__)

INVALID_REASON = "InvalidSpec"
VALID_REASON = "SpecValid"


@dataclass(frozen=True)
class LoadedPolicy:
    namespace: str
    name: str
    uid: str
    generation: int
    spec: GPUScalingPolicySpec
    service: ServicePolicy
    status: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class InvalidPolicy:
    namespace: str
    name: str
    uid: str
    generation: int
    field: str  # e.g. "spec.maxReplicas"
    message: str
    status: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def text(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class PolicySet:
    valid: tuple[LoadedPolicy, ...] = ()
    invalid: tuple[InvalidPolicy, ...] = ()

    @property
    def services(self) -> tuple[ServicePolicy, ...]:
        return tuple(p.service for p in self.valid)


def _field_path(loc: Sequence[Any]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


#: A rejected value is shown (repr) up to this many characters: the message goes into a condition and an Event.
MAX_SHOWN_VALUE = 80


def _shown(value: str | int | float | bool) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        # repr() of an integer of more than 4,300 digits raises; its size says enough
        return f"an integer of about {round(value.bit_length() * 0.30103):,} digits"
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE else text[: MAX_SHOWN_VALUE - 3] + "..."


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def validate_policy(obj: Mapping[str, Any]) -> LoadedPolicy | InvalidPolicy:
    """One custom object -> a loaded policy, or an invalid one naming the first field at fault."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    generation = meta.get("generation")
    status = obj.get("status")
    namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
    common: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "uid": _text(meta.get("uid")),
        "generation": generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        "status": status if isinstance(status, Mapping) else {},
    }
    spec = obj.get("spec")
    if spec is None:
        return InvalidPolicy(field="spec", message="Required value: the policy has no spec", **common)
    if not isinstance(spec, Mapping):
        message = f"Invalid value: must be an object, got {type(spec).__name__}"
        return InvalidPolicy(field="spec", message=message, **common)
    try:
        parsed = GPUScalingPolicySpec.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        value = first.get("input")
        # Name the offending value when it is a scalar; cross-field checks (minReplicas > maxReplicas) report at
        # their model with a message that already names the fields.
        if first["type"] != "missing" and isinstance(value, (str, int, float, bool)):
            message += f" (got {_shown(value)})"
        if exc.error_count() > 1:
            message += f" (and {exc.error_count() - 1} more)"
        return InvalidPolicy(field=_field_path(first["loc"]), message=message, **common)
    return LoadedPolicy(spec=parsed, service=to_service_policy(namespace, name, parsed), **common)


def _incarnation(policy: LoadedPolicy | InvalidPolicy) -> dict[str, Any]:
    """The status write's precondition: the object that was read (its uid), at the generation that was validated
    (``observedGeneration``). A policy deleted and created again under its name since the read is left alone."""
    return {"uid": policy.uid or None, "generation": policy.generation or None}


def _acted_on(status: Mapping[str, Any] | None, generation: int) -> bool:
    """The controller has been scaling for this policy: its status says Ready and not InvalidSpec, of this generation
    of the spec (a Ready condition observed at another generation speaks of an earlier spec, which may have targeted
    another Deployment; one without observedGeneration is taken at its word)."""
    ready, invalid = condition(status, READY), condition(status, INVALID_SPEC)
    if not (ready and ready.get("status") == "True") or (invalid and invalid.get("status") == "True"):
        return False
    observed = ready.get("observedGeneration")
    return observed is None or not generation or observed == generation


class PolicyLoader:
    """Lists GPUScalingPolicy objects (all namespaces, or the given ones), paginated, and validates each."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespaces: Sequence[str] = (),
        *,
        page_size: int = 500,
        request_timeout_s: float = 10.0,
        read_retries: int = 2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        # each namespace once: listed twice, every policy in it came twice and its copy contested its own Deployment
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self._owners: dict[str, str] = {}  # service key -> uid of the policy that scaled it at the previous load
        self.api_calls = 0
        self._pager = Pager(
            page_size=page_size,
            timeout_s=request_timeout_s,
            retries=read_retries,
            backoff_s=0.2,
            max_backoff_s=2.0,
            sleep=sleep,
            on_call=self._count,
        )

    def _count(self) -> None:
        self.api_calls += 1

    def list_objects(self) -> list[dict[str, Any]]:
        try:
            return self._list_objects()
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            # The API server's 404 for a resource it does not serve reads "the server could not find the requested
            # resource", which does not say that the usual cause is a missing CRD.
            raise KubeApiError(
                exc.what,
                exc.status,
                exc.reason,
                f"{exc.message} (is the GPUScalingPolicy CRD installed? kubectl get crd {PLURAL}.{API_GROUP}; "
                "deploy/base/crd-gpuscalingpolicies.yaml)",
            ) from exc

    def _list_objects(self) -> list[dict[str, Any]]:
        if not self.namespaces:
            return self._pager.items(
                f"list {PLURAL}", self._custom.list_cluster_custom_object, API_GROUP, API_VERSION, PLURAL
            )
        items: list[dict[str, Any]] = []
        for ns in self.namespaces:
            items.extend(
                self._pager.items(
                    f"list {PLURAL} in {ns}",
                    self._custom.list_namespaced_custom_object,
                    API_GROUP,
                    API_VERSION,
                    ns,
                    PLURAL,
                )
            )
        return items

    def load(self) -> PolicySet:
        """Read and validate every policy (reads only; ``report`` writes the verdicts)."""
        objects = self.list_objects()
        owners_before = self._owners
        seen: set[str] = set()
        results: list[tuple[tuple[bool, bool, float, str, str], LoadedPolicy | InvalidPolicy]] = []
        for obj in objects:
            result = validate_policy(obj)
            if result.uid:
                if result.uid in seen:
                    continue  # the same object twice (listed by two overlapping reads): it is one policy
                seen.add(result.uid)
            meta = obj.get("metadata")
            created = parse_time(meta.get("creationTimestamp")) if isinstance(meta, Mapping) else None
            if isinstance(result, LoadedPolicy):
                # Established for *this* Deployment: its owner at the previous load (owning another one does not
                # count: a policy retargeted onto a Deployment another policy scales is a newcomer to it), else
                # a status that says the controller has been acting on this generation of the spec.
                newcomer = owners_before.get(result.service.key) != result.uid
                acted = _acted_on(result.status, result.generation)
            else:
                newcomer, acted = True, False
            results.append(((newcomer, not acted, created or 0.0, result.namespace, result.name), result))

        # Established owners first, so that they keep a contested Deployment.
        results.sort(key=lambda item: item[0])
        valid: list[LoadedPolicy] = []
        invalid: list[InvalidPolicy] = []
        owners: dict[str, str] = {}
        for _, result in results:
            if isinstance(result, InvalidPolicy):
                invalid.append(result)
                continue
            key = result.service.key
            if key in owners:
                invalid.append(
                    InvalidPolicy(
                        namespace=result.namespace,
                        name=result.name,
                        uid=result.uid,
                        generation=result.generation,
                        field="spec.targetRef.name",
                        message=f"Deployment {result.spec.target_ref.name!r} is already scaled by "
                        f"{KIND} {owners[key]!r}",
                        status=result.status,
                    )
                )
                continue
            owners[key] = result.name
            valid.append(result)
        self._owners = {p.service.key: p.uid for p in valid}
        for bad in invalid:
            log.warning("%s %s/%s is invalid: %s", KIND, bad.namespace, bad.name, bad.text)
        return PolicySet(valid=tuple(valid), invalid=tuple(invalid))

    @staticmethod
    def report(policies: PolicySet, writer: KubeClusterWriter, now: float) -> list[PortError]:
        """Give invalid policies their condition and Warning Event; clear the condition of fixed ones.

        Writes only on change (the Event only when the condition appears or its message changes), so calling this
        every tick costs nothing in steady state. Errors are collected, not raised: one failing write must not keep
        the other policies from being reported.
        """
        errors: list[PortError] = []
        for bad in policies.invalid:
            current = condition(bad.status, INVALID_SPEC)
            new_problem = not current or current.get("status") != "True" or current.get("message") != bad.text
            stale_generation = bool(current) and (current or {}).get("observedGeneration") != bad.generation
            if not new_problem and not stale_generation:
                continue
            try:
                written = writer.update_policy_status(
                    bad.namespace,
                    bad.name,
                    StatusUpdate(
                        conditions=(
                            ConditionUpdate(INVALID_SPEC, True, INVALID_REASON, bad.text),
                            ConditionUpdate(READY, False, INVALID_REASON, bad.text),
                        )
                    ),
                    now=now,
                    **_incarnation(bad),
                )
                # Not written: the object is gone, or is another one now (deleted and created again since the read),
                # or its status already says so: no Event about a spec that object may not have.
                if written and new_problem:
                    writer.emit_event(
                        KIND,
                        bad.namespace,
                        bad.name,
                        INVALID_REASON,
                        f"invalid policy: {bad.text}",
                        "Warning",
                        action="Validate",
                    )
            except PortError as exc:
                errors.append(exc)
        for good in policies.valid:
            current = condition(good.status, INVALID_SPEC)
            if not current or current.get("status") == "False":
                continue
            try:
                writer.update_policy_status(
                    good.namespace,
                    good.name,
                    StatusUpdate(conditions=(ConditionUpdate(INVALID_SPEC, False, VALID_REASON, "the spec is valid"),)),
                    now=now,
                    **_incarnation(good),
                )
            except PortError as exc:
                errors.append(exc)
        return errors

    def sync(self, writer: KubeClusterWriter, now: float) -> PolicySet:
        """``load`` then ``report``; report errors are logged, the valid policies are returned regardless."""
        policies = self.load()
        for exc in self.report(policies, writer, now):
            log.warning("reporting policy validity failed: %s", exc)
        return policies
