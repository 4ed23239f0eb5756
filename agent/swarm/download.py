"""BitTorrent as a transport: one blob downloaded by libtorrent from its swarm (and, for a lease holder,
from the origin as a web seed), waited for with a bound on stalls, verified end to end and recorded.

A blob finished by libtorrent is verified once end to end (sha256 / git sha1 against the blob id,
which is what the origin promised) in the same pass that writes its xxh3 sidecar, before any
snapshot link points at it. Why, when libtorrent has already checked every piece's SHA-1: those piece
hashes are only as good as the metainfo, and any holder of the tracker token can publish the
metainfo of a blob id. The publisher computed it from bytes it had verified (the origin engine
hashes sha256 and pieces in one stream; `agent publish` hashes its own files), and `check_info`
pins name and size, but a buggy or compromised node could still publish pieces of other bytes, and
then every node would install the same wrong "verified" weights in silence. The re-read catches that
(`BadMetainfo`, proven; the fetch policy recovers: agent.swarm.trust). It costs one sha256 of the
blob, once per blob per node (benchmarks.md, "Hashing a blob"). Hashing in piece order while the
download runs would hide it, but pieces arrive in rarest-first order, and sequential downloading would
make every node want the same pieces at once. The piece SHA-1s are not recomputed (the metainfo has
them): they were the larger part of this pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.cache.arrivals import Arrival
from agent.cache.layout import BlobDigest, RepoCache, write_atomic
from agent.core.errors import IntegrityError, SwarmError, WaitTimeoutError, WeightswarmError
from agent.core.hashing import BlobHasher
from agent.core.metainfo import infohash
from agent.core.plan import FileEntry
from agent.core.swarm_settings import SwarmSettings
from agent.swarm.session import Swarm
from agent.swarm.status import BlobStatus, WebSeed
from agent.swarm.trust import BadMetainfo
from agent.swarm.webseed import Renewal, WebSeedOrigin
from wirekit.bencode import bdecode

log = logging.getLogger(__name__)

TICK = 0.5
"""Seconds between looks at a downloading torrent."""
_READ_BLOCK = 4 * 2**20
_READ_AHEAD = 32 * 2**20
"""Bytes past a streaming reader's position that libtorrent is asked for first (piece deadlines)."""
_SUSPECT_WAIT = 5.0
"""Least seconds of failing pieces, none passing, before the metainfo is suspect (see `suspect_wait`)."""
_ANNOUNCE_WAIT = 5.0
"""Longest a seeder waits for its announce to be answered (`announced`)."""
_WEB_SEED_TRIES = 3
"""A web seed that failed and then brought nothing for this many of libtorrent's retry periods is given
up: a refused (SSRF, 403) or unreachable URL, or one libtorrent dropped (404), then costs ~15 s, not a
whole stall timeout; a web seed that recovers (progress) is kept."""

Progress = Callable[[int], None]
"""Called with the bytes of the blob present so far."""


class Stalled(SwarmError):
    """No byte came for the stall time (or a failing web seed brought nothing for its tries)."""


