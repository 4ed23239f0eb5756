"""Pods in: the pods scheduled to this node, and what each asks for in `weightswarm.io/models`.

`PodWatcher` reads only (list and watch through the port, agent.kube.api); what the agent writes back
on a pod, for a good request or a bad one, agent.kube.podsync decides and agent.kube.pods_out writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.errors import AnnotationError, ConfigError
from agent.core.settings import KubeSettings
from agent.kube.api import KubeApi, Query
from agent.kube.listwatch import ListWatch
from agent.kube.requests import MODELS_ANNOTATION, ModelRef, PodKey, parse_models_annotation

log = logging.getLogger(__name__)

_GONE_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass
class _Seen:
    """What the watcher last told about one pod, so re-lists and unrelated updates stay silent."""

    pod: PodKey
    models: tuple[ModelRef, ...] | None = None
    bad: str | None = None


class PodWatcher(ListWatch):
    """Follows pods on `settings.node_name` (list, then watch from the list's resourceVersion; relist
    on 410 Gone; reconnect with bounded backoff) and reports what they ask for.

    Callbacks run on the watcher's thread, one at a time, and should return quickly:
    - `on_request(pod, models)`: the pod's (non-empty, de-duplicated) wish list is new or changed;
      it is the whole list, not a delta (`RequestTracker.set_pod` turns it into one).
    - `on_bad_annotation(pod, error)`: the annotation is malformed (told once per distinct error).
    - `on_pod_gone(pod)`: a pod told about (a request or a bad annotation) was deleted, finished
      (Succeeded/Failed), is terminating, or dropped its annotation; also when a request turns bad
      (before `on_bad_annotation`).
    A callback that raises is logged and does not stop the watcher.
    """

    def __init__(
        self,
        settings: KubeSettings,
        api: KubeApi,
        on_request: Callable[[PodKey, list[ModelRef]], None],
        on_pod_gone: Callable[[PodKey], None],
        on_bad_annotation: Callable[[PodKey, AnnotationError], None] | None = None,
    ) -> None:
        if not settings.node_name:
            raise ConfigError(
                "the pod watcher needs this node's name: set --node-name (the chart passes spec.nodeName)"
            )
        super().__init__(settings, api)
        self._on_request = on_request
        self._on_pod_gone = on_pod_gone
        self._on_bad_annotation = on_bad_annotation
        self._seen: dict[str, _Seen] = {}  # by pod uid
        self.what = f"pods on node {settings.node_name}"
        self.rbac_hint = "RBAC: the agent needs list/watch on pods; see agent/kube/adapter.py"

    def query(self) -> Query:
        node = f"spec.nodeName={self._settings.node_name}"
        return Query("pods", self._settings.namespace, field_selector=node)

    def _known(self) -> list[str]:
        return list(self._seen)

    def _observe(self, pod: Mapping[str, Any]) -> str | None:
        """Act on one pod's current state; returns its uid if it is still of interest."""
        meta = pod.get("metadata") or {}
        uid, name, namespace = meta.get("uid"), meta.get("name"), meta.get("namespace")
        if not (isinstance(uid, str) and isinstance(name, str) and isinstance(namespace, str)):
            return None
        if not (uid and name and namespace):
            return None
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node != self._settings.node_name or phase in _GONE_PHASES or meta.get("deletionTimestamp"):
            self._forget(uid)
            return None
        value = (meta.get("annotations") or {}).get(MODELS_ANNOTATION)
        if value is None:
            self._forget(uid)
            return None
        key = PodKey(namespace=namespace, name=name, uid=uid)
        seen = self._seen.get(uid)
        try:
            models = parse_models_annotation(value)
        except AnnotationError as exc:
            if seen is not None and seen.bad == str(exc):
                return uid
            if seen is not None and seen.models is not None:
                self._call(self._on_pod_gone, key)
            self._seen[uid] = _Seen(key, bad=str(exc))
            if self._on_bad_annotation is not None:
                self._call(self._on_bad_annotation, key, exc)
            return uid
        if seen is not None and seen.models == tuple(models):
            return uid
        self._seen[uid] = _Seen(key, models=tuple(models))
        self._call(self._on_request, key, models)
        return uid

    def _forget(self, uid: str) -> None:
        seen = self._seen.pop(uid, None)
        if seen is not None:
            self._call(self._on_pod_gone, seen.pod)

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("pod watcher callback %s failed", getattr(callback, "__name__", callback))
