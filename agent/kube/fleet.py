"""The fleet side of an agent: ModelPreheat objects for this node, and node labels for what it holds.

Each agent acts for its own node only (docs/security.md, the chart's admission policy):
- `NodeWatcher` follows this node's Node object (its labels decide which preheats select it);
- `PreheatWatcher` follows the cluster-scoped ModelPreheat objects (agent.kube.preheat);
- `Fleet` turns both into background fetch jobs and pins, writes this node's entry and the counts
  on each preheat's status subresource, and keeps the node's `model.weightswarm.io/*` labels
  (agent.kube.labels) equal to the requested models that are complete here.

RBAC (the chart's ClusterRole): nodes get/list/watch/patch (watch: fieldSelector
metadata.name=<node>; list: the preheat's nodeSelector as a labelSelector, to count the wanted
nodes); weightswarm.io modelpreheats get/list/watch, modelpreheats/status get/patch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.cache.layout import is_commit, repo_folder_name
from agent.core.errors import WeightswarmError
from agent.core.modelnames import ModelNames
from agent.core.settings import KubeSettings
from agent.fetch.jobs import Job, RequestModel
from agent.kube.api import CONFLICT, FORBIDDEN, NOT_FOUND, ApiError, KubeApi, Query, describe, status_of
from agent.kube.labels import LABEL_PREFIX, model_label_key
from agent.kube.listwatch import ListWatch
from agent.kube.preheat import Preheat, PreheatWatcher, node_entry, summarise
from agent.kube.requests import ModelRef, ModelStatus

log = logging.getLogger(__name__)

_COUNT_ATTEMPTS = 5
"""Tries to write a preheat's counts when other agents write at the same time (409 Conflict)."""


class NodeWatcher(ListWatch):
    """This node's Node object: its labels, as they change."""

    def __init__(
        self, settings: KubeSettings, api: KubeApi, on_labels: Callable[[dict[str, str]], None]
    ) -> None:
        super().__init__(settings, api)
        self._on_labels = on_labels
        self._present = False
        self.what = f"node {settings.node_name}"
        self.rbac_hint = "RBAC: the agent needs get/list/watch on nodes (chart value nodeLabels.enabled)"

    def query(self) -> Query:
        return Query("nodes", field_selector=f"metadata.name={self._settings.node_name}")

    def _key(self, obj: Mapping[str, Any]) -> str | None:
        name = (obj.get("metadata") or {}).get("name")
        return name if name == self._settings.node_name else None

    def _known(self) -> list[str]:
        return [self._settings.node_name] if self._present else []

    def _observe(self, obj: Mapping[str, Any]) -> str | None:
        key = self._key(obj)
        if key is None:
            return None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        self._present = True
        self._on_labels({str(k): str(v) for k, v in labels.items()})
        return key

    def _forget(self, key: str) -> None:
        self._present = False
        self._on_labels({})


