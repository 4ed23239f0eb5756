"""The ways a blob comes from other agents: one small protocol, `Transport`, that BitTorrent
(agent.swarm.download) and the relay (agent.relay.receiver) both satisfy.

A transport brings one blob of one fetch into the cache, verified end to end, or says it could not
(`None`: what arrived stays recorded for the next way). What to do then, and which transport to try
when, is the source policy's (agent.fetch.sources.policy); so is what follows a delivery (the blob's
readers told it is installed, the blob seeded under the metainfo the delivery names).

A new transport is a module of its own implementing `Transport`, one instance in `SourcePolicy`, and
the branch of the policy that says when to use it (docs/architecture.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.layout import RepoCache
from agent.core.errors import IntegrityError
from agent.core.metainfo import listed_pieces
from agent.core.plan import FileEntry
from agent.fetch.sources.request import BlobRequest
from agent.swarm.download import Downloads, Stalled

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class How:
    """How the policy asks for a blob this time."""

    stall: float | None = None
    """BitTorrent: seconds without progress before it gives up (default `swarm.stall_timeout`)."""
    web_seed: bool = False
    """BitTorrent: the origin joins as a web seed (a lease holder)."""
    chain: bool = False
    """The relay: from seeds, relayed on to one node at a time (a warm start; agent.relay.directory)."""


@dataclass(frozen=True)
class Delivery:
    """A blob a transport brought: installed under its final name, verified end to end."""

    info: bytes
    """The metainfo it is seeded under."""
    from_peers: int
    from_origin: int = 0
    """Bytes the origin sent as a web seed."""
    seeding: bool = False
    """The transport seeds it already (libtorrent finishes a download in place and seeds it)."""


class Transport(Protocol):
    name: str

    def bring(self, req: BlobRequest, info: bytes | None, how: How) -> Delivery | None:
        """`req`'s blob from other agents, or None when they could not finish it (stalled, no source).
        Raises `BadMetainfo` (agent.swarm.trust) when the listed metainfo proves wrong or suspect."""
        ...


def recorded_info(cache: RepoCache, blob: FileEntry) -> bytes:
    """The info dict of a blob just installed, from the sidecar its download recorded."""
    digest = cache.read_sidecar(blob.blob_id)
    if digest is None:
        raise IntegrityError(f"no digest recorded for {blob.path} after its download; retry the fetch")
    return digest.encoded_info(blob.blob_id)


def advance(arrival: Arrival | None) -> Callable[[int], None]:
    """What a producer calls with each new end of the blob's written prefix (nothing without readers)."""
    return arrival.advance if arrival is not None else lambda _end: None


class BitTorrent:
    """The blob's swarm (agent.swarm.download), with the origin as a web seed for a lease holder."""

    name = "bittorrent"

    def __init__(self, torrents: Downloads, arrivals: Arrivals) -> None:
        self.torrents = torrents
        self.arrivals = arrivals

    def bring(self, req: BlobRequest, info: bytes | None, how: How) -> Delivery | None:
        if info is None:
            return None  # no metainfo, no swarm
        blob = req.blob
        seed = req.web_seed if how.web_seed else None
        arrival = self.arrivals.get(blob.blob_id)
        try:
            st, web_seeded = self.torrents.receive(
                req.cache, blob, info, seed, req.report, arrival, req.stage, stall=how.stall
            )
        except Stalled as exc:
            log.info("%s by BitTorrent: %s", blob.path, exc)
            return None
        peers, web = st.bytes_from_peers, st.bytes_from_web_seeds
        log.info("%s: %d bytes from peers, %d from web seeds", blob.path, peers, web)
        if not web_seeded:
            # No web seed on this torrent: every payload byte came from a peer, whatever the
            # swarm's sampled split says (it attributes unsampled bytes to web seeds).
            peers, web = peers + web, 0
        return Delivery(info, from_peers=peers, from_origin=web, seeding=True)


class Relay:
    """The nodes relaying the blob as it arrives, or seeds chaining it (agent.relay.receiver)."""

    name = "relay"

    def __init__(self, torrents: Downloads, arrivals: Arrivals) -> None:
        self.torrents = torrents
        self.arrivals = arrivals

    def bring(self, req: BlobRequest, info: bytes | None, how: How) -> Delivery | None:
        """`info`: the metainfo the tracker lists, if any (its piece hashes are taken, not computed).
        With `how.chain`, no wait for a source to be listed (a seed that offers the blob is listed
        already)."""
        blob = req.blob
        req.stage("peers")
        self.torrents.drop(blob.blob_id, self.torrents.known_info(blob.blob_id))
        arrival = self.arrivals.get(blob.blob_id)
        if arrival is not None:
            arrival.restart()
            arrival.chain = how.chain
        pieces = None if info is None else listed_pieces(info, blob.blob_id, blob.size)
        received = req.from_relay(advance(arrival), how.chain, pieces)
        if received is None:
            return None
        # The holder publishes the metainfo; ours is the same (same bytes, same piece length), or the
        # listed one whose pieces were taken.
        return Delivery(recorded_info(req.cache, blob), from_peers=received)
