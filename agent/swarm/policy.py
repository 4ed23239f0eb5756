"""The per-blob policy of the swarm: where each blob's bytes come from (ARCHITECTURE "Fetch flow").

    1. complete in the local cache                          -> done (size + xxh3 sidecar, no re-hash)
    2. tracker knows the metainfo and there are seeders     -> BitTorrent from peers
    3. metainfo known, no seeders                           -> ask for the origin lease; the holder
       joins the swarm first and, unless its own announce finds a seeder within
       `swarm.seeder_grace` (then it gives the lease back and does 2), adds the origin (a resolved
       CDN URL) as a web seed; the others join the same swarm. A relayed blob (below) does 4 instead:
       the web seed is one connection per blob, the origin engine several
    4. metainfo unknown                                     -> ask for the origin lease; the holder
       downloads with the origin engine (which hashes pieces while streaming), publishes the metainfo
       and seeds; the others take the blob from it as it arrives (the relay, agent.swarm.relay: blobs
       not `small`, metainfo known or not), else long-poll the tracker, then do 2. A blob big enough
       to come in parts (agent.swarm.relay "Parts") does this per part first (`_by_parts`): a node
       holds the lease of at most one part and receives the others from their holders' relays
    5. tracker unreachable                                  -> origin engine only; the blob is seeded
       anyway and published when the tracker returns (the daemon's probe loop)
    6. peers stall for `swarm.stall_timeout`                -> the lease path (3 or 4)
       (a lease holder whose web seed stalls as long, or fails and then brings nothing for
       3 x `swarm.web_seed_retry` seconds, uses the origin engine: same origin, own retries and errors)
    7. the metainfo is wrong (poisoned)                     -> the lease path as if it were unknown (4)
    8. the lease holder makes no progress                   -> take its lease over (then 3 or 4)

Wrong metainfo (issue 12): bytes that match every piece hash yet fail the blob id prove the published
metainfo wrong; pieces that keep failing make it suspect. Either way the node stops using it and takes
the lease path as if it were unknown (agent.swarm.trust: reports, bans, the check before re-publishing).

Stalled lease holders. A holder's heartbeats report the bytes it has; a node asking for the lease
passes `stale_after` (`holder_stall`: two heartbeat periods, at least `daemon.lease_stall_min`), and
the tracker hands it the lease of a holder whose bytes did not move for that long. So a waiter re-asks
as soon as the holder could count as stalled, and does not wait a lease TTL (30 s by default; the
bound is 20 s), let alone `max_wait_seconds`, on a holder whose heartbeats keep a dead download alive.

A blob finished by libtorrent is verified once end to end (sha256 / git sha1 against the blob id,
which is what the origin promised) in the same pass that writes its xxh3 sidecar, before any
snapshot link points at it. Why, when libtorrent has already checked every piece's SHA-1: those piece
hashes are only as good as the metainfo, and any holder of the tracker token can publish the
metainfo of a blob id. The publisher computed it from bytes it had verified (the origin engine
hashes sha256 and pieces in one stream; `agent publish` hashes its own files), and `check_info`
pins name and size, but a buggy or compromised node could still publish pieces of other bytes, and
then every node would install the same wrong "verified" weights in silence. The re-read catches that
(and the node recovers: "Wrong metainfo" above). Its cost with SHA-NI is ~0.6 CPU-s/GiB (+0.15 for
xxh3), once per blob per node. (Hashing in piece order while the download runs would hide it, but
pieces arrive in rarest-first order, and sequential downloading would make every node want the same
pieces at once.) The piece SHA-1s are not recomputed here (the metainfo has them): they were the
larger part of this pass (~1.1 CPU-s/GiB) until the warm benchmark showed it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.layout import BlobDigest, RepoCache, write_atomic
from agent.cache.verify import seedable_digest
from agent.core.errors import (
    CacheError,
    IntegrityError,
    SwarmError,
    TrackerError,
    TrackerUnavailableError,
    WaitTimeoutError,
    WeightswarmError,
)
from agent.core.hashing import BlobHasher
from agent.core.metainfo import infohash
from agent.core.parts import Feed, PartSink, Shares
from agent.core.plan import FileEntry
from agent.core.settings import Settings
from agent.swarm.relay import RelayDirectory, blob_parts, part_key
from agent.swarm.session import Swarm
from agent.swarm.status import WebSeed
from agent.swarm.tracker_client import Lease, TrackerClient
from agent.swarm.trust import MAX_BAD_METAINFO, BadMetainfo, MetainfoTrust
from tracker.bencode import bdecode

log = logging.getLogger(__name__)

BlobOrigin = Literal["cache", "peers", "origin"]
_READ_BLOCK = 4 * 2**20
_TICK = 0.5
_ANNOUNCE_WAIT = 5.0
"""Longest a publisher waits for its seeder announce to be answered before publishing the metainfo."""
_SUSPECT_WAIT = 5.0
"""Least seconds of failing pieces, none passing, before the metainfo is suspect (see `_suspect_wait`)."""
_READ_AHEAD = 32 * 2**20
"""Bytes past a streaming reader's position that libtorrent is asked for first (piece deadlines)."""
_WEB_SEED_TRIES = 3
"""A web seed that failed and then brought nothing for this many of libtorrent's retry periods is given
up: a refused (SSRF, 403) or unreachable URL, or one libtorrent dropped (404), then costs ~15 s, not a
whole stall timeout; a web seed that recovers (progress) is kept."""


