"""The Kubernetes backend: scale a Dynamo DynamoGraphDeployment (DGD).

It does what Dynamo's KubernetesConnector does, with the official client:

- per changed role, PATCH the Scale subresource of the scaling adapter
  ``dynamographdeploymentscalingadapters/{dgd}-{service}`` (nvidia.com/v1beta1)
  with ``{"spec": {"replicas": N}}``; the operator owns the rest;
- on 404 (no adapter for that service) fall back to an RFC 6902 JSON Patch
  of the DGD, ``test`` the component name at its index and ``add`` its
  replicas, so a reordered component list is never scaled by mistake;
- check at start that every DGD exists and has the services the roles map to;
- wait until the DGD is Ready before a change that raises a role (one that
  only lowers roles goes at once: it may be what clears a Pending replica)
  and until the services the decision moves are stable after (desired ==
  updated == available), like Dynamo's blocking mode;
- retry 409, 429 and 5xx answers and connection errors with exponential
  backoff; anything else fails the decision with the API's message.

The client is synchronous, so every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from fleetplan.connectors.base import (
    Applier,
    ApplyFailed,
    ConnectorConfigError,
    InDoubt,
    Observed,
    check_seconds,
)
from fleetplan.schemas.events import Decision, Role

log = logging.getLogger("fleetplan.connector.kubernetes")

GROUP = "nvidia.com"
VERSION = "v1beta1"
DGD_PLURAL = "dynamographdeployments"
ADAPTER_PLURAL = "dynamographdeploymentscalingadapters"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})

SERVICE_NAMES: dict[str, dict[Role, str]] = {
    "vllm": {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker", "agg": "VllmWorker"},
    "sglang": {"prefill": "prefill", "decode": "decode", "agg": "decode"},
    "trtllm": {"prefill": "prefill", "decode": "decode", "agg": "TRTLLMWorker"},
    "mocker": {"prefill": "prefill", "decode": "decode", "agg": "decode"},
}
"""Dynamo's DGD component names per engine (config/backend_components.py)."""

T = TypeVar("T")


@dataclass
class KubernetesSettings:
    """Everything the backend needs besides the API client configuration."""

    dgds: dict[str, str]
    """fleetplan deployment -> DGD name in ``namespace``."""
    services: dict[Role, str] = field(default_factory=lambda: dict(SERVICE_NAMES["vllm"]))
    """role -> DGD component (service) name."""
    namespace: str = "default"
    ready_timeout_s: float = 1800.0
    ready_poll_s: float = 10.0
    max_attempts: int = 6
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    request_timeout_s: float = 10.0

    def check(self) -> None:
        if not self.dgds:
            raise ConnectorConfigError("--deployment", "the kubernetes backend needs at least one")
        for name, value in (("--ready-timeout", self.ready_timeout_s),
                            ("--ready-poll", self.ready_poll_s),
                            ("--request-timeout", self.request_timeout_s)):
            check_seconds(name, value)
        if self.max_attempts < 1:
            raise ConnectorConfigError("--max-attempts", "must be at least 1")
        if not self.services:
            raise ConnectorConfigError("--service", "no role is mapped to a DGD service")


def load_configuration(kubeconfig: Path | None = None, context: str | None = None) -> k8s.Configuration:
    """Client configuration: the given kubeconfig or context, else in-cluster, else ~/.kube/config.

    A context names a cluster of a kubeconfig ($KUBECONFIG, else ~/.kube/config): given one,
    the service account of the pod the connector runs in is not the cluster it was told.
    """
    cfg = k8s.Configuration()
    try:
        if kubeconfig is not None or context is not None:
            k8s_config.load_kube_config(
                config_file=None if kubeconfig is None else str(kubeconfig), context=context,
                client_configuration=cfg,
            )
            return cfg
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            k8s_config.load_kube_config(context=context, client_configuration=cfg)
    except (ConfigException, OSError, TypeError, ValueError) as err:
        raise ConnectorConfigError("--kubeconfig", f"cannot load a Kubernetes config ({err})") from None
    return cfg


def adapter_name(dgd: str, service: str) -> str:
    """The operator's name for a component's scaling adapter."""
    return f"{dgd}-{service.lower()}"


