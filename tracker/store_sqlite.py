"""The embedded default store: SQLite (WAL) for what must survive a restart, memory for peers.

One process owns the file, so live peers can stay in a dict (see `tracker.peers`) and
several uvicorn workers are deliberately not supported with this store: each would see
only its own peers. Scale out with --redis instead. SQLite calls are short, indexed
single-row statements; running them on the event loop costs less than a thread hop.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from tracker.errors import ConflictError, PublishedRepoError, StoreUnavailableError
from tracker.peers import PeerTable
from tracker.settings import TrackerSettings
from tracker.store import (
    AnnounceResult,
    LeaseHolder,
    LeaseState,
    ModelEntry,
    PeerAddr,
    Store,
    StoreStats,
    SwarmCounts,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS metainfo (
    blob_id TEXT PRIMARY KEY, infohash TEXT NOT NULL, info BLOB NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS metainfo_infohash ON metainfo(infohash);
CREATE TABLE IF NOT EXISTS leases (
    blob_id TEXT NOT NULL, node_id TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY (blob_id, node_id));
CREATE TABLE IF NOT EXISTS manifests (
    repo_id TEXT NOT NULL, commit_id TEXT NOT NULL, body TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (repo_id, commit_id));
CREATE TABLE IF NOT EXISTS refs (
    repo_id TEXT NOT NULL, revision TEXT NOT NULL, commit_id TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (repo_id, revision));
CREATE TABLE IF NOT EXISTS published (repo_id TEXT PRIMARY KEY, since REAL NOT NULL);
"""


