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
  signed URLs live about an hour: docs.rs/crate/hf-fetch-model docs/upstream-differences.md, "typically 1
  hour", then "HTTP 403"). Its answer is the CDN's (huggingface/datasets#7931's HEAD of a
  cas-bridge URL): Content-Length, Accept-Ranges, Content-Range, a quoted 64-hex ETag (here the Xet hash:
  not the sha256), Cache-Control, Content-Disposition, X-Cache, Via, X-Request-Id; no X-Repo-Commit,
  X-Linked-*, X-Xet-*. A request that starts after the expiry, or with a bad signature, gets a 403 with
  an S3 XML body (`<Error><Code>AccessDenied</Code><Message>Request has expired</Message>...`, as
  presigned S3 URLs answer: bnb-chain/node-binary#317, expo/xde#128) and no X-Error-Code; a body that
  started in time runs to its end. Authorization is ignored there (recorded in `RequestRecord.authorized`).
- Rate limits (`agent.hub.ratelimit`, on by default with the Hub's numbers): per 5-minute fixed window,
  500 api / 3,000 resolvers per anonymous IP address, 1,000 / 5,000 per token (hub-docs rate-limits.md,
  September '25 table). Every counted answer carries `RateLimit` / `RateLimit-Policy`
  (huggingface_hub#3553 shows them on a 200, Rapid-MLX#1122 on a 307); over the quota a 429 with r=0
  and t=<seconds to the reset>, which huggingface_hub's `parse_ratelimit_headers` and http_backoff read.
  No reference shows a Retry-After from the Hub: `RateLimits(retry_after=True)` adds one. CDN requests
  are not counted (another host). A window starts at a client's first request; refused requests count
  too (no reference says; in a fixed window it changes nothing a client sees).
- `Faults.head_without_length`: a mirror's HEAD without Content-Length (huggingface_hub#4805 made the
  client tolerate one).

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

import socket
import threading
from http.server import ThreadingHTTPServer
from types import TracebackType

from agent.hub import listing
from agent.hub.handler import IDLE_TIMEOUT, Handler, Listener, access_log
from agent.hub.ratelimit import RateLimits
from agent.hub.records import RequestRecord
from agent.hub.state import (
    ANSWERS,
    CDN_URL_TTL,
    DEFAULT_TREE_PAGE_SIZE,
    LEGACY_CDN_URL_TTL,
    HubState,
)

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

# Tests subclass the handler (e.g. a listing that smuggles bad paths) and swap it on `_server`.
_Handler = Handler


class HubServer(HubState):
    """The hub on background threads. `with HubServer(root) as srv:` starts and stops it (`HubState`
    holds its settings and counters)."""

    def __repr__(self) -> str:  # tokens stay out of reprs
        return f"HubServer(root={str(self.root)!r}, url={self.url if self._listeners else None!r})"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._listeners:
            raise RuntimeError("hub server already started")
        main = Listener((self.host, self.port), self, cdn=False)
        cdn = None
        try:
            if self.answers == "2026":
                cdn = Listener((self.host, self._cdn_port), self, cdn=True)
        except OSError:
            main.server_close()
            raise
        self.port = int(main.server_address[1])
        self._listeners = [main]
        if cdn is not None:
            self._cdn_port = int(cdn.server_address[1])
            self._listeners.append(cdn)
        for listener, name in zip(self._listeners, ("hub-server", "hub-cdn"), strict=False):
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

    @property
    def _server(self) -> ThreadingHTTPServer | None:
        """The hub's own listener (not the CDN's), once started."""
        return self._listeners[0] if self._listeners else None
