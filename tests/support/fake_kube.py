"""A small fake Kubernetes API server on loopback, for the real `kubernetes` client (point a kubeconfig
or `kubernetes.client.Configuration(host=fake.url)` at `FakeKube().url`).

The store is the in-memory twin of the agent's port (tests.support.kube_memory: one monotonic
resourceVersion for all resources, a history of changes, the test controls); this module serves it
over HTTP as the API server does. Resources:

- pods (core/v1, namespaced): list and watch across all namespaces (`/api/v1/pods`) or one;
  GET and PATCH `/api/v1/namespaces/{ns}/pods/{name}`. PATCH applies to the whole stored pod
  (including .status, unlike a real server) and always bumps the resourceVersion.
- nodes (core/v1, cluster-scoped): list and watch `/api/v1/nodes`; GET and PATCH
  `/api/v1/nodes/{name}` (.status changes are ignored there, as on a real server) and
  `/api/v1/nodes/{name}/status` (only .status applies).
- modelpreheats.weightswarm.io/v1alpha1 `ModelPreheat` (a cluster-scoped custom resource with the
  status subresource): list and watch `/apis/weightswarm.io/v1alpha1/modelpreheats`; GET and PATCH
  `.../modelpreheats/{name}` (.status changes ignored; metadata.generation, 1 at creation, grows
  when anything outside metadata changes) and `.../modelpreheats/{name}/status` (only .status
  applies, generation unchanged).
- Event creation (core/v1 and events.k8s.io/v1), recorded in `events`, not stored as a resource.

Lists and watches honour `fieldSelector` and `labelSelector`; patches and selectors mean what they
mean to a real server (tests.support.kube_api). A watch is a chunked stream of JSON lines
(ADDED/MODIFIED/DELETED/BOOKMARK/ERROR) from a resourceVersion (unset or "0": synthetic ADDED events
for the current state first) with `timeoutSeconds` and `allowWatchBookmarks`; like the real watch
cache, an object that starts or stops matching the selectors arrives as ADDED or DELETED. A
resourceVersion older than the last `compact()` gets 410 Gone as an ERROR event, like the real
server. A watch ends as soon as its client hangs up (so `open_watches()` drops at once). Errors are
`Status` objects (404 NotFound for unknown objects and routes).

Test controls: the twin's (add_pod/update_pod/..., compact, bookmark, pause_watches/resume_watches,
drop_watches, open_watches, and the records `patches` (pods), `node_patches`, `preheat_patches`,
`events`; patches are recorded once accepted: after the 404 and precondition checks), and here
fail_next (by method and path), watch_requests/list_requests and `requests`. open_watches and
watch_requests take an optional resource plural (default: all); list_requests counts pods unless told.
"""

from __future__ import annotations

import copy
import json
import select
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import kube_api as api
from tests.support.kube_memory import MemoryKube, WatchDropped, WatchState, _key


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1", "True")


