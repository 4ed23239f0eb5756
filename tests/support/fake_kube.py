"""A small fake Kubernetes API server on loopback, for the real `kubernetes` client (point a kubeconfig
or `kubernetes.client.Configuration(host=fake.url)` at `FakeKube().url`).

Resources, each in one generic store (one monotonic resourceVersion counter for all of them; a history
of changes, each entry naming its resource, so a watch only sees its own resource):

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

Test controls: add_pod/update_pod/delete_pod/get_pod, add_node/update_node/delete_node/get_node,
add_preheat/update_preheat/delete_preheat/get_preheat, drop_watches, compact, bookmark,
pause_watches/resume_watches, fail_next, open_watches/watch_requests/list_requests, and the records
`patches` (pods), `node_patches`, `preheat_patches`, `events`, `requests` (patches are recorded once
accepted: after the 404 and precondition checks). open_watches/watch_requests take an optional
resource plural (default: all); list_requests counts pods unless given one.
"""

from __future__ import annotations

import copy
import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import kube_api as api


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1", "True")


@dataclass
class _Watch:
    sock: socket.socket
    resource: api.Resource
    matches: api.Predicate
    bookmarks: bool
    dropped: bool = False
    gone: bool = False
    bookmark_at: list[int] = field(default_factory=list)


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed its end (a watch client never sends more while it reads)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _key(resource: api.Resource, namespace: str | None, name: str) -> tuple[str, str]:
    return (namespace or "", name) if resource.namespaced else ("", name)