@dataclass(frozen=True)
class BlobOutcome:
    source: BlobOrigin
    bytes_from_peers: int = 0
    bytes_from_origin: int = 0
    """Bytes libtorrent took from the origin as a web seed (origin-engine bytes are counted by it)."""


OriginDownload = Callable[[Callable[[int], None]], None]
"""Runs the origin engine for this one blob, telling the callable it is given how far the blob is written
from the start (readers stream that); returns once `blobs/<id>` and its sidecar are installed."""
RelayDownload = Callable[[Callable[[int], None]], "int | None"]
"""Receives the blob from its relay sources (agent.fetch.relay), telling the callable it is given how far
it is written; the bytes received once `blobs/<id>` and its sidecar are installed, else None."""
PartedDownload = Callable[[Callable[[int], None], Shares], int]
"""Runs the origin engine for a blob that comes in parts (agent.core.parts `Shares`), telling the
callable it is given how far the blob is written from the start; returns the bytes its feeds
brought, once `blobs/<id>` and its sidecar are installed."""
RelayPart = Callable[[str, PartSink], bool]
"""Receives one part of a blob from the nodes relaying it under a part key (agent.fetch.relay `feed`);
True once the part is whole."""
WebSeedUrl = Callable[[], str]
"""The URL a web seed may fetch the blob from without credentials (the Hub's redirect resolved)."""
Progress = Callable[[int], None]
"""Called with the bytes of this blob present so far."""


class _Stalled(Exception):
    pass


class _Published(Exception):
    """A blob being pulled in parts was published, with seeders, meanwhile: BitTorrent brings the rest."""