@dataclass
class _Watch(WatchState):
    sock: socket.socket | None = None


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed its end (a watch client never sends more while it reads)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class FakeKube(MemoryKube):
    """The fake API server. Use as a context manager or call start()/stop()."""

    def __init__(self) -> None:
        super().__init__()
        self._failures: list[tuple[str, str, int]] = []
        self.requests: list[Request] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeKube:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kube", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closing = True
        self.drop_watches()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test controls over HTTP ------------------------------------------------------------------

    def drop_watches(self) -> tuple[WatchState, ...]:
        """Cut every open watch connection mid-stream (no terminating chunk), as a dying LB would."""
        watches = super().drop_watches()
        for w in watches:
            if isinstance(w, _Watch) and w.sock is not None:
                try:
                    w.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return watches

    def fail_next(self, method: str, path_contains: str, code: int) -> None:
        """Answer the next matching request with a Status error of `code`."""
        with self._cond:
            self._failures.append((method, path_contains, code))

    def watch_requests(self, resource: str | None = None) -> list[Request]:
        """Watch requests so far, of one resource (plural) or of all."""
        with self._cond:
            return [
                r
                for r in self.requests
                if r.method == "GET" and r.is_watch and (resource is None or r.path.endswith("/" + resource))
            ]

    def list_requests(self, resource: str = "pods") -> list[Request]:
        """List (not watch) requests so far of one resource (plural): pods unless told."""
        with self._cond:
            return [
                r
                for r in self.requests
                if r.method == "GET" and not r.is_watch and r.path.endswith("/" + resource)
            ]

    def _take_failure(self, method: str, path: str) -> int | None:
        for i, (m, fragment, code) in enumerate(self._failures):
            if m == method and fragment in path:
                del self._failures[i]
                return code
        return None

    # -- HTTP -------------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet tests
                pass

            def do_GET(self) -> None:
                fake._route(self, "GET")

            def do_PATCH(self) -> None:
                fake._route(self, "PATCH")

            def do_POST(self) -> None:
                fake._route(self, "POST")

        return Handler

    def _send_json(self, h: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, code: int, message: str) -> None:
        self._send_json(h, code, api.status_object(code, HTTPStatus(code).phrase.replace(" ", ""), message))

    def _route(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        segs = [s for s in parts.path.split("/") if s]
        with self._cond:
            self.requests.append(Request(method, parts.path, query))
            code = self._take_failure(method, parts.path)
        if code is not None:
            return self._error(h, code, f"injected failure {code}")
        # Events: created, recorded, never listed.
        if segs[:3] == ["api", "v1", "namespaces"] and len(segs) == 5 and segs[4] == "events":
            if method == "POST":
                return self._create_event(h, segs[3], raw, "v1")
        if segs[:3] == ["apis", "events.k8s.io", "v1"] and segs[3:4] == ["namespaces"] and len(segs) == 6:
            if segs[5] == "events" and method == "POST":
                return self._create_event(h, segs[4], raw, "events.k8s.io/v1")
        # /api/v1/... or /apis/{group}/{version}/..., then [namespaces/{ns}/]{plural}[/{name}[/status]]
        if segs[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segs[2:]
        elif segs[:1] == ["apis"] and len(segs) >= 3:
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            rest = []
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        resource = api.RESOURCES.get((group, version, rest[0])) if rest else None
        if resource is not None and (namespace is None or resource.namespaced):
            name = rest[1] if len(rest) >= 2 else None
            sub = rest[2] if len(rest) == 3 else None
            if len(rest) == 1 and method == "GET":
                return self._list_or_watch(h, resource, namespace, query)
            ok_sub = sub is None or (sub == "status" and resource.status_subresource)
            ok_ns = namespace is not None or not resource.namespaced  # a namespaced object needs its ns
            if name is not None and len(rest) <= 3 and ok_sub and ok_ns and method in ("GET", "PATCH"):
                return self._object(h, method, resource, namespace, name, sub, raw)
        message = f"the server could not find the requested resource ({method} {parts.path})"
        return self._error(h, 404, message)

    def _list_or_watch(
        self, h: BaseHTTPRequestHandler, resource: api.Resource, ns: str | None, query: Mapping[str, str]
    ) -> None:
        try:
            fields, labels = query.get("fieldSelector") or "", query.get("labelSelector") or ""
            matches = self.predicate(resource, ns, fields, labels)
        except api.SelectorError as e:
            return self._error(h, 400, str(e))
        if query.get("watch") in ("true", "1", "True"):
            return self._watch(h, resource, matches, query)
        self._send_json(h, 200, self.list_objects(resource, matches))

    def _watch(
        self,
        h: BaseHTTPRequestHandler,
        resource: api.Resource,
        matches: api.Predicate,
        query: Mapping[str, str],
    ) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1", "True")
        w = _Watch(resource, matches, bookmarks, sock=h.connection)
        timeout = float(query.get("timeoutSeconds") or 1800)
        try:
            # The watch ends as soon as its client hangs up, as the apiserver's does.
            events = self.stream(w, query.get("resourceVersion"), timeout, lambda: _hung_up(h.connection))
            for event in events:
                data = json.dumps(event).encode() + b"\n"
                h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.write(b"0\r\n\r\n")
        except (WatchDropped, OSError):
            h.close_connection = True  # no terminating chunk: the client sees a broken stream

    def _object(
        self,
        h: BaseHTTPRequestHandler,
        method: str,
        resource: api.Resource,
        ns: str | None,
        name: str,
        sub: str | None,
        raw: bytes,
    ) -> None:
        if method == "PATCH":
            code, body = self.apply_patch(resource, ns, name, sub, h.headers.get("Content-Type", ""), raw)
            return self._send_json(h, code, body)
        with self._cond:
            obj = self._objects[resource.plural].get(_key(resource, ns, name))
            if obj is None:
                message = f'{resource.qualified} "{name}" not found'
                code, body = 404, api.status_object(404, "NotFound", message, resource.details(name))
            else:
                code, body = 200, copy.deepcopy(obj)
        self._send_json(h, code, body)

    def _create_event(self, h: BaseHTTPRequestHandler, ns: str, raw: bytes, api_version: str) -> None:
        self._send_json(h, *self.record_event(ns, raw, api_version))
