"""Relay sources of a blob while it arrives from the origin: who may be asked, and the credential.

BitTorrent needs a blob's metainfo (every piece hash) before any peer can take a piece, and the
metainfo exists only once the lease holder has the whole blob. Without more, a one-shard model pays
the origin time first and the distribution time after it. The relay overlaps them: the holder, and
every node receiving from it, serves the blob's contiguous prefix over HTTP (`GET /v1/relay/{blob}`
on the agent's network listener, agent.relay.routes) while it grows; receivers stream it in order,
hash it as it comes, and serve their own prefix to the nodes after them. So the bytes form a tree
that moves at the origin's pace, and each node's uplink carries at most `swarm.relay_fanout`
streams of it.

Discovery reuses the tracker: a node holding or receiving a blob announces itself, with its API
port, on a torrent of its own, `relay_infohash(blob)` (no libtorrent torrent has that infohash), and
the announce reply lists the others. The tracker needs nothing new, its peer TTL drops dead sources,
and the announce carries the agents' passkey as every other one does.

Parts: an origin that caps each client (per connection or per IP, as a
CDN does) rather than its total holds one holder to that cap. A blob of at least twice
`swarm.origin_part_min` is therefore cut into up to `swarm.origin_holders` chunk-aligned parts
(`blob_parts`), each with an origin lease and relay sources of its own (`part_key`: a derived id, so
the tracker needs nothing new), all written into the same file (agent.core.parts `Shares`). The
first node to ask leads: it pulls the parts in order. Whether more nodes pull parts at once is
measured, per blob (agent.relay.admission): only if the lead keeps its origin rate while a second
node pulls does every node take a free part; on an origin that caps its total, K holders would end
when one does, but each node would then hash most of the blob only once all its parts are in
(sha256 is sequential). Origin egress stays one copy either way. Off by default (`origin_holders`
1): the measurement misjudges an origin capped in total when several blobs are pulled at once.

Warm starts (`swarm.relay_seeds`): a node that seeds a large blob whole offers it under the same key
(as a seeder there), and a node that wants a blob some node has whole takes it over the relay before
BitTorrent. Such a stream moves at link speed, not at the origin's, so each node passes it on to one
node only (`Arrival.chain`): the receivers form a chain behind each seed, and every node's uplink
carries the blob at its whole rate while it downloads, which is the lower bound of a broadcast.
BitTorrent from one seed sends many pieces twice (every receiver asks the seed for what looks rarest to
it), even with the CPU idle (benchmarks.md, "Warm with the CPU out of the way: the seed's pieces
go out twice"). The chain's costs: a node that slows holds up the nodes behind it, and one that stops
leaves them to ask another source after the stall time; a node that finds no relay source, or whose
relay breaks off, takes the blob by BitTorrent. Every seed announces its offers at the tracker's
interval, as it announces its torrents, and a lease holder as soon as it has the blob whole.

A chain has a hop per node, so each hop's cost counts N times, joining it included. A receiver finds
its place in one look (`place`): it announces on the blob's rank key, and the tracker's leecher count
in the reply is its rank (the tracker counts a node once); it says where it is on the key of its rank
(as that key's seeder); and it takes the blob from the node as many ranks before it as the blob has
seeds, the first receivers from a seed each. So each seed heads a chain, in the order the receivers
asked. Found by a walk to the chain's end instead, which moves one node at a time, a node's first byte
came seconds and tens of requests after its first request at 32 nodes (benchmarks.md, "Scaling: N = 4
to 32 nodes"). A receiver whose place does not stream to it (its node stopped, another took the place,
the tracker could not say) walks: a busy node names the nodes it streams to (`NEXT_HEADER`) and the
receiver asks them next, down to a chain's end in a request a hop. A node that is not ahead of a
receiver yet (it found its own source a moment ago) makes it wait up to a second rather than refuse
it, and bytes are handed on within 20 ms of their arrival, the last one included, since every receiver
checks the whole blob itself (agent.cache.arrivals): each node waiting for the one before it to check
and install its copy before the last byte moved on cost a wait per hop, which a chain pays N times.

Trust: the relayed bytes are origin bytes passed on, as a direct origin download is; each node
checks the sha256 end to end before the blob is visible, and discards a blob that fails it (then
takes the lease path again). Relay requests need the relay credential, derived from the passkey
(the passkey itself never goes to a peer), come only from addresses the peer gate admits, and go only
to them (the tracker refuses the interop passkey on these keys, which no metainfo has).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable

from agent.core.errors import TrackerError
from agent.core.settings import Settings
from agent.tracking.client import Announced, TrackerClient

log = logging.getLogger(__name__)

RELAY_PATH = "/v1/relay/"
NEXT_HEADER = "X-Relay-Next"
"""On the 503 of a source that streams the blob to as many nodes as it may: their addresses, by commas."""
_DEFAULT_INTERVAL = 30.0
"""Seconds between a source's announces until the tracker has said its `interval`."""
_SALT = b"weightswarm relay credential v1"
_PLACE_LOOKUP = 1.0
"""Seconds a receiver looks for the node before it in a chain (`place`), which says where it is a moment
after it asked for its rank."""
_PLACE_POLL = 0.05


