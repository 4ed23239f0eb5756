"""A small fake Kubernetes API server on loopback, enough for agent.kube.client with the real client.

Speaks: pod list (all namespaces or one) honouring `fieldSelector=spec.nodeName=X`; watch as a
chunked stream of JSON lines (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR) from a resourceVersion
with `timeoutSeconds` and `allowWatchBookmarks`; 410 Gone (as an ERROR event, like the real
server) for a resourceVersion older than the last `compact()`; pod GET; pod PATCH with
merge-patch / strategic-merge-patch (applied to the stored pod, bumping the resourceVersion,
emitting MODIFIED; `metadata.uid` in the patch is a precondition); Event creation (core/v1
and events.k8s.io/v1). Errors are `Status` objects. resourceVersion is one monotonic counter.

Test controls: add_pod, update_pod, delete_pod, drop_watches, compact, bookmark,
pause_watches/resume_watches, fail_next, and the records `patches`, `events`, `requests`.
"""

from __future__ import annotations

import copy
import json
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


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also what strategic merge does for maps like annotations)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


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
    namespace: str | None
    node: str | None
    bookmarks: bool
    dropped: bool = False
    gone: bool = False
    bookmark_at: list[int] = field(default_factory=list)


class FakeKube:
    """The fake API server. Use as a context manager or call start()/stop()."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 100
        self._compacted_rv = 0
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._history: list[tuple[int, str, dict[str, Any]]] = []
        self._watches: list[_Watch] = []
        self._failures: list[tuple[str, str, int]] = []
        self._paused = False
        self._closing = False
        self.patches: list[dict[str, Any]] = []
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

    # -- test controls ----------------------------------------------------------------------------

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
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or str(uuid.uuid4()),
                "annotations": dict(annotations or {}),
                "creationTimestamp": "2024-01-01T00:00:00Z",
            },
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "vllm/vllm-openai"}]},
            "status": {"phase": phase},
        }
        with self._cond:
            if (namespace, name) in self._pods:
                raise ValueError(f"pod {namespace}/{name} exists")
            return self._store("ADDED", pod)

    def update_pod(
        self,
        name: str,
        namespace: str = "default",
        annotations: Mapping[str, str | None] | None = None,
        phase: str | None = None,
        terminating: bool = False,
    ) -> dict[str, Any]:
        """Change a pod as a user or the kubelet would; an annotation set to None is removed."""
        patch: dict[str, Any] = {}
        if annotations is not None:
            patch["metadata"] = {"annotations": dict(annotations)}
        if terminating:
            patch.setdefault("metadata", {})["deletionTimestamp"] = "2024-01-01T00:00:01Z"
        if phase is not None:
            patch["status"] = {"phase": phase}
        with self._cond:
            pod = self._pods[(namespace, name)]
            return self._store("MODIFIED", merge_patch(pod, patch))

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        with self._cond:
            pod = self._pods.pop((namespace, name))
            self._rv += 1
            pod = copy.deepcopy(pod)
            pod["metadata"]["resourceVersion"] = str(self._rv)
            self._history.append((self._rv, "DELETED", pod))
            self._cond.notify_all()

    def get_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._pods[(namespace, name)])

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

        Open watches get an ERROR 410 event and end, as when the apiserver's watch cache
        drops a watcher that fell behind.
        """
        with self._cond:
            self._rv += 1  # other objects changed meanwhile; the current list rv is still watchable
            self._compacted_rv = self._rv
            self._history = [h for h in self._history if h[0] > self._compacted_rv]
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

    def open_watches(self) -> int:
        with self._cond:
            return len(self._watches)

    def watch_requests(self) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if r.method == "GET" and r.is_watch]

    def list_requests(self) -> list[Request]:
        with self._cond:
            return [
                r for r in self.requests
                if r.method == "GET" and not r.is_watch and r.path.endswith("/pods")
            ]

    # -- state (hold self._cond) ------------------------------------------------------------------

    def _store(self, kind: str, pod: dict[str, Any]) -> dict[str, Any]:
        self._rv += 1
        pod = copy.deepcopy(pod)
        pod["metadata"]["resourceVersion"] = str(self._rv)
        meta = pod["metadata"]
        self._pods[(meta["namespace"], meta["name"])] = pod
        self._history.append((self._rv, kind, copy.deepcopy(pod)))
        self._cond.notify_all()
        return copy.deepcopy(pod)

    def _take_failure(self, method: str, path: str) -> int | None:
        for i, (m, fragment, code) in enumerate(self._failures):
            if m == method and fragment in path:
                del self._failures[i]
                return code
        return None

    @staticmethod
    def _matches(pod: Mapping[str, Any], namespace: str | None, node: str | None) -> bool:
        if namespace is not None and pod["metadata"]["namespace"] != namespace:
            return False
        return node is None or pod["spec"].get("nodeName") == node

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
        self._send_json(h, code, status_object(code, HTTPStatus(code).phrase.replace(" ", ""), message))

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
        # /api/v1/pods | /api/v1/namespaces/{ns}/pods[/{name}] | .../events
        if segs[:2] == ["api", "v1"] and segs[2:] == ["pods"] and method == "GET":
            return self._list_or_watch(h, None, query)
        if segs[:3] == ["api", "v1", "namespaces"] and len(segs) >= 5:
            ns, resource, rest = segs[3], segs[4], segs[5:]
            if resource == "pods" and not rest and method == "GET":
                return self._list_or_watch(h, ns, query)
            if resource == "pods" and len(rest) == 1 and method in ("GET", "PATCH"):
                return self._pod(h, method, ns, rest[0], raw)
            if resource == "events" and not rest and method == "POST":
                return self._create_event(h, ns, raw, "v1")
        if segs[:3] == ["apis", "events.k8s.io", "v1"] and segs[3:4] == ["namespaces"] and len(segs) == 6:
            if segs[5] == "events" and method == "POST":
                return self._create_event(h, segs[4], raw, "events.k8s.io/v1")
        message = f"the server could not find the requested resource ({method} {parts.path})"
        return self._error(h, 404, message)

    def _node_selector(self, query: Mapping[str, str]) -> tuple[bool, str | None]:
        selector = query.get("fieldSelector")
        if not selector:
            return True, None
        key, _, value = selector.replace("==", "=").partition("=")
        if key != "spec.nodeName":
            return False, None
        return True, value

    def _list_or_watch(self, h: BaseHTTPRequestHandler, ns: str | None, query: Mapping[str, str]) -> None:
        ok, node = self._node_selector(query)
        if not ok:
            return self._error(h, 400, f"unsupported field selector {query.get('fieldSelector')!r}")
        if query.get("watch") in ("true", "1", "True"):
            return self._watch(h, ns, node, query)
        with self._cond:
            items = [copy.deepcopy(p) for p in self._pods.values() if self._matches(p, ns, node)]
            rv = self._rv
        self._send_json(h, 200, {
            "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}, "items": items,
        })

    def _watch(
        self, h: BaseHTTPRequestHandler, ns: str | None, node: str | None, query: Mapping[str, str]
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

        w = _Watch(h.connection, ns, node, query.get("allowWatchBookmarks") in ("true", "1", "True"))
        with self._cond:
            self._watches.append(w)
            rv_param = query.get("resourceVersion") or "0"
            initial: list[dict[str, Any]] = []
            if rv_param == "0":  # "any": synthetic ADDED for the current state, as the real server
                cursor = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(p)}
                    for p in self._pods.values() if self._matches(p, ns, node)
                ]
            else:
                cursor = int(rv_param)
            too_old = cursor < self._compacted_rv
        try:
            if too_old:
                msg = f"too old resource version: {cursor} ({self._compacted_rv})"
                send({"type": "ERROR", "object": status_object(410, "Expired", msg)})
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
                            expired = status_object(410, "Expired", "watch expired")
                            out = [{"type": "ERROR", "object": expired}]
                            break
                        fresh = [] if self._paused else [
                            (rv, kind, pod) for rv, kind, pod in self._history
                            if rv > cursor and self._matches(pod, ns, node)
                        ]
                        # A bookmark must not move the cursor past events that are held back.
                        marks = [] if self._paused else w.bookmark_at[:]
                        if marks:
                            w.bookmark_at.clear()
                        if fresh or marks:
                            out = [{"type": kind, "object": copy.deepcopy(pod)} for _, kind, pod in fresh]
                            if fresh:
                                cursor = max(cursor, fresh[-1][0])
                            for mark in marks:
                                cursor = max(cursor, mark)
                                out.append({"type": "BOOKMARK", "object": {
                                    "kind": "Pod", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": str(cursor)},
                                }})
                            break
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            out = []
                            break
                        self._cond.wait(min(remaining, 1.0))
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

    def _pod(self, h: BaseHTTPRequestHandler, method: str, ns: str, name: str, raw: bytes) -> None:
        with self._cond:
            pod = self._pods.get((ns, name))
            if pod is None:
                code, body = 404, status_object(404, "NotFound", f'pods "{name}" not found')
            elif method == "GET":
                code, body = 200, copy.deepcopy(pod)
            else:
                code, body = self._apply_patch(pod, h.headers.get("Content-Type", ""), raw)
        self._send_json(h, code, body)

    def _apply_patch(self, pod: dict[str, Any], content_type: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        kind = content_type.split(";")[0].strip()
        if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return 415, status_object(415, "UnsupportedMediaType", f"patch type {kind!r} not supported")
        try:
            patch = json.loads(raw)
        except ValueError:
            return 400, status_object(400, "BadRequest", "patch body is not JSON")
        if not isinstance(patch, dict):
            return 400, status_object(400, "BadRequest", "patch body is not an object")
        meta = patch.get("metadata") or {}
        if "uid" in meta and meta["uid"] != pod["metadata"]["uid"]:
            message = "Precondition failed: UID in precondition does not match"
            return 409, status_object(409, "Conflict", message)
        self.patches.append({
            "namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"],
            "content_type": kind, "body": patch, "at": time.monotonic(),
        })
        return 200, self._store("MODIFIED", merge_patch(pod, patch))

    def _create_event(self, h: BaseHTTPRequestHandler, ns: str, raw: bytes, api: str) -> None:
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
            event = dict(event, metadata=meta, apiVersion=api if api != "v1" else "v1", kind="Event")
            self.events.append(event)
        self._send_json(h, 201, event)
