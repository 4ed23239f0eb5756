"""Pods on this node → fetch jobs → status on the pods: the glue between pods in (agent.kube.pods_in),
the daemon's jobs and pods out (agent.kube.pods_out).

Flow: the `PodWatcher` calls `on_request(pod, models)` / `on_bad_annotation(pod, error)` /
`on_pod_gone(pod)` from its thread; the `RequestTracker` turns those into "nobody wanted this model
before" (start one daemon job, however many pods ask) and "nobody wants it any more" (unpin it); a
bad annotation is reported on its pod at once. A supervised loop (`run`) looks at the jobs every
`KubeSettings.poll_interval`, hands each pod its whole `weightswarm.io/status` to the
`StatusReporter` (which rate-limits and coalesces the patches) and creates the Events, so every
Kubernetes write on a pod is decided in one place:

    ModelFetchStarted (Normal)   the pod asked for a model that is not Ready yet
    ModelReady (Normal)          the model is complete and verified in this node's cache
    ModelFetchFailed (Warning)   the fetch failed; the error is in the event and in the status
    ModelCacheFull (Warning)     the model cannot fit under the cache limit (eviction's hook)
    BadAnnotation (Warning)      the pod's annotation is malformed; its status says why, at once

A model some running pod asked for is pinned (`set_pins`): eviction never removes
what a workload on this node reads. A failed model is fetched again when another pod asks for
it (a retry needs no agent restart: delete the pod, or scale up).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.core.errors import AnnotationError, CacheFullError, WeightswarmError
from agent.core.modelnames import ModelNames
from agent.core.settings import KubeSettings
from agent.fetch.jobs import Job, RequestModel
from agent.kube.api import KubeApi
from agent.kube.fleet import Fleet
from agent.kube.pods_in import PodWatcher
from agent.kube.pods_out import StatusReporter
from agent.kube.requests import (
    FINAL_PHASES,
    MODELS_ANNOTATION,
    ModelRef,
    ModelStatus,
    PodKey,
    RequestTracker,
)

log = logging.getLogger(__name__)

Spawn = Callable[[str, Callable[[threading.Event], None]], None]


class PodSync:
    """Serves the models pods on this node ask for, and tells them how it goes.

    `start(spawn)` runs the watcher and the status loop as the daemon's supervised tasks;
    `close()` (after those stopped) flushes the last statuses and closes the port.
    """

    def __init__(
        self,
        settings: KubeSettings,
        request_model: RequestModel,
        set_pins: Callable[[set[str]], None],
        names: ModelNames,
        api: KubeApi | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """`request_model` starts (or joins) a fetch; `set_pins` replaces the models eviction must keep
        for the pods (and the preheats) on this node; `names`: how log lines name a model (the pods'
        own annotations and Events name it as the pod did, agent.core.modelnames). `on_cache_full` is for
        the evictor's cannot-fit hooks. `cache_dir`: the hub cache, for the fleet side (agent.kube.fleet:
        ModelPreheats, node labels), which runs when the settings ask for it and a cache is given. `api`:
        the Kubernetes API (agent.kube.api); None = the kubernetes client (agent.kube.adapter) as the
        settings say."""
        if api is None:
            # Imported here: a daemon without --kube never loads the kubernetes client (slow, large).
            from agent.kube.adapter import KubernetesApi

            api = KubernetesApi(settings)
        self._settings = settings
        self._names = names
        self._request_model = request_model
        self._set_pins = set_pins
        self._api = api
        self.reporter = StatusReporter(settings, api)
        self.watcher = PodWatcher(settings, api, self.on_request, self.on_pod_gone, self.on_bad_annotation)
        self.requests = RequestTracker()
        self._lock = threading.Lock()
        self._jobs: dict[ModelRef, Job] = {}
        self._errors: dict[ModelRef, str] = {}
        """Models that could not even be requested (e.g. the agent is shutting down)."""
        self._told: dict[tuple[PodKey, ModelRef], str] = {}
        """The last event sent per (pod, model): Started, Ready or Failed; each is sent once per change."""
        self.fleet = (
            Fleet(settings, self._api, request_model, cache_dir, self.pod_models, self._update_pins, names)
            if cache_dir is not None and (settings.preheat or settings.node_labels)
            else None
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, spawn: Spawn) -> None:
        spawn("pod-watcher", self.watcher.run)
        spawn("pod-status", self.run)
        if self.fleet is not None:
            self.fleet.start(spawn)

    def pod_models(self) -> dict[ModelRef, Job]:
        """The models pods on this node asked for, with their jobs."""
        with self._lock:
            return dict(self._jobs)

    def run(self, stop: threading.Event) -> None:
        """The status loop: until `stop`, look at the jobs and report them on their pods."""
        while True:
            self.sync_once()
            if stop.wait(self._settings.poll_interval):
                return

    def close(self, timeout: float = 10.0) -> None:
        """After the watcher stopped: report the final state, flush pending patches, release the client."""
        try:
            self.sync_once()
        except Exception:  # noqa: BLE001 - shutting down: what is pending still gets flushed below
            log.exception("last pod status sync failed")
        self.reporter.close(timeout)
        self._api.close()

    # -- watcher callbacks (the watcher's thread) -------------------------------------------------

    def on_request(self, pod: PodKey, models: list[ModelRef]) -> None:
        before = self.requests.models_for(pod)
        added, removed = self.requests.set_pod(pod, models)
        with self._lock:
            for model in models:
                new_for_pod = model not in before
                if model in added or model not in self._jobs or (new_for_pod and self._failed(model)):
                    self._start(model)
            for model in removed:
                self._drop(model)
            for key in [k for k in self._told if k[0] == pod and k[1] not in models]:
                del self._told[key]
        self._update_pins()
        log.info("pod %s asks for %s", pod, self._named(models))

    def on_bad_annotation(self, pod: PodKey, error: AnnotationError) -> None:
        """A malformed annotation: a Warning Event, and the pod's status says why (the agent carries on)."""
        log.warning("pod %s: %s", pod, error)
        self.reporter.event(pod, "BadAnnotation", f"{MODELS_ANNOTATION}: {error}", "Warning")
        self.reporter.report_keys(pod, {error.entry: ModelStatus(phase="Failed", error=str(error))})

    def on_pod_gone(self, pod: PodKey) -> None:
        self.reporter.forget(pod)
        removed = self.requests.remove_pod(pod)
        with self._lock:
            for model in removed:
                self._drop(model)
            for key in [k for k in self._told if k[0] == pod]:
                del self._told[key]
        self._update_pins()
        if removed:
            log.info("pod %s gone; no pod wants %s any more", pod, self._named(removed))

    def _named(self, models: Iterable[ModelRef]) -> str:
        return ", ".join(self._names.label(m.repo_id, m.revision, m.source) for m in models)

    def _start(self, model: ModelRef) -> None:
        try:
            # An annotation is the operator's request (creating pods where the agent watches is the
            # credential, docs/security.md), so the node's token is lent.
            self._jobs[model] = self._request_model(
                model.repo_id, model.revision, lend=True, source=model.source
            )
            self._errors.pop(model, None)
        except WeightswarmError as exc:
            self._jobs.pop(model, None)
            self._errors[model] = str(exc)

    def _drop(self, model: ModelRef) -> None:
        # The job itself runs on (it may be shared with an API client); we only stop reporting it.
        self._jobs.pop(model, None)
        self._errors.pop(model, None)

    def _failed(self, model: ModelRef) -> bool:
        if model in self._errors:
            return True
        job = self._jobs.get(model)
        return job is not None and job.status().phase == "Failed"

    def _update_pins(self) -> None:
        with self._lock:
            pins = {m.key for m in (*self._jobs, *self._errors)}
        if self.fleet is not None:
            pins |= self.fleet.pinned()
        # Replaced, never mutated: the evictor copies the set from another thread.
        self._set_pins(pins)

    # -- the status loop --------------------------------------------------------------------------

    def sync_once(self) -> None:
        """Report every tracked pod's status now and create the Events its changes call for."""
        with self._lock:
            statuses = {m: self._status(m) for m in (*self._jobs, *self._errors)}
        by_pod: dict[PodKey, dict[ModelRef, ModelStatus]] = {}
        for model, status in statuses.items():
            for pod in self.requests.pods_for(model):
                by_pod.setdefault(pod, {})[model] = status
        for pod, per_model in by_pod.items():
            self.reporter.report(pod, per_model)
            for model, status in sorted(per_model.items()):
                self._events(pod, model, status)

    def _status(self, model: ModelRef) -> ModelStatus:
        error = self._errors.get(model)
        if error is not None:
            return ModelStatus(phase="Failed", error=error)
        return ModelStatus.of_job(self._jobs[model].status())

    def _events(self, pod: PodKey, model: ModelRef, status: ModelStatus) -> None:
        key = (pod, model)
        with self._lock:
            told = self._told.get(key)
            new: str | None
            if status.phase in FINAL_PHASES:
                new = status.phase if told != status.phase else None
            else:
                new = "Started" if told is None else None
            if new is None or (key[1] not in self.requests.models_for(pod)):
                return
            self._told[key] = new
        if new == "Started":
            self.reporter.event(pod, "ModelFetchStarted", f"fetching {model.key} into this node's cache")
        elif new == "Ready":
            self.reporter.event(
                pod, "ModelReady", f"{model.key} is complete in this node's cache: {status.snapshot}"
            )
        else:
            self.reporter.event(
                pod, "ModelFetchFailed", f"fetch of {model.key} failed: {status.error}", "Warning"
            )

    def on_cache_full(self, error: CacheFullError) -> None:
        """Eviction's hook (a job's thread): tell the pods waiting for that repo why it will fail."""
        with self._lock:
            models = [m for m in (*self._jobs, *self._errors) if m.repo_id == error.repo_id]
        for pod in sorted({p for m in models for p in self.requests.pods_for(m)}, key=str):
            self.reporter.event(pod, "ModelCacheFull", str(error), "Warning")