class Downloads:
    """The blobs libtorrent is downloading for this node's fetches (one torrent per blob). Thread-safe."""

    def __init__(self, swarm: Swarm, settings: SwarmSettings, trackers: list[str]) -> None:
        self.swarm = swarm
        self.settings = settings
        self.trackers = trackers
        """Announce URLs of every torrent this node adds (the tracker's, with its passkey), or none."""
        self._lock = threading.Lock()
        self._active: dict[str, bytes] = {}
        """blob id -> info of libtorrent downloads in flight (to stop them before an origin fallback)."""
        self._web_seeded: set[str] = set()
        """Blobs whose torrent got the origin as a web seed (their bytes may be origin bytes)."""

    @property
    def suspect_wait(self) -> float:
        """Seconds of failing pieces, none passing, after which the metainfo is suspect. A corrupt peer
        among good ones fails a piece now and then, but others keep passing; a wrong metainfo with
        honest bytes fails them all."""
        stall = self.settings.stall_timeout
        return min(stall, max(_SUSPECT_WAIT, stall / 4))

    def known_info(self, blob_id: str) -> bytes | None:
        """The metainfo of this blob's download in flight, if there is one."""
        with self._lock:
            return self._active.get(blob_id)

    def start(
        self,
        cache: RepoCache,
        blob: FileEntry,
        info: bytes,
        web_seed: WebSeed | None,
        arrival: Arrival | None,
    ) -> str:
        """Join the blob's swarm (idempotent), recorded as in flight; returns the infohash."""
        if arrival is not None:
            arrival.restart()  # a new torrent may create the file afresh; its verified pieces say again
        with self._lock:
            self._active[blob.blob_id] = info
            if web_seed is not None:
                self._web_seeded.add(blob.blob_id)
        return self.swarm.download(
            cache.blobs_dir,
            blob.blob_id,
            info,
            trackers=self.trackers,
            web_seeds=[web_seed] if web_seed else [],
            incomplete_name=cache.incomplete_path(blob.blob_id).name,
        )

    def drop(self, blob_id: str, info: bytes | None) -> None:
        """Stop a libtorrent download of this blob, so that another engine owns its `.incomplete` file."""
        if info is None:
            return
        with self._lock:
            self._web_seeded.discard(blob_id)
        try:
            self.swarm.remove(infohash(info), delete_files=False)
        except WeightswarmError:
            pass

    def receive(
        self,
        cache: RepoCache,
        blob: FileEntry,
        info: bytes,
        web_seed: WebSeedOrigin | None,
        progress: Progress,
        arrival: Arrival | None,
        stage: Callable[[str], None],
        stall: float | None = None,
    ) -> tuple[BlobStatus, bool]:
        """Download the blob from its swarm (plus `web_seed`, the origin's URL, for a lease holder) until
        libtorrent has every piece, verify it end to end and record its sidecar: (its final status, whether
        it had a web seed). The file stays where libtorrent put it (the caller links it into the repo).

        Raises `Stalled` after `stall` seconds without progress (default `swarm.stall_timeout`), or when a
        failing web seed brought nothing for its tries; `BadMetainfo` when the metainfo proves wrong (the
        finished bytes fail the blob id) or suspect (pieces keep failing their hashes, none passing, for
        `suspect_wait`); `SwarmError` when libtorrent fails the torrent."""
        stage("origin" if web_seed is not None else "peers")
        seed = None if web_seed is None else WebSeed(web_seed())
        ih = self.start(cache, blob, info, seed, arrival)
        renewal = None if web_seed is None else Renewal(self.swarm, ih, web_seed, blob.path)
        stall = stall or self.settings.stall_timeout
        last_done, last_change = -1, time.monotonic()
        errors_at_progress = 0
        pieces, failures_at_piece, failing_since = -1, 0, 0.0
        while True:
            try:
                st = self.swarm.wait(ih, TICK)
            except WaitTimeoutError:
                st = self.swarm.status(ih)
            progress(st.done)
            if arrival is not None and st.state != "seeding":
                self.feed_readers(ih, arrival)
            if st.state == "error":
                self.drop(blob.blob_id, info)
                raise SwarmError(f"BitTorrent download of {blob.path} failed: {st.error}")
            if st.state == "seeding":
                break
            now = time.monotonic()
            if st.pieces != pieces:
                if pieces >= 0:  # a piece passed since the last look (a failure before the first counts)
                    failures_at_piece, failing_since = st.hash_failures, 0.0
                pieces = st.pieces
            if st.hash_failures > failures_at_piece and not failing_since:
                failing_since = now
            if st.done != last_done:
                last_done, last_change, errors_at_progress = st.done, now, st.web_seed_errors
            if renewal and renewal.look(st):
                errors_at_progress = st.web_seed_errors  # the new URL has its own tries
            if failing_since and now - max(failing_since, last_change) > self.suspect_wait:
                # Pieces failed, none passed since, and no byte arrives: libtorrent banned every peer that
                # sent them. Bytes still arriving (a good peer filling in for a corrupt one) wait on.
                raise BadMetainfo(
                    f"{st.hash_failures - failures_at_piece} pieces of {blob.path} failed their hash check, "
                    f"none passed since, and nothing arrived for {now - last_change:.0f}s",
                    ih,
                    proven=False,
                )
            if now - last_change > stall:
                raise Stalled(
                    f"no progress for {now - last_change:.0f}s: {st.state}, {st.done}/{st.total} bytes, "
                    f"{st.num_peers} peers ({st.num_seeds} seeds)"
                )
            if (
                web_seed is not None
                and st.web_seed_errors > errors_at_progress
                and now - last_change > _WEB_SEED_TRIES * self.settings.web_seed_retry
            ):
                raise Stalled(f"{st.web_seed_error} (nothing received for {now - last_change:.0f}s)")
        with self._lock:
            self._active.pop(blob.blob_id, None)
            web_seeded = blob.blob_id in self._web_seeded
            self._web_seeded.discard(blob.blob_id)
        stage("verifying")
        self._verify_and_record(st.path, blob, info, ih, cache)
        return st, web_seeded

    def _verify_and_record(self, path: Path, blob: FileEntry, info: bytes, ih: str, cache: RepoCache) -> None:
        """One pass over `path`: the content id the origin promised, and the xxh3 sidecar for cheap checks;
        then the blob is adopted into the repo's `blobs/`. BadMetainfo (proven, naming the seeds that sent
        the bytes) when the content id differs."""
        hasher = BlobHasher(blob.size, blob.is_lfs, pieces=False)  # the metainfo holds the piece hashes
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(_READ_BLOCK):
                hasher.update(chunk)
        got = hasher.finish()
        if got.content_id != blob.blob_id or got.size != blob.size:
            try:
                seeds = self.swarm.status(ih).seed_sources
            except WeightswarmError:
                seeds = frozenset()
            self.swarm.remove(ih, delete_files=True)
            path.unlink(missing_ok=True)
            raise BadMetainfo(
                f"{blob.path}: bytes matching every piece hash of metainfo {ih} hash to "
                f"{got.content_id[:16]}…, not to the blob id {blob.blob_id[:16]}…; discarded",
                ih,
                proven=True,
                seeds=seeds,
            )
        st = path.stat()
        d = bdecode(info)
        assert isinstance(d, dict)
        piece_length, pieces = d[b"piece length"], d[b"pieces"]
        assert isinstance(piece_length, int) and isinstance(pieces, bytes)
        sidecar = BlobDigest(st.st_size, st.st_mtime_ns, got.xxh3, piece_length, pieces)
        write_atomic(cache.sidecar_path(blob.blob_id), sidecar.to_json(), fsync=False)
        if not cache.adopt_blob(blob.blob_id, blob.size):
            # The torrent may have been started for another repo (one torrent per blob, whoever asked
            # first): the file is where libtorrent put it, and this repo gets a link to it.
            raise IntegrityError(f"{blob.path}: the downloaded blob vanished from {path}; retry the fetch")

    def announced(self, ih: str, seeders: int) -> bool:
        """Wait, at most `_ANNOUNCE_WAIT`, for a tracker reply to the torrent's announce that counts at
        least `seeders` seeders (0: any reply); whether one came."""
        deadline = time.monotonic() + _ANNOUNCE_WAIT
        while self.swarm.status(ih).swarm_seeders < seeders:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # libtorrent has no completion event for an announce reply we can wait on
        return True

    def feed_readers(self, ih: str, arrival: Arrival) -> None:
        """While a reader streams the blob: its verified prefix to the reader, and the pieces the reader
        waits for first. Nothing while no one reads (the piece scan costs a little per tick)."""
        wanted = arrival.wanted
        if wanted is None:
            return
        try:
            arrival.advance(self.swarm.verified_prefix(ih))
            self.swarm.read_ahead(ih, wanted, _READ_AHEAD)
        except WeightswarmError as exc:
            log.debug("cannot feed the readers of %s: %s", arrival.blob_id, exc)
