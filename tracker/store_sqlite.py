"""The embedded default store: SQLite (WAL) for what must survive a restart, memory for peers.

Leases expire and go stale by the monotonic clock, which a wall-clock step (NTP, a VM resumed, an
operator's `date -s`) does not move: on wall time, a 10-minute step forward would expire every lease at
once and hand each blob to a second origin download. Monotonic time is since boot, so the file records
the boot it was written in (`/proc/sys/kernel/random/boot_id`) and its leases are dropped when the
tracker opens it in another boot or on another host (holders ask again; a lease lives 30 s anyway).

One process owns the file, so live peers can stay in a dict (see `tracker.peers`) and
several uvicorn workers are deliberately not supported with this store: each would see
only its own peers. Scale out with --redis instead. SQLite calls are short, indexed
single-row statements; running them on the event loop costs less than a thread hop.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import time
from typing import Any

from tracker.errors import (
    ConflictError,
    ManifestConflictError,
    PublishedRepoError,
    QuarantinedMetainfoError,
    StoreUnavailableError,
)
from tracker.manifest import same_files
from tracker.peers import SWEEP_PAUSE, SWEEP_SLICE, PeerTable
from tracker.settings import TrackerSettings
from tracker.store import (
    AnnounceResult,
    LeaseHolder,
    LeaseState,
    ModelEntry,
    PeerAddr,
    QuarantineRecord,
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
CREATE TABLE IF NOT EXISTS metainfo_quarantine (
    blob_id TEXT NOT NULL, infohash TEXT NOT NULL, info BLOB NOT NULL, reason TEXT NOT NULL,
    reporter TEXT, address TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS metainfo_quarantine_blob ON metainfo_quarantine(blob_id, infohash);
CREATE TABLE IF NOT EXISTS lease_clock (boot_id TEXT NOT NULL);
"""
_LEASE_PROGRESS = (("progress", "INTEGER"), ("progressed", "REAL"))
"""Columns added to `leases` after its first release (ALTER TABLE for older files): the holder's
reported bytes and when they last changed (NULL in rows granted before: never taken over)."""


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
            columns = {str(row[1]) for row in self._db.execute("PRAGMA table_info(leases)")}
            for name, kind in _LEASE_PROGRESS:
                if name not in columns:
                    self._db.execute(f"ALTER TABLE leases ADD COLUMN {name} {kind}")
            self._same_clock()
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailableError(f"cannot open SQLite store {path}: {exc}") from None
        self._peers = self.local_peers = PeerTable(settings.peer_ttl, settings.swarm_limits, self._registered)
        self._epoch = secrets.token_hex(8)
        """Peers live in this process's memory: each process is a new epoch."""
        self._quarantine_hold = settings.quarantine_hold

    def _same_clock(self) -> None:
        """Drop leases timed by another boot's monotonic clock (or, in files from before, by wall time)."""
        boot = _boot_id()
        row = self._db.execute("SELECT boot_id FROM lease_clock").fetchone()
        if row is not None and boot and row[0] == boot:
            return
        with self._db:
            self._db.execute("DELETE FROM leases")
            self._db.execute("DELETE FROM lease_clock")
            self._db.execute("INSERT INTO lease_clock (boot_id) VALUES (?)", (boot,))

    # -- swarm ---------------------------------------------------------------------------
    def _registered(self, infohash: bytes) -> bool:
        """Whether a blob's metainfo has this infohash: one lookup in the metainfo's infohash index, made
        for interop-passkey announces only (the agents' skip it)."""
        row = self._db.execute("SELECT 1 FROM metainfo WHERE infohash = ?", (infohash.hex(),)).fetchone()
        return row is not None

    async def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int, agent: bool = True
    ) -> AnnounceResult:
        return self._peers.announce(infohash, peer, seeder, event, numwant, agent)

    async def scrape(self, infohashes: list[bytes]) -> dict[bytes, SwarmCounts]:
        return {ih: self._peers.counts(ih) for ih in infohashes}

    async def seeder_addresses(self, infohashes: list[bytes]) -> dict[bytes, list[tuple[bytes, int]]]:
        return {ih: self._peers.seeders(ih) for ih in infohashes}

    async def stats(self) -> StoreStats:
        return self._peers.stats()

    async def peer_addresses(self) -> list[bytes]:
        return self._peers.addresses()

    async def sweep_expired(self) -> None:
        while True:
            self._peers.sweep_step(time.monotonic(), SWEEP_SLICE)
            await asyncio.sleep(SWEEP_PAUSE)

    # -- metainfo ------------------------------------------------------------------------
    async def put_metainfo(self, blob_id: str, infohash: str, info: bytes) -> bool:
        with self._db:
            row = self._db.execute("SELECT info FROM metainfo WHERE blob_id = ?", (blob_id,)).fetchone()
            if row is not None:
                if bytes(row[0]) == info:
                    return False
                raise ConflictError(f"blob {blob_id} already has a different info dict")
            held = self._db.execute(
                "SELECT 1 FROM metainfo_quarantine WHERE blob_id = ? AND infohash = ? AND created > ?",
                (blob_id, infohash, time.time() - self._quarantine_hold),
            ).fetchone()
            if held:
                raise QuarantinedMetainfoError(blob_id, infohash)
            self._db.execute(
                "INSERT INTO metainfo (blob_id, infohash, info, created) VALUES (?, ?, ?, ?)",
                (blob_id, infohash, info, time.time()),
            )
        return True

    async def get_metainfo(self, blob_id: str) -> tuple[str, bytes] | None:
        row = self._db.execute("SELECT infohash, info FROM metainfo WHERE blob_id = ?", (blob_id,)).fetchone()
        return (str(row[0]), bytes(row[1])) if row else None

    async def quarantine_metainfo(
        self, blob_id: str, infohash: str, reason: str, reporter: str | None, address: str | None
    ) -> bool:
        with self._db:
            row = self._db.execute(
                "SELECT info FROM metainfo WHERE blob_id = ? AND infohash = ?", (blob_id, infohash)
            ).fetchone()
            if row is None:
                return False
            self._db.execute(
                "INSERT INTO metainfo_quarantine"
                " (blob_id, infohash, info, reason, reporter, address, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (blob_id, infohash, row[0], reason, reporter, address, time.time()),
            )
            self._db.execute("DELETE FROM metainfo WHERE blob_id = ?", (blob_id,))
        return True

    async def quarantined(self, blob_id: str) -> list[QuarantineRecord]:
        rows = self._db.execute(
            "SELECT infohash, info, reason, reporter, address, created FROM metainfo_quarantine"
            " WHERE blob_id = ? ORDER BY created",
            (blob_id,),
        ).fetchall()
        return [
            QuarantineRecord(str(ih), bytes(info), str(why), who, addr, at)
            for ih, info, why, who, addr, at in rows
        ]

    # -- leases --------------------------------------------------------------------------
    def _expire(self, blob_id: str, now: float) -> int:
        return self._db.execute(
            "DELETE FROM leases WHERE blob_id = ? AND expires <= ?", (blob_id, now)
        ).rowcount

    def _holders(self, blob_id: str, now: float) -> list[LeaseHolder]:
        rows = self._db.execute(
            "SELECT node_id, expires, progress, progressed FROM leases WHERE blob_id = ? AND expires > ?"
            " ORDER BY expires",
            (blob_id, now),
        ).fetchall()
        return [
            LeaseHolder(
                str(node),
                round(exp - now, 3),
                None if done is None else int(done),
                None if at is None else round(max(now - at, 0.0), 3),
            )
            for node, exp, done, at in rows
        ]

    async def acquire_lease(
        self, blob_id: str, node_id: str, ttl: float, max_holders: int, stale_after: float | None = None
    ) -> LeaseState:
        now = time.monotonic()
        taken = 0
        with self._db:
            expired = self._expire(blob_id, now)
            holders = self._holders(blob_id, now)
            mine = any(h.node_id == node_id for h in holders)
            if not mine and len(holders) >= max_holders and stale_after is not None:
                taken = self._db.execute(
                    "DELETE FROM leases WHERE blob_id = ? AND progressed IS NOT NULL AND progressed <= ?",
                    (blob_id, now - stale_after),
                ).rowcount
                holders = self._holders(blob_id, now)
            granted = mine or len(holders) < max_holders
            if mine:
                # The holder asking again has started over (its agent restarted, or its job is retried):
                # its stall clock restarts with it, else a waiter could take over a restarted holder
                # at once for the idle time of the process that died.
                self._db.execute(
                    "UPDATE leases SET expires = ?, progress = 0, progressed = ?"
                    " WHERE blob_id = ? AND node_id = ?",
                    (now + ttl, now, blob_id, node_id),
                )
            elif granted:
                self._db.execute(
                    "INSERT OR REPLACE INTO leases (blob_id, node_id, expires, progress, progressed)"
                    " VALUES (?, ?, ?, 0, ?)",
                    (blob_id, node_id, now + ttl, now),
                )
            if granted:
                holders = self._holders(blob_id, now)
        return LeaseState(granted, holders, expired, taken)

    async def renew_lease(
        self, blob_id: str, node_id: str, ttl: float, progress: int | None = None, reclaim: int = 0
    ) -> LeaseState:
        now = time.monotonic()
        with self._db:
            expired = self._expire(blob_id, now)
            renewed = self._db.execute(
                "UPDATE leases SET expires = ?1,"
                " progressed = CASE WHEN ?2 IS NULL OR progress IS NULL OR progress != ?2 THEN ?3"
                " ELSE progressed END,"
                " progress = COALESCE(?2, progress) WHERE blob_id = ?4 AND node_id = ?5",
                (now + ttl, progress, now, blob_id, node_id),
            ).rowcount
            if not renewed and len(self._holders(blob_id, now)) < reclaim:
                renewed = self._db.execute(
                    "INSERT INTO leases (blob_id, node_id, expires, progress, progressed)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (blob_id, node_id, now + ttl, progress or 0, now),
                ).rowcount
            holders = self._holders(blob_id, now)
        return LeaseState(renewed > 0, holders, expired)

    async def release_lease(self, blob_id: str, node_id: str) -> bool:
        with self._db:
            return bool(
                self._db.execute(
                    "DELETE FROM leases WHERE blob_id = ? AND node_id = ? AND expires > ?",
                    (blob_id, node_id, time.monotonic()),
                ).rowcount
            )

    async def lease_holders(self, blob_id: str) -> list[LeaseHolder]:
        return self._holders(blob_id, time.monotonic())

    # -- manifests -----------------------------------------------------------------------
    async def put_manifest(
        self,
        repo_id: str,
        commit: str,
        manifest: dict[str, Any],
        revision: str | None,
        *,
        publisher: bool = False,
    ) -> bool:
        now = time.time()
        body = json.dumps({**manifest, "published": publisher}, sort_keys=True)
        # No await inside: the published check, the comparison with what is stored and the write
        # cannot interleave. Every check comes before the first write (the connection autocommits).
        with self._db:
            if (
                not publisher
                and self._db.execute("SELECT 1 FROM published WHERE repo_id = ?", (repo_id,)).fetchone()
            ):
                raise PublishedRepoError(repo_id)
            row = self._db.execute(
                "SELECT body FROM manifests WHERE repo_id = ? AND commit_id = ?", (repo_id, commit)
            ).fetchone()
            if row is not None and not same_files(_manifest(row[0])["files"], manifest["files"]):
                raise ManifestConflictError(repo_id, commit)
            if publisher:
                self._db.execute(
                    "INSERT OR IGNORE INTO published (repo_id, since) VALUES (?, ?)", (repo_id, now)
                )
            if row is None:
                self._db.execute(
                    "INSERT INTO manifests (repo_id, commit_id, body, created) VALUES (?, ?, ?, ?)",
                    (repo_id, commit, body, now),
                )
            elif publisher:  # the same files, (re)signed by the publisher
                self._db.execute(
                    "UPDATE manifests SET body = ? WHERE repo_id = ? AND commit_id = ?",
                    (body, repo_id, commit),
                )
            if publisher and revision is not None:
                self._db.execute(
                    "INSERT OR REPLACE INTO refs (repo_id, revision, commit_id, updated) VALUES (?, ?, ?, ?)",
                    (repo_id, revision, commit, now),
                )
        return row is None

    async def get_manifest(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT body FROM manifests WHERE repo_id = ? AND commit_id = ?", (repo_id, commit)
        ).fetchone()
        return _manifest(row[0]) if row else None

    async def resolve(self, repo_id: str, revision: str) -> str | None:
        # Only the publisher moves refs; the join also hides refs agents wrote before that rule.
        row = self._db.execute(
            "SELECT r.commit_id FROM refs r JOIN published p ON p.repo_id = r.repo_id"
            " WHERE r.repo_id = ? AND r.revision = ?",
            (repo_id, revision),
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
            if repo_id in models and repo_id in published:
                models[repo_id].revisions[revision] = commit
        return list(models.values())

    # -- lifecycle -----------------------------------------------------------------------
    async def ping(self) -> None:
        try:
            self._db.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"SQLite store unusable: {exc}") from None

    async def epoch(self) -> str:
        return self._epoch

    async def close(self) -> None:
        self._db.close()


def _manifest(body: str) -> dict[str, Any]:
    """A stored manifest; rows written before roles (or signatures) existed lack `published` (they
    were not) and `signature`."""
    manifest = dict(json.loads(body))
    manifest.setdefault("published", False)
    manifest.setdefault("signature", None)
    return manifest


def _boot_id() -> str:
    """This boot's id ("" where the kernel does not say: then leases never outlive the process)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""
