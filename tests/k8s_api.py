"""A local stand-in for the Kubernetes API server's pods endpoint, for the real ``kubernetes``
client: ``DELETE /api/v1/namespaces/NS/pods/NAME`` answers 200 with the Pod, 404 and 403 with a
``Status`` body like the API server, 401 without the right bearer token. Namespace ``forbidden``
answers 403 as RBAC does. ``on_delete`` lets a test play the kubelet + StatefulSet (stop the pod's
process and start it again). No cluster runs here: this is the only faked part.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

TOKEN = "sa-token-for-tests"
DENIED = ('pods "{name}" is forbidden: User "system:serviceaccount:motor:motor-controller" cannot '
          'delete resource "pods" in API group "" in the namespace "{ns}"')


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


@dataclass
class FakeApiServer:
    """Pods of namespace ``motor``; namespace ``forbidden`` answers 403 like RBAC does."""

    pods: set[tuple[str, str]] = field(default_factory=set)
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, auth
    url: str = ""
    on_delete: Callable[[str, str], None] | None = None  # (namespace, name) after a 200

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        auth = f"{scheme.capitalize()} {token}"  # the scheme is case-insensitive (RFC 9110)
        self.requests.append((request.method, request.path, auth))
        if auth != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        parts = request.path.strip("/").split("/")
        if request.method != "DELETE" or len(parts) != 6 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
            return _status(404, "NotFound", "the server could not find the requested resource")
        ns, name = parts[3], parts[5]
        if ns == "forbidden":
            return _status(403, "Forbidden", DENIED.format(name=name, ns=ns))
        if (ns, name) not in self.pods:
            return _status(404, "NotFound", f'pods "{name}" not found')
        self.pods.discard((ns, name))
        if self.on_delete is not None:
            self.on_delete(ns, name)
        pod = {"kind": "Pod", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": ns, "deletionTimestamp": "2026-12-01T00:00:00Z"}}
        return web.Response(body=orjson.dumps(pod), content_type="application/json")


@asynccontextmanager
async def serve(api: FakeApiServer, ssl_context: Any = None) -> AsyncIterator[FakeApiServer]:
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield api
    finally:
        await runner.cleanup()




def write_kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: "{server}"}}
users:
- name: test
  user: {{token: "{token}"}}
contexts:
- name: test
  context: {{cluster: test, user: test, namespace: motor}}
current-context: test
""")
    return path
