"""A Hugging Face-compatible hub that serves a directory: for tests, benchmarks and air-gapped clusters.

It answers as huggingface.co does in 2026 (`answers="2026"`, the default) or as it did in 2024
(`answers="2024"`). Routes (read-only, model repos):
- `GET /api/models/{org}/{name}[/revision/{rev}]` model info (`?blobs=true` adds sizes and oids;
  `?expand=a&expand=b` or `expand[]=` answers only `_id`, `id` and those properties, as the Hub);
- `GET /api/models/{org}/{name}/auth-check` 200 when the token may read the repo's files, else the
  refusal the files would get (what `huggingface_hub.auth_check` asks);
- `GET /api/models/{org}/{name}/tree/{rev}[/{path}]` listing, paginated by a `Link: rel="next"` header;
- `HEAD|GET /{org}/{name}/resolve/{rev}/{path}` a file, as below;
- `GET /_weightswarm/stats` egress, request and per-bucket counters, `POST /_weightswarm/reset` zeroes
  them (main port only, never counted or limited).

2026 (what the references below show):
- A small (non-LFS) file's resolve is a **307** to a relative `/api/resolve-cache/models/{org}/{name}/
  {commit}/{path}?{quoted /{org}/{name}/resolve/{rev}/{path}}=&etag={quoted "sha1"}`
  (the shape in huggingface/swift-transformers#209 and raullenchai/Rapid-MLX#1122), with
  `Content-Type: text/plain; charset=utf-8` and Express's body `Temporary Redirect. Redirecting to <Location>`
  whose length is its Content-Length (262 bytes for Rapid-MLX#1122's 227-character Location), not the
  file's. The 307 in Rapid-MLX#1122 carries Location, Content-Type, Content-Length, X-Powered-By,
  X-Request-Id, RateLimit, RateLimit-Policy and CORS headers; no ETag, no X-Linked-*; the list is cut
  before any X-Repo-Commit, and huggingface/huggingface_hub#4698 calls it "only Location and a small
  Content-Length", so none is sent here (the commit is in the Location). huggingface_hub#4698/#4699 and
  huggingface/hf-hub#191: a redirect's Content-Length is never the file size.
- `HEAD|GET /api/resolve-cache/models/{org}/{name}/{rev}/{path}` serves the file: 200/206 with ETag (the
  git blob sha1, quoted), X-Repo-Commit, Accept-Ranges, Content-Length, Range, the access checks of
  resolve. The Hub's rate-limit page links this endpoint as "Resolve a file", so it counts as a resolver
  (huggingface/hub-docs docs/hub/rate-limits.md). An LFS file asked here gets the resolve's 302.
- An LFS file's resolve is a **302** with X-Repo-Commit, ETag and X-Linked-Etag (the sha256, quoted),
  X-Linked-Size, `X-Xet-Hash: <64 hex>` and `Link: <{hub}/api/models/{repo}/xet-read-token/{commit}>;
  rel="xet-auth", <{cas}/v1/reconstructions/{xet hash}>; rel="xet-reconstruction-info"`. huggingface_hub's
  `utils/_xet.py` (`parse_xet_file_data_from_response`) reads X-Xet-Hash and the xet-auth link; the
  xet-core spec (`file_id.md`): X-Xet-Hash is the Xet file id and following the 302 is "the old LFS
  compatible route"; the reconstruction link names the CAS's `GET /v1/reconstructions/{hash}`
  (hyprstream/hyprstream#693 lists xet-core's routes), on another host (huggingface/huggingface_hub#4475:
  `cas-server.xethub.hf.co`, named by xet-read-token). Its body is `Found. Redirecting to <Location>`
  (ngxson/wllama#248 shows a 302 with `content-type: text/plain` and a 913-byte content-length). The
  xet-read-token route and the CAS are not served here: clients take the HTTP route.
  Here the Xet hash is `sha256(b"xet" + sha256 bytes)`, never the sha256 itself.
- The 302's Location is a signed URL on **another origin**, as the Hub's `cas-bridge.xethub.hf.co` /
  `*.cdn.hf.co` (wllama#248): a second listener of this HubServer on `cdn_port`, so huggingface_hub's
  metadata HEAD stops at the 302 (`_is_same_or_hub_host` follows only same scheme+host+port) and clients
  drop their Authorization header. `/xet-bridge-us/{repo key}/{xet hash}?X-Amz-Algorithm=...&X-Amz-Date=
  ...&X-Amz-Expires=...&X-Amz-Signature=...` (`agent.hub.cdn`), valid `cdn_url_ttl` seconds (the Hub's
  bridge URLs: X-Amz-Expires=3600). Its answer is the CDN's (huggingface/datasets#7931's HEAD of a
  cas-bridge URL): Content-Length, Accept-Ranges, Content-Range, a quoted 64-hex ETag (here the Xet hash:
  not the sha256), Cache-Control, Content-Disposition, X-Cache, Via, X-Request-Id; no X-Repo-Commit,
  X-Linked-*, X-Xet-*. A request that starts after the expiry, or with a bad signature, gets a 403 with
  an S3 XML body (`<Error><Code>AccessDenied</Code><Message>Request has expired</Message>...`) and no
  X-Error-Code; a body that started in time runs to its end. Authorization is ignored there (recorded in
  `RequestRecord.authorized`).
- Rate limits (`agent.hub.ratelimit`, on by default with the Hub's numbers): per 5-minute fixed window,
  500 api / 3,000 resolvers per anonymous IP address, 1,000 / 5,000 per token (hub-docs rate-limits.md,
  September '25 table). Every counted answer carries `RateLimit` / `RateLimit-Policy`
  (huggingface_hub#3553 shows them on a 200, Rapid-MLX#1122 on a 307); over the quota a 429 with r=0
  and t=<seconds to the reset>, which huggingface_hub's `parse_ratelimit_headers` and http_backoff read.
  No reference shows a Retry-After from the Hub: `RateLimits(retry_after=True)` adds one. CDN requests
  are not counted (another host).

2024: small files answered directly (ETag = git sha1); LFS files 302 (Content-Length 0) to a same-origin
`/_cdn/{sha256}?...` URL valid a day, which repeats X-Repo-Commit / X-Linked-Etag / X-Linked-Size
(huggingface_hub then followed same-origin redirects on its metadata HEAD and read them from the final
answer); no Xet headers, no RateLimit headers, no rate limits unless `rate_limits` is given.

Errors carry the Hub's `X-Error-Code` / `X-Error-Message` headers and a JSON `{"error": ...}` body,
so `huggingface_hub` raises its usual exception classes. Access rules (`agent.hub.access`): a token
in `tokens` reads every repo, one in `grants` the gated/private repos listed for it; an unknown token
is refused (401); a private repo is invisible without access (401 RepoNotFound anonymous, 404 with a
token, as a missing repo); a gated repo's model info is public (`gated: "auto"|"manual"`), its files
answer 401 GatedRepo anonymous, 403 GatedRepo to a token without access. With no tokens configured
every bearer token is accepted.
"""

