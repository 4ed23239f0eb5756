"""Node operations of one daemon, wired in one place: metrics, blob usage and leases, eviction, the
HF-compatible endpoint and the admin routes (`DELETE /v1/models/...`, `POST /v1/publish`,
`POST /v1/blobs/{id}/forget`).

The daemon creates one `NodeOps`, calls `start(spawn)` once its swarm exists, `job_finished(job)`
after each fetch job, `before_fetch(plan)` before a job downloads, and `include_routes(app)` from
the API factory. Other components add pins (`extra_pins`, e.g. the pod watcher's models) and
cannot-fit hooks (`evictor.cannot_fit_hooks`, e.g. a Kubernetes Warning event).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from agent.cache.eviction import BlobLeases, Evicted, Evictor, UsageLog, own_bytes, remove_model, scan_cache
from agent.cache.layout import RepoCache
from agent.core.errors import CacheFullError, NotFoundError, WeightswarmError
from agent.core.settings import Settings
from agent.http.hf import HfEndpoint, hf_router
from agent.http.metrics import AgentMetrics, SwarmSnapshot, metrics_router

if TYPE_CHECKING:
    from agent.core.plan import FetchPlan
    from agent.daemon.node import Daemon
    from agent.fetch.jobs import Job

log = logging.getLogger(__name__)

_CACHE_BYTES_EVERY = 10.0
"""Seconds a scrape reuses the cache size (walking a big cache on every scrape is wasted I/O)."""


class PublishRequest(BaseModel):
    directory: str = Field(min_length=1, max_length=4096)
    repo_id: str = Field(min_length=1, max_length=200)
    revision: str = Field(default="main", min_length=1, max_length=255)


class NodeOps:
    def __init__(self, settings: Settings, daemon: Daemon) -> None:
        self.settings = settings
        self.daemon = daemon
        self.metrics = AgentMetrics()
        self.usage = UsageLog(settings.state_dir / "usage.json")
        self.leases = BlobLeases()
        self.extra_pins: set[str] = set()
        """`REPO[@REV]` pinned by other components (pods on this node); replace or mutate under no lock:
        the evictor copies it each pass."""
        self.evictor = Evictor(
            settings, self.usage, self.leases, self._pins, daemon.blob_leaving, self._evicted
        )
        self.evictor.cannot_fit_hooks.append(lambda _e: self.metrics.cache_full.inc())
        self.hf = HfEndpoint(self)
        self._cache_bytes: tuple[float, int] = (float("-inf"), 0)
        self._cache_lock = threading.Lock()

    def _pins(self) -> Iterable[str]:
        running = [f"{j.key.repo_id}@{j.key.revision}" for j in self.daemon.jobs.all() if not j.done]
        return [*running, *list(self.extra_pins)]

    def _evicted(self, item: Evicted) -> None:
        self.metrics.evictions.inc()
        self.metrics.evicted_bytes.inc(item.size)

    # -- daemon hooks -----------------------------------------------------------------------

    def start(self, spawn: Callable[[str, Callable[[threading.Event], None]], None]) -> None:
        self.metrics.bind_state(self._swarm_state, self._cache_size)
        if self.evictor.limited:
            spawn("eviction", self.evictor.loop)

    def before_fetch(self, plan: FetchPlan) -> None:
        """Make room for the plan's missing blobs, or raise `CacheFullError` (counted, hooks called)."""
        cache = RepoCache(self.settings.cache_dir, self.settings.state_dir, plan.repo_id)
        # Content another repo holds costs no room: it is linked (agent.cache.layout.adopt_blob).
        missing = {e.blob_id: e.size for e in plan.files if not cache.adopt_blob(e.blob_id, e.size)}
        protect = {e.blob_id for e in plan.files}
        self.usage.touch(e.blob_id for e in plan.files)
        self.evictor.make_room(plan.repo_id, sum(missing.values()), protect)

    def job_finished(self, job: Job) -> None:
        status = job.status()
        self.metrics.observe_job(status)
        if status.phase == "Ready":
            self.usage.touch(f.blob_id for f in status.files if f.blob_id)

    def stop(self) -> None:
        self.usage.flush()

    # -- state for metrics ------------------------------------------------------------------

    def _swarm_state(self) -> SwarmSnapshot:
        swarm = self.daemon.swarm
        if swarm is None:
            return SwarmSnapshot(0, 0, 0)
        torrents = peers = uploaded = 0
        for ih in swarm.torrents():
            try:
                st = swarm.status(ih)
            except WeightswarmError:
                continue
            torrents += 1
            peers += st.num_peers
            uploaded += st.bytes_uploaded
        return SwarmSnapshot(torrents, peers, uploaded)

    def _cache_size(self) -> int:
        with self._cache_lock:
            at, size = self._cache_bytes
            if time.monotonic() - at > _CACHE_BYTES_EVERY:
                size = own_bytes(scan_cache(self.settings.cache_dir))
                self._cache_bytes = (time.monotonic(), size)
            return size

    # -- routes -----------------------------------------------------------------------------

    def include_routes(self, app: FastAPI) -> None:
        app.include_router(metrics_router(self.metrics))
        app.include_router(self._admin_router())
        app.include_router(hf_router(self.hf))  # last: its /{org}/{name}/resolve/... pattern is broad

    def _admin_router(self) -> APIRouter:
        router = APIRouter(prefix="/v1")

        @router.delete("/models/{org}/{name}")
        def delete_model(org: str, name: str, revision: str | None = None) -> dict[str, Any]:
            try:
                removed = remove_model(
                    self.settings, f"{org}/{name}", revision, self.leases, self.daemon.blob_leaving
                )
            except NotFoundError as exc:
                raise HTTPException(404, str(exc)) from None
            except WeightswarmError as exc:
                raise HTTPException(400, str(exc)) from None
            self.usage.forget(set(removed.blobs) - set(removed.shared))
            return {
                "repo_id": removed.repo_id,
                "snapshots": list(removed.snapshots),
                "blobs": list(removed.blobs),
                "bytes_freed": removed.bytes_freed,
                "shared": list(removed.shared),
            }

        @router.post("/blobs/{blob_id}/forget")
        def forget_blob(blob_id: str) -> dict[str, str]:
            """Stop seeding a blob (before `agent verify` deletes a corrupt copy and fetches it again)."""
            self.daemon.forget_blob(blob_id)
            return {"blob_id": blob_id}

        @router.post("/publish")
        def publish(body: PublishRequest, request: Request) -> dict[str, Any]:
            from agent.fetch.publish import publish_directory

            try:
                result = publish_directory(
                    self.settings,
                    Path(body.directory),
                    body.repo_id,
                    body.revision,
                    self.daemon.tracker,
                    self.daemon.seed_blob,
                )
            except CacheFullError as exc:
                raise HTTPException(507, str(exc)) from None
            except WeightswarmError as exc:
                raise HTTPException(400, str(exc)) from None
            return result.to_json()

        return router
