"""Kubernetes adapter: the pod watcher and the status reporter (with agent.kube.fleet, the only modules
that import `kubernetes`). `ListWatch` is the list-then-watch loop both use.

`PodWatcher` follows the pods scheduled to this node (list, then watch from the list's
resourceVersion; relist on 410 Gone; reconnect with bounded backoff) and tells the daemon
which models each pod asks for in `weightswarm.io/models`. `StatusReporter` writes progress
back on the pod (`weightswarm.io/status`, rate-limited and coalesced) and creates Events.

RBAC the agent's ServiceAccount needs (a ClusterRole bound by a ClusterRoleBinding; a Role
in one namespace is enough when `KubeSettings.namespace` is set):

    - apiGroups: [""]
      resources: ["pods"]
      verbs: ["list", "watch", "patch"]
        list + watch: GET /api/v1/pods?fieldSelector=spec.nodeName=<node> (or
          /api/v1/namespaces/<ns>/pods), with watch=1, allowWatchBookmarks, timeoutSeconds.
        patch: PATCH /api/v1/namespaces/<ns>/pods/<name>, application/merge-patch+json,
          touching only metadata.annotations["weightswarm.io/status"] (metadata.uid is sent
          as a precondition so a recreated pod of the same name is never patched).
    - apiGroups: [""]
      resources: ["events"]
      verbs: ["create"]
        core/v1 Events in the pod's namespace (reasons ModelFetchStarted, ModelReady,
        ModelFetchFailed, BadAnnotation), involvedObject = the pod with its uid.

A 403 from any of these is logged (with the verb and resource, so the chart can be fixed)
and the watcher keeps retrying with backoff; nothing here exits the process.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from agent.core.errors import AnnotationError, ConfigError, snippet
from agent.core.settings import KubeSettings
from agent.kube.requests import (
    FINAL_PHASES,
    MODELS_ANNOTATION,
    STATUS_ANNOTATION,
    ModelRef,
    ModelStatus,
    PodKey,
    encode_status,
    parse_models_annotation,
)

__all__ = [
    "ModelRef",
    "ModelStatus",
    "PodKey",
    "PodWatcher",
    "StatusReporter",
    "make_api_client",
    "parse_models_annotation",
]

log = logging.getLogger(__name__)

REPORTING_COMPONENT = "weightswarm-agent"
_GONE_PHASES = frozenset({"Succeeded", "Failed"})
_HTTP_GONE = 410
# Patch answers meaning "that pod is not there any more" (404), or "a different pod has that
# name now" (the uid precondition: 409 from a precondition, 422 from the immutable-uid check).
_POD_REPLACED = frozenset({404, 409, 422})


def make_api_client(settings: KubeSettings) -> Any:
    """A kubernetes ApiClient: the given kubeconfig, else in-cluster, else ~/.kube/config."""
    try:
        if settings.kubeconfig is not None:
            return config.new_client_from_config(config_file=str(settings.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except config.ConfigException:
            return config.new_client_from_config()  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - missing file, bad YAML, bad keys: all one actionable line
        raise ConfigError(
            f"cannot configure the Kubernetes client ({snippet(str(exc), 150)}); "
            "run in a pod with a service account or pass --kubeconfig"
        ) from exc


def describe(exc: BaseException) -> str:
    """One short line for a log: status and reason, the body cut short (it may echo request data)."""
    if isinstance(exc, ApiException):
        message = ""
        try:
            message = str(json.loads(exc.body or "{}").get("message", ""))
        except (ValueError, AttributeError):
            message = snippet(exc.body, 120)
        return f"HTTP {exc.status} {exc.reason or ''}: {snippet(message, 160)}".rstrip(": ")
    return f"{type(exc).__name__}: {snippet(str(exc), 160)}"


@dataclass
class _Seen:
    """What the watcher last acted on for one pod, so re-lists and unrelated updates stay silent."""

    pod: PodKey
    models: tuple[ModelRef, ...] | None = None
    bad: str | None = None


@dataclass
class WatchStats:
    """Counters for logs, metrics and tests."""

    lists: int = 0
    watches: int = 0
    bookmarks: int = 0
    gone: int = 0
    errors: int = 0
    resource_version: str | None = None


class _RawWatch(watch.Watch):
    """`Watch` that hands events over as plain dicts: we read only metadata, annotations and phase,
    and skipping model deserialisation keeps a busy node cheap. ERROR events (410) still raise."""

    def get_return_type(self, func: Any) -> None:
        return None


class ListWatch:
    """List, then watch, one kind of object: resume from the last resourceVersion, relist on 410 Gone,
    reconnect with bounded jittered backoff. Subclasses say what to list (`_list_call`, `_selectors`)
    and act on objects (`_observe`: returns the object's key when still of interest; `_forget`)."""

    what = "objects"
    """For logs: what is watched ("pods on node x")."""
    rbac_hint = ""
    """What a 403 means for the chart, in a log line."""

    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._watch: _RawWatch | None = None
        self.stats = WatchStats()

    def _list_call(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _selectors(self) -> dict[str, str]:
        """field_selector / label_selector keyword arguments of both the list and the watch."""
        return {}

    def _observe(self, obj: Mapping[str, Any]) -> str | None:
        raise NotImplementedError

    def _forget(self, key: str) -> None:
        raise NotImplementedError

    def _known(self) -> list[str]:
        """Keys of every object currently of interest (what a relist may find gone)."""
        raise NotImplementedError

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event, max_iterations: int | None = None) -> None:
        """List, then watch, until `stop` is set (or after `max_iterations` list/watch rounds).

        One iteration is one watch request (preceded by a list when needed), whether it ends
        normally (the server's timeoutSeconds), with 410 Gone (relist at once), or with an
        error (wait a bounded, jittered, growing delay and resume from the last resourceVersion).
        """
        done = threading.Event()
        waker = threading.Thread(
            target=self._stop_waker, args=(stop, done), name="kube-watch-stop", daemon=True
        )
        waker.start()
        # A second run() resumes where the last one stopped (a 410 makes it relist if too old).
        need_list = self.stats.resource_version is None
        failures = 0
        gone_streak = 0
        iterations = 0
        try:
            while not stop.is_set() and (max_iterations is None or iterations < max_iterations):
                iterations += 1
                delay = 0.0
                try:
                    if need_list:
                        self._relist()
                        need_list = False
                    if self._watch_once(stop):
                        gone_streak = 0
                    failures = 0
                except ApiException as exc:
                    if exc.status == _HTTP_GONE:
                        # History before our resourceVersion is compacted: only a fresh list is
                        # complete. Relist at once; back off only if 410s repeat without progress.
                        self.stats.gone += 1
                        gone_streak += 1
                        need_list = True
                        log.info("pod watch expired (410 Gone); relisting")
                        if gone_streak > 1:
                            delay = self._backoff(gone_streak - 1)
                    else:
                        failures += 1
                        delay = self._backoff(failures)
                        self._log_failure(exc, delay)
                except Exception as exc:  # noqa: BLE001 - dropped connections, bad JSON, timeouts
                    if stop.is_set():
                        break
                    failures += 1
                    delay = self._backoff(failures)
                    self._log_failure(exc, delay)
                if delay and stop.wait(delay):
                    break
        finally:
            done.set()
            waker.join(timeout=5)

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self._settings.backoff_max, self._settings.backoff_base * 2.0 ** (attempt - 1))
        # Half fixed, half random: bounded below so a flapping server is not hammered, and
        # spread so a whole DaemonSet does not reconnect to a restarted API server in lockstep.
        return ceiling * random.uniform(0.5, 1.0)

    def _log_failure(self, exc: BaseException, delay: float) -> None:
        self.stats.errors += 1
        hint = ""
        if isinstance(exc, ApiException) and exc.status == 403:
            hint = f" ({self.rbac_hint})"
        log.warning("watch of %s failed: %s%s; retrying in %.1fs", self.what, describe(exc), hint, delay)

    def _stop_waker(self, stop: threading.Event, done: threading.Event) -> None:
        # A watch blocks in a socket read for up to watch_timeout; closing its socket is the
        # only prompt way out. Repeat while running, since a new watch may start after a stop().
        while not done.is_set():
            if stop.wait(0.1):
                current = self._watch
                if current is not None:
                    current.stop()  # type: ignore[no-untyped-call]
                if done.wait(0.1):
                    return

    def _relist(self) -> None:
        resp = self._list_call(
            **self._selectors(),
            _preload_content=False,
            _request_timeout=self._settings.request_timeout,
        )
        try:
            data = json.loads(resp.data)
        finally:
            resp.release_conn()
        self.stats.lists += 1
        listed: set[str] = set()
        for obj in data.get("items") or []:
            key = self._observe(obj)
            if key:
                listed.add(key)
        # Whatever we knew and the list no longer shows went away while we were not watching.
        for key in [k for k in self._known() if k not in listed]:
            self._forget(key)
        self.stats.resource_version = str(data.get("metadata", {}).get("resourceVersion") or "") or None

    def _watch_once(self, stop: threading.Event) -> bool:
        """One watch request from the current resourceVersion; True if it delivered any event."""
        w = _RawWatch()  # type: ignore[no-untyped-call]
        self._watch = w
        self.stats.watches += 1
        got_any = False
        kwargs: dict[str, Any] = {
            **self._selectors(),
            "allow_watch_bookmarks": True,
            "timeout_seconds": self._settings.watch_timeout,
            # The server ends the watch after timeout_seconds; the read timeout is only for a
            # connection that died silently.
            "_request_timeout": (
                self._settings.request_timeout,
                self._settings.watch_timeout + self._settings.request_timeout,
            ),
        }
        if self.stats.resource_version:
            kwargs["resource_version"] = self.stats.resource_version
        try:
            events: Iterator[dict[str, Any]] = w.stream(self._list_call, **kwargs)  # type: ignore[no-untyped-call]
            for event in events:
                if stop.is_set():
                    break
                got_any = True
                self._handle(event)
        finally:
            self._watch = None
            w.stop()  # type: ignore[no-untyped-call]
        return got_any

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("raw_object") or event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
        elif kind in ("ADDED", "MODIFIED"):
            self._observe(obj)
        elif kind == "DELETED":
            key = self._key(obj)
            if key:
                self._forget(key)
        else:
            log.debug("ignoring watch event of type %r", kind)
            return
        if rv:
            self.stats.resource_version = str(rv)

    def _key(self, obj: Mapping[str, Any]) -> str | None:
        """The key a DELETED object was known by: its uid (a recreated object is a new one)."""
        uid = (obj.get("metadata") or {}).get("uid")
        return uid if isinstance(uid, str) and uid else None


