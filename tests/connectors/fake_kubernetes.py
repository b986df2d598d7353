"""A local HTTP server that speaks the slice of the Kubernetes API the connector uses.

DGD GET and JSON Patch (RFC 6902 ``test``/``add``), the Scale subresource of
DGD scaling adapters, DGD status with a Ready condition and per-component
replica counts. It records every request, can be told to fail the next
requests of a kind with given status codes, and can make status lag behind
spec so readiness waits are exercised.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import orjson
from aiohttp import web

PREFIX = "/apis/nvidia.com/v1beta1/namespaces/{ns}"


@dataclass
class Seen:
    method: str
    path: str
    content_type: str
    body: object


def _status(code: int, reason: str, message: str, details: dict | None = None) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


def _not_found(plural: str, name: str) -> web.Response:
    """The API server's NotFound for a missing object names it in ``details``."""
    return _status(404, "NotFound", f"{plural}.nvidia.com {name!r} not found",
                   {"name": name, "group": "nvidia.com", "kind": plural})


class FakeKubernetes:
    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self.dgds: dict[str, dict] = {}
        self.adapters: dict[str, tuple[str, str]] = {}
        """adapter name -> (dgd, component)."""
        self.seen: list[Seen] = []
        self._failures: dict[str, list[int]] = {}
        self.settle_polls = 0
        """GETs after a spec change before status shows the new counts."""
        self._lag: dict[str, int] = {}
        self.unready_polls: dict[str, int] = {}
        """dgd -> GETs for which its Ready condition is still False."""
        self.pending: dict[tuple[str, str], int] = {}
        """(dgd, component) -> replicas whose pods stay Pending (no GPU): never ready or available,
        and the DGD not Ready while there are any, as Dynamo's operator reports them."""
        self.reorder_before_patch: str | None = None
        """Swap the components of this DGD right before the next JSON patch lands."""
        self.adapter_polls = 0
        """DGD GETs after a scale patch before the operator copies the adapter's replicas
        into the DGD spec (0: at once). Dynamo's adapter controller reconciles, so the spec lags."""
        self._adapter_replicas: dict[str, int] = {}
        self._adapter_lag: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- setup -------------------------------------------------------------------

    def add_dgd(self, name: str, replicas: dict[str, int], *, adapters: bool = True,
                types: dict[str, str] | None = None) -> None:
        """types: component -> its v1beta1 ``type`` (prefill, decode, worker, ...), if any."""
        comps = [{"name": c, "replicas": n} for c, n in replicas.items()]
        for comp in comps:
            if types and comp["name"] in types:
                comp["type"] = types[comp["name"]]
        self.dgds[name] = {
            "apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name, "namespace": self.namespace, "generation": 1},
            "spec": {"components": comps},
            "status": {},
        }
        self._sync_status(name)
        if adapters:
            for component in replicas:
                self.adapters[f"{name}-{component.lower()}"] = (name, component)

    def fail_next(self, kind: str, *codes: int) -> None:
        """kind: "get", "scale" or "patch"."""
        self._failures.setdefault(kind, []).extend(codes)

    def replicas(self, dgd: str) -> dict[str, int]:
        return {c["name"]: c.get("replicas", 1) for c in self.dgds[dgd]["spec"]["components"]}

    @property
    def writes(self) -> list[Seen]:
        """Requests that changed (or tried to change) something."""
        return [s for s in self.seen if s.method == "PATCH"]

    # --- server ------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        base = PREFIX.format(ns="{ns}")
        app.router.add_get(base + "/dynamographdeployments/{name}", self._get_dgd)
        app.router.add_patch(base + "/dynamographdeployments/{name}", self._patch_dgd)
        app.router.add_get(base + "/dynamographdeploymentscalingadapters/{name}/scale", self._get_scale)
        app.router.add_patch(base + "/dynamographdeploymentscalingadapters/{name}/scale", self._patch_scale)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self) -> str:
        return (
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
            f"    namespace: {self.namespace}\n"
            "users:\n- name: fake\n  user:\n    token: test-token\n"
        )

    # --- handlers ---------------------------------------------------------------------

    async def _record(self, request: web.Request) -> Seen:
        raw = await request.read()
        seen = Seen(request.method, request.path, request.headers.get("Content-Type", ""),
                    orjson.loads(raw) if raw else None)
        self.seen.append(seen)
        return seen

    def _scripted(self, kind: str) -> web.Response | None:
        codes = self._failures.get(kind)
        if codes:
            code = codes.pop(0)
            reason = {409: "Conflict", 422: "Invalid"}.get(code, "InternalError")
            return _status(code, reason, f"scripted {code}")
        return None

    def _check_ns(self, request: web.Request) -> web.Response | None:
        if request.match_info["ns"] != self.namespace:  # as the API server: the object is not found
            plural = request.path.split("/")[6]
            return _not_found(plural, request.match_info["name"])
        return None

    async def _get_dgd(self, request: web.Request) -> web.Response:
        await self._record(request)
        if (bad := self._check_ns(request) or self._scripted("get")) is not None:
            return bad
        name = request.match_info["name"]
        if name not in self.dgds:
            return _not_found("dynamographdeployments", name)
        self._tick(name)
        return web.json_response(self.dgds[name])

    async def _patch_dgd(self, request: web.Request) -> web.Response:
        seen = await self._record(request)
        if (bad := self._check_ns(request) or self._scripted("patch")) is not None:
            return bad
        name = request.match_info["name"]
        if name not in self.dgds:
            return _not_found("dynamographdeployments", name)
        if seen.content_type != "application/json-patch+json":
            return _status(415, "UnsupportedMediaType", f"got {seen.content_type}")
        if self.reorder_before_patch == name:
            self.reorder_before_patch = None
            self.dgds[name]["spec"]["components"].reverse()
        obj = copy.deepcopy(self.dgds[name])
        for op in seen.body:
            parts = op["path"].strip("/").split("/")
            parent = obj
            for part in parts[:-1]:
                parent = parent[int(part)] if isinstance(parent, list) else parent[part]
            leaf = parts[-1]
            if op["op"] == "test":
                if parent.get(leaf) != op["value"]:
                    return _status(422, "Invalid", f"test failed at {op['path']}")
            elif op["op"] in ("add", "replace"):
                parent[leaf] = op["value"]
            else:
                return _status(422, "Invalid", f"unsupported op {op['op']}")
        self.dgds[name] = obj
        self._changed(name)
        return web.json_response(obj)

    async def _get_scale(self, request: web.Request) -> web.Response:
        await self._record(request)
        if (bad := self._check_ns(request)) is not None:
            return bad
        return self._scale_reply(request.match_info["name"])

    async def _patch_scale(self, request: web.Request) -> web.Response:
        seen = await self._record(request)
        if (bad := self._check_ns(request) or self._scripted("scale")) is not None:
            return bad
        name = request.match_info["name"]
        if name not in self.adapters:
            return _not_found("dynamographdeploymentscalingadapters", name)
        if seen.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"got {seen.content_type}")
        self._adapter_replicas[name] = seen.body["spec"]["replicas"]
        if self.adapter_polls:
            self._adapter_lag[name] = self.adapter_polls
        else:
            self._reconcile_adapter(name)
        return self._scale_reply(name)

    def _reconcile_adapter(self, name: str) -> None:
        """The operator copies an adapter's replicas into its DGD component's spec."""
        dgd, component = self.adapters[name]
        for comp in self.dgds[dgd]["spec"]["components"]:
            if comp["name"] == component:
                comp["replicas"] = self._adapter_replicas[name]
        self._changed(dgd)

    def _scale_reply(self, name: str) -> web.Response:
        if name not in self.adapters:
            return _not_found("dynamographdeploymentscalingadapters", name)
        dgd, component = self.adapters[name]
        n = self._adapter_replicas.get(name, self.replicas(dgd)[component])
        # autoscaling/v1 Scale's replicas are omitempty: 0 is left out of spec and status
        return web.json_response({
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"replicas": n} if n else {}, "status": {"replicas": n} if n else {},
        })

    # --- status ---------------------------------------------------------------------------

    def _changed(self, name: str) -> None:
        self.dgds[name]["metadata"]["generation"] += 1
        if self.settle_polls:
            self._lag[name] = self.settle_polls
        else:
            self._sync_status(name)

    def _tick(self, name: str) -> None:
        for adapter, left in list(self._adapter_lag.items()):
            if self.adapters[adapter][0] == name:
                self._adapter_lag[adapter] = left - 1
                if left == 1:
                    del self._adapter_lag[adapter]
                    self._reconcile_adapter(adapter)
        if self.unready_polls.get(name):
            self.unready_polls[name] -= 1
        if self._lag.get(name):
            self._lag[name] -= 1
            if self._lag[name] == 0:
                self._sync_status(name)
        ready = "False" if self.unready_polls.get(name) or self._stuck(name) else "True"
        self.dgds[name]["status"]["conditions"] = [{"type": "Ready", "status": ready}]

    def _stuck(self, name: str) -> dict[str, int]:
        """component -> its Pending replicas (no more than its spec's)."""
        return {c["name"]: min(self.pending.get((name, c["name"]), 0), c["replicas"])
                for c in self.dgds[name]["spec"]["components"]
                if self.pending.get((name, c["name"]), 0) and c["replicas"]}

    def _sync_status(self, name: str) -> None:
        obj = self.dgds[name]
        stuck = self._stuck(name)
        serving = {c["name"]: c["replicas"] - stuck.get(c["name"], 0) for c in obj["spec"]["components"]}
        obj["status"] = {
            "observedGeneration": obj["metadata"]["generation"],
            "conditions": [{"type": "Ready", "status": "False" if stuck else "True"}],
            "components": {
                c["name"]: {"replicas": c["replicas"], "readyReplicas": serving[c["name"]],
                            "availableReplicas": serving[c["name"]], "updatedReplicas": c["replicas"]}
                for c in obj["spec"]["components"]
            },
        }
