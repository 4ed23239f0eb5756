"""The test hub's shared state: settings, repos, access, signed URLs, rate limits, counters and the
request log; what the handler of either listener reads and updates (`agent.hub.server.HubServer` adds
the listeners and their threads)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Literal, NamedTuple

from agent.hub.access import HubAccess
from agent.hub.cdn import SignedUrls
from agent.hub.faults import Faults, TokenBucket
from agent.hub.guard import HUB_LIMITS
from agent.hub.ratelimit import RateLimiter, RateLimits
from agent.hub.records import BUCKETS, RequestRecord
from agent.hub.repos import RepoStore, valid_repo_id
from servekit.limits import ConnectionLimits

DEFAULT_TREE_PAGE_SIZE = 1000
"""Entries per tree page, as the Hub; tests pass a small one to exercise pagination."""

ANSWERS = ("2026", "2024")
"""How the hub may answer: as huggingface.co does now, or as it did in 2024."""

CDN_URL_TTL = 3600.0
"""Seconds a signed CDN URL stays valid in 2026, as the Hub's X-Amz-Expires=3600."""

LEGACY_CDN_URL_TTL = 24 * 3600.0
"""Seconds a 2024 `/_cdn/` URL stays valid: long enough for a slow multi-range download to reuse it."""

Answers = Literal["2026", "2024"]


class StreamRecord(NamedTuple):
    """One CDN GET of a file body (`HubState.cdn_streams`)."""

    at: float
    """time.monotonic() when it was asked."""
    client: str
    path: str
    streams: int
    """Bodies of `path` to `client` at once with it, itself included."""
    admitted: bool
    files: int
    """Files with a body going to `client` once it was admitted (itself included), or as it was refused."""


