"""What the swarm reports about a blob torrent, and how the origin joins one as a web seed."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WebSeed:
    """The origin as a BEP 19 web seed.

    `headers` are sent with every request, and libtorrent re-sends them after a redirect to
    another host: never put a Hub token here for a URL that redirects to a CDN. Pass the
    resolved (signed) CDN URL instead. Headers are kept out of repr (they may hold secrets).
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class WebSeedRefusal:
    """The last HTTP error status a web seed answered a torrent with (agent.swarm.webseed)."""

    url: str = field(repr=False)
    """The URL refused, whole: compared, never logged (a signed URL's query is a credential)."""
    status: int
    reason: str
    """What libtorrent said: "403 Forbidden"."""
    count: int
    """The torrent's `web_seed_errors` when it came: a new refusal has a new count."""


@dataclass(frozen=True)
class BlobStatus:
    """One blob torrent, as the daemon sees it. Byte counters are for this process's session."""

    infohash: str
    state: str
    """checking | downloading | stalled | finishing (verified, being renamed) | seeding | error | paused."""
    path: Path
    """Where the complete blob is (or will be): save_path / final name."""
    total: int
    done: int
    num_peers: int
    num_seeds: int
    bytes_from_peers: int
    bytes_from_web_seeds: int
    bytes_uploaded: int
    hash_failures: int
    banned_peers: int
    error: str | None
    last_progress_monotonic: float
    swarm_seeders: int = -1
    """Seeders the tracker counted in its last announce reply to this torrent; -1 = no reply yet."""
    web_seed_errors: int = 0
    """Times a web seed (the origin) failed for this torrent: refused, HTTP error, unreachable."""
    web_seed_error: str | None = None
    """The last of those failures, one line, its URL without the query (which may be a signature)."""
    web_seed_refusal: WebSeedRefusal | None = None
    """The last of those failures that was an HTTP error status."""
    pieces: int = 0
    """Pieces verified against the metainfo so far."""
    seed_sources: frozenset[str] = frozenset()
    """Addresses of seeds that sent this torrent payload (sampled while it downloads): if the finished
    blob fails its own hash, these served bytes that match a wrong metainfo."""
    rechecks: int = 0
    """Times its file was re-checked because libtorrent held a written piece without a verdict."""

    @property
    def complete(self) -> bool:
        return self.state == "seeding"


@dataclass
class TorrentRecord:
    """The session's record of one blob torrent (guarded by the session's lock)."""

    handle: Any
    infohash: str
    save_path: Path
    final_name: str
    current_name: str
    total: int
    complete: bool = False
    piece_length: int = 0
    error: str | None = None
    hash_failures: int = 0
    banned_peers: int = 0
    web_seeded: bool = False
    open_to_all: bool = False
    """Exempt from the peer gate's IP filter (a public model's blob, with --interop-public)."""
    finishing: bool = False
    """Its rename to the final name is requested (once)."""
    web_seed_errors: int = 0
    web_seed_error: str | None = None
    web_seed_refusal: WebSeedRefusal | None = None
    peer_bytes: int = 0
    peer_seen: dict[tuple[str, int], int] = field(default_factory=dict)
    last_done: int = -1
    last_progress: float = field(default_factory=time.monotonic)
    last_resume_save: float = field(default_factory=time.monotonic)
    seed_sources: set[str] = field(default_factory=set)
    last_seed_sample: float = 0.0
    rechecks: int = 0
    """Times its file was re-checked because libtorrent held a written piece without a verdict."""
    last_held_look: float = 0.0
    """When `Swarm._recheck_held` last read the download queue (at most once per `held_piece_recheck`)."""
    pieces_on_disk: int = 0
    """Leading pieces read back from the file and found to match their hashes (`Swarm.verified_prefix`)."""


class Records:
    """The torrents of one session by infohash, under one lock; waiters sleep on `changed`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.by_infohash: dict[str, TorrentRecord] = {}

    def get(self, infohash: str) -> TorrentRecord | None:
        with self.lock:
            return self.by_infohash.get(infohash)

    def values(self) -> list[TorrentRecord]:
        with self.lock:
            return list(self.by_infohash.values())
