"""Node operations of one daemon, wired in one place: metrics, blob usage and readers, eviction,
the HF-compatible endpoint and the admin routes (agent.http.admin).

The daemon creates one `NodeOps` with the parts it needs (the job table for running pins, the
swarm for metrics, the seeder that stops or moves a blob's torrent, the tracker for publishing,
the daemon's `request_model` for the HF endpoint), calls `start(spawn)`, `job_finished(job)` after
each fetch job and `before_fetch(plan)` before a job downloads, and mounts `admin_routers()` and
`network_routers()` on its channels. Other components pin models (`pin_for_pods`, the pod
watcher) and add cannot-fit hooks (`evictor.cannot_fit_hooks`, e.g. a Kubernetes Warning event).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from fastapi import APIRouter

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.eviction import (
    BlobReaders,
    Evicted,
    Evictor,
    Removed,
    UsageLog,
    own_bytes,
    parse_ref,
    remove_model,
    scan_cache,
)
from agent.cache.layout import RepoCache, StateDir, node_key
from agent.core.errors import RefusedError, WeightswarmError
from agent.core.modelnames import ModelNames
from agent.core.plan import FetchPlan
from agent.core.settings import Settings
from agent.fetch.jobs import Job, JobTable, RequestModel
from agent.fetch.publish import (
    PublishResult,
    check_publish_source,
    check_publishable,
    publish_directory,
)
from agent.http.admin import AdminOps, admin_router
from agent.http.hf import HfEndpoint, hf_router
from agent.http.metrics import AgentMetrics, SwarmSnapshot, metrics_router
from agent.relay.directory import blob_parts, relay_credential
from agent.relay.routes import relay_router
from agent.swarm.seeding import Seeder
from agent.swarm.session import Swarm
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)

_CACHE_BYTES_EVERY = 10.0
"""Seconds a scrape reuses the cache size (walking a big cache on every scrape is wasted I/O)."""


def label_key(settings: Settings) -> bytes:
    """The key of hidden model labels: the cluster's passkey where there is one (one label per model on
    every node), else this node's own (agent.core.modelnames says why)."""
    passkey = settings.daemon.tracker_passkey
    return passkey.encode() if passkey else node_key(StateDir(settings.state_dir).labels_key)