class PodWatcher(ListWatch):
    """Follows pods on `settings.node_name` and reports what they ask for.

    Callbacks run on the watcher's thread, one at a time, and should return quickly:
    - `on_request(pod, models)`: the pod's (non-empty, de-duplicated) wish list is new or changed;
      it is the whole list, not a delta (`RequestTracker.set_pod` turns it into one).
    - `on_pod_gone(pod)`: the pod was deleted, finished (Succeeded/Failed), is terminating,
      or dropped its annotation or made it invalid; called only for pods that had a request.
    - `on_bad_annotation(pod, message)`: the annotation is malformed. The watcher also
      creates a Warning event and sets the pod's status annotation to Failed.
    A callback that raises is logged and does not stop the watcher.
    """

    def __init__(
        self,
        settings: KubeSettings,
        api_client: Any | None,
        on_request: Callable[[PodKey, list[ModelRef]], None],
        on_pod_gone: Callable[[PodKey], None],
        on_bad_annotation: Callable[[PodKey, str], None] | None = None,
        reporter: StatusReporter | None = None,
    ) -> None:
        if not settings.node_name:
            raise ConfigError(
                "the pod watcher needs this node's name: set --node-name (the chart passes spec.nodeName)"
            )
        super().__init__(settings)
        api = api_client if api_client is not None else make_api_client(settings)
        self._core = client.CoreV1Api(api)
        self._reporter = reporter if reporter is not None else StatusReporter(settings, api)
        self._on_request = on_request
        self._on_pod_gone = on_pod_gone
        self._on_bad_annotation = on_bad_annotation
        self._seen: dict[str, _Seen] = {}  # by pod uid
        self._selector = f"spec.nodeName={settings.node_name}"
        self.what = f"pods on node {settings.node_name}"
        self.rbac_hint = "RBAC: the agent needs list/watch on pods; see agent/kube/client.py"

    def _list_call(self, **kwargs: Any) -> Any:
        if self._settings.namespace is not None:
            return self._core.list_namespaced_pod(self._settings.namespace, **kwargs)
        return self._core.list_pod_for_all_namespaces(**kwargs)

    def _selectors(self) -> dict[str, str]:
        return {"field_selector": self._selector}

    def _known(self) -> list[str]:
        return list(self._seen)


    # -- what a pod wants -------------------------------------------------------------------------

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
            self._report_bad(key, exc)
            return uid
        if seen is not None and seen.models == tuple(models):
            return uid
        self._seen[uid] = _Seen(key, models=tuple(models))
        self._call(self._on_request, key, models)
        return uid

    def _forget(self, uid: str) -> None:
        seen = self._seen.pop(uid, None)
        if seen is None:
            return
        self._reporter.forget(seen.pod)
        if seen.models is not None:
            self._call(self._on_pod_gone, seen.pod)

    def _report_bad(self, pod: PodKey, exc: AnnotationError) -> None:
        log.warning("pod %s: %s", pod, exc)
        if self._on_bad_annotation is not None:
            self._call(self._on_bad_annotation, pod, str(exc))
        self._reporter.event(pod, "BadAnnotation", f"{MODELS_ANNOTATION}: {exc}", "Warning")
        self._reporter.report_keys(pod, {exc.entry: ModelStatus(phase="Failed", error=str(exc))})

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("pod watcher callback %s failed", getattr(callback, "__name__", callback))