class SwarmFetcher:
    """Obtains blobs for the daemon's jobs. Thread-safe; one per daemon."""

    def __init__(
        self,
        settings: Settings,
        swarm: Swarm,
        tracker: TrackerClient | None,
        node_id: str,
        on_seeding: Callable[[str, str, bytes], None],
        relay: RelayDirectory | None = None,
    ) -> None:
        self.settings = settings
        self.relay = relay
        """This node as a relay source of the blobs it pulls from the origin (agent.swarm.relay)."""
        self.swarm = swarm
        self.tracker = tracker
        self.node_id = node_id
        self._on_seeding = on_seeding
        """(blob_id, infohash, info) for every blob this node starts seeding: the daemon remembers it."""
        self._active: dict[str, bytes] = {}
        """blob id -> info of libtorrent downloads in flight (to stop them before an origin fallback)."""
        self._web_seeded: set[str] = set()
        """Blobs whose torrent got the origin as a web seed (their bytes may be origin bytes)."""
        self._leases: set[str] = set()
        """Blobs whose origin lease this node holds or is asking for (see `_acquire_lease`)."""
        self._blob_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._trust = MetainfoTrust(swarm, tracker, node_id)
        self._present: dict[str, Callable[[], int | None]] = {}
        """blob id -> bytes of it present now, for lease heartbeats (set while it is obtained)."""
        self._stages: dict[str, Callable[[str], None]] = {}
        """blob id -> where to say which stage its fetch is in (the job's file, see `obtain`)."""
        self.arrivals = Arrivals()
        """Blobs being obtained, readable while they arrive (agent.cache.arrivals; the HF endpoint
        streams them). One producer per blob: `obtain` holds the blob's lock."""

    @property
    def holder_stall(self) -> float:
        """Seconds a lease holder's reported bytes may stay the same before another node takes its lease
        over: two heartbeat periods (heartbeats every ttl/3), less than one lease TTL, but at least
        `daemon.lease_stall_min` (progress shows in whole reads)."""
        d = self.settings.daemon
        return max(1.0, 2 * d.lease_ttl / 3, d.lease_stall_min)

    @property
    def _suspect_wait(self) -> float:
        """Seconds of failing pieces, none passing, after which the metainfo is suspect. A corrupt peer
        among good ones fails a piece now and then, but others keep passing; a wrong metainfo with
        honest bytes fails them all."""
        stall = self.settings.swarm.stall_timeout
        return min(stall, max(_SUSPECT_WAIT, stall / 4))

    @property
    def trackers(self) -> list[str]:
        return [self.tracker.announce_url] if self.tracker else []

    def _lock_for(self, blob_id: str) -> threading.Lock:
        # Two jobs wanting the same blob (two revisions sharing a shard) must not race on its files.
        with self._locks_guard:
            return self._blob_locks.setdefault(blob_id, threading.Lock())

    # -- the policy -----------------------------------------------------------------------

    def obtain(
        self,
        cache: RepoCache,
        blob: FileEntry,
        origin_download: OriginDownload,
        web_seed_url: WebSeedUrl,
        progress: Progress,
        present: Callable[[], int | None] | None = None,
        relay_download: RelayDownload | None = None,
        stage: Callable[[str], None] | None = None,
        parted: tuple[PartedDownload, RelayPart] | None = None,
    ) -> BlobOutcome:
        """`present`: the bytes of this blob present now, whichever engine writes them (lease
        heartbeats report it), or None while the origin told the download to wait (that is no stall);
        by default the last value passed to `progress`. `relay_download`: how to
        take the blob from the nodes relaying it while another node holds its origin lease. `stage`:
        told where the blob is ("lease", "origin", "peers", "verifying") as that changes. `parted`:
        how to pull it in parts (`_by_parts`)."""
        with self._lock_for(blob.blob_id):
            last = [0]

            def tracked(done: int) -> None:
                last[0] = done
                progress(done)

            with self._locks_guard:
                self._present[blob.blob_id] = present or (lambda: last[0])
                if stage is not None:
                    self._stages[blob.blob_id] = stage
            arrival = self.arrivals.begin(blob.blob_id, blob.size, cache.incomplete_path(blob.blob_id))
            try:
                outcome = self._obtain(
                    cache, blob, origin_download, web_seed_url, tracked, relay_download, parted
                )
                arrival.finish(cache.blob_path(blob.blob_id))
                return outcome
            except BaseException as exc:
                arrival.fail(str(exc) or type(exc).__name__)
                raise
            finally:
                self.arrivals.end(arrival)
                with self._locks_guard:
                    self._present.pop(blob.blob_id, None)
                    self._stages.pop(blob.blob_id, None)

    def _at(self, blob: FileEntry, stage: str) -> None:
        with self._locks_guard:
            sink = self._stages.get(blob.blob_id)
        if sink is not None:
            sink(stage)

    def _obtain(
        self,
        cache: RepoCache,
        blob: FileEntry,
        origin_download: OriginDownload,
        web_seed_url: WebSeedUrl,
        progress: Progress,
        relay_download: RelayDownload | None,
        parted: tuple[PartedDownload, RelayPart] | None,
    ) -> BlobOutcome:
        if cache.adopt_blob(blob.blob_id, blob.size):  # here, or linked from another repo
            self._seed_from_cache(cache, blob)
            return BlobOutcome("cache")
        if self.tracker is None:
            return self._from_origin(cache, blob, origin_download, publish=False)
        said = False
        while True:
            try:
                return self._via_tracker(
                    cache, blob, origin_download, web_seed_url, progress, relay_download, parted
                )
            except TrackerUnavailableError as exc:
                outcome = self._through_outage(cache, blob, progress, exc, said)
                if outcome is not None:
                    return outcome
                said = True
                down = self.tracker.outage
                if down >= self.settings.daemon.tracker_outage_grace:
                    log.warning("%s for %.0fs; fetching %s from the origin", exc, down, blob.path)
                    return self._from_origin(
                        cache, blob, origin_download, publish=False, info=self._known_info(blob)
                    )

    def _through_outage(
        self, cache: RepoCache, blob: FileEntry, progress: Progress, exc: TrackerUnavailableError, said: bool
    ) -> BlobOutcome | None:
        """While the tracker is down (at most `daemon.tracker_outage_grace`): go on with the peers this
        node already knows for the blob (libtorrent keeps its connections; None when they stall), else
        wait a little and let the caller ask the tracker again. The lease holder's origin download
        runs on meanwhile, and the others still take its pieces."""
        assert self.tracker is not None
        if not said:
            log.warning("%s; going on with the peers this node knows for %s and asking again", exc, blob.path)
        info = self._known_info(blob)
        if info is not None:
            # Back to the tracker after a short quiet spell: it may be up again, with new peers.
            left = self.settings.daemon.tracker_outage_grace - self.tracker.outage
            quiet = min(left, self.settings.daemon.tracker_probe_interval)
            return self._swarm_or_none(
                cache, blob, info, progress, stall=max(quiet, 1.0), then="asking the tracker again"
            )
        time.sleep(min(1.0, self.settings.daemon.tracker_probe_interval))
        return None

    def _via_tracker(
        self,
        cache: RepoCache,
        blob: FileEntry,
        origin_download: OriginDownload,
        web_seed_url: WebSeedUrl,
        progress: Progress,
        relay_download: RelayDownload | None,
        parted: tuple[PartedDownload, RelayPart] | None,
    ) -> BlobOutcome:
        assert self.tracker is not None
        deadline = time.monotonic() + self.settings.daemon.max_wait_seconds
        peers_stalled = relay_tried = False
        parts = blob_parts(blob.size, self.settings) if parted is not None and self._relayed(blob) else []
        waiting_on: str | None = None
        while True:
            if self._trust.bad_count(blob) >= MAX_BAD_METAINFO:
                log.warning("%s: wrong metainfo published again and again; using the origin", blob.path)
                return self._from_origin(cache, blob, origin_download, publish=True)
            info = self._trust.usable(blob, self.tracker.get_metainfo(blob.blob_id))
            state = self.tracker.blob_state(blob.blob_id)
            if info is not None and state.seeders > 0 and not peers_stalled:
                outcome = self._swarm_or_none(cache, blob, info, progress)
                if outcome is not None:
                    return outcome
                peers_stalled = True
                continue
            if len(parts) > 1 and parted is not None:
                # One try: a blob that fails in parts (a relayed part failed its source's check) comes
                # whole by the paths below.
                outcome = self._by_parts(cache, blob, parts, *parted)
                if outcome is not None:
                    return outcome
                parts = []
                continue
            lease = self._acquire_lease(blob, held_elsewhere=state.lease_holder not in (None, self.node_id))
            if lease.granted and info is None:
                # Asking can take seconds (`lease_spread`), and the previous holder may have published
                # the metainfo and released the lease meanwhile: a grant then is no reason to pull the
                # blob from the origin a second time (seen in the 8-node benchmark: egress 1.25-1.47 S).
                info = self._trust.usable(blob, self.tracker.get_metainfo(blob.blob_id))
            if (
                lease.granted
                and info is not None
                and not peers_stalled
                and self._seeder_appeared(blob, info, cache)
            ):
                # The tracker's count was a snapshot: a seeder announced (or restarted) since.
                log.info("%s: a seeder appeared; giving the origin lease back", blob.path)
                self._release(blob.blob_id)
                outcome = self._swarm_or_none(cache, blob, info, progress)
                if outcome is not None:
                    return outcome
                peers_stalled = True
                continue
            if lease.granted:
                return self._as_lease_holder(cache, blob, info, origin_download, web_seed_url, progress)
            if relay_download is not None and not relay_tried and self._relayed(blob):
                # The holder is pulling the blob from the origin and relaying it: take it as it arrives.
                relay_tried = True
                outcome = self._from_relay(cache, blob, relay_download)
                if outcome is not None:
                    return outcome
                continue  # ask again at once: the holder may have finished, or died
            if info is not None and not peers_stalled and not self._relayed(blob):
                # The holder is filling the swarm from the origin: take pieces from it as they arrive,
                # and ask the tracker again if none come for as long as a holder may stall. (A relayed
                # blob's holder seeds it only once whole: wait for that below, and try the relay again.)
                outcome = self._swarm_or_none(cache, blob, info, progress, stall=self.holder_stall)
                if outcome is not None:
                    return outcome
                peers_stalled = True
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("waited too long for %s from node %s; using the origin", blob.path, lease.holder)
                return self._from_origin(cache, blob, origin_download, publish=True, info=info)
            if lease.holder != waiting_on:
                waiting_on = lease.holder
                log.info("%s: node %s holds the origin lease; waiting for it", blob.path, lease.holder)
            self._at(blob, "lease")
            wait = min(self.settings.daemon.wait_poll_seconds, left)
            if lease.holder_idle is not None:
                # Ask again (with stale_after) as soon as the holder could count as stalled.
                wait = min(wait, max(0.2, self.holder_stall - lease.holder_idle + 0.2))
            if lease.retry_in is not None:
                # Refused while the tracker rebuilds lost state: ask again when it grants leases.
                wait = min(wait, lease.retry_in + 0.2)
            self.tracker.wait_blob(blob.blob_id, wait)
            peers_stalled = relay_tried = False

    def _swarm_or_none(
        self,
        cache: RepoCache,
        blob: FileEntry,
        info: bytes,
        progress: Progress,
        stall: float | None = None,
        then: str = "taking the origin-lease path",
    ) -> BlobOutcome | None:
        """The blob from its swarm; None when the peers stalled or the metainfo proved wrong or suspect
        (then the caller does what `then` says: by default, the lease path)."""
        try:
            return self._from_swarm(cache, blob, info, None, progress, stall=stall)
        except _Stalled:
            log.warning("peers stalled on %s; %s", blob.path, then)
        except BadMetainfo as exc:
            self._trust.distrust(blob, exc)
        return None

    def _by_parts(
        self,
        cache: RepoCache,
        blob: FileEntry,
        parts: list[tuple[int, int]],
        download: PartedDownload,
        relay_part: RelayPart,
    ) -> BlobOutcome | None:
        """The blob in parts (agent.swarm.relay "Parts"): the lease of one free part, pulled from the origin
        while the others come from their holders' relays; a part whose relay fails (its holder died or
        stalled) is taken over with its lease, or without it after `daemon.max_wait_seconds`, as a whole
        blob's is. None when it must come another way (then what arrived stays recorded): a relayed part
        failed its source's check (the blob is discarded), or the blob was published and seeded meanwhile."""
        assert self.tracker is not None and self.relay is not None
        relay = self.relay
        n = len(parts)
        keys = [part_key(blob.blob_id, k, n) for k in range(n)]
        held: dict[int, threading.Event] = {}
        guard = threading.Lock()
        deadline = time.monotonic() + self.settings.daemon.max_wait_seconds
        shares = Shares(own=[], feeds=[])

        def hold(k: int) -> None:
            """Part `k`'s lease is ours: heartbeats say how much of it is written; others may relay it."""
            start, end = parts[k]
            stop = threading.Event()
            with self._locks_guard:
                self._present[keys[k]] = lambda: shares.written_end(start) - start
            with guard:
                held[k] = stop
            relay.join(keys[k], end - start)
            threading.Thread(
                target=self._heartbeat, args=(keys[k], stop), name=f"lease-{keys[k][:12]}", daemon=True
            ).start()

        def feed_of(k: int) -> Feed:
            return lambda share: self._feed_part(blob, keys[k], share, relay_part, lambda: hold(k), deadline)

        self._at(blob, "lease")
        own = self._claim_part(keys)
        if own is not None:
            hold(own)
            shares.own.append(parts[own])
        shares.feeds.extend((parts[k], feed_of(k)) for k in range(n) if k != own)
        log.info(
            "%s: in %d parts; %s", blob.path, n, f"pulling part {own} from the origin" if own is not None else
            "every part is held elsewhere",
        )
        self._at(blob, "origin" if own is not None else "peers")
        self._drop_torrent(blob.blob_id, self._known_info(blob))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()
            arrival.extent = shares.written_end  # each part is relayed as it grows
        try:
            relayed = download(arrival.advance if arrival is not None else lambda _end: None, shares)
            self._installed(cache, blob)
            digest = cache.read_sidecar(blob.blob_id)
            if digest is None:
                raise CacheError(f"no digest recorded for {blob.path} after its download; retry the fetch")
            # Holders publish (the same dict from each: idempotent) before their part leases go.
            self._seed(cache, blob, digest.encoded_info(blob.blob_id), publish=bool(held))
        except _Published:
            log.info("%s: published and seeded meanwhile; taking the rest from peers", blob.path)
            return None
        except IntegrityError as exc:  # a relayed part failed its source's check, or the blob its sha256
            cache.discard_partial(blob.blob_id)
            log.warning("%s; fetching it whole", exc)
            return None
        finally:
            with guard:
                holding = dict(held)
            for k, stop in holding.items():
                stop.set()
                self._release(keys[k])
                with self._locks_guard:
                    self._present.pop(keys[k], None)
            for key in keys:
                relay.leave(key)
        return BlobOutcome("origin" if holding else "peers", bytes_from_peers=relayed)

    def _feed_part(
        self,
        blob: FileEntry,
        key: str,
        share: PartSink,
        relay_part: RelayPart,
        hold: Callable[[], None],
        deadline: float,
    ) -> None:
        """One part not this node's (a feed of `_by_parts`): from its relay sources while they bring it;
        when they cannot, its lease (`hold` it) and the origin engine for the rest, as soon as its holder
        counts as stalled, or at `deadline` without the lease."""
        assert self.tracker is not None
        ttl, stall = self.settings.daemon.lease_ttl, self.holder_stall
        while not share.cancelled:
            if relay_part(key, share) or share.cancelled:
                return
            try:
                if self.tracker.blob_state(blob.blob_id).seeders > 0:
                    raise _Published()
                granted = self.tracker.acquire_lease(key, self.node_id, ttl, stale_after=stall).granted
            except TrackerError as exc:
                log.info("%s: cannot ask for its part's lease: %s", blob.path, exc)
                granted = False
            if granted or time.monotonic() >= deadline:
                log.info("%s: taking over its part at %d from the origin", blob.path, share.start)
                hold()
                share.take_over()
                return
            time.sleep(min(1.0, self.settings.daemon.wait_poll_seconds))

    def _claim_part(self, keys: list[str]) -> int | None:
        """The lease of one part nobody holds, or None; nodes start looking at different parts."""
        assert self.tracker is not None
        n = len(keys)
        first = int(hashlib.sha1(self.node_id.encode(), usedforsecurity=False).hexdigest(), 16) % n
        for i in range(n):
            k = (first + i) % n
            try:
                if self.tracker.acquire_lease(keys[k], self.node_id, self.settings.daemon.lease_ttl).granted:
                    return k
            except TrackerError as exc:
                log.info("cannot ask for a part lease: %s", exc)
                return None
        return None

    def _as_lease_holder(
        self,
        cache: RepoCache,
        blob: FileEntry,
        info: bytes | None,
        origin_download: OriginDownload,
        web_seed_url: WebSeedUrl,
        progress: Progress,
    ) -> BlobOutcome:
        assert self.tracker is not None
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(blob.blob_id, stop), name=f"lease-{blob.blob_id[:12]}", daemon=True
        )
        beat.start()
        try:
            if self._relayed(blob):
                # Known metainfo or not, a blob this big comes through the origin engine and the relay:
                # libtorrent's web seed is one HTTP connection per blob, which an origin that caps each
                # connection (a CDN) holds to that cap (bench.swarm --origin-rate-per-connection).
                assert self.relay is not None
                self.relay.join(blob.blob_id, blob.size)  # nodes waiting for it take it as it arrives
                return self._from_origin(cache, blob, origin_download, publish=True, info=info)
            if info is None:
                return self._from_origin(cache, blob, origin_download, publish=True)
            try:
                seed = WebSeed(web_seed_url())
                return self._from_swarm(cache, blob, info, seed, progress)
            except BadMetainfo as exc:
                self._trust.distrust(blob, exc)
                return self._from_origin(cache, blob, origin_download, publish=True, info=info)
            except (SwarmError, _Stalled) as exc:
                log.warning("web seed download of %s failed (%s); using the origin engine", blob.path, exc)
                return self._from_origin(cache, blob, origin_download, publish=True, info=info)
        finally:
            if self.relay is not None:
                self.relay.leave(blob.blob_id)
            stop.set()
            beat.join(timeout=5)
            self._release(blob.blob_id)

    def _relayed(self, blob: FileEntry) -> bool:
        return self.relay is not None and not blob.small

    def _acquire_lease(self, blob: FileEntry, held_elsewhere: bool = False) -> Lease:
        """Ask for the blob's origin lease; a node already holding one first lets others ask (unless
        another node held this lease a moment ago: then there is nothing to spread, and the wait would
        only delay taking the blob as it arrives).

        Nodes asked for a model at once race for its shards' leases, and one fast node could win
        them all: it then pulls every shard from the origin and is the only source of each new
        piece for all peers, so its uplink saturates and its own origin download slows (measured:
        8 nodes, one holder of 3 of 4 shards, 1.4x the bound). Waiting `swarm.lease_spread`
        seconds before a second lease lets idle nodes take them; a lone node only loses that.
        """
        assert self.tracker is not None
        with self._locks_guard:
            holding = len(self._leases)
            if not blob.small:  # only large leases make the next one wait (a small one is over at once)
                self._leases.add(blob.blob_id)
        try:
            if holding and not blob.small and not held_elsewhere:
                time.sleep(self.settings.swarm.lease_spread)
            lease = self.tracker.acquire_lease(
                blob.blob_id, self.node_id, self.settings.daemon.lease_ttl, stale_after=self.holder_stall
            )
        except BaseException:
            self._forget_lease(blob.blob_id)
            raise
        if not lease.granted:
            self._forget_lease(blob.blob_id)
        return lease

    def _forget_lease(self, blob_id: str) -> None:
        with self._locks_guard:
            self._leases.discard(blob_id)

    def _release(self, blob_id: str) -> None:
        assert self.tracker is not None
        self._forget_lease(blob_id)
        try:
            self.tracker.release_lease(blob_id, self.node_id)
        except TrackerError as exc:
            log.info("could not release the lease on %s: %s", blob_id, exc)

    def _seeder_appeared(self, blob: FileEntry, info: bytes, cache: RepoCache) -> bool:
        """Join the blob's swarm without the origin and say whether a seeder shows up.

        True as soon as libtorrent is connected to a seed or the tracker's announce reply counts
        one; False once the reply counts none and no seed is connected, or after
        `swarm.seeder_grace` seconds. A torrent restored after a restart may have found its
        seeders long ago, which this sees at once.
        """
        ih = self._start_download(cache, blob, info, None)
        deadline = time.monotonic() + self.settings.swarm.seeder_grace
        while True:
            st = self.swarm.status(ih)
            if st.num_seeds > 0 or st.swarm_seeders > 0 or st.state == "seeding":
                return True
            if st.swarm_seeders == 0 or st.state == "error" or time.monotonic() >= deadline:
                return False
            try:
                self.swarm.wait(ih, 0.1)
            except WaitTimeoutError:
                pass

    def _heartbeat(self, blob_id: str, stop: threading.Event) -> None:
        """Renew the lease every ttl/3 with the bytes present: while they stay the same for
        `holder_stall`, another node may take the lease over. After a failed heartbeat the next comes
        within a second: a lease the tracker lost (a Redis restart) is the holder's again on its next
        heartbeat only while no other node took it (`lease_amnesty` at the tracker)."""
        assert self.tracker is not None
        ttl = self.settings.daemon.lease_ttl
        wait = ttl / 3
        while not stop.wait(wait):
            with self._locks_guard:
                present = self._present.get(blob_id)
            wait = ttl / 3
            try:
                if not self.tracker.heartbeat(
                    blob_id, self.node_id, ttl=ttl, progress=present() if present else None
                ):
                    log.warning("lost the origin lease on %s; finishing the download anyway", blob_id)
                    return
            except TrackerError as exc:
                log.info("lease heartbeat for %s failed: %s", blob_id, exc)
                wait = 1.0

    # -- sources --------------------------------------------------------------------------

    def _from_origin(
        self,
        cache: RepoCache,
        blob: FileEntry,
        origin_download: OriginDownload,
        publish: bool,
        info: bytes | None = None,
    ) -> BlobOutcome:
        self._at(blob, "origin")
        self._drop_torrent(blob.blob_id, info if info is not None else self._known_info(blob))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()  # the origin engine may start the file over
        origin_download(arrival.advance if arrival is not None else lambda _end: None)
        self._installed(cache, blob)
        digest = cache.read_sidecar(blob.blob_id)
        if digest is None:
            raise IntegrityError(f"no digest recorded for {blob.path} after its download; retry the fetch")
        info = digest.encoded_info(blob.blob_id)
        self._trust.trust_again(blob, infohash(info))
        self._seed(cache, blob, info, publish=publish)
        # The origin engine's own counters say how many bytes it really pulled (resume included).
        return BlobOutcome("origin")

    def _from_relay(
        self, cache: RepoCache, blob: FileEntry, relay_download: RelayDownload
    ) -> BlobOutcome | None:
        """The blob from the nodes relaying it (agent.fetch.relay); None when they could not finish it."""
        self._at(blob, "peers")
        self._drop_torrent(blob.blob_id, self._known_info(blob))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()
        received = relay_download(arrival.advance if arrival is not None else lambda _end: None)
        if received is None:
            return None
        self._installed(cache, blob)
        digest = cache.read_sidecar(blob.blob_id)
        if digest is None:
            raise IntegrityError(f"no digest recorded for {blob.path} after its download; retry the fetch")
        # The holder publishes the metainfo; ours is the same (same bytes, same piece length).
        self._seed(cache, blob, digest.encoded_info(blob.blob_id), publish=False)
        return BlobOutcome("peers", bytes_from_peers=received)

    def _start_download(
        self, cache: RepoCache, blob: FileEntry, info: bytes, web_seed: WebSeed | None
    ) -> str:
        """Join the blob's swarm (idempotent), recorded as in flight; returns the infohash."""
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()  # a new torrent may create the file afresh; its verified pieces say again
        with self._locks_guard:
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

    def _from_swarm(
        self,
        cache: RepoCache,
        blob: FileEntry,
        info: bytes,
        web_seed: WebSeed | None,
        progress: Progress,
        stall: float | None = None,
    ) -> BlobOutcome:
        """`stall`: seconds without progress before _Stalled (default `swarm.stall_timeout`). Raises
        BadMetainfo when the metainfo proves wrong (the finished bytes fail the blob id) or suspect
        (pieces keep failing their hashes, none passing, for `_suspect_wait`)."""
        self._at(blob, "origin" if web_seed is not None else "peers")
        ih = self._start_download(cache, blob, info, web_seed)
        stall = stall or self.settings.swarm.stall_timeout
        last_done, last_change = -1, time.monotonic()
        errors_at_progress = 0
        pieces, failures_at_piece, failing_since = -1, 0, 0.0
        arrival = self._arrival(blob)
        while True:
            try:
                st = self.swarm.wait(ih, _TICK)
            except WaitTimeoutError:
                st = self.swarm.status(ih)
            progress(st.done)
            if arrival is not None and st.state != "seeding":
                self._feed_readers(ih, arrival)
            if st.state == "error":
                self._drop_torrent(blob.blob_id, info)
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
            if failing_since and now - max(failing_since, last_change) > self._suspect_wait:
                # Pieces failed, none passed since, and no byte arrives: libtorrent banned every peer that
                # sent them. Bytes still arriving (a good peer filling in for a corrupt one) wait on.
                raise BadMetainfo(
                    f"{st.hash_failures - failures_at_piece} pieces of {blob.path} failed their hash check, "
                    f"none passed since, and nothing arrived for {now - last_change:.0f}s",
                    ih,
                    proven=False,
                )
            if now - last_change > stall:
                raise _Stalled(
                    f"no progress for {now - last_change:.0f}s: {st.state}, {st.done}/{st.total} bytes, "
                    f"{st.num_peers} peers ({st.num_seeds} seeds)"
                )
            elif (
                web_seed is not None
                and st.web_seed_errors > errors_at_progress
                and now - last_change > _WEB_SEED_TRIES * self.settings.swarm.web_seed_retry
            ):
                raise _Stalled(f"{st.web_seed_error} (nothing received for {now - last_change:.0f}s)")
        with self._locks_guard:
            self._active.pop(blob.blob_id, None)
        # The torrent may have been started for another repo (one torrent per blob, whoever asked
        # first): the file is where libtorrent put it, and this repo gets a link to it.
        self._verify_and_record(st.path, blob, info, ih, cache)
        if not cache.adopt_blob(blob.blob_id, blob.size):
            raise IntegrityError(f"{blob.path}: the downloaded blob vanished from {st.path}; retry the fetch")
        self._installed(cache, blob)
        log.info(
            "%s: %d bytes from peers, %d from web seeds",
            blob.path,
            st.bytes_from_peers,
            st.bytes_from_web_seeds,
        )
        self._on_seeding(blob.blob_id, ih, info)
        with self._locks_guard:
            web_seeded = blob.blob_id in self._web_seeded
            self._web_seeded.discard(blob.blob_id)
        if not web_seeded:
            # No web seed on this torrent: every payload byte came from a peer, whatever the
            # swarm's sampled split says (it attributes unsampled bytes to web seeds).
            return BlobOutcome("peers", bytes_from_peers=st.bytes_from_peers + st.bytes_from_web_seeds)
        return BlobOutcome(
            "peers" if st.bytes_from_web_seeds == 0 else "origin",
            bytes_from_peers=st.bytes_from_peers,
            bytes_from_origin=st.bytes_from_web_seeds,
        )

    # -- helpers --------------------------------------------------------------------------

    def _verify_and_record(self, path: Path, blob: FileEntry, info: bytes, ih: str, cache: RepoCache) -> None:
        """One pass over `path`: the content id the origin promised, and the xxh3 sidecar for cheap checks.
        BadMetainfo (proven, naming the seeds that sent the bytes) when the content id differs."""
        self._at(blob, "verifying")
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

    def _seed(self, cache: RepoCache, blob: FileEntry, info: bytes, publish: bool) -> None:
        ih = self.swarm.seed(cache.blob_path(blob.blob_id), info, self.trackers)
        self._on_seeding(blob.blob_id, ih, info)
        if publish and self.tracker is not None:
            # Announce before publishing: nodes waiting on the lease wake up at the metainfo, and if
            # the tracker did not count us as a seeder yet, one of them took the released lease and
            # pulled the blob from the origin a second time (origin egress 1.14 S in the benchmark).
            deadline = time.monotonic() + _ANNOUNCE_WAIT
            while self.swarm.status(ih).swarm_seeders < 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # libtorrent has no completion event for an announce reply we can wait on
            self._trust.publish(cache.blob_path(blob.blob_id), blob, info)

    def _seed_from_cache(self, cache: RepoCache, blob: FileEntry) -> None:
        digest = seedable_digest(cache, blob.blob_id)
        if digest is None:
            return
        try:
            self._seed(cache, blob, digest.encoded_info(blob.blob_id), publish=False)
        except (SwarmError, ValueError) as exc:
            log.warning("not seeding %s: %s", blob.path, exc)

    def _arrival(self, blob: FileEntry) -> Arrival | None:
        return self.arrivals.get(blob.blob_id)

    def _installed(self, cache: RepoCache, blob: FileEntry) -> None:
        """The blob is verified and installed: its readers get the last bytes now, before it is seeded and
        its metainfo published (a second or two: an announce is awaited first)."""
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.finish(cache.blob_path(blob.blob_id))

    def _feed_readers(self, ih: str, arrival: Arrival) -> None:
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

    def _known_info(self, blob: FileEntry) -> bytes | None:
        with self._locks_guard:
            return self._active.get(blob.blob_id)

    def _drop_torrent(self, blob_id: str, info: bytes | None) -> None:
        """Stop a libtorrent download of this blob so the origin engine owns its `.incomplete` file."""
        if info is None:
            return
        with self._locks_guard:
            self._web_seeded.discard(blob_id)
        try:
            self.swarm.remove(infohash(info), delete_files=False)
        except WeightswarmError:
            pass