class OpenStreams:
    """Bodies of each path going to each client address at once, and a record of every one asked for: how a
    download host that allows a few streams of a file per address counts (the test hub's CDN, and the
    tests' store proxy). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[tuple[str, str]] = Counter()
        self._log: list[StreamRecord] = []

    @property
    def log(self) -> list[StreamRecord]:
        with self._lock:
            return list(self._log)

    def clear(self) -> None:
        with self._lock:
            self._log.clear()

    @contextlib.contextmanager
    def body(self, client: str, path: str, limit: int) -> Iterator[bool]:
        """One body of `path` to `client` while the block runs; yields False when it is one more than
        `limit` (0: any number)."""
        key = (client, path)
        with self._lock:
            admitted = not limit or self._open[key] < limit
            self._open[key] += admitted
            files = sum(1 for (c, _), n in self._open.items() if c == client and n)
            streams = self._open[key] + (not admitted)
            self._log.append(StreamRecord(time.monotonic(), client, path, streams, admitted, files))
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    self._open[key] -= 1


class HubState:
    """What both listeners of a hub share: its settings, repos, access rules, counters and records
    (`HubServer` adds the listeners).

    `answers`: "2026" (default) or "2024" (module docstring). `cdn_port`: the CDN listener's port in
    2026 (0: any free one; `cdn_url` once started); in 2024 the CDN is the hub's own port.
    `cdn_url_ttl`: seconds a signed CDN URL lives (default 3600 in 2026, a day in 2024; settable; 0 or
    less hands out URLs that are expired already).
    `rate_limits`: requests per client and window (`RateLimits`), None for none; "auto" means the Hub's
    numbers in 2026 and none in 2024 (settable)."""

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tokens: Iterable[str] = (),
        grants: Mapping[str, Iterable[str]] | None = None,
        gated: Iterable[str] | Mapping[str, str] = (),
        private: Iterable[str] = (),
        rate_total: float | None = None,
        rate_per_connection: float | None = None,
        rate_per_client: float | None = None,
        tree_page_size: int = DEFAULT_TREE_PAGE_SIZE,
        answers: Answers = "2026",
        cdn_port: int = 0,
        cdn_url_ttl: float | None = None,
        rate_limits: RateLimits | None | Literal["auto"] = "auto",
        limits: ConnectionLimits = HUB_LIMITS,
    ) -> None:
        if answers not in ANSWERS:
            raise ValueError(f"answers must be one of {ANSWERS}: {answers!r}")
        self.root = Path(root)
        self.limits = limits
        """What each listener holds (agent.hub.guard): connections, a request's head."""
        self.host = host
        self.port = port
        self.answers: Answers = answers
        self._cdn_port = cdn_port
        ttl = (
            cdn_url_ttl
            if cdn_url_ttl is not None
            else CDN_URL_TTL
            if answers == "2026"
            else LEGACY_CDN_URL_TTL
        )
        self.cdn_url_ttl = ttl
        """Seconds a signed CDN URL handed out from now on stays valid (0 or less: born expired)."""
        self.store = RepoStore(self.root)
        self.access = HubAccess(tokens, grants, gated, private)
        for repo_id in self.access.repo_ids():
            if not valid_repo_id(repo_id):
                raise ValueError(f"not a repo id (org/name): {repo_id!r}")
        self.total_bucket: TokenBucket | None = None
        self.rate_total = rate_total
        self.rate_per_connection = rate_per_connection
        if rate_per_connection is not None and rate_per_connection <= 0:
            raise ValueError(f"rate_per_connection must be positive: {rate_per_connection}")
        if rate_per_client is not None and rate_per_client <= 0:
            raise ValueError(f"rate_per_client must be positive: {rate_per_client}")
        self.rate_per_client = rate_per_client
        self._client_buckets: dict[str, TokenBucket] = {}
        self.rate_limiter: RateLimiter | None = None
        self.rate_limits = (
            (RateLimits() if answers == "2026" else None) if rate_limits == "auto" else rate_limits
        )
        self.tree_page_size = max(1, tree_page_size)
        self.faults = Faults()
        self.signer = SignedUrls(secrets.token_bytes(32))
        self._lock = threading.Lock()
        self._egress = 0
        self._requests: list[RequestRecord] = []
        self._cdn_blobs: dict[str, str] = {}
        self._streams = OpenStreams()
        self._connections: set[socket.socket] = set()
        self._accepted = 0
        self._listeners: list[ThreadingHTTPServer] = []
        """The hub's own listener, then its CDN's, while started (`HubServer`)."""
        self._threads: list[threading.Thread] = []

    # -- settings --------------------------------------------------------------------------------------

    @property
    def rate_total(self) -> float | None:
        """The cap on all bodies of both listeners together, bytes/s (None: uncapped); settable."""
        return self.total_bucket.rate if self.total_bucket is not None else None

    @rate_total.setter
    def rate_total(self, rate: float | None) -> None:
        self.total_bucket = TokenBucket(rate) if rate else None

    @property
    def rate_limits(self) -> RateLimits | None:
        """Requests per client and window (None: unlimited); setting it starts every window afresh."""
        return self.rate_limiter.limits if self.rate_limiter is not None else None

    @rate_limits.setter
    def rate_limits(self, limits: RateLimits | None) -> None:
        self.rate_limiter = RateLimiter(limits) if limits is not None else None

    def client_bucket(self, address: str) -> TokenBucket | None:
        """The cap shared by every connection from one client address (as a CDN's per-IP limit)."""
        if self.rate_per_client is None:
            return None
        with self._lock:
            return self._client_buckets.setdefault(address, TokenBucket(self.rate_per_client))

    @property
    def url(self) -> str:
        return self._url(self.port)

    @property
    def cdn_port(self) -> int:
        """The port signed LFS URLs point to: the CDN listener's in 2026, the hub's own in 2024."""
        return self._cdn_port if self.answers == "2026" else self.port

    @property
    def cdn_url(self) -> str:
        """Where signed LFS URLs point (another origin in 2026; the hub itself in 2024)."""
        return self._url(self.cdn_port)

    def _url(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    # -- observation -------------------------------------------------------------------------------

    @property
    def egress_bytes(self) -> int:
        """Body bytes sent so far by both listeners, all responses except the /_weightswarm/ ones."""
        with self._lock:
            return self._egress

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request both listeners answered (or saw go away), in order; not /_weightswarm/."""
        with self._lock:
            return list(self._requests)

    def counts(self) -> dict[str, int]:
        """Requests so far per bucket ("api", "resolvers", "cdn", and "pages" if any)."""
        with self._lock:
            counted = Counter(r.bucket for r in self._requests if r.bucket)
        return {**dict.fromkeys(BUCKETS, 0), **counted}

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far: with keep-alive clients, far fewer than `requests`."""
        with self._lock:
            return self._accepted

    @property
    def cdn_streams(self) -> list[StreamRecord]:
        """Every CDN GET of a file body: how many of that file's bodies went to that address at once with
        it (itself included), and whether it was refused (`Faults.streams_per_file`)."""
        return self._streams.log

    def reset_counters(self) -> None:
        """Zero egress, requests and connections (rate-limit windows run on: they are the Hub's state)."""
        with self._lock:
            self._egress = 0
            self._accepted = 0
            self._requests.clear()
        self._streams.clear()

    def commit_for(self, repo_id: str, revision: str = "main") -> str:
        snapshot = self.store.resolve(repo_id, revision)
        if snapshot is None:
            raise KeyError(f"no repo {repo_id!r} at {revision!r} under {self.root}")
        return snapshot.commit

    def warm(self) -> int:
        """Hash every repo now, so first requests need not wait; returns how many repos were scanned."""
        repo_ids = self.store.repo_ids()
        for repo_id in repo_ids:
            self.store.head(repo_id)
        return len(repo_ids)

    # -- used by the handler -----------------------------------------------------------------------

    def _add_egress(self, n: int) -> None:
        with self._lock:
            self._egress += n

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._requests.append(record)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)
            self._accepted += add

    def _serve_on_cdn(self, path: str, sha256: str) -> None:
        """The CDN will serve blob `sha256` at `path` (its URL is about to be handed out)."""
        with self._lock:
            self._cdn_blobs[path] = sha256

    def _cdn_stream(self, client: str, path: str) -> contextlib.AbstractContextManager[bool]:
        """One CDN body of `path` to `client` while the block runs; yields False when it is one too many."""
        return self._streams.body(client, path, self.faults.streams_per_file)

    def _served_on_cdn(self, path: str) -> str | None:
        with self._lock:
            return self._cdn_blobs.get(path)
