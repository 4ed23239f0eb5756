"""A bucket model's content ids, learnt once per cluster (agent.origin.bucket: a listing names no content).

A plan from a bucket lists each object by a listing id (`FileEntry.content_known` False). Before the
swarm can share an object, someone must read it and compute its sha256. In a daemon, in this order:
1. this node learnt them before (agent.cache.listings: the same key, size, ETag and version);
2. the tracker has the manifest of this commit (the derived one: any change to the prefix is another
   commit): its files must be the listing's paths and sizes, and each blob is checked against its id
   when it arrives, as every blob is;
3. else one node takes the commit's index lease and reads the objects from the store with the origin
   engine (parallel ranges, resume, `If-Match` on the listed ETag), hashing as it writes, and relays
   each object as it arrives under its listing id (agent.relay); it seeds each blob and publishes its
   metainfo and the manifest. The store serves each byte about once.
   - The others take every object whose listed ETag is a hash of its bytes (S3's: the MD5, or the MD5 of
     the parts' MD5s; agent.origin.bucket `listed_checksum`) from that relay while it arrives, as they
     take a hub model's blob from its lease holder: each checks the bytes against the ETag and size of
     its own listing,
     computes the sha256 itself and installs the blob under it, so no byte is installed that only a
     peer vouches for.
   - The rest (Azure's ETag, parts of an uncommon size; bytes that failed the check, as an SSE-KMS
     object's would) wait for the manifest (or take the lease over if the holder dies), then come
     through the swarm by their sha256 as for a hub model.

The trust of the manifest is the tracker's: any agent with the tracker's agent token may write one, as
for hub models planned from the tracker; a node still only plans a bucket model after its own credentials
listed the prefix and signed a HEAD of an object (agent.fetch.planning), and a relayed object is checked
against the checksum that listing gave.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from agent.cache.arrivals import Arrival
from agent.cache.layout import RepoCache, check_blob_id
from agent.cache.listings import ListingIds
from agent.core.errors import SwarmError, TrackerError, WaitTimeoutError, WeightswarmError
from agent.core.hashing import BlobHashes
from agent.core.modelnames import Scrub
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress, Progress
from agent.core.settings import Settings
from agent.fetch.engine import BlobSource, FetchEngine, install_downloaded
from agent.fetch.sources.policy import SourcePolicy
from agent.origin.client import Origin
from agent.origin.ranges import OriginSource
from agent.relay.receiver import RelayReceiver

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
        relay: RelayReceiver | None = None,
    ) -> None:
        """`scrub`: how this job's log lines name its model (agent.core.modelnames). `relay`: takes objects
        from the relay of the node reading the bucket (None: the relay is off; wait for the manifest)."""
        self.relay = relay
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
        self.bytes_from_peers = 0
        self.received_here: set[str] = set()
        """Content ids of the blobs this node took from the reader's relay."""
        self._lock = threading.Lock()

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
        said = received = False
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
            if not received:
                received = True
                plan = self._receive(plan, key)
                if not unknown(plan):
                    return plan
                continue
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
        origin = OriginSource(self.client, self.settings.fetch)
        settings, source, relaying = self.settings, cast("BlobSource", origin), None
        if self.policy.relay is not None:
            source = relaying = _Relaying(origin, self.policy, settings.fetch.verify_safetensors)
            # It installs each blob (checks included) so that the relay's readers follow the rename; the
            # engine finds it installed. The index files are checked by the job's run over the whole plan.
            unchecked = dataclasses.replace(settings.fetch, verify_safetensors=False)
            settings = dataclasses.replace(settings, fetch=unchecked)
        try:
            # The streams per object the store allows (agent.origin.streams) widen the lane, as a hub's do.
            result = FetchEngine(settings, source, self.progress, origin.streams_per_file).run(plan)
        finally:
            self.bytes_from_origin += origin.bytes_received
            if relaying is not None:
                relaying.close()
        read = set(result.downloaded)
        self.read_here |= {f.blob_id for f in result.files if f.path in read}
        return dataclasses.replace(plan, files=result.files)

    # --- taking objects from the reader's relay --------------------------------------------------------

    def _receive(self, plan: FetchPlan, key: str) -> FetchPlan:
        """The plan with the content ids of the objects taken from the relay of the node reading the bucket
        (module doc): each with a listed checksum, largest first as the reader reads; the rest as listed."""
        todo = [e for e in plan.files if not e.content_known and e.content_etag]
        if self.relay is None or self.policy.relay is None or not todo:
            return plan
        cache = RepoCache(self.settings.cache_dir, self.settings.state_dir, plan.repo_id)
        cache.prepare()
        order = sorted(todo, key=lambda e: -e.size)
        large, small = [e for e in order if not e.small], [e for e in order if e.small]
        most = self.settings.fetch.files_at_once
        ids: dict[str, str] = {}
        # Two pools as the engine's lanes: the reader reads small files beside the large ones.
        with ThreadPoolExecutor(max(1, min(most, len(large))), "bucket-relay") as lp, \
                ThreadPoolExecutor(max(1, min(most, len(small))), "bucket-relay-small") as sp:
            futures = [(e, lp.submit(self._receive_one, plan, cache, e, key)) for e in large]
            futures += [(e, sp.submit(self._receive_one, plan, cache, e, key)) for e in small]
            for entry, fut in futures:
                try:
                    content_id = fut.result()
                except WeightswarmError as exc:
                    log.info("%s: not taken from the relay: %s", entry.path, exc)
                    continue
                if content_id is not None:
                    ids[entry.blob_id] = content_id
        if ids:
            log.info("%s@%s: %d of %d objects taken from the reader's relay", self.scrub(plan.repo_id),
                     plan.commit[:12], len(ids), len(plan.files))
        files = tuple(
            FileEntry(e.path, e.size, ids[e.blob_id], e.is_lfs) if e.blob_id in ids else e for e in plan.files
        )
        return dataclasses.replace(plan, files=files)

    def _receive_one(self, plan: FetchPlan, cache: RepoCache, entry: FileEntry, key: str) -> str | None:
        """One object from the reader's relay, checked against this node's listed ETag and size, installed
        under the sha256 computed here and seeded: its content id; None when the relay did not bring it
        (the reader finished or died first, or the bytes failed the check)."""
        assert self.relay is not None
        arrivals = self.policy.arrivals
        fp = self.progress.start_file(entry.path, entry.size)
        fp.set_stage("peers")
        while not self.stopping.is_set():
            # This node relays what it takes on to the nodes after it, as a hub blob's receivers do.
            arrival = arrivals.begin(entry.blob_id, entry.size, cache.incomplete_path(entry.blob_id))
            try:
                chunk = self.settings.fetch.chunk_size
                got = self.relay.receive(plan, entry, cache, chunk, fp, arrival.advance)
                if got is not None:
                    hashes, received = got
                    install_downloaded(cache, entry, hashes, self.settings.fetch.verify_safetensors)
                    arrival.finish(cache.blob_path(hashes.content_id))
                    self._received(cache, entry, hashes, received)
                    fp.finish()
                    return hashes.content_id
            except BaseException as exc:
                arrival.fail(str(exc) or type(exc).__name__)
                raise
            finally:
                arrivals.end(arrival)
            if not cache.incomplete_path(entry.blob_id).exists():
                return None  # received whole and failed the listed ETag (discarded): by its sha256 later
            if not self._still_read(plan, key):
                return None
            self.stopping.wait(_POLL)
        return None

    def _received(self, cache: RepoCache, entry: FileEntry, hashes: BlobHashes, received: int) -> None:
        with self._lock:
            self.bytes_from_peers += received
            self.received_here.add(hashes.content_id)
        blob = FileEntry(entry.path, entry.size, hashes.content_id, entry.is_lfs)
        try:
            self.policy.seed_installed(cache, blob, publish=False)
        except (WeightswarmError, SwarmError, ValueError) as exc:
            log.info("not seeding %s: %s", entry.path, exc)

    def _still_read(self, plan: FetchPlan, key: str) -> bool:
        """Whether another node holds the index lease and has not published the manifest yet."""
        tracker = self.policy.tracker
        assert tracker is not None
        try:
            if tracker.get_manifest(plan.repo_id, plan.commit) is not None:
                return False
            return tracker.blob_state(key).lease_holder not in (None, self.policy.node_id)
        except TrackerError:
            return False


