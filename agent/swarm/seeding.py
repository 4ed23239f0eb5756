"""What this node seeds: every complete blob of the hub cache, one torrent per blob.

The `Seeder` remembers each seeded blob's metainfo so that a tracker that comes back (or a new one)
gets it again (`reregister`), restores seeding at start-up from libtorrent's resume data or the
blob's digest sidecar without a re-hash (`restore`), hashes the blobs that have no piece hashes yet
in the background (`backfill`), and stops seeding a blob or moves its torrent to another repo's
copy when a file goes (`leaving`: `agent rm`, eviction, a corrupt copy).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from agent.cache.eviction import repo_id_of
from agent.cache.layout import RepoCache, check_repo_id
from agent.cache.verify import seedable_digest
from agent.core.errors import TrackerError, TrackerUnavailableError, WeightswarmError
from agent.swarm.session import Swarm
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)


class Seeder:
    """The node's seeded blobs. Thread-safe."""

    def __init__(self, swarm: Swarm, tracker: TrackerClient | None, cache_dir: Path, state_dir: Path) -> None:
        self.swarm = swarm
        self.tracker = tracker
        self.cache_dir = cache_dir
        self.state_dir = state_dir
        self._held: dict[str, tuple[str, bytes]] = {}
        """blob id -> (infohash, info) of every blob this node seeds."""
        self._lock = threading.Lock()
        self._needs_pieces: list[tuple[RepoCache, str]] = []
        """Complete blobs found at start-up without piece hashes (see `backfill`)."""

    @property
    def trackers(self) -> list[str]:
        return [self.tracker.announce_url] if self.tracker else []

    def remember(self, blob_id: str, infohash: str, info: bytes) -> None:
        """A blob is being seeded (by a fetch, a publish or `seed`)."""
        with self._lock:
            self._held[blob_id] = (infohash, info)

    def held(self) -> dict[str, str]:
        """blob id -> infohash of every blob seeded now."""
        with self._lock:
            return {blob_id: ih for blob_id, (ih, _info) in self._held.items()}

    def seed(self, path: Path, blob_id: str, info: bytes, checked: bool = False) -> str:
        """Seed a complete, verified blob put into the cache outside a fetch (`agent publish`); `checked`
        as for `Swarm.seed`."""
        ih = self.swarm.seed(path, info, self.trackers, checked)
        self.remember(blob_id, ih, info)
        return ih

    def forget(self, blob_id: str) -> None:
        """Stop seeding a blob (eviction, a corrupt copy) before its files are deleted."""
        self.leaving(blob_id, None)

    def leaving(self, blob_id: str, stays: Path | None) -> None:
        """One repo's file of a blob is about to be deleted (`agent rm`, eviction): stop seeding the
        blob, or, when another repo keeps a copy (`stays`), seed it from that copy from now on."""
        with self._lock:
            held = self._held.pop(blob_id, None)
        if held is None:
            return
        ih, info = held
        if stays is not None:
            try:
                if self.swarm.status(ih).path == stays:
                    self.remember(blob_id, ih, info)
                    return
            except WeightswarmError:
                pass
        self.swarm.remove(ih, delete_files=False)
        if stays is not None:
            try:
                self.seed(stays, blob_id, info)
            except WeightswarmError as exc:
                log.warning("blob %s: cannot seed it from %s: %s", blob_id[:16], stays, exc)

    # -- start-up ---------------------------------------------------------------------------

    def restore(self) -> int:
        """Seed every complete blob: resume data first, else the sidecar's piece hashes. No re-hash.

        Blobs without piece hashes (a standalone `agent fetch`, huggingface_hub) are left to
        `backfill`, so a large cache of those does not delay start-up. Content several repos share
        (one inode) is one torrent, seeded from the first repo that has it.
        """
        self.swarm.restore(self.trackers)
        count = 0
        self._needs_pieces.clear()
        for repo_dir in sorted(self.cache_dir.glob("models--*")):
            repo_id = repo_id_of(repo_dir.name) or ""
            try:
                cache = RepoCache(self.cache_dir, self.state_dir, check_repo_id(repo_id))
            except WeightswarmError:
                continue
            for blob in sorted(cache.blobs_dir.glob("*")):
                if "." in blob.name:
                    continue  # *.incomplete and temp files
                digest = cache.read_sidecar(blob.name)
                if digest is None or not digest.pieces:
                    self._needs_pieces.append((cache, blob.name))
                    continue
                if not cache.blob_is_complete(blob.name, digest.size):
                    continue
                try:
                    info = digest.encoded_info(blob.name)
                    ih = self.swarm.seed(blob, info, self.trackers)
                except (WeightswarmError, ValueError) as exc:
                    log.warning("not seeding %s: %s", blob, exc)
                    continue
                self.remember(blob.name, ih, info)
                count += 1
        return count

    def backfill(self, stop: threading.Event) -> None:
        """The supervised task: hash, verify and then seed the blobs `restore` found without piece hashes."""
        while self._needs_pieces and not stop.is_set():
            cache, blob_id = self._needs_pieces.pop()
            if blob_id in self.held():
                continue  # seeded meanwhile (a fetch): no re-hash
            digest = seedable_digest(cache, blob_id)
            if digest is None:
                continue
            info = digest.encoded_info(blob_id)
            try:
                self.seed(cache.blob_path(blob_id), blob_id, info)
                if self.tracker is not None:
                    self.tracker.put_metainfo(blob_id, info)  # peers find a blob through its metainfo
            except TrackerError as exc:
                log.warning("publishing blob %s failed (the tracker probe retries): %s", blob_id[:16], exc)
            except (WeightswarmError, ValueError) as exc:
                log.warning("not seeding %s: %s", blob_id[:16], exc)
        stop.wait()  # a supervised task must not return; there is nothing left to do

    def reregister(self, tracker: TrackerClient) -> None:
        """Publish every held blob's metainfo again and re-announce: the tracker is (back) up."""
        with self._lock:
            held = list(self._held.items())
        published = 0
        for blob_id, (_ih, info) in held:
            try:
                tracker.put_metainfo(blob_id, info)
                published += 1
            except TrackerError as exc:
                log.warning("re-registering blob %s failed: %s", blob_id, exc)
                if isinstance(exc, TrackerUnavailableError):
                    break  # down again: the probe loop retries the whole set when it is back
        self.swarm.force_reannounce()
        log.info("re-registered %d/%d blobs with the tracker", published, len(held))