from __future__ import annotations

import secrets
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from agent.hub import listing
from agent.hub.access import HubAccess
from agent.hub.cdn import SignedUrls
from agent.hub.faults import Faults, TokenBucket
from agent.hub.handler import IDLE_TIMEOUT, Handler, access_log, log
from agent.hub.ratelimit import RateLimiter, RateLimits
from agent.hub.records import BUCKETS, RequestRecord
from agent.hub.repos import RepoStore, valid_repo_id

__all__ = [
    "ANSWERS",
    "CDN_URL_TTL",
    "DEFAULT_TREE_PAGE_SIZE",
    "IDLE_TIMEOUT",
    "LEGACY_CDN_URL_TTL",
    "HubServer",
    "RateLimits",
    "RequestRecord",
    "access_log",
    "listing",
]

DEFAULT_TREE_PAGE_SIZE = 1000
"""Entries per tree page, as the Hub; tests pass a small one to exercise pagination."""

ANSWERS = ("2026", "2024")
"""How the hub may answer: as huggingface.co does now, or as it did in 2024."""

CDN_URL_TTL = 3600.0
"""Seconds a signed CDN URL stays valid in 2026, as the Hub's X-Amz-Expires=3600."""

LEGACY_CDN_URL_TTL = 24 * 3600.0
"""Seconds a 2024 `/_cdn/` URL stays valid: long enough for a slow multi-range download to reuse it."""

Answers = Literal["2026", "2024"]

# Tests subclass the handler (e.g. a listing that smuggles bad paths) and swap it on `_server`.
_Handler = Handler


class Listener(ThreadingHTTPServer):
    """One listening socket of a hub: its own port (`cdn` False) or its CDN's."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a fleet asking at once (32 nodes planning a fetch) overflowed
    # it, the kernel dropped SYNs and clients waited out 10-s connect timeouts (bench.scaling, N = 32).
    request_queue_size = socket.SOMAXCONN

    def __init__(self, address: tuple[str, int], hub: HubServer, cdn: bool) -> None:
        super().__init__(address, Handler)
        self.hub = hub
        self.cdn = cdn

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client dropping a keep-alive connection (or a download it cancelled) is routine for a
        # file server; socketserver's default prints a traceback to stderr for each one.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, TimeoutError)):
            log.debug("client %s went away: %s", client_address[0], type(exc).__name__)
            return
        log.exception("error serving %s", client_address[0])


class HubServer:
    """The hub on background threads. `with HubServer(root) as srv:` starts and stops it.

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
    ) -> None:
        if answers not in ANSWERS:
            raise ValueError(f"answers must be one of {ANSWERS}: {answers!r}")
        self.root = Path(root)
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
        self._connections: set[socket.socket] = set()
        self._accepted = 0
        self._listeners: list[Listener] = []
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:  # tokens stay out of reprs
        return f"HubServer(root={str(self.root)!r}, url={self.url if self._listeners else None!r})"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._listeners:
            raise RuntimeError("hub server already started")
        main = Listener((self.host, self.port), self, cdn=False)
        self._listeners = [main]
        try:
            if self.answers == "2026":
                self._listeners.append(Listener((self.host, self._cdn_port), self, cdn=True))
        except OSError:
            main.server_close()
            self._listeners = []
            raise
        self.port = int(main.server_address[1])
        if len(self._listeners) > 1:
            self._cdn_port = int(self._listeners[1].server_address[1])
        for listener in self._listeners:
            name = "hub-cdn" if listener.cdn else "hub-server"
            thread = threading.Thread(
                target=listener.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        listeners, self._listeners = self._listeners, []
        if not listeners:
            return
        for listener in listeners:
            listener.shutdown()
            listener.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:  # idle keep-alive connections would otherwise hold their threads
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout=10)

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

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
    def _server(self) -> Listener | None:
        """The hub's own listener (not the CDN's), once started."""
        return self._listeners[0] if self._listeners else None

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

    def reset_counters(self) -> None:
        """Zero egress, requests and connections (rate-limit windows run on: they are the Hub's state)."""
        with self._lock:
            self._egress = 0
            self._accepted = 0
            self._requests.clear()

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

    def _served_on_cdn(self, path: str) -> str | None:
        with self._lock:
            return self._cdn_blobs.get(path)
