"""The per-blob policy of the swarm: where each blob's bytes come from (ARCHITECTURE "Fetch flow").

    1. complete in the local cache                          -> done (size + xxh3 sidecar, no re-hash)
    2. tracker knows the metainfo and there are seeders     -> BitTorrent from peers; a blob not `small`
       first as a chain of relays from the nodes that hold it whole (agent.swarm.relay "Warm starts"),
       when a seed offers it (`swarm.chains_seeds`)
    3. metainfo known, no seeders                           -> ask for the origin lease; a holder that
       learns of a seeder (the grant counts the blob's; from an older tracker that does not, its own
       announce within `swarm.seeder_grace`) gives the lease back and does 2; otherwise it joins the
       swarm and adds the origin (a resolved CDN URL) as a web seed; the others join the same swarm.
       A relayed blob (below) does 4 instead: the web seed is one connection per blob, the origin
       engine several
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

import functools
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
from agent.core.metainfo import infohash, listed_pieces
from agent.core.parts import PartSink, Shares
from agent.core.plan import FileEntry
from agent.core.settings import Settings
from agent.swarm.admission import MORE, ONE, Verdicts, admission_key, growing, judge, steady_rate
from agent.swarm.relay import RelayDirectory, blob_parts, part_key
from agent.swarm.session import Swarm
from agent.swarm.status import WebSeed
from agent.swarm.tracker_client import BlobState, Lease, TrackerClient
from agent.swarm.trust import MAX_BAD_METAINFO, BadMetainfo, MetainfoTrust
from agent.swarm.webseed import Renewal, WebSeedOrigin
from wirekit.bencode import bdecode

log = logging.getLogger(__name__)

BlobOrigin = Literal["cache", "peers", "origin"]
_READ_BLOCK = 4 * 2**20
_TICK = 0.5
_ASK_PARTS = 1.0
"""Seconds a node keeps the tracker's answer about a part of a blob in parts (who holds it, seeders)."""
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
RelayDownload = Callable[[Callable[[int], None], bool, "bytes | None"], "int | None"]
"""Receives the blob from its relay sources (agent.fetch.relay), telling the callable it is given how far
it is written, waiting a moment for a first source to be listed if the bool says so, and taking the piece
hashes given (the tracker's metainfo) rather than computing them when there are some; the bytes
received once `blobs/<id>` and its sidecar are installed, else None."""
PartedDownload = Callable[[Callable[[int], None], Shares], int]
"""Runs the origin engine for a blob that comes in parts (agent.core.parts `Shares`), telling the
callable it is given how far the blob is written from the start; returns the bytes its feeds
brought, once `blobs/<id>` and its sidecar are installed."""
RelayPart = Callable[[str, PartSink], bool]
"""Receives one part of a blob from the nodes relaying it under a part key (agent.fetch.relay `feed`);
True once the part is whole."""
Progress = Callable[[int], None]
"""Called with the bytes of this blob present so far."""


class _Stalled(Exception):
    pass


class _Published(Exception):
    """A blob being pulled in parts was published, with seeders, meanwhile: BitTorrent brings the rest."""


class _Claimable:
    """A feed's handle (agent.core.parts `PartSink`) that the node may claim for the origin: a relay
    stream into it then stops at once, and the feed hands the rest of the part to the origin engine."""

    def __init__(self, share: PartSink, claimed: threading.Event) -> None:
        self.share, self.claimed = share, claimed
        self.start, self.end, self.entry = share.start, share.end, share.entry

    @property
    def pos(self) -> int:
        return self.share.pos

    @property
    def cancelled(self) -> bool:
        return self.share.cancelled or self.claimed.is_set()

    def write(self, pos: int, data: bytes | memoryview) -> None:
        self.share.write(pos, data)

    def take_over(self) -> None:
        self.share.take_over()

    def fail(self, exc: BaseException) -> None:
        self.share.fail(exc)