@dataclass
class _PodStatusState:
    """Per-pod sending state: what the pod shows, what is waiting, and when we last wrote."""

    sent_body: str | None = None
    sent_phases: Mapping[str, str] = field(default_factory=dict)
    sent_at: float = float("-inf")
    pending: str | None = None
    pending_phases: Mapping[str, str] = field(default_factory=dict)
    urgent: bool = False


class StatusReporter:
    """Writes `weightswarm.io/status` on pods and creates Events.

    `report` never blocks on the API: it records the latest state and a sender thread patches
    each pod at most once per `status_min_interval` (the latest state wins; a state equal to
    what the pod already shows is not sent). A model newly Ready or Failed is sent at once.
    Call `close()` to flush what is pending and stop the sender thread.
    """

    def __init__(
        self,
        settings: KubeSettings,
        api_client: Any | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        api = api_client if api_client is not None else make_api_client(settings)
        self._core = client.CoreV1Api(api)
        self._clock = clock
        self._cond = threading.Condition()
        self._pods: dict[PodKey, _PodStatusState] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self.patches_sent = 0
        self.patch_errors = 0

    def report(self, pod: PodKey, statuses: Mapping[ModelRef, ModelStatus]) -> None:
        """The pod's whole status now, one entry per requested model."""
        self.report_keys(pod, {ref.key: st for ref, st in statuses.items()})

    def report_keys(self, pod: PodKey, statuses: Mapping[str, ModelStatus]) -> None:
        """As `report`, keyed by the status-annotation key (a bad annotation has no ModelRef)."""
        body = encode_status(statuses)
        phases: dict[str, str] = {key: st.phase for key, st in statuses.items()}
        with self._cond:
            if self._closing:
                return
            state = self._pods.setdefault(pod, _PodStatusState())
            if body == state.pending:
                return
            if body == state.sent_body:
                state.pending, state.urgent = None, False
                return
            state.pending, state.pending_phases = body, phases
            state.urgent = state.urgent or any(
                phase in FINAL_PHASES and state.sent_phases.get(key) != phase for key, phase in phases.items()
            )
            if self._thread is None:
                self._thread = threading.Thread(target=self._sender, name="kube-status", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def forget(self, pod: PodKey) -> None:
        """Drop the pod's state (it is gone); a pending patch for it is not sent."""
        with self._cond:
            self._pods.pop(pod, None)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is pending (ignoring the interval) and stop the sender thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def event(
        self, pod: PodKey, reason: str, message: str, type_: Literal["Normal", "Warning"] = "Normal"
    ) -> None:
        """Create a core/v1 Event about the pod. Failures are logged, never raised."""
        now = datetime.now(UTC)
        node = self._settings.node_name or None
        body = client.CoreV1Event.from_dict(
            {
                # client-go names events "<object>.<unique hex>"; time_ns is unique enough per pod.
                "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.name,
                    "namespace": pod.namespace,
                    "uid": pod.uid,
                },
                "reason": reason,
                "message": snippet(message, 1000),
                "type": type_,
                "source": {"component": REPORTING_COMPONENT, "host": node},
                "reportingComponent": REPORTING_COMPONENT,
                "reportingInstance": node,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )
        assert body is not None
        try:
            self._core.create_namespaced_event(
                pod.namespace, body, _request_timeout=self._settings.request_timeout
            )
        except Exception as exc:  # noqa: BLE001 - an event is best effort
            hint = " (RBAC: the agent needs create on events)" if getattr(exc, "status", None) == 403 else ""
            log.warning("event %s on pod %s not created: %s%s", reason, pod, describe(exc), hint)

    # -- sender thread ----------------------------------------------------------------------------

    def _sender(self) -> None:
        interval = self._settings.status_min_interval
        while True:
            with self._cond:
                while True:
                    now = self._clock()
                    waiting = [(p, s) for p, s in self._pods.items() if s.pending is not None]
                    due = [
                        (p, s) for p, s in waiting
                        if self._closing or s.urgent or now >= s.sent_at + interval
                    ]
                    if due or (self._closing and not waiting):
                        break
                    next_due = min((s.sent_at + interval for _, s in waiting), default=None)
                    self._cond.wait(None if next_due is None else max(0.0, next_due - now))
                if not due:
                    return
                batch = []
                for pod, state in due:
                    assert state.pending is not None
                    batch.append((pod, state.pending, state.sent_body))
                    state.sent_body, state.sent_phases = state.pending, state.pending_phases
                    state.sent_at, state.pending, state.urgent = now, None, False
            for pod, body, previous in batch:
                self._patch(pod, body, previous)

    def _patch(self, pod: PodKey, body: str, previous: str | None) -> None:
        patch = {"metadata": {"uid": pod.uid, "annotations": {STATUS_ANNOTATION: body}}}
        try:
            self._core.patch_namespaced_pod(
                pod.name,
                pod.namespace,
                patch,
                _content_type="application/merge-patch+json",
                _request_timeout=self._settings.request_timeout,
            )
            with self._cond:
                self.patches_sent += 1
            return
        except Exception as exc:  # noqa: BLE001 - logged; the reporter survives API trouble
            status = getattr(exc, "status", None)
            with self._cond:
                self.patch_errors += 1
                state = self._pods.get(pod)
                if status in _POD_REPLACED:
                    self._pods.pop(pod, None)
                elif state is not None and status != 403 and state.pending is None:
                    # Transient (5xx, connection): what the pod shows is unknown; try this state
                    # again after the interval unless a newer one arrives first.
                    state.sent_body, state.pending = previous, body
            hint = " (RBAC: the agent needs patch on pods)" if status == 403 else ""
            log.warning("status of pod %s not updated: %s%s", pod, describe(exc), hint)
