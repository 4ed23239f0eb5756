"""The store interface, split by concern, and the values that cross it.

Five small interfaces, one per thing the tracker keeps: `PeerStore` (live peers: announce,
scrape), `MetainfoStore` (info dicts and their quarantine), `LeaseStore` (origin leases),
`ManifestStore` (manifests, refs, the model list) and `StoreLifecycle` (ping, epoch, totals,
close). Each router asks for the ones it uses; `Store` is all five, what `tracker.stores.open_store`
returns. Two implementations: `store_sqlite` (the embedded default: durable manifests, metainfo
and leases in one SQLite file, live peers in memory) and `store_redis` (everything in Redis, so
several tracker replicas share one view of the swarm). Both pass the same test suite
(tests/tracker/test_tracker_store.py).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

PeerAddr = tuple[bytes, bytes, int]
"""(peer_id, packed IP address (4 or 16 bytes), port)."""


@dataclass(frozen=True)
class SwarmCounts:
    """What scrape reports for one torrent."""

    complete: int = 0
    incomplete: int = 0
    downloaded: int = 0


class AnnounceResult(NamedTuple):  # a tuple: made once per announce, cheaper than a frozen dataclass
    """Counts after the announce, and the peers handed to the client (never itself)."""

    complete: int
    incomplete: int
    peers: Sequence[PeerAddr]
    compact: list[bytes] | None = None
    """The same peers, each as BEP 23 lists it (packed ip + port), when the store has them at hand."""


@dataclass(frozen=True)
class LeaseHolder:
    node_id: str
    expires_in: float
    progress: int | None = None
    """Bytes of the blob the holder reported with its last heartbeat (0 when granted; None: unknown)."""
    idle: float | None = None
    """Seconds since the holder's reported bytes last changed, or since the grant (None: unknown)."""


@dataclass(frozen=True)
class LeaseState:
    """Outcome of a lease request: who holds the blob now, and whether the caller is one of them."""

    granted: bool
    holders: list[LeaseHolder]
    expired: int = 0
    """Leases found expired (and dropped) while handling this request, for the metrics."""
    taken_over: int = 0
    """Leases of holders idle past `stale_after` that this request took over, for the metrics."""

    def expires_in(self, node_id: str) -> float:
        return next((h.expires_in for h in self.holders if h.node_id == node_id), 0.0)


@dataclass(frozen=True)
class QuarantineRecord:
    """An info dict a node reported wrong for a blob, removed from the blob and kept here."""

    infohash: str
    info: bytes
    reason: str
    reporter: str | None
    """The node id the report named (self-declared: any agent-role holder can name any)."""
    address: str | None
    """The address the report came from."""
    at: float
    """Unix time of the report."""


@dataclass(frozen=True)
class StoreStats:
    torrents: int
    peers: int
    seeders: int


@dataclass(frozen=True)
class ModelEntry:
    """One registered repo: its commits (with manifests) and the revisions pointing at them."""

    repo_id: str
    revisions: dict[str, str]
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    published: bool = False
    """The publisher role wrote a manifest for it: agent-role writes are refused."""


class OverLimitError(Exception):
    """An announce the store refused, over a `SwarmLimits` limit: nothing of it was stored. The message
    is the bencoded failure reason the client gets."""


UNREGISTERED = "unregistered torrent: the interop passkey announces only blobs the tracker has metainfo for"


class UnregisteredTorrentError(Exception):
    """An interop-passkey announce for an infohash the tracker holds no metainfo for (a relay, rank or
    place key, or anything else no blob has): refused, nothing stored. Stock clients crowding a relay
    key's listing would cost the agents' relay its sources."""


# Every method is async so that the Redis store never blocks the event loop.


class LocalPeers(Protocol):
    """Live peers held in this process's memory: announce and scrape without an await."""

    def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int, agent: bool = True
    ) -> AnnounceResult: ...

    def counts(self, infohash: bytes) -> SwarmCounts: ...


class PeerStore(abc.ABC):
    """Live peers per torrent: what announce and scrape read and write."""

    local_peers: LocalPeers | None = None
    """The same peers, when they live in this process (the SQLite store): the tracker answers
    announces and scrapes from them inside its listener's protocol (tracker.app), in one step."""

    @abc.abstractmethod
    async def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int, agent: bool = True
    ) -> AnnounceResult:
        """Record (or, for event=stopped, remove) the peer; return counts and up to numwant peers.
        `agent`: the announce carried the agents' passkey, so its address joins `peer_addresses`; without
        it (the interop passkey) UnregisteredTorrentError unless a blob's metainfo has this infohash."""

    @abc.abstractmethod
    async def scrape(self, infohashes: list[bytes]) -> dict[bytes, SwarmCounts]:
        """Counts per infohash; unknown ones are all zeros."""

    @abc.abstractmethod
    async def seeder_addresses(self, infohashes: list[bytes]) -> dict[bytes, list[tuple[bytes, int]]]:
        """(packed IP, listen port) of each live seeder per infohash, sorted; unknown ones: empty.
        Live as for `scrape`: an entry past its expiry is not counted."""

    @abc.abstractmethod
    async def peer_addresses(self) -> list[bytes]:
        """Packed IPs (4 or 16 bytes) of every peer that announced in any swarm within the peer TTL:
        the agents, since an announce needs the passkey. Agents admit only these (agent.swarm.gate)."""


