"""The in-memory twin of the agent's Kubernetes port (agent.kube.api.KubeApi), as spegel's
`routing.Router` has `memory.go`: the watchers, pods out and the fleet run against it with no HTTP and
no kubernetes client. It is also the store that tests.support.fake_kube serves over HTTP, so both mean
the same by every object, patch, selector and watch event (tests.support.kube_api says what a real
API server means by them).

Resources: pods (namespaced), nodes, ModelPreheats (cluster-scoped, status subresource); one monotonic
resourceVersion for all of them and a history of changes. A watch from a resourceVersion older than
the last `compact()` gets 410 Gone, as on the real server (the apiserver's watch cache keeps a window
of history: `--watch-cache-sizes`, "too old resource version" in k8s.io/apiserver's cacher).

Test controls: add_pod/update_pod/delete_pod/get_pod, add_node/update_node/delete_node/get_node,
add_preheat/update_preheat/delete_preheat/get_preheat, compact, bookmark, pause_watches/resume_watches,
drop_watches, refuse_next (the port's calls), open_watches, and the records `patches` (pods),
`node_patches`, `preheat_patches`, `events`.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.kube.api import ApiError, Kind, Query
from tests.support import kube_api as api

_BY_PLURAL = {r.plural: r for r in api.RESOURCES.values()}


class WatchDropped(Exception):
    """The watch ended without its last chunk: the connection was cut (or its client went away)."""


@dataclass
class WatchState:
    """One open watch: what it sees, and what the test did to it."""

    resource: api.Resource
    matches: api.Predicate
    bookmarks: bool
    dropped: bool = False
    gone: bool = False
    stopped: bool = False
    bookmark_at: list[int] = field(default_factory=list)


def _key(resource: api.Resource, namespace: str | None, name: str) -> tuple[str, str]:
    return (namespace or "", name) if resource.namespaced else ("", name)


class MemoryKube:
    """The twin; `KubeApi` by its `list`, `watch`, `get`, `patch`, `create_event` and `close`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 100
        self._compacted_rv = 0
        # resource plural -> (namespace or "", name) -> object
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r: {} for _, _, r in api.RESOURCES}
        self._history: list[api.Change] = []
        self._watches: list[WatchState] = []
        self._refusals: list[tuple[str, int]] = []
        self._paused = False
        self._closing = False
        self.patches: list[dict[str, Any]] = []  # pods: {namespace, name, content_type, body, at}
        self.node_patches: list[dict[str, Any]] = []  # {name, content_type, body, at, subresource}
        self.preheat_patches: list[dict[str, Any]] = []  # {name, subresource, content_type, body, at}
        self.events: list[dict[str, Any]] = []

    # -- the port ---------------------------------------------------------------------------------

    def list(self, query: Query) -> tuple[list[dict[str, Any]], str | None]:
        self._refuse("list")
        resource, matches = self._filter(query)
        with self._cond:
            items = [copy.deepcopy(o) for o in self._objects[resource.plural].values() if matches(o)]
            return items, str(self._rv)

    def watch(self, query: Query, resource_version: str | None, timeout: int) -> _MemoryWatch:
        self._refuse("watch")
        resource, matches = self._filter(query)
        return _MemoryWatch(self, WatchState(resource, matches, bookmarks=True), resource_version, timeout)

    def get(self, kind: Kind, name: str, subresource: str | None = None) -> dict[str, Any]:
        self._refuse("get")
        resource = _BY_PLURAL[kind]
        with self._cond:
            obj = self._objects[resource.plural].get(_key(resource, None, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource.qualified} "{name}" not found')
            return copy.deepcopy(obj)

    def patch(
        self, kind: Kind, name: str, body: Mapping[str, Any], namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        self._refuse("patch")
        resource = _BY_PLURAL[kind]
        code, answer = self.apply_patch(
            resource, namespace, name, subresource, api.MERGE_PATCH, json.dumps(body).encode()
        )
        if code != 200:
            raise ApiError(code, answer["reason"], answer["message"])
        return answer

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self._refuse("create_event")
        # As the client sends it: datetimes in ISO 8601.
        raw = json.dumps(event, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v))
        code, answer = self.record_event(namespace, raw.encode(), "v1")
        if code != 201:
            raise ApiError(code, answer["reason"], answer["message"])

    def close(self) -> None:
        """Nothing to release."""

    # -- shared with the HTTP fake ----------------------------------------------------------------

    def apply_patch(
        self, resource: api.Resource, ns: str | None, name: str, sub: str | None, content_type: str,
        raw: bytes,
    ) -> tuple[int, dict[str, Any]]:
        """A PATCH as the API server takes it: (HTTP code, the stored object or a `Status`)."""
        with self._cond:
            current = self._objects[resource.plural].get(_key(resource, ns, name))
            if current is None:
                message = f'{resource.qualified} "{name}" not found'
                return 404, api.status_object(404, "NotFound", message, resource.details(name))
            try:
                kind, patch, patched = api.patch_object(resource, current, content_type, raw)
            except api.ApiError as e:
                return e.code, e.status
            record: dict[str, Any] = {"name": name, "content_type": kind, "body": patch}
            record["at"] = time.monotonic()
            if resource is api.PODS:
                self.patches.append({"namespace": current["metadata"]["namespace"], **record})
                return 200, self._store(resource, "MODIFIED", patched)
            (self.node_patches if resource is api.NODES else self.preheat_patches).append(
                {**record, "subresource": sub}
            )
            kept = api.update_strategy(resource, current, patched, sub)
            return 200, self._store(resource, "MODIFIED", kept)

    def record_event(self, ns: str, raw: bytes, api_version: str) -> tuple[int, dict[str, Any]]:
        """An Event created (recorded in `events`, never listed): (HTTP code, the event or a `Status`)."""
        try:
            event = json.loads(raw)
        except ValueError:
            return 400, api.status_object(400, "BadRequest", "event body is not JSON")
        meta = event.get("metadata") or {}
        if meta.get("namespace", ns) != ns:
            message = "the namespace of the object does not match the request"
            return 400, api.status_object(400, "BadRequest", message)
        if not meta.get("name") and not meta.get("generateName"):
            return 422, api.status_object(422, "Invalid", "metadata.name or generateName is required")
        with self._cond:
            self._rv += 1
            meta = dict(meta, namespace=ns, resourceVersion=str(self._rv), uid=str(uuid.uuid4()))
            meta.setdefault("name", meta.get("generateName", "") + uuid.uuid4().hex[:5])
            event = dict(event, metadata=meta, apiVersion=api_version, kind="Event")
            self.events.append(event)
        return 201, event

    def list_objects(self, resource: api.Resource, matches: api.Predicate) -> dict[str, Any]:
        """A list answer: the matching objects and the resourceVersion to watch from."""
        with self._cond:
            items = [copy.deepcopy(o) for o in self._objects[resource.plural].values() if matches(o)]
            rv = self._rv
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    def stream(
        self, w: WatchState, rv_param: str | None, timeout: float, hung_up: Callable[[], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch, as the apiserver sends them: from `rv_param` (unset or "0": the
        current state as ADDED first), ERROR 410 last when too old or compacted under it; ends at
        `timeout` or `w.stopped`; raises WatchDropped when the test cut it or `hung_up()`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._watches.append(w)
            initial: list[dict[str, Any]] = []
            if not rv_param or rv_param == "0":  # "any": synthetic ADDED for the current state
                cursor = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for o in self._objects[w.resource.plural].values()
                    if w.matches(o)
                ]
            else:
                cursor = int(rv_param)
            too_old = cursor < self._compacted_rv
            compacted = self._compacted_rv
        try:
            if too_old:
                msg = f"too old resource version: {cursor} ({compacted})"
                yield {"type": "ERROR", "object": api.status_object(410, "Expired", msg)}
                return
            yield from initial
            while True:
                with self._cond:
                    while True:
                        if w.dropped or self._closing:
                            raise WatchDropped
                        if w.stopped:
                            return
                        if w.gone:
                            expired = api.status_object(410, "Expired", "watch expired")
                            out = [{"type": "ERROR", "object": expired}]
                            break
                        mine = w.resource.plural
                        fresh = [c for c in self._history if c.rv > cursor and c.resource == mine]
                        fresh = [] if self._paused else fresh
                        # A bookmark must not move the cursor past events that are held back.
                        marks = [] if self._paused else w.bookmark_at[:]
                        if marks:
                            w.bookmark_at.clear()
                        if fresh:
                            cursor = max(cursor, fresh[-1].rv)
                        out = [e for e in (api.watch_event(c, w.matches) for c in fresh) if e is not None]
                        for mark in marks:
                            cursor = max(cursor, mark)
                            obj: dict[str, Any] = {"kind": w.resource.kind, "metadata": {}}
                            obj["apiVersion"] = w.resource.api_version
                            obj["metadata"]["resourceVersion"] = str(cursor)
                            out.append({"type": "BOOKMARK", "object": obj})
                        if out:
                            break
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        if hung_up is not None and hung_up():  # the client went away: end, as the apiserver
                            raise WatchDropped
                        self._cond.wait(min(remaining, 0.2))
                yield from out
                if not out or out[-1]["type"] == "ERROR":
                    return
        finally:
            with self._cond:
                self._watches.remove(w)

    def _filter(self, query: Query) -> tuple[api.Resource, api.Predicate]:
        resource = _BY_PLURAL[query.kind]
        try:
            fields, labels = query.field_selector, query.label_selector
            return resource, self.predicate(resource, query.namespace, fields, labels)
        except api.SelectorError as e:
            raise ApiError(400, "BadRequest", str(e)) from None

    @staticmethod
    def predicate(resource: api.Resource, ns: str | None, fields: str, labels: str) -> api.Predicate:
        """What a list or watch selects; raises SelectorError (a 400)."""
        by_field = api.field_selector(fields, resource)
        by_label = api.label_selector(labels)

        def matches(obj: Mapping[str, Any]) -> bool:
            if ns is not None and obj["metadata"].get("namespace") != ns:
                return False
            return by_field(obj) and by_label(obj)

        return matches

    def _refuse(self, call: str) -> None:
        with self._cond:
            for i, (c, status) in enumerate(self._refusals):
                if c == call:
                    del self._refusals[i]
                    raise ApiError(status, "Injected", f"injected failure {status}")

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
        """Change a pod as a user or the kubelet would; an annotation set to None is removed."""
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
        """Change a node's labels as a user would; a label set to None is removed. No change: no event."""
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

    # -- test controls: watches, failures ---------------------------------------------------------

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

    def drop_watches(self) -> tuple[WatchState, ...]:
        """Cut every open watch mid-stream (no last chunk), as a dying load balancer would."""
        with self._cond:
            watches = tuple(self._watches)
            for w in watches:
                w.dropped = True
            self._cond.notify_all()
        return watches

    def refuse_next(self, call: str, status: int) -> None:
        """Answer the next port call of this name ("list", "watch", "patch", ...) with ApiError(status)."""
        with self._cond:
            self._refusals.append((call, status))

    def open_watches(self, resource: str | None = None) -> int:
        """Open watch streams, of one resource (plural, e.g. "nodes") or of all."""
        with self._cond:
            return len([w for w in self._watches if resource is None or w.resource.plural == resource])

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


class _MemoryWatch:
    """agent.kube.api.Watch over `MemoryKube.stream`: an ERROR event is the ApiError the adapter
    raises for it, a cut stream a ConnectionError."""

    def __init__(self, kube: MemoryKube, state: WatchState, rv: str | None, timeout: int) -> None:
        self._kube, self._state, self._rv, self._timeout = kube, state, rv, timeout

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        try:
            for event in self._kube.stream(self._state, self._rv, self._timeout):
                if event["type"] == "ERROR":
                    status = event["object"]
                    raise ApiError(status["code"], status["reason"], status["message"])
                yield event
        except WatchDropped:
            raise ConnectionError("watch stream cut") from None

    def stop(self) -> None:
        with self._kube._cond:
            self._state.stopped = True
            self._kube._cond.notify_all()