def relay_infohash(blob_id: str) -> bytes:
    """The tracker key under which a blob's relay sources announce (not a real torrent's infohash)."""
    return hashlib.sha1(b"weightswarm-relay:" + blob_id.encode(), usedforsecurity=False).digest()


def rank_key(blob_id: str) -> bytes:
    """The tracker key on which a warm start's receivers of a blob count themselves (`place`)."""
    return relay_infohash(f"rank:{blob_id}")


def _place_key(blob_id: str, rank: int) -> bytes:
    """The tracker key on which the receiver of `rank` says where it is (as the key's one seeder)."""
    return relay_infohash(f"place:{blob_id}:{rank}")


def _urls(peers: Iterable[tuple[str, int]]) -> list[str]:
    return [f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}" for host, port in peers]


def blob_parts(size: int, settings: Settings) -> list[tuple[int, int]]:
    """The byte ranges of a blob that separate nodes pull from the origin at once: [(0, size)] for a blob
    under 2 x `swarm.origin_part_min` (or one holder allowed), else up to `swarm.origin_holders` near-equal
    parts, cut at multiples of `fetch.chunk_size` (the origin engine's resume record counts chunks)."""
    sw = settings.swarm
    n = min(sw.origin_holders, size // max(1, sw.origin_part_min))
    if n <= 1:
        return [(0, size)]
    chunk = settings.fetch.chunk_size
    chunks = -(-size // chunk)
    bounds = [min(size, chunks * k // n * chunk) for k in range(n + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


def part_key(blob_id: str, part: int, parts: int) -> str:
    """The id under which part `part` of `parts` has its origin lease and relay sources at the tracker."""
    return hashlib.sha256(f"weightswarm-part:{blob_id}:{part}/{parts}".encode()).hexdigest()


def relay_credential(settings: Settings) -> str | None:
    """The bearer token of relay requests, an HMAC of the agents' passkey; None when the node relays
    nothing (no tracker, no passkey, or `swarm.relay_fanout` 0)."""
    passkey = settings.daemon.tracker_passkey
    if not (settings.daemon.tracker_url and passkey and settings.swarm.relay_fanout > 0):
        return None
    return hmac.new(passkey.encode(), _SALT, hashlib.sha256).hexdigest()


class RelayDirectory:
    """This node in the relay sources of the blobs it holds or receives. Thread-safe."""

    def __init__(
        self, tracker: TrackerClient, port: Callable[[], int], credential: str, admits: Callable[[str], bool]
    ) -> None:
        self.tracker = tracker
        self.admits = admits
        """The peer gate's word on an address: only agents are named as sources (`_agents`)."""
        self._port_of = port
        """The agent's network listener port (known once it listens; asked once, at the first use)."""
        self._port: int | None = None
        self.credential = credential
        self._peer_id = b"-WS0001-" + os.urandom(6).hex().encode()
        self._lock = threading.Lock()
        self._joined: dict[str, tuple[int, float]] = {}
        """blob id -> (bytes left when it joined, monotonic time of its last announce)."""
        self.seeds: Callable[[], Iterable[str]] = lambda: ()
        """The blobs this node seeds whole and offers as a relay source (`swarm.relay_seeds`)."""
        self._offered: dict[str, float] = {}
        """blob id -> monotonic time of its last announce as an offered seed."""

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = self._port_of()
        return self._port

    def join(self, blob_id: str, left: int) -> list[str] | None:
        """Announce this node as a source of `blob_id`; the other sources' base URLs (may be empty), or
        None when the tracker could not be asked (the sources it named before may still relay). A source
        the tracker did not hear of is announced at the next `refresh` (a holder that joined during a
        tracker restart stayed unlisted for its whole download, and later nodes found no source)."""
        reply = self._join(blob_id, left)
        return None if reply is None else _urls(self._agents(reply.peers))

    def _agents(self, peers: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """The peers the peer gate admits as agents (announced with the agents' passkey): a receiver sends
        the relay credential to these only. The tracker lists a stock client that announced a relay key
        with the interop passkey as any other peer; asked, it was handed the credential."""
        return [(host, port) for host, port in peers if self.admits(host)]

    def _join(self, blob_id: str, left: int) -> Announced | None:
        reply = self._announce(relay_infohash(blob_id), max(1, left))
        with self._lock:
            self._joined[blob_id] = (left, time.monotonic() if reply is not None else -math.inf)
        return reply

    def place(self, blob_id: str, left: int) -> str | None:
        """Where this node takes `blob_id` from on a warm start: the base URL of its node in the seeds'
        chains, by the order in which the receivers asked (module doc, "Warm starts"); None when the
        tracker could not say, or the node before this one did not say where it is in time. Joins as
        a source, as `join` does."""
        ranked = self._announce(rank_key(blob_id), 1, numwant=0)
        if ranked is None or ranked.leechers < 1:
            return None
        rank = ranked.leechers - 1  # the tracker counts this node once, however often it announces
        self._announce(_place_key(blob_id, rank), 0, numwant=0)
        reply = self._join(blob_id, left)
        if reply is None:
            return None
        seeds = sorted(_urls(self._agents(reply.peers[: reply.seeders])))  # the tracker lists seeders first
        if rank < len(seeds):
            return seeds[rank]
        if not seeds:
            return None  # no chain to take a place in (the seed is not listed yet): any source will do
        # Each seed heads a chain: node `rank` follows the node `len(seeds)` places before it, which asked
        # a moment earlier and says where it is right after it learns its rank.
        deadline = time.monotonic() + _PLACE_LOOKUP
        while True:
            before = self._announce(_place_key(blob_id, rank - len(seeds)), 1, numwant=8)
            if before is not None and before.seeders:
                ahead = _urls(self._agents(before.peers[: before.seeders]))
                if ahead:
                    return random.choice(ahead)
            if before is None or time.monotonic() >= deadline:
                return None
            time.sleep(_PLACE_POLL)

    def refresh(self, lost: bool = False) -> None:
        """Announce again as a source of each blob last announced an announce interval ago, or of every
        one when the tracker `lost` its swarm state. A holder joins once, before a stream that can
        outlast the tracker's peer TTL or a tracker restart; unlisted, it left the nodes that asked
        after that with no source, and they waited out the relay's stall time (20 s). Each blob that
        `seeds` names is offered the same way, and withdrawn once it is not named any more."""
        every = self.tracker.interval or _DEFAULT_INTERVAL
        now = time.monotonic()
        seeds = set(self.seeds())
        with self._lock:
            due = [(b, left) for b, (left, at) in self._joined.items() if lost or now - at >= every]
            offers = [
                b for b in seeds
                if b not in self._joined and (lost or now - self._offered.get(b, -math.inf) >= every)
            ]
            gone = [b for b in self._offered if b not in seeds and b not in self._joined]
            for blob_id in gone:
                del self._offered[blob_id]
        for blob_id in gone:  # no longer seeded here (removed, evicted)
            self._stop(blob_id)
        for blob_id in offers:
            self._offer(blob_id)
        for blob_id, left in due:
            if self._announce(relay_infohash(blob_id), max(1, left)) is None:
                continue
            with self._lock:
                # A blob that left meanwhile stays left (the tracker lists this node until its peer TTL;
                # the relay route answers 404 for it, which receivers take as a source gone).
                if blob_id in self._joined:
                    self._joined[blob_id] = (left, time.monotonic())

    def _announce(self, key: bytes, left: int, numwant: int = 50) -> Announced | None:
        try:
            return self.tracker.announce(key, self._peer_id, self.port, left, "started", numwant=numwant)
        except TrackerError as exc:
            log.info("relay announce failed: %s", exc)
            return None

    def leave(self, blob_id: str) -> None:
        """No longer a source (done, or failed): the tracker stops handing this node out for it, unless
        the node seeds the blob whole now and offers it (a lease holder that finished: it stays listed)."""
        with self._lock:
            joined = self._joined.pop(blob_id, None)
        if joined is None:
            return
        if blob_id in set(self.seeds()):
            # Listed as a seeder at once, not at the next `refresh`: until then the tracker has it as a
            # receiver, and a warm start's receivers, which count the seeders as the chains' heads
            # (`place`), found no chain and looked for a source after the place lookup's second.
            self._offer(blob_id)
            return
        self._stop(blob_id)

    def _offer(self, blob_id: str) -> None:
        """Announce a blob this node seeds whole as a seeder of its relay key (`left` 0: `place` counts
        the seeders as the chains' heads); a failed announce is retried at the next `refresh`."""
        if self._announce(relay_infohash(blob_id), 0, numwant=0) is not None:
            with self._lock:
                self._offered[blob_id] = time.monotonic()

    def _stop(self, blob_id: str) -> None:
        try:
            self.tracker.announce(
                relay_infohash(blob_id), self._peer_id, self.port, 0, "stopped", numwant=0
            )
        except TrackerError as exc:
            log.info("relay leave for %s failed: %s", blob_id[:16], exc)