class _InParts:
    """One blob coming in parts at this node (`SwarmFetcher._by_parts`): its parts and their lease keys,
    the parts this node holds, and what the tracker says of the others (asked at most once a second)."""

    def __init__(
        self, blob: FileEntry, parts: list[tuple[int, int]], tracker: TrackerClient, wait: float, ahead: int
    ) -> None:
        n = len(parts)
        self.blob, self.parts, self.tracker = blob, parts, tracker
        self.keys = [part_key(blob.blob_id, k, n) for k in range(n)]
        self.shares = Shares(own=[], feeds=[])
        self.verdicts = Verdicts(tracker, blob.blob_id, n)
        self.deadline = time.monotonic() + wait
        self.ahead = ahead
        """Bytes left of a part the lead pulls when it may take its next one: the origin engine's
        connections are then on their last chunks of it, and would idle until the next part's."""
        self.held: set[int] = set()
        """Parts whose lease this node holds (it pulls them from the origin)."""
        self.claims = [threading.Event() for _ in parts]
        """Set when `_probe` holds the part: its feed hands it to the origin engine."""
        self.done = threading.Event()
        self.taking = threading.Lock()
        self._leases: dict[str, tuple[threading.Event, threading.Thread]] = {}
        self._asked: dict[str, tuple[float, BlobState | None]] = {}
        self._lock = threading.Lock()

    def keep(self, key: str, stop: threading.Event, beat: threading.Thread) -> bool:
        """Start the heartbeats (`beat`, stopping with `stop`) of a lease this node holds, and remember
        them for `close`; False once the blob is done."""
        with self._lock:
            if self.done.is_set():
                return False
            self._leases[key] = (stop, beat)
            beat.start()
            return True

    def close(self) -> list[tuple[str, threading.Event, threading.Thread]]:
        """The blob is done with: the leases to give back."""
        with self._lock:
            self.done.set()
            leases, self._leases = [(k, *v) for k, v in self._leases.items()], {}
        return leases

    def overdue(self) -> bool:
        return time.monotonic() >= self.deadline

    def whole(self, k: int) -> bool:
        start, end = self.parts[k]
        return self.shares.written_end(start) >= end

    def missing(self, k: int) -> int:
        start, end = self.parts[k]
        return end - start - self.shares.present(start, end)

    def may_add(self, k: int) -> bool:
        """Whether this node may take free part `k` to pull from the origin: only while it pulls no other
        part, and then, unless more holders pay, only as the lead (it holds a part before `k`, and every
        part before `k` is its own or in hand here: the lead takes the parts in order). Once the verdict
        is that the lead pulls them all, a part counts as pulled until no more than `ahead` bytes of it
        are missing (the lead's connections then move on to the next part without a pause)."""
        held, verdict = set(self.held), self.verdicts.current()
        ahead = self.ahead if verdict == ONE else 0
        if any(self.missing(i) > ahead for i in held):
            return False
        if verdict == MORE:
            return True
        return any(i < k for i in held) and all(i in held or self.whole(i) for i in range(k))

    def holder(self, k: int) -> str | None:
        """Who holds part `k`'s lease ("?" when the tracker cannot say); raises `_Published` once the blob
        has seeders (the rest comes by BitTorrent)."""
        blob = self.state(self.blob.blob_id)
        if blob is not None and blob.seeders > 0:
            raise _Published()
        part = self.state(self.keys[k])
        return "?" if part is None else part.lease_holder

    def state(self, key: str) -> BlobState | None:
        """What the tracker says of `key` (a blob, a part, an admission lease); None when it cannot say."""
        with self._lock:
            at, state = self._asked.get(key, (0.0, None))
            if time.monotonic() - at < _ASK_PARTS:
                return state
        try:
            state = self.tracker.blob_state(key)
        except TrackerError as exc:
            log.info("cannot ask about a part of %s: %s", self.blob.path, exc)
            state = None
        with self._lock:
            self._asked[key] = (time.monotonic(), state)
        return state


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
        web_seed_url: WebSeedOrigin,
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
        web_seed_url: WebSeedOrigin,
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
        web_seed_url: WebSeedOrigin,
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
                warm = self.settings.swarm.chains_seeds
                if relay_download is not None and not relay_tried and self._relayed(blob) and warm:
                    # A warm start: the seeds offer the blob over the relay, as a chain at link speed
                    # (agent.swarm.relay "Warm starts"); BitTorrent if none does, or the chain breaks.
                    relay_tried = True
                    outcome = self._from_relay(cache, blob, relay_download, info, chain=True)
                    if outcome is not None:
                        return outcome
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
                and self._seeder_appeared(blob, info, cache, lease.seeders)
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
                outcome = self._from_relay(cache, blob, relay_download, info)
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
        """The blob in parts (agent.swarm.relay "Parts"): the first node to ask holds part 0 and pulls the
        parts in order; whether other nodes hold parts too is measured (agent.swarm.admission: `_judge` at
        the lead, `_probe` at the others);
        every part this node does not pull comes from its holder's relay (`_feed_part`). A part whose
        relay fails (its holder died or stalled) is taken over with its lease, or without it after
        `daemon.max_wait_seconds`, as a whole blob's is. None when it must come another way (then what
        arrived stays recorded): a relayed part failed its source's check (the blob is discarded), or
        the blob was published and seeded meanwhile."""
        assert self.tracker is not None and self.relay is not None
        fetch = self.settings.fetch
        ahead = fetch.chunk_size * fetch.connections_per_file
        run = _InParts(blob, parts, self.tracker, self.settings.daemon.max_wait_seconds, ahead)
        self._at(blob, "lease")
        try:
            first = self._acquire_lease(blob, key=run.keys[0]).granted
        except TrackerError as exc:
            log.info("cannot ask for the first part's lease of %s: %s", blob.path, exc)
            first = False
        if first:
            self._hold(run, 0)
            run.shares.own.append(parts[0])
        run.shares.feeds.extend(
            (parts[k], functools.partial(self._feed_part, run, k, relay_part))
            for k in range(len(parts)) if k or not first
        )
        log.info(
            "%s: in %d parts; %s", blob.path, len(parts),
            "pulling part 0 from the origin" if first else "part 0 is held elsewhere",
        )
        self._at(blob, "origin" if first else "peers")
        self._drop_torrent(blob.blob_id, self._known_info(blob))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()
            arrival.extent = run.shares.written_end  # each part is relayed as it grows
        admit = self._judge if first else self._probe
        name = f"admit-{blob.blob_id[:12]}"
        threading.Thread(target=self._admit, args=(admit, run), name=name, daemon=True).start()
        try:
            relayed = download(arrival.advance if arrival is not None else lambda _end: None, run.shares)
            self._installed(cache, blob)
            digest = cache.read_sidecar(blob.blob_id)
            if digest is None:
                raise CacheError(f"no digest recorded for {blob.path} after its download; retry the fetch")
            # Holders publish (the same dict from each: idempotent) before their part leases go.
            self._seed(cache, blob, digest.encoded_info(blob.blob_id), publish=bool(run.held))
        except _Published:
            log.info("%s: published and seeded meanwhile; taking the rest from peers", blob.path)
            return None
        except IntegrityError as exc:  # a relayed part failed its source's check, or the blob its sha256
            cache.discard_partial(blob.blob_id)
            log.warning("%s; fetching it whole", exc)
            return None
        finally:
            self._forget_lease(blob.blob_id)
            leases = run.close()
            for _key, stop, _beat in leases:
                stop.set()
            for key, _stop, beat in leases:
                beat.join(timeout=5)  # a heartbeat still in flight would take the released lease back
                self._release(key)
                with self._locks_guard:
                    self._present.pop(key, None)
            for key in run.keys:
                self.relay.leave(key)
        return BlobOutcome("origin" if run.held else "peers", bytes_from_peers=relayed)

    def _try_lease(self, key: str, stale: bool = False) -> bool:
        """Whether this node now holds the lease `key` (`stale`: also taken from a stalled holder)."""
        assert self.tracker is not None
        stale_after = self.holder_stall if stale else None
        try:
            return self.tracker.acquire_lease(
                key, self.node_id, self.settings.daemon.lease_ttl, stale_after=stale_after
            ).granted
        except TrackerError as exc:
            log.info("cannot ask for a lease of a blob's parts: %s", exc)
            return False

    def _keep(self, run: _InParts, key: str, present: Callable[[], int | None] | None = None) -> bool:
        """Heartbeats for a lease just granted (reporting `present`), until the blob is done with; False
        (and the lease given back) when it already is."""
        stop = threading.Event()
        name = f"lease-{key[:12]}"
        beat = threading.Thread(target=self._heartbeat, args=(key, stop), name=name, daemon=True)
        if present is not None:
            with self._locks_guard:
                self._present[key] = present
        if not run.keep(key, stop, beat):
            self._release(key)
            with self._locks_guard:
                self._present.pop(key, None)
            return False
        return True

    def _hold(self, run: _InParts, k: int) -> bool:
        """Part `k`'s lease is ours: heartbeats report the bytes this node has read from the origin for the
        blob (a part held ahead of its turn does not look stalled, nor does one whose connections are
        still on their first blocks: writes come a block per connection at a time, and on an origin
        shared by many they took over 10 s), and others may relay the part from here."""
        start, end = run.parts[k]
        if not self._keep(run, run.keys[k], run.shares.streamed):
            return False
        run.held.add(k)
        assert self.relay is not None
        self.relay.join(run.keys[k], end - start)
        return True

    def _take_part(self, run: _InParts, k: int, stale: bool) -> bool:
        """Hold part `k` to pull it from the origin: a free part when `may_add` says so, a part whose holder
        counts as stalled (`stale`), or any part once the blob is overdue; False when not."""
        with run.taking:  # one decision at a time: a node adds one part while `may_add` holds
            if not stale and not run.may_add(k) and not run.overdue():
                return False
            if not self._try_lease(run.keys[k], stale=stale) and not run.overdue():
                return False
            log.info("%s: pulling its part at %d from the origin", run.blob.path, run.parts[k][0])
            return self._hold(run, k)

    def _feed_part(self, run: _InParts, k: int, relay_part: RelayPart, share: PartSink) -> None:
        """Part `k`, not this node's at the start (a feed of `_by_parts`): from its holder's relay while
        somebody pulls it; pulled from the origin here once this node holds its lease (`_take_part`:
        free and `may_add`, or its holder stalled) or the prober claimed it (`_probe`)."""
        claim = _Claimable(share, run.claims[k])
        while not share.cancelled:
            if claim.claimed.is_set():
                share.take_over()
                return
            holder = run.holder(k)
            if holder is not None:  # somebody pulls it: take it from the relay (nobody relays a free part)
                if relay_part(run.keys[k], claim) or share.cancelled:
                    return
                if not claim.claimed.is_set() and self._take_part(run, k, stale=True):
                    share.take_over()
                    return
                continue
            if (run.may_add(k) or run.overdue()) and self._take_part(run, k, stale=False):
                share.take_over()
                return
            run.done.wait(_TICK)

    @staticmethod
    def _admit(admit: Callable[[_InParts], None], run: _InParts) -> None:
        try:
            admit(run)
        except _Published:  # the blob has seeders: nothing left to decide
            pass

    def _judge(self, run: _InParts) -> None:
        """At the lead, on its own thread: whether more nodes pulling the blob's parts pay
        (agent.swarm.admission). Its own origin rate alone, then while the prober pulls the last part;
        the verdict goes to the tracker as a lease."""
        stop, seconds = run.done, self.settings.swarm.origin_probe_seconds
        n, patience = len(run.parts), max(10.0, 3 * seconds)
        # Each rate once steady, in windows of half the setting: a new download first opens its
        # connections (one, then the rest), and other blobs' holders may still be arriving.
        origin, window = run.shares.streamed, seconds / 2
        if not growing(origin, patience, stop):
            return
        alone = steady_rate(origin, window, stop)
        if alone is None:
            run.verdicts.reached(ONE)  # here only, as below
            return
        ready = admission_key(run.blob.blob_id, n, "alone")
        if not self._try_lease(ready) or not self._keep(run, ready):
            return
        deadline = time.monotonic() + patience
        while not any(run.holder(k) not in (None, "?", self.node_id) for k in range(1, n)):
            if stop.wait(_TICK) or time.monotonic() >= deadline:
                log.info("%s: no second node came to pull a part; this node pulls them", run.blob.path)
                run.verdicts.reached(ONE)  # here only: a node that comes later still finds no verdict
                return
        shared = steady_rate(origin, window, stop)
        if shared is None:
            log.info("%s: no steady origin rate with a second node; this node pulls the parts", run.blob.path)
            run.verdicts.reached(ONE)
            return
        verdict = judge(alone, shared)
        log.info(
            "%s: the origin brought %.1f MB/s to this node alone, %.1f MB/s while a second node pulled: %s",
            run.blob.path, alone / 1e6, shared / 1e6,
            "more holders pay" if verdict == MORE else "this node pulls the rest",
        )
        key = run.verdicts.reached(verdict)
        if self._try_lease(key):
            self._keep(run, key)

    def _probe(self, run: _InParts) -> None:
        """At a node that does not lead, on its own thread: once the lead has measured its rate alone, the
        first such node to get the probe lease pulls the last free part, for the lead to measure again."""
        n = len(run.parts)
        ready, probing = (admission_key(run.blob.blob_id, n, what) for what in ("alone", "probe"))
        while not run.done.wait(_TICK):
            if run.verdicts.current() is not None:
                return
            lead_ready = run.state(ready)
            if lead_ready is None or lead_ready.lease_holder is None:
                continue
            if not self._try_lease(probing) or not self._keep(run, probing):
                return  # another node probes
            free = (k for k in reversed(range(1, n)) if run.holder(k) is None)
            j = next((k for k in free if self._try_lease(run.keys[k])), None)
            if j is not None and self._hold(run, j):
                log.info("%s: probing with its part at %d", run.blob.path, run.parts[j][0])
                run.claims[j].set()
            return

    def _as_lease_holder(
        self,
        cache: RepoCache,
        blob: FileEntry,
        info: bytes | None,
        origin_download: OriginDownload,
        web_seed_url: WebSeedOrigin,
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
                outcome = self._from_swarm(cache, blob, info, web_seed_url, progress)
                # Released as the download ended, the lease went to a node that asked before the tracker
                # knew of this seeder, and that node pulled the blob from the origin too (seen under a
                # loaded CI: a 267-byte file web-seeded by both nodes).
                if not self._announced(infohash(info), seeders=1):
                    log.info("no tracker reply counts %s's seeder yet; releasing its lease anyway", blob.path)
                return outcome
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

    def _announced(self, ih: str, seeders: int) -> bool:
        """Wait, at most `_ANNOUNCE_WAIT`, for a tracker reply to the torrent's announce that counts at
        least `seeders` seeders (0: any reply); whether one came."""
        deadline = time.monotonic() + _ANNOUNCE_WAIT
        while self.swarm.status(ih).swarm_seeders < seeders:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # libtorrent has no completion event for an announce reply we can wait on
        return True

    def _relayed(self, blob: FileEntry) -> bool:
        return self.relay is not None and not blob.small

    def _acquire_lease(self, blob: FileEntry, held_elsewhere: bool = False, key: str | None = None) -> Lease:
        """Ask for the blob's origin lease (or `key`'s: the first part of a blob in parts); a node already
        holding one first lets others ask (unless another node held this lease a moment ago: then there is
        nothing to spread, and the wait would only delay taking the blob as it arrives).

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
            ttl, stall = self.settings.daemon.lease_ttl, self.holder_stall
            lease = self.tracker.acquire_lease(key or blob.blob_id, self.node_id, ttl, stale_after=stall)
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

    def _seeder_appeared(self, blob: FileEntry, info: bytes, cache: RepoCache, counted: int | None) -> bool:
        """Join the blob's swarm without the origin and say whether a seeder shows up.

        True as soon as libtorrent is connected to a seed or the tracker's announce reply counts
        one; False once the reply counts none and no seed is connected, or after
        `swarm.seeder_grace` seconds. A torrent restored after a restart may have found its
        seeders long ago, which this sees at once.

        `counted`: the seeders the tracker counted when it granted the lease (None: an older tracker
        that does not say). Counted after the grant, it already covers the race the announce is for: 0
        answers at once (a restored torrent's own seeds still count), where the announce's reply took
        about a second (bench.swarm cold-known: 1.04 s from the grant to the holder's first origin request,
        0.10 s now).
        """
        if counted is not None and counted > 0:
            return True
        if counted == 0:
            known = infohash(info)
            if known not in self.swarm.torrents():
                return False
            st = self.swarm.status(known)
            return st.num_seeds > 0 or st.state == "seeding"
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
        self,
        cache: RepoCache,
        blob: FileEntry,
        relay_download: RelayDownload,
        info: bytes | None,
        chain: bool = False,
    ) -> BlobOutcome | None:
        """The blob from the nodes relaying it (agent.fetch.relay); None when they could not finish it.
        `info`: the metainfo the tracker lists, if any (its piece hashes are taken, not computed).
        `chain`: from seeds (a warm start): relayed on to one node at a time, and no wait for a source
        to be listed (a seed that offers the blob is listed already)."""
        self._at(blob, "peers")
        self._drop_torrent(blob.blob_id, self._known_info(blob))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()
            arrival.chain = chain
        pieces = None if info is None else listed_pieces(info, blob.blob_id, blob.size)
        advance = arrival.advance if arrival is not None else lambda _end: None
        received = relay_download(advance, not chain, pieces)
        if received is None:
            return None
        self._installed(cache, blob)
        digest = cache.read_sidecar(blob.blob_id)
        if digest is None:
            raise IntegrityError(f"no digest recorded for {blob.path} after its download; retry the fetch")
        # The holder publishes the metainfo; ours is the same (same bytes, same piece length), or the listed
        # one whose pieces were taken.
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
        web_seed: WebSeedOrigin | None,
        progress: Progress,
        stall: float | None = None,
    ) -> BlobOutcome:
        """`stall`: seconds without progress before _Stalled (default `swarm.stall_timeout`). Raises
        BadMetainfo when the metainfo proves wrong (the finished bytes fail the blob id) or suspect
        (pieces keep failing their hashes, none passing, for `_suspect_wait`)."""
        self._at(blob, "origin" if web_seed is not None else "peers")
        seed = None if web_seed is None else WebSeed(web_seed())
        ih = self._start_download(cache, blob, info, seed)
        renewal = None if web_seed is None else Renewal(self.swarm, ih, web_seed, blob.path)
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
            if renewal and renewal.look(st):
                errors_at_progress = st.web_seed_errors  # the new URL has its own tries
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
        peers, web = st.bytes_from_peers, st.bytes_from_web_seeds
        log.info("%s: %d bytes from peers, %d from web seeds", blob.path, peers, web)
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
            self._announced(ih, seeders=0)
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
