"""A Hugging Face-compatible hub that serves a directory: for tests, benchmarks and air-gapped clusters.

Routes (as huggingface.co, read-only, model repos):
- `GET /api/models/{org}/{name}[/revision/{rev}]` model info (`?blobs=true` adds sizes and oids;
  `?expand=a&expand=b` or `expand[]=` answers only `_id`, `id` and those properties, as the Hub);
- `GET /api/models/{org}/{name}/auth-check` 200 when the token may read the repo's files, else the
  refusal the files would get (what `huggingface_hub.auth_check` asks);
- `GET /api/models/{org}/{name}/tree/{rev}[/{path}]` listing, paginated by a `Link: rel="next"` header;
- `HEAD|GET /{org}/{name}/resolve/{rev}/{path}`: small files answered directly (ETag = git sha1),
  LFS files redirected (302) to a signed `/_cdn/{sha256}?...` URL that needs no Authorization;
- `GET /_weightswarm/stats` egress and request counters, `POST /_weightswarm/reset` zeroes them.

Errors carry the Hub's `X-Error-Code` / `X-Error-Message` headers and a JSON `{"error": ...}` body,
so `huggingface_hub` raises its usual exception classes. Access rules (`agent.hub.access`): a token
in `tokens` reads every repo, one in `grants` the gated/private repos listed for it; an unknown token
is refused (401); a private repo is invisible without access (401 RepoNotFound anonymous, 404 with a
token, as a missing repo); a gated repo's model info is public (`gated: "auto"|"manual"`), its files
answer 401 GatedRepo anonymous, 403 GatedRepo to a token without access. With no tokens configured
every bearer token is accepted.

The CDN route also repeats `X-Repo-Commit` / `X-Linked-Etag` / `X-Linked-Size`: recent
`huggingface_hub` follows a same-origin redirect on its metadata HEAD and reads them from the
final response (a real CDN is another host, where it stops at the 302).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from agent.hub import listing
from agent.hub.access import HubAccess, Refusal
from agent.hub.faults import Faults, TokenBucket, chunk_for
from agent.hub.ranges import parse_range
from agent.hub.repos import RepoFile, RepoStore, Snapshot, safe_repo_path, valid_repo_id

log = logging.getLogger(__name__)
access_log = logging.getLogger("agent.hub.access")
"""One line per request: client, method, path, Range, status (`agent serve-hub --access-log`)."""

DEFAULT_TREE_PAGE_SIZE = 1000
"""Entries per tree page, as the Hub; tests pass a small one to exercise pagination."""

CDN_URL_TTL = 24 * 3600.0
"""Seconds a signed CDN URL stays valid: long enough for a slow multi-range download to reuse it."""

IDLE_TIMEOUT = 300.0
"""Seconds a keep-alive connection may sit idle (or a send may block) before the server drops it."""

_SENDFILE_CAP = 8 * 2**20  # bytes one os.sendfile call may take (the stats move at least this often)


def _acked(sock: socket.socket) -> int | None:
    """Bytes of the connection its peer has acknowledged (Linux TCP_INFO `tcpi_bytes_acked`), or None."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 128)
    except (OSError, AttributeError):
        return None
    return int(struct.unpack_from("=Q", info, 120)[0]) if len(info) >= 128 else None


def _wait_writable(sock: socket.socket) -> None:
    """Until `sock` takes bytes again, at most its timeout."""
    with selectors.DefaultSelector() as ready:
        ready.register(sock, selectors.EVENT_WRITE)
        if not ready.select(sock.gettimeout()):
            raise TimeoutError("the client stopped reading")