def components(dgd_obj: Mapping[str, Any]) -> list[dict]:
    comps = (dgd_obj.get("spec") or {}).get("components")
    return comps if isinstance(comps, list) else []


def spec_replicas(dgd_obj: Mapping[str, Any], service: str) -> int | None:
    for comp in components(dgd_obj):
        if comp.get("name") == service:
            replicas = comp.get("replicas", 1)
            return replicas if isinstance(replicas, int) else None
    return None


OTHER_ROLE: dict[str, str] = {"prefill": "decode", "decode": "prefill"}


def named_roles(dgd_obj: Mapping[str, Any], services: Mapping[Role, str]) -> dict[Role, str]:
    """role -> the component named as the role's service, unless its ``type`` is the other role.

    A component named ``VllmPrefillWorker`` whose v1beta1 ``type`` says
    ``decode`` is a decode worker: taken by name it scaled prefill with
    decode's engines. Dynamo takes a name only where the type is empty,
    ``worker`` or the role itself; here only the contradiction is refused,
    so an agg worker of any type keeps its name.
    """
    types = {c.get("name"): c.get("type") for c in components(dgd_obj)}
    return {role: name for role, name in services.items()
            if name in types and not (role in OTHER_ROLE and types[name] == OTHER_ROLE[role])}


def typed_roles(dgd_obj: Mapping[str, Any], skip: Mapping[Role, str]) -> dict[Role, str]:
    """prefill/decode -> the one component whose v1beta1 ``type`` is that role.

    Dynamo finds these roles by type, names being the fallback; here the name a role maps
    to comes first (an explicit ``--service`` stays the one scaled), and the type serves a
    DGD that names its workers otherwise. Roles in ``skip`` and ambiguous types are left out.
    """
    found: dict[Role, str] = {}
    for role in ("prefill", "decode"):
        if role in skip:
            continue
        named = [c.get("name") for c in components(dgd_obj) if c.get("type") == role]
        if len(named) == 1 and isinstance(named[0], str):
            found[role] = named[0]
    return found