class Fleet:
    """Preheats this node is selected by, and the node labels of what it holds (see the module doc).

    `pod_models()`: the models pods on this node asked for, with their jobs (agent.kube.podsync),
    which get labels too. `on_pins`: called when `pinned()` changed.
    """

    def __init__(
        self,
        settings: KubeSettings,
        api: KubeApi,
        request_model: RequestModel,
        cache_dir: Path,
        pod_models: Callable[[], Mapping[ModelRef, Job]],
        on_pins: Callable[[], None],
        names: ModelNames,
    ) -> None:
        """`names`: how log lines name a model (agent.core.modelnames)."""
        self._settings = settings
        self._names = names
        self._api = api
        self._request_model = request_model
        self._cache_dir = cache_dir
        self._pod_models = pod_models
        self._on_pins = on_pins
        self._lock = threading.Lock()
        self._labels: dict[str, str] | None = None
        """This node's labels; None until the node watcher has listed it."""
        self._preheats: dict[str, Preheat] = {}
        """uid -> every preheat in the cluster."""
        self._jobs: dict[str, Job] = {}
        """uid -> the job of each preheat that selects this node."""
        self._errors: dict[str, str] = {}
        self._refused: dict[str, float] = {}
        """uid -> when the node last refused to start the preheat's job (monotonic)."""
        self._written: dict[str, tuple[str, float]] = {}
        """uid -> (this node's entry as last written, when), to write only what changed."""
        self._leaving: dict[str, str] = {}
        """uid -> name of preheats that stopped selecting this node: its entry is removed."""
        self._held: dict[str, tuple[str, str]] = {}
        """label key -> (ref key, commit) this node labelled as held."""
        self.node = NodeWatcher(settings, api, self._on_labels)
        self.watcher = (
            PreheatWatcher(settings, api, self._on_preheat, self._on_gone) if settings.preheat else None
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, spawn: Callable[[str, Callable[[threading.Event], None]], None]) -> None:
        spawn("node-watcher", self.node.run)
        if self.watcher is not None:
            spawn("preheat-watcher", self.watcher.run)
        spawn("fleet-status", self.run)

    def run(self, stop: threading.Event) -> None:
        while True:
            self.sync_once()
            if stop.wait(self._settings.poll_interval):
                return

    # -- watcher callbacks ------------------------------------------------------------------------

    def _on_labels(self, labels: dict[str, str]) -> None:
        with self._lock:
            self._labels = labels
        self._reconcile()

    def _on_preheat(self, preheat: Preheat) -> None:
        with self._lock:
            self._preheats[preheat.uid] = preheat
        self._reconcile()

    def _name(self, model: ModelRef) -> str:
        return self._names.label(model.repo_id, model.revision, model.source)

    def _on_gone(self, uid: str) -> None:
        with self._lock:
            preheat = self._preheats.pop(uid, None)
            self._leaving.pop(uid, None)
        if preheat is not None:
            log.info("ModelPreheat %s (%s) deleted; unpinning it", preheat.name, self._name(preheat.model))
        self._reconcile()

    def _reconcile(self) -> None:
        """Start the preheats that select this node, forget those that no longer do."""
        changed = False
        with self._lock:
            labels = self._labels
            selected = {} if labels is None else {
                uid: p for uid, p in self._preheats.items() if p.selects(labels)
            }
            for uid in [u for u in (*self._jobs, *self._errors) if u not in selected]:
                self._jobs.pop(uid, None)
                self._errors.pop(uid, None)
                self._written.pop(uid, None)
                if uid in self._preheats:
                    self._leaving[uid] = self._preheats[uid].name
                changed = True
            for uid, preheat in selected.items():
                job = self._jobs.get(uid)
                if job is not None and self._keep(job, preheat.model):
                    continue
                refused = self._refused.get(uid)
                recently = refused is not None and time.monotonic() - refused < self._settings.preheat_retry
                if job is None and recently:
                    continue  # the node refused it a moment ago (busy, shutting down): not at every sync
                self._leaving.pop(uid, None)
                changed = True
                try:
                    # The operator's object is the request (creating ModelPreheats is the credential,
                    # docs/security.md), so the node's token is lent, as for a pod annotation.
                    self._jobs[uid] = self._request_model(
                        preheat.model.repo_id,
                        preheat.model.revision,
                        lend=True,
                        background=True,
                        source=preheat.model.source,
                    )
                    self._errors.pop(uid, None)
                    what = self._name(preheat.model)
                    log.info("ModelPreheat %s selects this node: keeping %s", preheat.name, what)
                except WeightswarmError as exc:
                    self._jobs.pop(uid, None)
                    self._errors[uid] = str(exc)
                    self._refused[uid] = time.monotonic()
        if changed:
            self._on_pins()

    def _keep(self, job: Job, model: ModelRef) -> bool:
        """Whether `job` still serves the preheat: same model, and not a failure old enough to retry
        (a preheat keeps trying, as the operator asked; the error shows in its status meanwhile)."""
        if (job.key.repo_id, job.key.revision) != (model.repo_id, model.revision):
            return False
        ago = job.since_finished()
        retry = ago is not None and ago >= self._settings.preheat_retry
        return not (retry and job.status().phase == "Failed")

    # -- views ------------------------------------------------------------------------------------

    def pinned(self) -> set[str]:
        """"org/name@rev" of every preheat that selects this node: eviction keeps them."""
        with self._lock:
            uids = [u for u in (*self._jobs, *self._errors) if u in self._preheats]
            return {self._preheats[u].model.key for u in uids}

    def phase_counts(self) -> dict[str, int]:
        """Preheats selecting this node by phase here (the `weightswarm_agent_preheats` gauge)."""
        out: dict[str, int] = {}
        for status in self._statuses().values():
            out[status.phase] = out.get(status.phase, 0) + 1
        return out

    def _statuses(self) -> dict[str, ModelStatus]:
        with self._lock:
            jobs, errors = dict(self._jobs), dict(self._errors)
        out = {uid: ModelStatus.of_job(job.status()) for uid, job in jobs.items()}
        out.update({uid: ModelStatus(phase="Failed", error=err) for uid, err in errors.items()})
        return out

    # -- the status loop --------------------------------------------------------------------------

    def sync_once(self) -> None:
        if self.watcher is not None:
            self._reconcile()  # retries failed preheats when due
            self._sync_preheats()
        if self._settings.node_labels:
            self._sync_labels()

    def _sync_preheats(self) -> None:
        now = time.monotonic()
        with self._lock:
            leaving = dict(self._leaving)
            preheats = dict(self._preheats)
        for uid, name in leaving.items():
            if self._write(preheats.get(uid), name, None):
                with self._lock:
                    self._leaving.pop(uid, None)
        for uid, status in self._statuses().items():
            preheat = preheats.get(uid)
            if preheat is None:
                continue
            entry = node_entry(status)
            body = json.dumps({k: v for k, v in entry.items() if k != "updated"}, sort_keys=True)
            last = self._written.get(uid)
            if last is not None and last[0] == body:
                continue
            phase_changed = last is None or json.loads(last[0]).get("phase") != status.phase
            recent = last is not None and now - last[1] < self._settings.preheat_status_interval
            if recent and not phase_changed:
                continue
            if self._write(preheat, preheat.name, entry):
                self._written[uid] = (body, now)

    def _write(self, preheat: Preheat | None, name: str, entry: dict[str, Any] | None) -> bool:
        """Set (or, with None, remove) this node's entry, then the counts; False to try again later."""
        node = self._settings.node_name
        try:
            obj = self._patch_status(name, {"status": {"nodes": {node: entry}}})
            if preheat is not None:
                self._write_counts(preheat, obj)
            return True
        except ApiError as exc:
            if exc.status == NOT_FOUND:
                return True  # deleted meanwhile: nothing left to write
            hint = " (RBAC: the agent needs patch on modelpreheats/status)" if exc.status == FORBIDDEN else ""
            log.warning("status of ModelPreheat %s not updated: %s%s", name, describe(exc), hint)
        except Exception as exc:  # noqa: BLE001 - connection trouble: the next round tries again
            log.warning("status of ModelPreheat %s not updated: %s", name, describe(exc))
        return False

    def _write_counts(self, preheat: Preheat, obj: Mapping[str, Any]) -> None:
        """The counts over the wanted nodes, written under the resourceVersion they were computed
        from: another agent's write in between is a 409, and the counts are computed again."""
        for _ in range(_COUNT_ATTEMPTS):
            status = obj.get("status") or {}
            wanted = self._wanted_nodes(preheat)
            counts = summarise(preheat, status.get("nodes") or {}, wanted)
            if all(status.get(k) == v for k, v in counts.items()):
                return
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            try:
                self._patch_status(preheat.name, {"metadata": {"resourceVersion": rv}, "status": counts})
                return
            except ApiError as exc:
                if exc.status != CONFLICT:
                    raise
            obj = self._api.get("modelpreheats", preheat.name, "status")
        log.info("counts of ModelPreheat %s left to the next writer (busy)", preheat.name)

    def _wanted_nodes(self, preheat: Preheat) -> list[str]:
        items, _rv = self._api.list(Query("nodes", label_selector=preheat.label_selector))
        return sorted(str((n.get("metadata") or {}).get("name")) for n in items)

    def _patch_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._api.patch("modelpreheats", name, body, subresource="status")

    # -- node labels ------------------------------------------------------------------------------

    def _sync_labels(self) -> None:
        with self._lock:
            current = self._labels
            refs = {self._preheats[u].model: j for u, j in self._jobs.items() if u in self._preheats}
        if current is None:
            return
        refs.update(self._pod_models())
        held = dict(self._held)
        for ref, job in refs.items():
            st = job.status()
            # A label value is the commit, which the origin named: only a real one becomes a label.
            if st.phase == "Ready" and st.commit and is_commit(st.commit):
                held[model_label_key(ref.key)] = (ref.key, st.commit)
        # A label stays while the snapshot it names is still in the cache (eviction may take it).
        held = {k: v for k, v in held.items() if self._in_cache(*v)}
        self._held = held
        want = {k: commit for k, (_ref, commit) in held.items()}
        ours = {k: v for k, v in current.items() if k.startswith(LABEL_PREFIX)}
        patch: dict[str, str | None] = {k: v for k, v in want.items() if ours.get(k) != v}
        patch.update({k: None for k in ours if k not in want})
        if not patch:
            return
        try:
            self._api.patch("nodes", self._settings.node_name, {"metadata": {"labels": patch}})
            changes = ", ".join(f"{k}={v or '(removed)'}" for k, v in sorted(patch.items()))
            log.info("node labels: %s", changes)
        except Exception as exc:  # noqa: BLE001 - retried at the next round
            hint = " (RBAC: the agent needs patch on nodes)" if status_of(exc) == FORBIDDEN else ""
            log.warning("labels of node %s not updated: %s%s", self._settings.node_name, describe(exc), hint)

    def _in_cache(self, ref_key: str, commit: str) -> bool:
        snapshot = self._cache_dir / repo_folder_name(ref_key.partition("@")[0]) / "snapshots" / commit
        try:
            return any(snapshot.iterdir())
        except OSError:
            return False

