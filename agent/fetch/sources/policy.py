"""The per-blob source policy: where each blob's bytes come from (architecture.md, "The path of one blob").

    1. complete in the local cache                          -> done (size + xxh3 sidecar, no re-hash)
    2. tracker knows the metainfo and there are seeders     -> BitTorrent from peers; a blob not `small`
       first as a chain of relays from the nodes that hold it whole (agent.relay.directory "Warm starts"),
       when a seed offers it (`swarm.chains_seeds`)
    3. metainfo known, no seeders                           -> ask for the origin lease; a holder that
       learns of a seeder (the grant counts the blob's; from an older tracker that does not, its own
       announce within `swarm.seeder_grace`) gives the lease back and does 2; otherwise it joins the
       swarm and adds the origin (a resolved CDN URL) as a web seed; the others join the same swarm.
       A relayed blob (below) does 4 instead: the web seed is one connection per blob, the origin
       engine several
    4. metainfo unknown                                     -> ask for the origin lease; the holder
       downloads with the origin engine (which hashes pieces while streaming), publishes the metainfo
       and seeds; the others take the blob from it as it arrives (the relay, agent.relay: blobs not
       `small`, metainfo known or not), else long-poll the tracker, then do 2. A blob big enough to
       come in parts (agent.relay.directory "Parts") does this per part first (agent.fetch.sources.parts):
       a node holds the lease of at most one part and receives the others from their holders' relays
    5. tracker unreachable                                  -> origin engine only; the blob is seeded
       anyway and published when the tracker returns (the daemon's probe loop)
    6. peers stall for `swarm.stall_timeout`                -> the lease path (3 or 4)
       (a lease holder whose web seed stalls as long, or fails and then brings nothing for
       3 x `swarm.web_seed_retry` seconds, uses the origin engine: same origin, own retries and errors)
    7. the metainfo is wrong (poisoned)                     -> the lease path as if it were unknown (4)
    8. the lease holder makes no progress                   -> take its lease over (then 3 or 4)

The policy calls the transports itself: BitTorrent (agent.swarm.download), the relay and the origin
engine (through the `BlobRequest` of the fetch that wants the blob). Wrong metainfo: bytes that match
every piece hash yet fail the blob id prove the published metainfo wrong; pieces that keep failing make
it suspect. Either way the node stops using it and takes the lease path as if it were unknown
(agent.swarm.trust: reports, bans, the check before re-publishing).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.layout import RepoCache
from agent.cache.verify import seedable_digest
from agent.core.errors import (
    CacheError,
    IntegrityError,
    SwarmError,
    TrackerError,
    TrackerUnavailableError,
    WaitTimeoutError,
)
from agent.core.metainfo import infohash
from agent.core.plan import FileEntry
from agent.core.settings import Settings
from agent.fetch.sources.leases import Leases, holder_stall
from agent.fetch.sources.parts import InParts, Published
from agent.fetch.sources.request import BlobRequest
from agent.fetch.sources.transports import BitTorrent, How, Relay, Transport, advance, recorded_info
from agent.relay.directory import RelayDirectory, blob_parts
from agent.swarm.download import Downloads
from agent.swarm.session import Swarm
from agent.swarm.trust import MAX_BAD_METAINFO, BadMetainfo, MetainfoTrust
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)

BlobOrigin = Literal["cache", "peers", "origin"]


@dataclass(frozen=True)
class BlobOutcome:
    source: BlobOrigin
    bytes_from_peers: int = 0
    bytes_from_origin: int = 0
    """Bytes libtorrent took from the origin as a web seed (origin-engine bytes are counted by it)."""


class SourcePolicy:
    """Obtains blobs for the daemon's fetches. Thread-safe; one per daemon."""

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
        """This node as a relay source of the blobs it pulls from the origin (agent.relay.directory)."""
        self.swarm = swarm
        self.tracker = tracker
        self.node_id = node_id
        self._on_seeding = on_seeding
        """(blob_id, infohash, info) for every blob this node starts seeding: the daemon remembers it."""
        self.torrents = Downloads(swarm, settings.swarm, [tracker.announce_url] if tracker else [])
        self.leases = Leases(settings, tracker, node_id) if tracker is not None else None
        self._blob_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._trust = MetainfoTrust(swarm, tracker, node_id)
        self.arrivals = Arrivals()
        """Blobs being obtained, readable while they arrive (agent.cache.arrivals; the HF endpoint
        streams them). One producer per blob: `obtain` holds the blob's lock."""
        self.bittorrent: Transport = BitTorrent(self.torrents, self.arrivals)
        self.relayed: Transport = Relay(self.torrents, self.arrivals)
        """The ways between agents (agent.fetch.sources.transports); the relay only with a directory."""

    @property
    def holder_stall(self) -> float:
        """Seconds a lease holder's reported bytes may stay the same before another node takes it over."""
        return holder_stall(self.settings)

    def _lock_for(self, blob_id: str) -> threading.Lock:
        # Two jobs wanting the same blob (two revisions sharing a shard) must not race on its files.
        with self._locks_guard:
            return self._blob_locks.setdefault(blob_id, threading.Lock())

    # -- the policy -----------------------------------------------------------------------

    def obtain(self, req: BlobRequest) -> BlobOutcome:
        """The blob into its repo's cache, from wherever the policy finds it (see the module doc)."""
        blob = req.blob
        with self._lock_for(blob.blob_id):
            if self.leases is not None:
                self.leases.report(blob.blob_id, req.present)
            arrival = self.arrivals.begin(blob.blob_id, blob.size, req.cache.incomplete_path(blob.blob_id))
            try:
                outcome = self._obtain(req)
                arrival.finish(req.cache.blob_path(blob.blob_id))
                return outcome
            except BaseException as exc:
                arrival.fail(str(exc) or type(exc).__name__)
                raise
            finally:
                self.arrivals.end(arrival)
                if self.leases is not None:
                    self.leases.report(blob.blob_id, None)

    def _obtain(self, req: BlobRequest) -> BlobOutcome:
        cache, blob = req.cache, req.blob
        if cache.adopt_blob(blob.blob_id, blob.size):  # here, or linked from another repo
            self._seed_from_cache(cache, blob)
            return BlobOutcome("cache")
        if self.tracker is None:
            return self._from_origin(req, publish=False)
        said = False
        while True:
            try:
                return self._via_tracker(req)
            except TrackerUnavailableError as exc:
                outcome = self._through_outage(req, exc, said)
                if outcome is not None:
                    return outcome
                said = True
                down = self.tracker.outage
                if down >= self.settings.daemon.tracker_outage_grace:
                    log.warning("%s for %.0fs; fetching %s from the origin", exc, down, blob.path)
                    return self._from_origin(req, publish=False, info=self.torrents.known_info(blob.blob_id))

    def _through_outage(
        self, req: BlobRequest, exc: TrackerUnavailableError, said: bool
    ) -> BlobOutcome | None:
        """While the tracker is down (at most `daemon.tracker_outage_grace`): go on with the peers this
        node already knows for the blob (libtorrent keeps its connections; None when they stall), else
        wait a little and let the caller ask the tracker again. The lease holder's origin download
        runs on meanwhile, and the others still take its pieces."""
        assert self.tracker is not None
        if not said:
            log.warning(
                "%s; going on with the peers this node knows for %s and asking again", exc, req.blob.path
            )
        info = self.torrents.known_info(req.blob.blob_id)
        if info is not None:
            # Back to the tracker after a short quiet spell: it may be up again, with new peers.
            left = self.settings.daemon.tracker_outage_grace - self.tracker.outage
            quiet = min(left, self.settings.daemon.tracker_probe_interval)
            return self._swarm_or_none(req, info, stall=max(quiet, 1.0), then="asking the tracker again")
        time.sleep(min(1.0, self.settings.daemon.tracker_probe_interval))
        return None

    def _via_tracker(self, req: BlobRequest) -> BlobOutcome:
        """Steps 2-4, 6-8 of the module doc with the tracker up, until one source brings the blob. One loop
        on purpose: its order is the policy's, and what the last pass learnt (peers stalled, relay tried,
        whom the node waits on) decides the next."""
        assert self.tracker is not None and self.leases is not None
        blob = req.blob
        deadline = time.monotonic() + self.settings.daemon.max_wait_seconds
        peers_stalled = relay_tried = False
        relayed = self._relayed(req)
        parts = blob_parts(blob.size, self.settings) if relayed else []
        waiting_on: str | None = None
        while True:
            if self._trust.bad_count(blob) >= MAX_BAD_METAINFO:
                log.warning("%s: wrong metainfo published again and again; using the origin", blob.path)
                return self._from_origin(req, publish=True)
            info = self._trust.usable(blob, self.tracker.get_metainfo(blob.blob_id))
            state = self.tracker.blob_state(blob.blob_id)
            if info is not None and state.seeders > 0 and not peers_stalled:
                if relayed and not relay_tried and self.settings.swarm.chains_seeds:
                    # A warm start: the seeds offer the blob over the relay, as a chain at link speed
                    # (agent.relay.directory "Warm starts"); BitTorrent if none does, or the chain breaks.
                    relay_tried = True
                    outcome = self._by(self.relayed, req, info, How(chain=True))
                    if outcome is not None:
                        return outcome
                outcome = self._swarm_or_none(req, info)
                if outcome is not None:
                    return outcome
                peers_stalled = True
                continue
            if len(parts) > 1:
                # One try: a blob that fails in parts (a relayed part failed its source's check) comes
                # whole by the paths below.
                outcome = self._by_parts(req, parts)
                if outcome is not None:
                    return outcome
                parts = []
                continue
            lease = self.leases.acquire(blob, held_elsewhere=state.lease_holder not in (None, self.node_id))
            if lease.granted and info is None:
                # Asking can take seconds (`lease_spread`), and the previous holder may have published
                # the metainfo and released the lease meanwhile: a grant then is no reason to pull the
                # blob from the origin a second time (benchmarks.md, "The swarm on shaped links (8 nodes)").
                info = self._trust.usable(blob, self.tracker.get_metainfo(blob.blob_id))
            if (
                lease.granted
                and info is not None
                and not peers_stalled
                and self._seeder_appeared(req, info, lease.seeders)
            ):
                # The tracker's count was a snapshot: a seeder announced (or restarted) since.
                log.info("%s: a seeder appeared; giving the origin lease back", blob.path)
                self.leases.release(blob.blob_id)
                outcome = self._swarm_or_none(req, info)
                if outcome is not None:
                    return outcome
                peers_stalled = True
                continue
            if lease.granted:
                return self._as_lease_holder(req, info)
            if relayed and not relay_tried:
                # The holder is pulling the blob from the origin and relaying it: take it as it arrives.
                relay_tried = True
                outcome = self._by(self.relayed, req, info, How())
                if outcome is not None:
                    return outcome
                continue  # ask again at once: the holder may have finished, or died
            if info is not None and not peers_stalled and not relayed:
                # The holder is filling the swarm from the origin: take pieces from it as they arrive,
                # and ask the tracker again if none come for as long as a holder may stall. (A relayed
                # blob's holder seeds it only once whole: wait for that below, and try the relay again.)
                outcome = self._swarm_or_none(req, info, stall=self.holder_stall)
                if outcome is not None:
                    return outcome
                peers_stalled = True
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("waited too long for %s from node %s; using the origin", blob.path, lease.holder)
                return self._from_origin(req, publish=True, info=info)
            if lease.holder != waiting_on:
                waiting_on = lease.holder
                log.info("%s: node %s holds the origin lease; waiting for it", blob.path, lease.holder)
            req.stage("lease")
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
        req: BlobRequest,
        info: bytes,
        stall: float | None = None,
        then: str = "taking the origin-lease path",
    ) -> BlobOutcome | None:
        """The blob from its swarm; None when the peers stalled or the metainfo proved wrong or suspect
        (then the caller does what `then` says: by default, the lease path)."""
        try:
            outcome = self._by(self.bittorrent, req, info, How(stall=stall))
        except BadMetainfo as exc:
            self._trust.distrust(req.blob, exc)
            return None
        if outcome is None:
            log.warning("peers stalled on %s; %s", req.blob.path, then)
        return outcome

    def _by_parts(self, req: BlobRequest, parts: list[tuple[int, int]]) -> BlobOutcome | None:
        """The blob in parts (agent.fetch.sources.parts). None when it must come another way (then what
        arrived stays recorded): a relayed part failed its source's check (the blob is discarded), or
        the blob was published and seeded meanwhile."""
        assert self.leases is not None and self.relay is not None
        cache, blob = req.cache, req.blob
        run = InParts(blob, parts, self.settings, self.leases, self.relay)
        req.stage("lease")
        try:
            first = self.leases.acquire(blob, key=run.keys[0]).granted
        except TrackerError as exc:
            log.info("cannot ask for the first part's lease of %s: %s", blob.path, exc)
            first = False
        if first:
            run.hold(0)
            run.shares.own.append(parts[0])
        run.shares.feeds.extend(
            (parts[k], functools.partial(run.feed, k, req.relay_part))
            for k in range(len(parts))
            if k or not first
        )
        log.info(
            "%s: in %d parts; %s",
            blob.path,
            len(parts),
            "pulling part 0 from the origin" if first else "part 0 is held elsewhere",
        )
        req.stage("origin" if first else "peers")
        self.torrents.drop(blob.blob_id, self.torrents.known_info(blob.blob_id))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()
            arrival.extent = run.shares.written_end  # each part is relayed as it grows
        name = f"admit-{blob.blob_id[:12]}"
        threading.Thread(target=run.admit, args=(first,), name=name, daemon=True).start()
        try:
            relayed = req.from_origin(advance(arrival), run.shares)
            self._installed(cache, blob)
            digest = cache.read_sidecar(blob.blob_id)
            if digest is None:  # not an IntegrityError: that one means "fetch it whole" here
                raise CacheError(f"no digest recorded for {blob.path} after its download; retry the fetch")
            # Holders publish (the same dict from each: idempotent) before their part leases go.
            self._seed(cache, blob, digest.encoded_info(blob.blob_id), publish=bool(run.held))
        except Published:
            log.info("%s: published and seeded meanwhile; taking the rest from peers", blob.path)
            return None
        except IntegrityError as exc:  # a relayed part failed its source's check, or the blob its sha256
            cache.discard_partial(blob.blob_id)
            log.warning("%s; fetching it whole", exc)
            return None
        finally:
            self.leases.forget(blob.blob_id)
            run.close()
        return BlobOutcome("origin" if run.held else "peers", bytes_from_peers=relayed)

    def _as_lease_holder(self, req: BlobRequest, info: bytes | None) -> BlobOutcome:
        assert self.leases is not None
        blob = req.blob
        stop = threading.Event()
        beat = self.leases.beat(blob.blob_id, stop)
        beat.start()
        try:
            if self._relayed(req):
                # Known metainfo or not, a blob this big comes through the origin engine and the relay:
                # libtorrent's web seed is one HTTP connection per blob, which an origin that caps each
                # connection (a CDN) holds to that cap (bench.swarm --origin-rate-per-connection).
                assert self.relay is not None
                self.relay.join(blob.blob_id, blob.size)  # nodes waiting for it take it as it arrives
                return self._from_origin(req, publish=True, info=info)
            if info is None or not req.web_seed():  # no metainfo, or an origin that offers no web seed
                return self._from_origin(req, publish=True, info=info)
            try:
                outcome = self._by(self.bittorrent, req, info, How(web_seed=True))
            except BadMetainfo as exc:
                self._trust.distrust(blob, exc)
                return self._from_origin(req, publish=True, info=info)
            except SwarmError as exc:
                log.warning("web seed download of %s failed (%s); using the origin engine", blob.path, exc)
                return self._from_origin(req, publish=True, info=info)
            if outcome is None:
                log.warning("web seed download of %s stalled; using the origin engine", blob.path)
                return self._from_origin(req, publish=True, info=info)
            # Released as the download ended, the lease went to a node that asked before the tracker knew
            # of this seeder, and that node pulled the blob from the origin too (a 267-byte file web-seeded
            # by both nodes).
            if not self.torrents.announced(infohash(info), seeders=1):
                log.info("no tracker reply counts %s's seeder yet; releasing its lease anyway", blob.path)
            return outcome
        finally:
            if self.relay is not None:
                self.relay.leave(blob.blob_id)
            stop.set()
            beat.join(timeout=5)
            self.leases.release(blob.blob_id)

    def _relayed(self, req: BlobRequest) -> bool:
        return self.relay is not None and req.has_relay and not req.blob.small

    def _seeder_appeared(self, req: BlobRequest, info: bytes, counted: int | None) -> bool:
        """Join the blob's swarm without the origin and say whether a seeder shows up.

        True as soon as libtorrent is connected to a seed or the tracker's announce reply counts
        one; False once the reply counts none and no seed is connected, or after
        `swarm.seeder_grace` seconds. A torrent restored after a restart may have found its
        seeders long ago, which this sees at once.

        `counted`: the seeders the tracker counted when it granted the lease (None: an older tracker
        that does not say). Counted after the grant, it already covers the race the announce is for: 0
        answers at once (a restored torrent's own seeds still count), where the announce's reply took
        about a second of every cold start.
        """
        if counted is not None and counted > 0:
            return True
        if counted == 0:
            known = infohash(info)
            if known not in self.swarm.torrents():
                return False
            st = self.swarm.status(known)
            return st.num_seeds > 0 or st.state == "seeding"
        ih = self.torrents.start(req.cache, req.blob, info, None, self._arrival(req.blob))
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

    # -- the transports ---------------------------------------------------------------------

    def _from_origin(self, req: BlobRequest, publish: bool, info: bytes | None = None) -> BlobOutcome:
        cache, blob = req.cache, req.blob
        req.stage("origin")
        self.torrents.drop(blob.blob_id, info if info is not None else self.torrents.known_info(blob.blob_id))
        arrival = self._arrival(blob)
        if arrival is not None:
            arrival.restart()  # the origin engine may start the file over
        req.from_origin(advance(arrival))
        self._installed(cache, blob)
        info = recorded_info(cache, blob)
        self._trust.trust_again(blob, infohash(info))
        # The recorded piece hashes are the engine's, of these bytes, unless the blob was only linked to
        # another repo's copy (a content id learnt by the download: agent.fetch.engine `install_downloaded`).
        self._seed(cache, blob, info, publish=publish, checked=blob.content_known)
        # The origin engine's own counters say how many bytes it really pulled (resume included).
        return BlobOutcome("origin")

    def _by(self, transport: Transport, req: BlobRequest, info: bytes | None, how: How) -> BlobOutcome | None:
        """The blob by one of the ways between agents (agent.fetch.sources.transports); None when it could
        not finish it. Once it is in: its readers get the last bytes, and it is seeded."""
        cache, blob = req.cache, req.blob
        delivery = transport.bring(req, info, how)
        if delivery is None:
            return None
        self._installed(cache, blob)
        if delivery.seeding:
            self._on_seeding(blob.blob_id, infohash(delivery.info), delivery.info)
        else:
            self._seed(cache, blob, delivery.info, publish=False)
        source: BlobOrigin = "origin" if delivery.from_origin else "peers"
        return BlobOutcome(source, delivery.from_peers, delivery.from_origin)

    # -- helpers --------------------------------------------------------------------------

    def _seed(
        self, cache: RepoCache, blob: FileEntry, info: bytes, publish: bool, checked: bool = False
    ) -> None:
        ih = self.swarm.seed(cache.blob_path(blob.blob_id), info, self.torrents.trackers, checked)
        self._on_seeding(blob.blob_id, ih, info)
        if publish and self.tracker is not None:
            # Announce before publishing: nodes waiting on the lease wake up at the metainfo, and if
            # the tracker did not count us as a seeder yet, one of them took the released lease and
            # pulled the blob from the origin a second time.
            self.torrents.announced(ih, seeders=0)
            self._trust.publish(cache.blob_path(blob.blob_id), blob, info)

    def seed_installed(self, cache: RepoCache, blob: FileEntry, publish: bool = True) -> None:
        """Seed a blob this node installed outside the swarm (a bucket's first read, or an object taken from
        its reader's relay: agent.fetch.bucket) and publish its metainfo (`publish`), so that other nodes
        take it from here."""
        self._seed(cache, blob, recorded_info(cache, blob), publish=publish)

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