class RequestRecord(NamedTuple):
    """One request as the server saw it (path without the query string, which is `query`)."""

    method: str
    path: str
    range: str | None
    status: int
    query: str = ""
    authorized: bool = False
    """Whether it carried an Authorization header (never the header itself)."""
    client: str = ""
    """The client's address."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a fleet asking at once (32 nodes planning a fetch) overflowed
    # it, the kernel dropped SYNs and clients waited out 10-s connect timeouts (bench.scaling, N = 32).
    request_queue_size = socket.SOMAXCONN
    hub: HubServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client dropping a keep-alive connection (or a download it cancelled) is routine for a
        # file server; socketserver's default prints a traceback to stderr for each one.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, TimeoutError)):
            log.debug("client %s went away: %s", client_address[0], type(exc).__name__)
            return
        log.exception("error serving %s", client_address[0])


class HubServer:
    """The hub on a background thread. `with HubServer(root) as srv:` starts and stops it."""

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
    ) -> None:
        self.root = Path(root)
        self.host = host
        self.port = port
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
        self.tree_page_size = max(1, tree_page_size)
        self.faults = Faults()
        self._secret = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._egress = 0
        self._requests: list[RequestRecord] = []
        self._connections: set[socket.socket] = set()
        self._accepted = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:  # tokens stay out of reprs
        return f"HubServer(root={str(self.root)!r}, url={self.url if self._server else None!r})"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("hub server already started")
        server = _Server((self.host, self.port), _Handler)
        server.hub = self
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-server", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:  # idle keep-alive connections would otherwise hold their threads
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def rate_total(self) -> float | None:
        """The cap on all bodies together, bytes/s (None: uncapped); settable while serving."""
        return self.total_bucket.rate if self.total_bucket is not None else None

    @rate_total.setter
    def rate_total(self, rate: float | None) -> None:
        self.total_bucket = TokenBucket(rate) if rate else None

    def client_bucket(self, address: str) -> TokenBucket | None:
        """The cap shared by every connection from one client address (as a CDN's per-IP limit)."""
        if self.rate_per_client is None:
            return None
        with self._lock:
            return self._client_buckets.setdefault(address, TokenBucket(self.rate_per_client))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- observation -------------------------------------------------------------------------------

    @property
    def egress_bytes(self) -> int:
        """Body bytes sent so far, all responses except the /_weightswarm/ ones."""
        with self._lock:
            return self._egress

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._requests)

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far: with keep-alive clients, far fewer than `requests`."""
        with self._lock:
            return self._accepted

    def reset_counters(self) -> None:
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

    def _signature(self, sha256: str, repo_id: str, commit: str, path: str, expires: int) -> str:
        msg = f"{sha256}|{repo_id}|{commit}|{path}|{expires}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest()

    def cdn_location(self, base: str, snapshot: Snapshot, entry: RepoFile) -> str:
        assert entry.sha256 is not None
        expires = int(time.time() + CDN_URL_TTL)
        params = {
            "repo": snapshot.repo_id,
            "commit": snapshot.commit,
            "file": entry.path,
            "expires": str(expires),
            "sig": self._signature(entry.sha256, snapshot.repo_id, snapshot.commit, entry.path, expires),
        }
        return f"{base}/_cdn/{entry.sha256}?{urlencode(params)}"

    def cdn_valid(self, sha256: str, query: dict[str, str]) -> bool:
        try:
            expires = int(query.get("expires", ""))
        except ValueError:
            return False
        want = self._signature(
            sha256, query.get("repo", ""), query.get("commit", ""), query.get("file", ""), expires
        )
        return expires >= time.time() and hmac.compare_digest(want, query.get("sig", ""))


class _HttpError(Exception):
    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = IDLE_TIMEOUT
    # Until _dispatch starts a request: a request line the stdlib refuses (send_error) is answered, not
    # recorded.
    _request_id = ""
    _status = 0
    _recorded = True
    _body_sent = 0
    """Bytes of the body being sent that were counted as egress."""

    def setup(self) -> None:
        super().setup()
        self.hub = self.server.hub
        self.hub._track(self.connection, True)
        rate = self.hub.rate_per_connection
        self.conn_bucket = TokenBucket(rate) if rate else None

    def finish(self) -> None:
        self.hub._track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        # Recorded before the status line can reach the client (headers go out at end_headers): a client
        # that has its answer finds its request in `requests`.
        self._record_request()
        super().send_response(code, message)
        self.send_header("X-Request-Id", self._request_id)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # -- dispatch ----------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._request_id = uuid.uuid4().hex
        self._status = 0
        self._recorded = False
        split = urlsplit(self.path)
        raw = split.path
        self._query_pairs = parse_qsl(split.query, keep_blank_values=True)
        query = dict(self._query_pairs)
        internal = raw.startswith("/_weightswarm/")
        try:
            if not internal:
                self._raise_fault(self.hub.faults.path_fault(raw))
            self._route(method, raw, query)
        except _HttpError as err:
            self._send_error(err)
        except OSError:  # the client went away or stopped reading: nothing left to tell it
            self.close_connection = True
        except Exception:
            log.exception("hub: unexpected error on %s %s", method, raw)
            if not self._status:
                self._send_error(_HttpError(500, "Internal error"))
            self.close_connection = True
        self._record_request()  # one the handler never answered (the client went away)

    def _record_request(self) -> None:
        if self._recorded:
            return
        self._recorded = True
        split = urlsplit(self.path)
        if split.path.startswith("/_weightswarm/"):
            return
        rng, authed = self.headers.get("Range"), "Authorization" in self.headers
        client = self.client_address[0]
        record = RequestRecord(self.command, split.path, rng, self._status, split.query, authed, client)
        self.hub._record(record)
        # The query string stays out: a CDN URL's is a signature.
        access_log.info("%s %s %s %s %d", client, self.command, split.path, rng or "-", self._status)

    def _route(self, method: str, raw: str, query: dict[str, str]) -> None:
        parts = raw.split("/")[1:]
        if raw.startswith("/_weightswarm/"):
            if raw == "/_weightswarm/stats" and method in ("GET", "HEAD"):
                stats = {"egress_bytes": self.hub.egress_bytes, "requests": len(self.hub.requests)}
                return self._send_json(200, stats, count=False)
            if raw == "/_weightswarm/reset" and method == "POST":
                self.hub.reset_counters()
                return self._send_json(200, {"ok": True}, count=False)
            raise _HttpError(404, "Not Found")
        if method == "POST":
            raise _HttpError(405, "Method Not Allowed")
        if len(parts) >= 2 and parts[0] == "_cdn":
            return self._cdn(method, parts[1], query)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{unquote(parts[0])}/{unquote(parts[1])}"
            return self._resolve(method, repo_id, unquote(parts[3]), unquote("/".join(parts[4:])))
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            repo_id = f"{unquote(parts[2])}/{unquote(parts[3])}"
            rest = parts[4:]
            if not rest:
                return self._model_info(repo_id, "main", query)
            if len(rest) == 2 and rest[0] == "revision":
                return self._model_info(repo_id, unquote(rest[1]), query)
            if rest == ["auth-check"]:
                return self._auth_check(repo_id)
            if len(rest) >= 2 and rest[0] == "tree":
                return self._tree(repo_id, unquote(rest[1]), unquote("/".join(rest[2:])), query)
        raise _HttpError(404, "Not Found")

    # -- access ------------------------------------------------------------------------------------

    def _check_access(self, repo_id: str, content: bool) -> None:
        exists = self.hub.store.repo_dir(repo_id) is not None
        header = self.headers.get("Authorization")
        refusal = self.hub.access.check(header, repo_id, exists=exists, content=content)
        if isinstance(refusal, Refusal):
            raise _HttpError(refusal.status, refusal.message, refusal.code)

    def _snapshot(self, repo_id: str, revision: str, content: bool) -> Snapshot:
        self._check_access(repo_id, content)
        snapshot = self.hub.store.resolve(repo_id, revision)
        if snapshot is None:
            raise _HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return snapshot

    def _base_url(self) -> str:
        host = self.headers.get("Host")
        return f"http://{host}" if host else self.hub.url

    # -- API routes --------------------------------------------------------------------------------

    def _model_info(self, repo_id: str, revision: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo_id, revision, content=False)
        blobs = query.get("blobs", "").lower() in ("1", "true")
        access = self.hub.access
        private, gated = repo_id in access.private, access.gated_mode(repo_id)
        info = listing.model_info(snapshot, private=private, gated=gated, blobs=blobs)
        expand = [v for k, v in self._query_pairs if k in ("expand", "expand[]")]
        if expand:
            unknown = sorted(set(expand) - listing.EXPAND_PROPERTIES)
            if unknown:
                raise _HttpError(400, f"Invalid expand value(s): {', '.join(unknown)}")
            info = {k: v for k, v in info.items() if k in ("_id", "id", *expand)}
        for name in self.hub.faults.model_info_omit:
            info.pop(name, None)
        self._send_json(200, info)

    def _auth_check(self, repo_id: str) -> None:
        self._check_access(repo_id, content=True)
        self._send_json(200, {})

    def _tree(self, repo_id: str, revision: str, prefix: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo_id, revision, content=False)
        prefix = prefix.strip("/")
        if prefix and not safe_repo_path(prefix):
            raise _HttpError(400, f"Invalid path: {prefix!r}")
        recursive = query.get("recursive", "").lower() in ("1", "true")
        entries = listing.tree_entries(snapshot, prefix, recursive=recursive)
        if entries is None:
            raise _HttpError(404, f"{prefix} does not exist on {revision}", "EntryNotFound")
        try:
            start = max(0, int(query.get("cursor", "0") or 0))
        except ValueError as exc:
            raise _HttpError(400, "Invalid cursor") from exc
        page = entries[start : start + self.hub.tree_page_size]
        headers: dict[str, str] = {}
        if start + self.hub.tree_page_size < len(entries):
            next_query = dict(query, cursor=str(start + self.hub.tree_page_size))
            path_part = "/" + quote(prefix, safe="") if prefix else ""
            url = f"{self._base_url()}/api/models/{repo_id}/tree/{quote(revision, safe='')}{path_part}"
            headers["Link"] = f'<{url}?{urlencode(next_query)}>; rel="next"'
        self._send_json(200, page, headers=headers)

    # -- file routes -------------------------------------------------------------------------------

    def _injected_status(self, method: str) -> None:
        self._raise_fault(self.hub.faults.take_status(method))

    def _raise_fault(self, fault: tuple[int, dict[str, str]] | None) -> None:
        if fault is not None:
            status, headers = fault
            raise _HttpError(status, f"injected fault: HTTP {status}", headers.get("X-Error-Code"), headers)

    def _resolve(self, method: str, repo_id: str, revision: str, path: str) -> None:
        self._injected_status(method)
        if not safe_repo_path(path):
            raise _HttpError(400, f"Invalid path: {path!r}")
        snapshot = self._snapshot(repo_id, revision, content=True)
        entry = snapshot.files.get(path)
        headers = {"X-Repo-Commit": snapshot.commit}
        if entry is None:
            raise _HttpError(404, f"Entry not found: {path}", "EntryNotFound", headers)
        if entry.sha256 is None:
            headers["ETag"] = f'"{entry.oid}"'
            return self._send_file(method, entry, headers, (entry.path, entry.oid))
        location = self.hub.cdn_location(self._base_url(), snapshot, entry)
        headers.update(
            {
                "ETag": f'"{entry.sha256}"',
                "X-Linked-Etag": f'"{entry.sha256}"',
                "X-Linked-Size": str(entry.size),
                "Location": location,
                "Content-Length": "0",
            }
        )
        self.send_response(302)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _cdn(self, method: str, sha256: str, query: dict[str, str]) -> None:
        self._injected_status(method)
        if not self.hub.cdn_valid(sha256, query):
            raise _HttpError(403, "Request has expired or its signature does not match")
        entry = self.hub.store.blob(sha256)
        if entry is None:
            raise _HttpError(404, "Blob not found (its file changed on disk?)")
        headers = {
            "ETag": f'"{sha256}"',
            "X-Repo-Commit": query.get("commit", ""),
            "X-Linked-Etag": f'"{sha256}"',
            "X-Linked-Size": str(entry.size),
        }
        self._send_file(method, entry, headers, (query.get("file", ""), sha256))

    def _send_file(
        self, method: str, entry: RepoFile, headers: dict[str, str], names: tuple[str, ...]
    ) -> None:
        try:
            f = open(entry.abs_path, "rb")  # noqa: SIM115 - closed below; the fd pins the bytes we checked
        except OSError as exc:
            raise _HttpError(404, f"Entry not found: {entry.path}", "EntryNotFound", headers) from exc
        with f:
            st = os.fstat(f.fileno())
            if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
                msg = f"Entry changed on disk since this commit: {entry.path}"
                raise _HttpError(404, msg, "EntryNotFound", headers)
            rng = None if self.hub.faults.ignore_range else parse_range(self.headers.get("Range"), entry.size)
            if rng == "unsatisfiable":
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{entry.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = rng if isinstance(rng, tuple) else (0, entry.size - 1)
            length = end - start + 1
            self.send_response(206 if isinstance(rng, tuple) else 200)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            if isinstance(rng, tuple):
                self.send_header("Content-Range", f"bytes {start}-{end}/{entry.size}")
            self.end_headers()
            if method == "HEAD" or length == 0:
                return
            self._send_body(f, start, length, names)

    def _send_body(self, f: BinaryIO, start: int, length: int, names: tuple[str, ...]) -> None:
        """The body, its bytes counted as egress as the kernel takes them; when the client leaves halfway,
        only what it acknowledged stays counted (the rest of the socket's send buffer never went out)."""
        self._body_sent = 0
        acked = _acked(self.connection)
        try:
            self._send_payload(f, start, length, names)
        except OSError:
            now = _acked(self.connection)
            if acked is not None and now is not None:
                self.hub._add_egress(-max(0, self._body_sent - (now - acked)))
            raise

    def _send_payload(self, f: BinaryIO, start: int, length: int, names: tuple[str, ...]) -> None:
        faults = self.hub.faults
        truncate = faults.take_truncate()
        corrupt = faults.take_corrupt(names)
        stall = faults.take_stall(start + length - 1)
        caps = (self.hub.total_bucket, self.hub.client_bucket(self.client_address[0]), self.conn_bucket)
        buckets = [b for b in (*caps, faults.take_slow(start + length - 1)) if b is not None]
        if not (buckets or corrupt or stall or truncate is not None):
            return self._sendfile(f, start, length)
        limit = length if truncate is None else min(length, truncate)
        rate = min((b.rate for b in buckets), default=None)
        step = chunk_for(rate)
        f.seek(start)
        sent = 0
        while sent < limit:
            if stall is not None and sent >= stall[0]:
                time.sleep(stall[1])
                stall = None
            want = min(step, limit - sent)
            if stall is not None and sent < stall[0]:
                want = min(want, stall[0] - sent)
            for bucket in buckets:
                bucket.take(want)
            if corrupt and sent == 0:
                data = f.read(want)
                if not data:
                    break
                self.wfile.write(bytes([data[0] ^ 0xFF]) + data[1:])
                n = len(data)
                self._counted(n)
            else:
                # sendfile: a capped body costs the server no copies through Python, so a
                # benchmark measures the client, not this test origin's CPU.
                n = self._send_counted(f, start + sent, want)
                if n == 0:
                    break
            sent += n
        if stall is not None:  # stall_after beyond the body: stall at the end instead
            time.sleep(stall[1])
        if sent < length:  # a truncated body: the client sees the connection drop
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _sendfile(self, f: BinaryIO, start: int, length: int) -> None:
        if self._send_counted(f, start, length) < length:
            raise BrokenPipeError("file shrank while sending")

    def _send_counted(self, f: BinaryIO, offset: int, count: int) -> int:
        """Up to `count` bytes of `f` from `offset` by sendfile, counted as the kernel takes them.
        (socket.sendfile reports nothing of a call that ends in an error: a response the client closed
        halfway, as the fetch engine closes a hedged range, went uncounted, and a cold start, which cannot
        take less than one copy, read 0.95 x S of origin egress.)"""
        sock = self.connection
        out, src = sock.fileno(), f.fileno()
        sent = 0
        while sent < count:
            try:
                n = os.sendfile(out, src, offset + sent, min(_SENDFILE_CAP, count - sent))
            except BlockingIOError:  # the socket has a timeout, so it is non-blocking underneath
                _wait_writable(sock)
                continue
            if n == 0:
                break
            sent += n
            self._counted(n)
        return sent

    def _counted(self, n: int) -> None:
        self._body_sent += n
        self.hub._add_egress(n)

    # -- responses ---------------------------------------------------------------------------------

    def _send_json(
        self, status: int, obj: Any, headers: dict[str, str] | None = None, count: bool = True
    ) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            if count:
                self.hub._add_egress(len(body))

    def _send_error(self, err: _HttpError) -> None:
        headers = dict(err.headers)
        headers.pop("Content-Length", None)
        if err.code:
            headers["X-Error-Code"] = err.code
        # Header values must be one latin-1 line: paths in messages come from the client.
        headers.setdefault("X-Error-Message", "".join(c if " " <= c <= "~" else "?" for c in err.message))
        self._send_json(err.status, {"error": err.message}, headers=headers)