def is_ready(dgd_obj: Mapping[str, Any]) -> bool:
    conditions = (dgd_obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def serving_replicas(dgd_obj: Mapping[str, Any], service: str) -> tuple[int, bool]:
    """(replicas serving traffic, stable) from DGD status, as Dynamo reads them."""
    status = ((dgd_obj.get("status") or {}).get("components") or {}).get(service) or {}
    available = status.get("availableReplicas")
    serving = available if available is not None else status.get("readyReplicas", 0)
    updated = status.get("updatedReplicas", 0)
    return serving, spec_replicas(dgd_obj, service) == updated == serving


def missing_object(err: k8s.ApiException, name: str) -> bool:
    """Whether a 404 says that object is missing, not that its resource is not served.

    The API server names the object in a NotFound Status; a group, version or resource it
    does not serve (the CRD not installed, another version) gets a 404 without that name.
    """
    try:
        status = json.loads(err.body or "")
    except ValueError:
        return False
    return isinstance(status, dict) and (status.get("details") or {}).get("name") == name


def _moved(decision: Decision) -> set[Role]:
    """The roles whose target is not the planner's previous count: the ones a decision moves."""
    return {r for r, n in decision.targets.items() if decision.previous.get(r) != n}


def _api_error(err: k8s.ApiException) -> str:
    body = (err.body or "")[:300]
    return f"HTTP {err.status} {err.reason or ''}: {body}".strip()


class KubernetesApplier(Applier):
    backend = "kubernetes"

    def __init__(self, settings: KubernetesSettings, configuration: k8s.Configuration) -> None:
        self.settings = settings
        self._configuration = configuration
        self._api_client: k8s.ApiClient | None = None
        self._api: k8s.CustomObjectsApi | None = None
        self._roles: dict[str, dict[Role, str]] = {}
        """deployment -> the roles its DGD has, with their service names."""

    def describe(self) -> str:
        dgds = ", ".join(f"{d}->{n}" for d, n in sorted(self.settings.dgds.items()))
        return f"kubernetes ({self._configuration.host}, namespace {self.settings.namespace}; {dgds})"

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        self.settings.check()
        self._api_client = k8s.ApiClient(self._configuration)
        self._api = k8s.CustomObjectsApi(self._api_client)
        for deployment, dgd in sorted(self.settings.dgds.items()):
            try:
                obj = await self._get_dgd(dgd)
            except k8s.ApiException as err:
                if err.status == 404 and not missing_object(err, dgd):
                    raise ConnectorConfigError(
                        "--kubeconfig", f"the API server does not serve {GROUP}/{VERSION} {DGD_PLURAL} "
                        f"(is Dynamo's operator installed, with {VERSION}?): {_api_error(err)}"
                    ) from None
                if err.status == 404:
                    raise ConnectorConfigError(
                        "--dgd", f"DynamoGraphDeployment {self.settings.namespace}/{dgd} "
                        f"(for deployment {deployment}) does not exist"
                    ) from None
                if err.status in (401, 403):
                    raise ConnectorConfigError(
                        "--kubeconfig", f"not allowed to read {dgd}: {_api_error(err)}"
                    ) from None
                raise ConnectorConfigError("--kubeconfig", _api_error(err)) from None
            except ApplyFailed as err:
                raise ConnectorConfigError("--kubeconfig", str(err)) from None
            names = [c.get("name") for c in components(obj)]
            if not names:
                raise ConnectorConfigError(
                    "--dgd", f"{dgd} has no v1beta1 spec.components list"
                )
            roles = named_roles(obj, self.settings.services)
            roles.update(typed_roles(obj, skip=roles))
            if not roles:
                mapped = ", ".join(f"{r}={s}" for r, s in self.settings.services.items())
                raise ConnectorConfigError(
                    "--service", f"none of {mapped} is a component of DGD {dgd} "
                    f"(it has {', '.join(map(str, names))})"
                )
            self._roles[deployment] = roles
            log.info("DGD %s for %s: roles %s", dgd, deployment, roles)

    async def stop(self) -> None:
        if self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)
            self._api_client = None

    # --- applying --------------------------------------------------------------

    async def apply(self, decision: Decision) -> Observed:
        dgd, roles = self._target(decision)
        try:
            desired = await self._desired(dgd, await self._get_dgd(dgd), roles, decision)
        except k8s.ApiException as err:
            # a token expired, RBAC changed, the DGD deleted: the decision fails in the API's
            # words (the exception's own text carries the HTTP headers, and read as a bug)
            raise ApplyFailed(_api_error(err)) from None
        if any(n is None or decision.targets[r] > n for r, n in desired.items()):
            # Only a raise waits for Ready. A replica that never starts (a pod Pending with
            # no GPU) keeps the DGD not Ready until it is gone, and the decision that lowers
            # its role is the one that removes it (Dynamo #14251, #14671).
            obj = await self._wait(dgd, lambda o: is_ready(o), "Ready")
            desired = await self._desired(dgd, obj, roles, decision)
        patched: list[str] = []
        moved = _moved(decision)
        # cuts first: a decision moving GPUs between roles fits the budget only as a whole,
        # so if a later patch is refused, what landed leaves the fleet under it (Dynamo #12428)
        for role, count in sorted(decision.targets.items(),
                                  key=lambda rc: (desired[rc[0]] is None or rc[1] > desired[rc[0]], rc[0])):
            service = roles[role]
            try:
                if desired[role] == count:
                    continue
                await self._scale(dgd, service, count)
            except (ApplyFailed, k8s.ApiException) as err:
                # the fleet is already moving for the roles patched before: say which (a DGD
                # read for the JSON patch raises the API's refusal as it is)
                problem = _api_error(err) if isinstance(err, k8s.ApiException) else str(err)
                if not patched:
                    raise ApplyFailed(problem) from None
                raise ApplyFailed(f"{problem}; already patched: {', '.join(patched)}") from None
            patched.append(f"{role}={count}")
            moved.add(role)
            log.info("%s: %s %s -> %d (decision %d)", decision.deployment, dgd, service,
                     count, decision.decision_id)
        return await self._settle(dgd, roles, decision, moved)

    async def recover(self, decision: Decision) -> Observed:
        """Settled if the fleet is already headed for every target; in doubt otherwise."""
        dgd, roles = self._target(decision)
        spec = await self._desired(dgd, await self._get_dgd(dgd), roles, decision)
        if spec != dict(decision.targets):
            raise InDoubt(
                f"a run that died may have applied decision {decision.decision_id} in part; "
                f"{dgd} spec has {spec}, the decision wanted {dict(decision.targets)}; "
                f"not applied again"
            )
        return await self._settle(dgd, roles, decision, _moved(decision))

    def _target(self, decision: Decision) -> tuple[str, dict[Role, str]]:
        dgd = self.settings.dgds.get(decision.deployment)
        roles = self._roles.get(decision.deployment)
        if dgd is None or roles is None:
            raise ApplyFailed(f"deployment {decision.deployment} is not managed by this connector")
        missing = sorted(set(decision.targets) - set(roles))
        if missing:
            raise ApplyFailed(f"DGD {dgd} has no service for role(s) {', '.join(missing)}")
        return dgd, roles

    async def _settle(self, dgd: str, roles: dict[Role, str], decision: Decision,
                      moved: set[Role]) -> Observed:
        """Wait until the roles the decision moves are stable; report what every role serves.

        ``moved``: the roles whose target is not the planner's previous count, and those patched.
        A role the decision keeps is not waited for, nor is the DGD's Ready condition: a replica
        Pending with no GPU keeps both from settling for as long as it stays (Dynamo #14251),
        and a decision that does not touch it would wait out the whole ``ready_timeout_s``.
        """
        targets = {roles[r]: n for r, n in decision.targets.items() if r in moved}

        def stable(obj: Mapping[str, Any]) -> bool:
            # the spec must hold the target too: a scaling adapter's replicas reach the DGD
            # spec only when the operator reconciles it, and until then the old spec and the
            # old status agree with each other
            return all(
                spec_replicas(obj, s) == n and serving_replicas(obj, s)[1] for s, n in targets.items()
            )

        try:
            obj = await self._wait(dgd, stable, "stable")
        except (ApplyFailed, k8s.ApiException) as err:
            # Every target is patched: the decision is applied whatever the wait says (the fleet
            # is still converging, or the API server stopped answering or refused the read: a
            # token expired, RBAC changed). Report what serves now, if it can be read; a
            # "failed" ack would leave the planner at counts it left.
            log.warning("%s (decision %d applied)", _api_error(err) if isinstance(err, k8s.ApiException)
                        else err, decision.decision_id)
            try:
                obj = await self._get_dgd(dgd)
            except (ApplyFailed, k8s.ApiException) as unreadable:
                log.warning("%s (decision %d applied; serving replicas unknown)",
                            _api_error(unreadable) if isinstance(unreadable, k8s.ApiException)
                            else unreadable, decision.decision_id)
                return {}
        return {role: serving_replicas(obj, roles[role])[0] for role in decision.targets}

    async def _desired(self, dgd: str, obj: Mapping[str, Any], roles: dict[Role, str],
                       decision: Decision) -> dict[Role, int | None]:
        """The replicas each role of the decision is headed for (see ``_desired_replicas``)."""
        return {role: await self._desired_replicas(dgd, obj, roles[role]) for role in decision.targets}

    async def _desired_replicas(self, dgd: str, obj: Mapping[str, Any], service: str) -> int | None:
        """The replicas a component is headed for: its scaling adapter's, else the DGD spec's.

        The operator copies an adapter's replicas into the DGD spec when it
        reconciles, so until then the spec holds the count before the last
        change: a decision compared with it would skip a patch it needs.
        A Scale's replicas are omitempty: one that has none is at 0 (a custom
        resource without the replicas field answers the GET with an error).
        """
        name = adapter_name(dgd, service)
        try:
            scale = await self._call(
                "get scale of " + name, self._custom.get_namespaced_custom_object_scale,
                GROUP, VERSION, self.settings.namespace, ADAPTER_PLURAL, name,
            )
        except k8s.ApiException as err:
            if err.status != 404:
                raise ApplyFailed(f"reading {name}: {_api_error(err)}") from None
            return spec_replicas(obj, service)
        replicas = (scale.get("spec") or {}).get("replicas", 0) if isinstance(scale, Mapping) else None
        return replicas if isinstance(replicas, int) else spec_replicas(obj, service)

    async def _wait(self, dgd: str, done: Callable[[Mapping[str, Any]], bool], what: str) -> dict:
        deadline = time.monotonic() + self.settings.ready_timeout_s
        while True:
            obj = await self._get_dgd(dgd)
            if done(obj):
                return obj
            if time.monotonic() >= deadline:
                raise ApplyFailed(f"DGD {dgd} not {what} within {self.settings.ready_timeout_s:g} s")
            await asyncio.sleep(self.settings.ready_poll_s)

    async def _scale(self, dgd: str, service: str, replicas: int) -> None:
        name = adapter_name(dgd, service)
        try:
            await self._call(
                "patch scale of " + name, self._custom.patch_namespaced_custom_object_scale,
                GROUP, VERSION, self.settings.namespace, ADAPTER_PLURAL, name,
                {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH,
            )
        except k8s.ApiException as err:
            if err.status != 404:
                raise ApplyFailed(f"scaling {name}: {_api_error(err)}") from None
            log.info("no scaling adapter %s; patching DGD %s instead", name, dgd)
            await self._patch_dgd(dgd, service, replicas)

    async def _patch_dgd(self, dgd: str, service: str, replicas: int) -> None:
        """JSON Patch with a ``test`` guard; a 422 (the list moved) re-reads and retries.

        A 422 is also how the API server refuses a value (schema, validation rules): if the
        re-read finds the component where the refused patch looked for it, the ``test`` op
        passed, and the refusal is reported as it is rather than patched again.
        """
        refused: tuple[int, k8s.ApiException] | None = None
        for _ in range(self.settings.max_attempts):
            obj = await self._get_dgd(dgd)
            index = next((i for i, c in enumerate(components(obj)) if c.get("name") == service), None)
            if index is None:
                raise ApplyFailed(f"DGD {dgd} has no component {service}")
            if refused is not None and refused[0] == index:
                raise ApplyFailed(f"patching {dgd}: {_api_error(refused[1])}")
            patch = [
                {"op": "test", "path": f"/spec/components/{index}/name", "value": service},
                {"op": "add", "path": f"/spec/components/{index}/replicas", "value": replicas},
            ]
            try:
                await self._call(
                    "JSON patch of " + dgd, self._custom.patch_namespaced_custom_object,
                    GROUP, VERSION, self.settings.namespace, DGD_PLURAL, dgd, patch,
                    _content_type=JSON_PATCH,
                )
                return
            except k8s.ApiException as err:
                if err.status != 422:
                    raise ApplyFailed(f"patching {dgd}: {_api_error(err)}") from None
                refused = (index, err)
                log.info("JSON patch of %s refused (422); re-reading to see whether %s moved",
                         dgd, service)
        raise ApplyFailed(f"patching {dgd}: component {service} kept moving")

    # --- API calls -----------------------------------------------------------------

    @property
    def _custom(self) -> k8s.CustomObjectsApi:
        if self._api is None:
            raise RuntimeError("KubernetesApplier used before start()")
        return self._api

    async def _get_dgd(self, dgd: str) -> dict:
        return await self._call(
            "get " + dgd, self._custom.get_namespaced_custom_object,
            GROUP, VERSION, self.settings.namespace, DGD_PLURAL, dgd,
        )

    async def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One API call with retries. Non-retryable API errors are raised as they are."""
        s = self.settings
        delay = s.backoff_s
        for attempt in range(1, s.max_attempts + 1):
            try:
                return await asyncio.to_thread(
                    fn, *args, _request_timeout=s.request_timeout_s, **kwargs
                )
            except k8s.ApiException as err:
                if err.status not in RETRYABLE:
                    raise
                problem = _api_error(err)
            except (urllib3.exceptions.HTTPError, OSError) as err:
                problem = f"{type(err).__name__}: {err}"
            if attempt == s.max_attempts:
                raise ApplyFailed(f"{what} failed after {attempt} attempts: {problem}")
            log.warning("%s: %s; retry %d in %.2f s", what, problem, attempt, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, s.backoff_max_s)
        raise AssertionError("unreachable")
