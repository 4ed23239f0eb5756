"""The store interface and the small table that picks an implementation by URL.

Two implementations: `store_sqlite` (the embedded default: durable manifests, metainfo
and leases in one SQLite file, live peers in memory) and `store_redis` (everything in
Redis, so several tracker replicas share one view of the swarm). Both pass the same test
suite (tests/test_tracker_store.py).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

PeerAddr = tuple[bytes, bytes, int]
"""(peer_id, packed IP address (4 or 16 bytes), port)."""


@dataclass(frozen=True)
class SwarmCounts:
    """What scrape reports for one torrent."""

    complete: int = 0
    incomplete: int = 0
    downloaded: int = 0


@dataclass(frozen=True)
class AnnounceResult:
    """Counts after the announce, and the peers handed to the client (never itself)."""

    complete: int
    incomplete: int
    peers: list[PeerAddr]


@dataclass(frozen=True)
class LeaseHolder:
    node_id: str
    expires_in: float


@dataclass(frozen=True)
class LeaseState:
    """Outcome of a lease request: who holds the blob now, and whether the caller is one of them."""

    granted: bool
    holders: list[LeaseHolder]
    expired: int = 0
    """Leases found expired (and dropped) while handling this request, for the metrics."""

    def expires_in(self, node_id: str) -> float:
        return next((h.expires_in for h in self.holders if h.node_id == node_id), 0.0)


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


class Store(abc.ABC):
    """Everything the tracker keeps. Async so that the Redis store never blocks the loop."""

    # -- swarm (live peers) --------------------------------------------------------------
    @abc.abstractmethod
    async def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int
    ) -> AnnounceResult:
        """Record (or, for event=stopped, remove) the peer; return counts and up to numwant peers."""

    @abc.abstractmethod
    async def scrape(self, infohashes: list[bytes]) -> dict[bytes, SwarmCounts]:
        """Counts per infohash; unknown ones are all zeros."""

    @abc.abstractmethod
    async def stats(self) -> StoreStats:
        """Totals for the metrics."""

    # -- metainfo ------------------------------------------------------------------------
    @abc.abstractmethod
    async def put_metainfo(self, blob_id: str, infohash: str, info: bytes) -> bool:
        """Store the info dict; True if new, False if the same bytes were there; ConflictError if other."""

    @abc.abstractmethod
    async def get_metainfo(self, blob_id: str) -> tuple[str, bytes] | None:
        """(infohash hex, bencoded info dict) or None."""

    # -- leases --------------------------------------------------------------------------
    @abc.abstractmethod
    async def acquire_lease(self, blob_id: str, node_id: str, ttl: float, max_holders: int) -> LeaseState:
        """Grant (or renew, if already held by node_id) a lease unless max_holders others hold it."""

    @abc.abstractmethod
    async def renew_lease(self, blob_id: str, node_id: str, ttl: float) -> LeaseState:
        """Extend node_id's lease; granted=False if it no longer holds one."""

    @abc.abstractmethod
    async def release_lease(self, blob_id: str, node_id: str) -> bool:
        """Drop node_id's lease; True if it held one."""

    @abc.abstractmethod
    async def lease_holders(self, blob_id: str) -> list[LeaseHolder]:
        """Current (unexpired) holders."""

    # -- manifests -----------------------------------------------------------------------
    @abc.abstractmethod
    async def put_manifest(
        self,
        repo_id: str,
        commit: str,
        manifest: dict[str, Any],
        revision: str | None,
        *,
        publisher: bool = False,
    ) -> None:
        """Store repo_id@commit; if revision is given, point repo_id@revision at commit (latest wins).

        publisher=True (the publisher role): the manifest is recorded as published and the repo is
        marked published. publisher=False on a published repo: PublishedRepoError, nothing stored.
        The check and the write are one atomic step (replicas share the store)."""

    @abc.abstractmethod
    async def get_manifest(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        """The stored manifest (`files`, and `published`: whether the publisher role wrote it)."""

    @abc.abstractmethod
    async def resolve(self, repo_id: str, revision: str) -> str | None: ...

    @abc.abstractmethod
    async def list_models(self) -> list[ModelEntry]: ...

    # -- lifecycle -----------------------------------------------------------------------
    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StoreUnavailableError if the store cannot serve."""

    @abc.abstractmethod
    async def close(self) -> None: ...
