"""A bucket model's content ids, learnt once per cluster (agent.origin.bucket: a listing names no content).

A plan from a bucket lists each object by a listing id (`FileEntry.content_known` False). Before the
swarm can share an object, someone must read it and compute its sha256. In a daemon, in this order:
1. this node learnt them before (agent.cache.listings: the same key, size, ETag and version);
2. the tracker has the manifest of this commit (the derived one: any change to the prefix is another
   commit): its files must be the listing's paths and sizes, and each blob is checked against its id
   when it arrives, as every blob is;
3. else one node takes the commit's index lease and reads the objects from the store with the origin
   engine (parallel ranges, resume, `If-Match` on the listed ETag), hashing as it writes; it seeds each
   blob and publishes its metainfo and the manifest. The others wait for that manifest (or take the
   lease over if the holder dies), then fetch through the swarm as for a hub model: the store serves
   each byte about once.

What the others wait for is the index holder's whole read (a first cold start of a bucket model takes
about twice one node's read; a hub model's overlaps its origin read and the swarm). The trust is the
tracker's: any agent with the tracker's agent token may write a manifest, as for hub models planned
from the tracker; a node still only plans a bucket model after its own credentials listed the prefix
and signed a HEAD of an object (agent.fetch.planning).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.cache.layout import RepoCache, check_blob_id
from agent.cache.listings import ListingIds
from agent.core.errors import TrackerError, WaitTimeoutError
from agent.core.modelnames import Scrub
from agent.core.plan import FetchPlan
from agent.core.progress import Progress
from agent.core.settings import Settings
from agent.fetch.engine import FetchEngine
from agent.fetch.sources.policy import SourcePolicy
from agent.origin.client import Origin
from agent.origin.ranges import OriginSource

log = logging.getLogger(__name__)

_POLL = 1.0
"""Seconds between looks at the tracker while another node reads the bucket."""


def index_key(plan: FetchPlan) -> str:
    """The lease a bucket commit's reader holds (a 64-hex key, as blob leases are)."""
    return hashlib.sha256(f"weightswarm bucket index\n{plan.repo_id}\n{plan.commit}".encode()).hexdigest()


def unknown(plan: FetchPlan) -> bool:
    return not all(e.content_known for e in plan.files)


def ids_from_manifest(plan: FetchPlan, manifest: dict[str, Any]) -> dict[str, str] | None:
    """listing id -> content id for each object of the plan, from a manifest whose files have the listing's
    paths and sizes; None when it does not fit (another writer's mistake or lie: read the bucket)."""
    by_path: dict[str, tuple[int, str]] = {}
    for f in manifest.get("files") or []:
        if isinstance(f, dict) and isinstance(f.get("path"), str):
            by_path[f["path"]] = (f.get("size"), f.get("blob_id"))  # type: ignore[assignment]
    ids: dict[str, str] = {}
    for e in plan.files:
        if e.content_known:
            continue
        size, blob_id = by_path.get(e.path, (None, None))
        if size != e.size or not isinstance(blob_id, str) or len(blob_id) != 64:
            return None
        try:
            ids[e.blob_id] = check_blob_id(blob_id)
        except Exception:  # noqa: BLE001 - an unsafe id is a manifest that does not fit
            return None
    return ids