class FakeKube:
    """The fake API server. Use as a context manager or call start()/stop()."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 100
        self._compacted_rv = 0
        # resource plural -> (namespace or "", name) -> object
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r: {} for _, _, r in api.RESOURCES}
        self._history: list[api.Change] = []
        self._watches: list[_Watch] = []
        self._failures: list[tuple[str, str, int]] = []
        self._paused = False
        self._closing = False
        self.patches: list[dict[str, Any]] = []  # pods: {namespace, name, content_type, body, at}
        self.node_patches: list[dict[str, Any]] = []  # {name, content_type, body, at, subresource}
        self.preheat_patches: list[dict[str, Any]] = []  # {name, subresource, content_type, body, at}
        self.events: list[dict[str, Any]] = []
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

    # -- test controls: pods ----------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def add_pod(
        self,
        name: str,
        namespace: str = "default",
        node: str | None = "node-a",
        annotations: Mapping[str, str] | None = None,
        phase: str = "Running",
        uid: str | None = None,
    ) -> dict[str, Any]:
        pod = api.pod_object(name, namespace, node, annotations, phase, uid)
        with self._cond:
            if (namespace, name) in self._objects[api.PODS.plural]:
                raise ValueError(f"pod {namespace}/{name} exists")
            return self._store(api.PODS, "ADDED", pod)

    def update_pod(
        self,
        name: str,
        namespace: str = "default",
        annotations: Mapping[str, str | None] | None = None,
        phase: str | None = None,
        terminating: bool = False,
    ) -> dict[str, Any]:
        """api.Change a pod as a user or the kubelet would; an annotation set to None is removed."""
        patch: dict[str, Any] = {}
        if annotations is not None:
            patch["metadata"] = {"annotations": dict(annotations)}
        if terminating:
            patch.setdefault("metadata", {})["deletionTimestamp"] = "2024-01-01T00:00:01Z"
        if phase is not None:
            patch["status"] = {"phase": phase}
        with self._cond:
            pod = self._objects[api.PODS.plural][(namespace, name)]
            return self._store(api.PODS, "MODIFIED", api.merge_patch(pod, patch))

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        with self._cond:
            self._delete(api.PODS, (namespace, name))

    def get_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects[api.PODS.plural][(namespace, name)])

    # -- test controls: nodes ---------------------------------------------------------------------

    def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        node = api.node_object(name, labels)
        with self._cond:
            if ("", name) in self._objects[api.NODES.plural]:
                raise ValueError(f"node {name} exists")
            return self._store(api.NODES, "ADDED", node)

    def update_node(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        """api.Change a node's labels as a user would; a label set to None is removed. No change: no event."""
        with self._cond:
            node = self._objects[api.NODES.plural][("", name)]
            return self._store(
                api.NODES, "MODIFIED", api.merge_patch(node, {"metadata": {"labels": dict(labels)}})
            )

    def delete_node(self, name: str) -> None:
        with self._cond:
            self._delete(api.NODES, ("", name))

    def get_node(self, name: str) -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects[api.NODES.plural][("", name)])

    # -- test controls: modelpreheats -------------------------------------------------------------

    def add_preheat(
        self, name: str, model: str, node_selector: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        preheat = api.preheat_object(name, model, node_selector)
        with self._cond:
            if ("", name) in self._objects[api.PREHEATS.plural]:
                raise ValueError(f"modelpreheat {name} exists")
            return self._store(api.PREHEATS, "ADDED", preheat)

    def update_preheat(self, name: str, spec_patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch the spec as a user would (None removes a key); the generation grows if it changed."""
        with self._cond:
            current = self._objects[api.PREHEATS.plural][("", name)]
            changed = api.merge_patch(current, {"spec": dict(spec_patch)})
            return self._store(
                api.PREHEATS, "MODIFIED", api.update_strategy(api.PREHEATS, current, changed, None)
            )

    def delete_preheat(self, name: str) -> None:
        with self._cond:
            self._delete(api.PREHEATS, ("", name))

    def get_preheat(self, name: str) -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects[api.PREHEATS.plural][("", name)])

    # -- test controls: watches, failures, records ------------------------------------------------

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream (no terminating chunk), as a dying LB would."""
        with self._cond:
            watches = list(self._watches)
            for w in watches:
                w.dropped = True
            self._cond.notify_all()
        for w in watches:
            try:
                w.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def compact(self) -> None:
        """Forget history: every resourceVersion up to now is too old to watch from (410 Gone).

        Open watches (of every resource) get an ERROR 410 event and end, as when the apiserver's
        watch cache drops a watcher that fell behind.
        """
        with self._cond:
            self._rv += 1  # other objects changed meanwhile; the current list rv is still watchable
            self._compacted_rv = self._rv
            self._history = [h for h in self._history if h.rv > self._compacted_rv]
            for w in self._watches:
                w.gone = True
            self._cond.notify_all()

    def bookmark(self) -> int:
        """Send a BOOKMARK with the current resourceVersion to watches that allow bookmarks."""
        with self._cond:
            for w in self._watches:
                if w.bookmarks:
                    w.bookmark_at.append(self._rv)
            self._cond.notify_all()
            return self._rv

    def pause_watches(self) -> None:
        """Hold back events from open watches (they still see compact/drop)."""
        with self._cond:
            self._paused = True

    def resume_watches(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def fail_next(self, method: str, path_contains: str, code: int) -> None:
        """Answer the next matching request with a Status error of `code`."""
        with self._cond:
            self._failures.append((method, path_contains, code))

    def open_watches(self, resource: str | None = None) -> int:
        """Open watch streams, of one resource (plural, e.g. "nodes") or of all."""
        with self._cond:
            return len([w for w in self._watches if resource is None or w.resource.plural == resource])

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

    # -- state (hold self._cond) ------------------------------------------------------------------

    def _store(self, resource: api.Resource, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = _key(resource, meta.get("namespace"), meta["name"])
        prev = self._objects[resource.plural].get(key)
        if kind == "MODIFIED" and prev is not None and resource.strict_updates:
            unchanged = copy.deepcopy(obj)
            unchanged["metadata"]["resourceVersion"] = prev["metadata"].get("resourceVersion")
            if unchanged == prev:  # a real apiserver skips the write: same resourceVersion, no event
                return copy.deepcopy(prev)
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objects[resource.plural][key] = obj
        self._history.append(api.Change(self._rv, resource.plural, kind, copy.deepcopy(obj), prev))
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _delete(self, resource: api.Resource, key: tuple[str, str]) -> None:
        prev = self._objects[resource.plural].pop(key)
        self._rv += 1
        obj = copy.deepcopy(prev)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append(api.Change(self._rv, resource.plural, "DELETED", obj, prev))
        self._cond.notify_all()

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
            by_field = api.field_selector(query.get("fieldSelector") or "", resource)
            by_label = api.label_selector(query.get("labelSelector") or "")
        except api.SelectorError as e:
            return self._error(h, 400, str(e))

        def matches(obj: Mapping[str, Any]) -> bool:
            if ns is not None and obj["metadata"].get("namespace") != ns:
                return False
            return by_field(obj) and by_label(obj)

        if query.get("watch") in ("true", "1", "True"):
            return self._watch(h, resource, matches, query)
        with self._cond:
            items = [copy.deepcopy(o) for o in self._objects[resource.plural].values() if matches(o)]
            rv = self._rv
        self._send_json(
            h,
            200,
            {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(rv)},
                "items": items,
            },
        )

    def _watch(
        self,
        h: BaseHTTPRequestHandler,
        resource: api.Resource,
        matches: api.Predicate,
        query: Mapping[str, str],
    ) -> None:
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def send(obj: Any) -> None:
            data = json.dumps(obj).encode() + b"\n"
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        w = _Watch(h.connection, resource, matches, query.get("allowWatchBookmarks") in ("true", "1", "True"))
        with self._cond:
            self._watches.append(w)
            rv_param = query.get("resourceVersion") or "0"
            initial: list[dict[str, Any]] = []
            if rv_param == "0":  # "any": synthetic ADDED for the current state, as the real server
                cursor = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for o in self._objects[resource.plural].values()
                    if matches(o)
                ]
            else:
                cursor = int(rv_param)
            too_old = cursor < self._compacted_rv
        try:
            if too_old:
                msg = f"too old resource version: {cursor} ({self._compacted_rv})"
                send({"type": "ERROR", "object": api.status_object(410, "Expired", msg)})
                return self._end(h)
            for event in initial:
                send(event)
            while True:
                with self._cond:
                    while True:
                        if w.dropped or self._closing:
                            h.close_connection = True
                            return  # no terminating chunk: the client sees a broken stream
                        if w.gone:
                            expired = api.status_object(410, "Expired", "watch expired")
                            out = [{"type": "ERROR", "object": expired}]
                            break
                        fresh = (
                            []
                            if self._paused
                            else [c for c in self._history if c.rv > cursor and c.resource == resource.plural]
                        )
                        # A bookmark must not move the cursor past events that are held back.
                        marks = [] if self._paused else w.bookmark_at[:]
                        if marks:
                            w.bookmark_at.clear()
                        if fresh:
                            cursor = max(cursor, fresh[-1].rv)
                        out = [e for e in (api.watch_event(c, matches) for c in fresh) if e is not None]
                        for mark in marks:
                            cursor = max(cursor, mark)
                            out.append(
                                {
                                    "type": "BOOKMARK",
                                    "object": {
                                        "kind": resource.kind,
                                        "apiVersion": resource.api_version,
                                        "metadata": {"resourceVersion": str(cursor)},
                                    },
                                }
                            )
                        if out:
                            break
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        if _hung_up(h.connection):  # the client went away: end, as the apiserver does
                            h.close_connection = True
                            return
                        self._cond.wait(min(remaining, 0.2))
                for event in out:
                    send(event)
                if not out or out[-1]["type"] == "ERROR":
                    return self._end(h)
        except OSError:
            h.close_connection = True
        finally:
            with self._cond:
                self._watches.remove(w)

    @staticmethod
    def _end(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"0\r\n\r\n")

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
        with self._cond:
            obj = self._objects[resource.plural].get(_key(resource, ns, name))
            if obj is None:
                message = f'{resource.qualified} "{name}" not found'
                code, body = 404, api.status_object(404, "NotFound", message, resource.details(name))
            elif method == "GET":
                code, body = 200, copy.deepcopy(obj)
            else:
                code, body = self._apply_patch(resource, obj, sub, h.headers.get("Content-Type", ""), raw)
        self._send_json(h, code, body)

    def _apply_patch(
        self, resource: api.Resource, current: dict[str, Any], sub: str | None, content_type: str, raw: bytes
    ) -> tuple[int, dict[str, Any]]:
        try:
            kind, patch, patched = api.patch_object(resource, current, content_type, raw)
        except api.ApiError as e:
            return e.code, e.status
        name = current["metadata"]["name"]
        record: dict[str, Any] = {"name": name, "content_type": kind, "body": patch, "at": time.monotonic()}
        if resource is api.PODS:
            self.patches.append({"namespace": current["metadata"]["namespace"], **record})
            return 200, self._store(resource, "MODIFIED", patched)
        (self.node_patches if resource is api.NODES else self.preheat_patches).append(
            {**record, "subresource": sub}
        )
        return 200, self._store(resource, "MODIFIED", api.update_strategy(resource, current, patched, sub))

    def _create_event(self, h: BaseHTTPRequestHandler, ns: str, raw: bytes, api_version: str) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            return self._error(h, 400, "event body is not JSON")
        meta = event.get("metadata") or {}
        if meta.get("namespace", ns) != ns:
            return self._error(h, 400, "the namespace of the object does not match the request")
        if not meta.get("name") and not meta.get("generateName"):
            return self._error(h, 422, "metadata.name or generateName is required")
        with self._cond:
            self._rv += 1
            meta = dict(meta, namespace=ns, resourceVersion=str(self._rv), uid=str(uuid.uuid4()))
            meta.setdefault("name", meta.get("generateName", "") + uuid.uuid4().hex[:5])
            event = dict(event, metadata=meta, apiVersion=api_version, kind="Event")
            self.events.append(event)
        self._send_json(h, 201, event)