class NodeOps:
    def __init__(
        self,
        settings: Settings,
        jobs: JobTable,
        swarm: Swarm,
        seeder: Seeder,
        tracker: TrackerClient | None,
        request_model: RequestModel,
        arrivals: Arrivals,
        relay_stall: float,
        names: ModelNames,
    ) -> None:
        """`relay_stall`: seconds a relay stream waits for new bytes before it ends (agent.relay.routes);
        `names`: the one naming of models in metrics and INFO logs (agent.core.modelnames)."""
        self.settings = settings
        self._arrivals = arrivals
        self._relay_stall = relay_stall
        self._jobs = jobs
        self._swarm = swarm
        self._seeder = seeder
        self._tracker = tracker
        self.metrics = AgentMetrics(names)
        self.usage = UsageLog(StateDir(settings.state_dir).usage)
        self.readers = BlobReaders()
        self.extra_pins: set[str] = set()
        """`REPO[@REV]` pinned for pods on this node (`pin_for_pods`); replaced, never mutated: the
        evictor copies it each pass."""
        self.evictor = Evictor(
            settings, self.usage, self.readers, self._pins, seeder.leaving, self._evicted, names.repo
        )
        self.evictor.cannot_fit_hooks.append(lambda _e: self.metrics.cache_full.inc())
        self.hf = HfEndpoint(settings, self.readers, self.usage, self.metrics, request_model, arrivals)
        self._cache_bytes: tuple[float, int] = (float("-inf"), 0)
        self._cache_lock = threading.Lock()
        self.metrics.bind_state(
            self._swarm_state, self._cache_size, lambda: [j.status() for j in jobs.all() if not j.done]
        )

    def pin_for_pods(self, pins: set[str]) -> None:
        self.extra_pins = pins

    def _pins(self) -> Iterable[str]:
        running = [f"{j.key.repo_id}@{j.key.revision}" for j in self._jobs.all() if not j.done]
        return [*running, *list(self.extra_pins)]

    def _evicted(self, item: Evicted) -> None:
        self.metrics.evictions.inc()
        self.metrics.evicted_bytes.inc(item.size)

    # -- daemon hooks -----------------------------------------------------------------------

    def start(self, spawn: Callable[[str, Callable[[threading.Event], None]], None]) -> None:
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
        self.metrics.observe_job(status, job.key.source)
        if status.phase == "Ready":
            self.usage.touch(f.blob_id for f in status.files if f.blob_id)

    def stop(self) -> None:
        self.usage.flush()

    # -- state for metrics ------------------------------------------------------------------

    def _swarm_state(self) -> SwarmSnapshot:
        torrents = peers = uploaded = 0
        per_blob: dict[str, int] = {}
        for ih in self._swarm.torrents():
            try:
                st = self._swarm.status(ih)
            except WeightswarmError:
                continue
            torrents += 1
            peers += st.num_peers
            uploaded += st.bytes_uploaded
            per_blob[st.path.name] = st.num_peers
        return SwarmSnapshot(torrents, peers, uploaded, per_blob)

    def _cache_size(self) -> int:
        with self._cache_lock:
            at, size = self._cache_bytes
            if time.monotonic() - at > _CACHE_BYTES_EVERY:
                size = own_bytes(scan_cache(self.settings.cache_dir))
                self._cache_bytes = (time.monotonic(), size)
            return size

    # -- routes -----------------------------------------------------------------------------

    def admin_routers(self) -> list[APIRouter]:
        """The admin channel's own routes: metrics and the admin operations."""
        admin = AdminOps(remove=self._remove, forget=self._seeder.forget, publish=self._publish)
        return [metrics_router(self.metrics, admin=True), admin_router(admin)]

    def network_routers(self) -> list[APIRouter]:
        """The network listener's: metrics (unless turned off) and the HF-compatible endpoint last
        (its pattern is broad)."""
        s = self.settings
        metrics = [metrics_router(self.metrics)] if s.daemon.metrics_on_network else []
        credential = relay_credential(s)
        if not credential:
            return [*metrics, hf_router(self.hf)]
        fanout, admits, stall = s.swarm.relay_fanout, self._swarm.admits, self._relay_stall
        parts = functools.partial(blob_parts, settings=s)
        seeded = self._seeded if s.swarm.chains_seeds else lambda _blob_id: None
        relay = relay_router(self._arrivals, credential, admits, fanout, stall, parts, seeded)
        return [*metrics, relay, hf_router(self.hf)]

    def _seeded(self, blob_id: str) -> Arrival | None:
        """A blob this node seeds whole, for the relay route (a warm start)."""
        ih = self._seeder.held().get(blob_id)
        if ih is None:
            return None
        try:
            st = self._swarm.status(ih)
        except WeightswarmError:
            return None  # removed meanwhile
        return Arrival.whole(blob_id, st.total, st.path) if st.state == "seeding" else None

    def _remove(self, repo_id: str, revision: str | None, force: bool = False) -> Removed:
        def uses(pin: str) -> bool:
            pin_repo, pin_rev = parse_ref(pin)
            return pin_repo == repo_id and (revision is None or pin_rev in (None, revision))

        users = [pin for pin in self.evictor.pins() if uses(pin)]
        if users and not force:
            raise RefusedError(
                f"{repo_id} is in use on this node ({', '.join(sorted(set(users)))}: a pod's request, a "
                "running fetch or --pin); pass --force to remove it anyway"
            )
        removed = remove_model(
            self.settings, repo_id, revision, self.readers, self._seeder.leaving, self.metrics.names.repo
        )
        self.usage.forget(set(removed.blobs) - set(removed.shared))
        return removed

    def _publish(self, directory: Path, repo_id: str, revision: str) -> PublishResult:
        s = self.settings
        source, root = check_publish_source(s, directory)
        name = self.metrics.names.repo
        check_publishable(s, repo_id, registering=self._tracker is not None, name=name)
        return publish_directory(s, source, repo_id, revision, self._tracker, self._seeder.seed, root, name)