class MetainfoStore(abc.ABC):
    """Each blob's info dict, and the dicts nodes reported wrong (quarantined)."""

    @abc.abstractmethod
    async def put_metainfo(self, blob_id: str, infohash: str, info: bytes) -> bool:
        """Store the info dict; True if new, False if the same bytes were there; ConflictError if other;
        QuarantinedMetainfoError if this dict was reported wrong within `quarantine_hold`."""

    @abc.abstractmethod
    async def get_metainfo(self, blob_id: str) -> tuple[str, bytes] | None:
        """(infohash hex, bencoded info dict) or None."""

    @abc.abstractmethod
    async def quarantine_metainfo(
        self, blob_id: str, infohash: str, reason: str, reporter: str | None, address: str | None
    ) -> bool:
        """Remove the blob's info dict if its infohash is `infohash` (a stale report removes nothing),
        keeping it as a QuarantineRecord; `put_metainfo` then refuses that dict (QuarantinedMetainfoError)
        for `quarantine_hold` seconds. True if removed. Check and removal are one atomic step."""

    @abc.abstractmethod
    async def quarantined(self, blob_id: str) -> list[QuarantineRecord]:
        """The blob's quarantined info dicts, oldest first."""


class LeaseStore(abc.ABC):
    """Origin leases: which nodes may download a blob from the origin now."""

    @abc.abstractmethod
    async def acquire_lease(
        self, blob_id: str, node_id: str, ttl: float, max_holders: int, stale_after: float | None = None
    ) -> LeaseState:
        """Grant (or renew, if already held by node_id) a lease unless max_holders others hold it.

        stale_after: also take over the lease of a holder whose reported progress has not changed
        for that many seconds (counted from its grant when it never reported any). A new holder
        starts at progress 0, its idle clock at the grant."""

    @abc.abstractmethod
    async def renew_lease(
        self, blob_id: str, node_id: str, ttl: float, progress: int | None = None, reclaim: int = 0
    ) -> LeaseState:
        """Extend node_id's lease; granted=False if it no longer holds one. `progress`: the bytes it
        has now; a change (or None: a holder that does not report bytes) restarts its idle clock.
        `reclaim` > 0: a node that holds none gets one while fewer than that many nodes hold the blob's
        (its lease lapsed while the tracker was unreachable, or was lost with the store's state)."""

    @abc.abstractmethod
    async def release_lease(self, blob_id: str, node_id: str) -> bool:
        """Drop node_id's lease; True if it held one."""

    @abc.abstractmethod
    async def lease_holders(self, blob_id: str) -> list[LeaseHolder]:
        """Current (unexpired) holders."""


class ManifestStore(abc.ABC):
    """Manifests (repo@commit -> files), the publisher's refs, and the list of models."""

    @abc.abstractmethod
    async def put_manifest(
        self,
        repo_id: str,
        commit: str,
        manifest: dict[str, Any],
        revision: str | None,
        *,
        publisher: bool = False,
    ) -> bool:
        """Store repo_id@commit once: True if it is new, False if the same files (path, size, blob id;
        `manifest.same_files`) were there already; ManifestConflictError, nothing changed, if other
        files were (a commit's manifest never changes).

        publisher=True (the publisher role): the manifest (and its `signature`) is recorded as
        published, the repo is marked published, and a given revision points at commit (the latest
        publisher write wins; also when the files were there already, and then the stored manifest
        takes the new signature). publisher=False (the agent role): never a ref, `revision` is
        ignored; on a published repo PublishedRepoError, nothing stored.
        The checks and the write are one atomic step (replicas share the store)."""

    @abc.abstractmethod
    async def get_manifest(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        """The stored manifest (`files`; `published`: whether the publisher role wrote it; `signature`:
        the publisher's, None for an agent-role manifest)."""

    @abc.abstractmethod
    async def resolve(self, repo_id: str, revision: str) -> str | None:
        """The commit the publisher pointed repo_id@revision at; None for any other repo."""

    @abc.abstractmethod
    async def list_models(self) -> list[ModelEntry]:
        """Every registered repo with its manifests, and its refs if the publisher wrote it."""


class StoreLifecycle(abc.ABC):
    """The store as a whole: whether it serves, which swarm state it holds, totals, closing it."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StoreUnavailableError if the store cannot serve."""

    @abc.abstractmethod
    async def epoch(self) -> str:
        """An id of the swarm state this store holds, new whenever that state was lost (a tracker
        process whose peers lived in its memory; a Redis restarted without its data). Agents that see
        it change register again what they hold (`/readyz` reports it)."""

    @abc.abstractmethod
    async def stats(self) -> StoreStats:
        """Totals for the metrics."""

    @abc.abstractmethod
    async def sweep_expired(self) -> None:
        """Drop expired peers for as long as the tracker runs (never returns), a bounded step at a time
        with awaits between: no step may hold the event loop (or Redis) for long, whatever the swarms."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connection (SQLite file, Redis pool); the store is unusable after."""


class Store(PeerStore, MetainfoStore, LeaseStore, ManifestStore, StoreLifecycle):
    """Everything the tracker keeps: what an implementation provides and `open_store` returns.

    The implementations are one class each because the concerns share one connection (the SQLite
    file, the Redis pool) and one lifecycle."""