class BucketIndex:
    """Learns a bucket plan's content ids for one daemon job (module doc)."""

    def __init__(
        self,
        settings: Settings,
        policy: SourcePolicy,
        client: Origin,
        progress: Progress,
        publish_manifest: Callable[[FetchPlan], None],
        stopping: threading.Event,
        scrub: Scrub,
    ) -> None:
        """`scrub`: how this job's log lines name its model (agent.core.modelnames)."""
        self.settings = settings
        self.scrub = scrub
        self.policy = policy
        self.client = client
        self.progress = progress
        self.publish_manifest = publish_manifest
        self.stopping = stopping
        self.bytes_from_origin = 0
        self.read_here: set[str] = set()
        """Content ids of the blobs this node read from the store."""

    def identify(self, plan: FetchPlan) -> FetchPlan:
        plan = ListingIds(self.settings.state_dir).resolve(plan)
        if not unknown(plan):
            return plan
        tracker, leases = self.policy.tracker, self.policy.leases
        if tracker is None or leases is None:
            return self._read(plan)
        if {e.path for e in plan.files} != plan.all_paths:
            # No manifest is written for part of a commit, so no node would wait for one.
            return self._read_and_share(plan)
        key = index_key(plan)
        deadline = time.monotonic() + self.settings.daemon.max_wait_seconds
        said = False
        while True:
            try:
                manifest = tracker.get_manifest(plan.repo_id, plan.commit)
            except TrackerError as exc:
                log.warning("%s: no bucket manifest from the tracker (%s); reading it",
                            self.scrub(plan.repo_id), self.scrub(str(exc)))
                return self._read_and_share(plan)
            if manifest is not None:
                ids = ids_from_manifest(plan, manifest)
                if ids is not None:
                    log.info("%s@%s: content ids from the tracker's manifest",
                             self.scrub(plan.repo_id), plan.commit[:12])
                    return plan.identified(ids)
                log.warning("%s@%s: the tracker's manifest does not fit the listing; reading the bucket",
                            self.scrub(plan.repo_id), plan.commit[:12])
                return self._read_and_share(plan)
            # Taken over from a holder whose read stopped moving (its heartbeats report the bytes read).
            if leases.try_lease(key, stale=True):
                return self._read_as_holder(plan, key)
            if time.monotonic() > deadline:
                log.warning("%s: waited too long for another node's read of the bucket",
                            self.scrub(plan.repo_id))
                return self._read_and_share(plan)
            if not said:
                log.info("%s@%s: another node is reading the bucket; waiting for its manifest",
                         self.scrub(plan.repo_id), plan.commit[:12])
                said = True
            if self.stopping.wait(_POLL):
                raise WaitTimeoutError(f"{plan.repo_id}: the agent is stopping")

    def _read_as_holder(self, plan: FetchPlan, key: str) -> FetchPlan:
        leases = self.policy.leases
        assert leases is not None
        stop = threading.Event()
        leases.report(key, self._present)
        beat = leases.beat(key, stop)
        beat.start()
        try:
            return self._read_and_share(plan)
        finally:
            stop.set()
            beat.join(timeout=5)
            leases.report(key, None)
            leases.release(key)

    def _present(self) -> int | None:
        """The bytes read so far, as they land (heartbeats report them: a count that moved only as files
        ended stood still for longer than a holder may stall, and waiting nodes took the lease over and
        read the bucket too); None while the store said "later"."""
        return None if self.client.told_to_wait else self.progress.done

    def _read_and_share(self, plan: FetchPlan) -> FetchPlan:
        """`_read`, then seed every blob, publish its metainfo and the commit's manifest."""
        identified = self._read(plan)
        cache = RepoCache(self.settings.cache_dir, self.settings.state_dir, plan.repo_id)
        for entry in identified.files:
            self.policy.seed_installed(cache, entry)
        self.publish_manifest(identified)
        return identified

    def _read(self, plan: FetchPlan) -> FetchPlan:
        """Every object of the plan from the store, hashed as it arrives and installed under its sha256."""
        source = OriginSource(self.client, self.settings.fetch)
        try:
            # The streams per object the store allows (agent.origin.streams) widen the lane, as a hub's do.
            result = FetchEngine(self.settings, source, self.progress, source.streams_per_file).run(plan)
        finally:
            self.bytes_from_origin += source.bytes_received
        read = set(result.downloaded)
        self.read_here |= {f.blob_id for f in result.files if f.path in read}
        return dataclasses.replace(plan, files=result.files)