class SqliteStore(Store):
    def __init__(self, settings: TrackerSettings) -> None:
        path = str(settings.db_path) if settings.db_path is not None else ":memory:"
        try:
            if settings.db_path is not None:
                settings.db_path.parent.mkdir(parents=True, exist_ok=True)
            # The app is built in one thread and served from the event-loop thread; only
            # the loop thread touches the connection after startup.
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailableError(f"cannot open SQLite store {path}: {exc}") from None
        self._peers = PeerTable(settings.peer_ttl)

    # -- swarm ---------------------------------------------------------------------------
    async def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int
    ) -> AnnounceResult:
        return self._peers.announce(infohash, peer, seeder, event, numwant)

    async def scrape(self, infohashes: list[bytes]) -> dict[bytes, SwarmCounts]:
        return {ih: self._peers.counts(ih) for ih in infohashes}

    async def stats(self) -> StoreStats:
        return self._peers.stats()

    # -- metainfo ------------------------------------------------------------------------
    async def put_metainfo(self, blob_id: str, infohash: str, info: bytes) -> bool:
        with self._db:
            row = self._db.execute("SELECT info FROM metainfo WHERE blob_id = ?", (blob_id,)).fetchone()
            if row is not None:
                if bytes(row[0]) == info:
                    return False
                raise ConflictError(f"blob {blob_id} already has a different info dict")
            self._db.execute(
                "INSERT INTO metainfo (blob_id, infohash, info, created) VALUES (?, ?, ?, ?)",
                (blob_id, infohash, info, time.time()),
            )
        return True

    async def get_metainfo(self, blob_id: str) -> tuple[str, bytes] | None:
        row = self._db.execute("SELECT infohash, info FROM metainfo WHERE blob_id = ?", (blob_id,)).fetchone()
        return (str(row[0]), bytes(row[1])) if row else None

    # -- leases --------------------------------------------------------------------------
    def _expire(self, blob_id: str, now: float) -> int:
        return self._db.execute(
            "DELETE FROM leases WHERE blob_id = ? AND expires <= ?", (blob_id, now)
        ).rowcount

    def _holders(self, blob_id: str, now: float) -> list[LeaseHolder]:
        rows = self._db.execute(
            "SELECT node_id, expires FROM leases WHERE blob_id = ? AND expires > ? ORDER BY expires",
            (blob_id, now),
        ).fetchall()
        return [LeaseHolder(str(node), round(exp - now, 3)) for node, exp in rows]

    async def acquire_lease(self, blob_id: str, node_id: str, ttl: float, max_holders: int) -> LeaseState:
        now = time.time()
        with self._db:
            expired = self._expire(blob_id, now)
            holders = self._holders(blob_id, now)
            granted = any(h.node_id == node_id for h in holders) or len(holders) < max_holders
            if granted:
                self._db.execute(
                    "INSERT OR REPLACE INTO leases (blob_id, node_id, expires) VALUES (?, ?, ?)",
                    (blob_id, node_id, now + ttl),
                )
                holders = self._holders(blob_id, now)
        return LeaseState(granted, holders, expired)

    async def renew_lease(self, blob_id: str, node_id: str, ttl: float) -> LeaseState:
        now = time.time()
        with self._db:
            expired = self._expire(blob_id, now)
            renewed = self._db.execute(
                "UPDATE leases SET expires = ? WHERE blob_id = ? AND node_id = ?",
                (now + ttl, blob_id, node_id),
            ).rowcount
            holders = self._holders(blob_id, now)
        return LeaseState(renewed > 0, holders, expired)

    async def release_lease(self, blob_id: str, node_id: str) -> bool:
        with self._db:
            return bool(
                self._db.execute(
                    "DELETE FROM leases WHERE blob_id = ? AND node_id = ? AND expires > ?",
                    (blob_id, node_id, time.time()),
                ).rowcount
            )

    async def lease_holders(self, blob_id: str) -> list[LeaseHolder]:
        return self._holders(blob_id, time.time())

    # -- manifests -----------------------------------------------------------------------
    async def put_manifest(
        self,
        repo_id: str,
        commit: str,
        manifest: dict[str, Any],
        revision: str | None,
        *,
        publisher: bool = False,
    ) -> None:
        now = time.time()
        body = json.dumps({**manifest, "published": publisher}, sort_keys=True)
        # One transaction, no await inside: the published check and the write cannot interleave.
        with self._db:
            if publisher:
                self._db.execute(
                    "INSERT OR IGNORE INTO published (repo_id, since) VALUES (?, ?)", (repo_id, now)
                )
            elif self._db.execute("SELECT 1 FROM published WHERE repo_id = ?", (repo_id,)).fetchone():
                raise PublishedRepoError(repo_id)
            self._db.execute(
                "INSERT OR REPLACE INTO manifests (repo_id, commit_id, body, created) VALUES (?, ?, ?, ?)",
                (repo_id, commit, body, now),
            )
            if revision is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO refs (repo_id, revision, commit_id, updated) VALUES (?, ?, ?, ?)",
                    (repo_id, revision, commit, now),
                )

    async def get_manifest(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT body FROM manifests WHERE repo_id = ? AND commit_id = ?", (repo_id, commit)
        ).fetchone()
        return _manifest(row[0]) if row else None

    async def resolve(self, repo_id: str, revision: str) -> str | None:
        row = self._db.execute(
            "SELECT commit_id FROM refs WHERE repo_id = ? AND revision = ?", (repo_id, revision)
        ).fetchone()
        return str(row[0]) if row else None

    async def list_models(self) -> list[ModelEntry]:
        models: dict[str, ModelEntry] = {}
        published = {str(r[0]) for r in self._db.execute("SELECT repo_id FROM published")}
        for repo_id, commit, body in self._db.execute(
            "SELECT repo_id, commit_id, body FROM manifests ORDER BY repo_id, created"
        ):
            entry = models.setdefault(repo_id, ModelEntry(repo_id, {}, published=repo_id in published))
            entry.manifests[commit] = _manifest(body)
        for repo_id, revision, commit in self._db.execute("SELECT repo_id, revision, commit_id FROM refs"):
            if repo_id in models:
                models[repo_id].revisions[revision] = commit
        return list(models.values())

    # -- lifecycle -----------------------------------------------------------------------
    async def ping(self) -> None:
        try:
            self._db.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"SQLite store unusable: {exc}") from None

    async def close(self) -> None:
        self._db.close()


def _manifest(body: str) -> dict[str, Any]:
    """A stored manifest; rows written before roles existed lack `published` (they were not)."""
    manifest = dict(json.loads(body))
    manifest.setdefault("published", False)
    return manifest