class _Relaying:
    """The index holder's origin engine, relaying each object under its listing id as it arrives, and until
    the whole read ends (the others take it from here: module doc; `close`). It installs each blob itself,
    then says where it is, so that relay streams follow the rename (agent.cache.arrivals)."""

    name = "origin"

    def __init__(self, origin: OriginSource, policy: SourcePolicy, verify_safetensors: bool) -> None:
        self.origin = origin
        self.policy = policy
        self.verify_safetensors = verify_safetensors
        self._lock = threading.Lock()
        self._held: list[Arrival] = []
        """Objects installed and still relayed: a node that asks after an object's last byte (a small file
        is read in a moment) takes it from here, not by its sha256 after the whole read."""

    @property
    def bytes_received(self) -> int:
        return self.origin.bytes_received

    @property
    def bytes_resumed(self) -> int:
        return self.origin.bytes_resumed

    def fetch_blob(
        self, plan: FetchPlan, entry: FileEntry, cache: RepoCache, progress: FileProgress
    ) -> BlobHashes:
        directory, arrivals = self.policy.relay, self.policy.arrivals
        assert directory is not None
        arrival = arrivals.begin(entry.blob_id, entry.size, cache.incomplete_path(entry.blob_id))
        directory.join(entry.blob_id, entry.size)
        try:
            hashes = self.origin.fetch_blob(plan, entry, cache, progress, prefix=arrival.advance)
            install_downloaded(cache, entry, hashes, self.verify_safetensors)
        except BaseException as exc:
            arrival.fail(str(exc) or type(exc).__name__)
            arrivals.end(arrival)
            directory.leave(entry.blob_id)
            raise
        arrival.moved(cache.blob_path(hashes.content_id))
        with self._lock:
            self._held.append(arrival)
        return hashes

    def close(self) -> None:
        """The read ended: no object is relayed from here any more (the swarm has them by sha256 now)."""
        directory, arrivals = self.policy.relay, self.policy.arrivals
        assert directory is not None
        with self._lock:
            held, self._held = self._held, []
        for arrival in held:
            assert arrival.final_path is not None
            arrival.finish(arrival.final_path)
            arrivals.end(arrival)
            directory.leave(arrival.blob_id)
