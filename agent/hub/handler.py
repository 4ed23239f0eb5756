"""The test hub's request handler: routes of the hub's port and of its CDN's, answered as `HubServer.answers`
says (the Hub of 2026 or of 2024; `agent.hub.server` describes both)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from agent.hub import listing
from agent.hub.access import Refusal
from agent.hub.cdn import cdn_path, content_disposition, redirect_body, xet_hash
from agent.hub.errors import CdnBlocked, HttpError, S3Error, amz_time
from agent.hub.faults import TokenBucket
from agent.hub.guard import HeadReader, HeadTooLarge, Slots
from agent.hub.records import RequestRecord, bucket_for
from agent.hub.repos import RepoFile, Snapshot, safe_repo_path
from agent.hub.sending import FileSender
from servekit.protocol import BUSY

if TYPE_CHECKING:
    from agent.hub.state import HubState

log = logging.getLogger("agent.hub.server")
access_log = logging.getLogger("agent.hub.access")
"""One line per request: client, method, path, Range, status (`agent serve-hub --access-log`)."""

IDLE_TIMEOUT = 300.0
"""Seconds a keep-alive connection may sit idle (or a send may block) before the server drops it."""

_TEXT = "text/plain; charset=utf-8"


class Handler(FileSender):
    protocol_version = "HTTP/1.1"
    server: Listener
    timeout = IDLE_TIMEOUT
    # Until _dispatch starts a request: a request line the stdlib refuses (send_error) is answered, not
    # recorded.
    _request_id = ""
    _status = 0
    _recorded = True
    _bucket = ""
    _limit_headers: dict[str, str] = {}  # replaced per request, never mutated

    def setup(self) -> None:
        super().setup()
        self.hub = self.server.hub
        self.cdn = self.server.cdn
        self.hub._track(self.connection, True)
        rate = self.hub.rate_per_connection
        self.conn_bucket = TokenBucket(rate) if rate else None
        self.rfile.close()  # the stdlib's reader: reads go through the head's limits (agent.hub.guard)
        self._head = HeadReader(self.connection, self.server.slots.limits, self.timeout)
        self.rfile = io.BufferedReader(self._head)

    def handle_one_request(self) -> None:
        self._head.begin_head()
        try:
            super().handle_one_request()
        except HeadTooLarge:  # in the request line: the stdlib answers it in the header lines itself
            self.close_connection = True
            body = b"request head too large"
            head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: %d"
            self.wfile.write(head % len(body) + b"\r\n\r\n" + body)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._head.end_head()
        announced = self.headers.get("Content-Length", "0").strip() not in ("", "0") if ok else False
        if announced or (ok and "Transfer-Encoding" in self.headers):
            # The hub reads no request body: its bytes would be taken for the next request, or never come.
            self.close_connection = True
        return ok

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
        for name, value in self._limit_headers.items():
            self.send_header(name, value)

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
        self._limit_headers = {}
        split = urlsplit(self.path)
        raw = split.path
        self._query_pairs = parse_qsl(split.query, keep_blank_values=True)
        query = dict(self._query_pairs)
        self._bucket = bucket_for(raw, self.cdn)
        try:
            self._rate_limit()
            if self._bucket:
                self._raise_fault(self.hub.faults.path_fault(raw))
            if self.cdn:
                self._cdn(method, raw)
            else:
                self._route(method, raw, query)
        except (S3Error, CdnBlocked) as err:
            self._send_s3_error(err)
        except HttpError as err:
            self._send_error(err)
        except OSError:  # the client went away or stopped reading: nothing left to tell it
            self.close_connection = True
        except Exception:
            log.exception("hub: unexpected error on %s %s", method, raw)
            if not self._status:
                self._send_error(HttpError(500, "Internal error"))
            self.close_connection = True
        self._record_request()  # one the handler never answered (the client went away)

    def _record_request(self) -> None:
        if self._recorded:
            return
        self._recorded = True
        split = urlsplit(self.path)
        if not self.cdn and split.path.startswith("/_weightswarm/"):
            return
        rng, authed = self.headers.get("Range"), "Authorization" in self.headers
        client = self.client_address[0]
        record = RequestRecord(
            self.command, split.path, rng, self._status, split.query, authed, client, self._bucket
        )
        self.hub._record(record)
        # The query string stays out: a CDN URL's is a signature.
        access_log.info("%s %s %s %s %d", client, self.command, split.path, rng or "-", self._status)

    def _rate_limit(self) -> None:
        limiter = self.hub.rate_limiter
        if limiter is None:
            return
        verdict = limiter.take(self._bucket, self.client_address[0], self.headers.get("Authorization"))
        if verdict is None:
            return
        self._limit_headers = verdict.headers()
        if verdict.allowed:
            return
        who = "your token" if verdict.user else "your IP address"
        message = (
            f"We had to rate limit {who}: {verdict.quota} {verdict.bucket} requests per "
            f"{verdict.window} seconds. Retry in {verdict.reset} seconds"
            + ("." if verdict.user else ", or pass a token (HF_TOKEN) for higher limits.")
        )
        headers = {"Retry-After": str(verdict.reset)} if limiter.limits.retry_after else {}
        raise HttpError(429, message, headers=headers)

    def _route(self, method: str, raw: str, query: dict[str, str]) -> None:
        parts = raw.split("/")[1:]
        if raw.startswith("/_weightswarm/"):
            if raw == "/_weightswarm/stats" and method in ("GET", "HEAD"):
                hub = self.hub
                stats = {
                    "egress_bytes": hub.egress_bytes,
                    "requests": len(hub.requests),
                    "counts": hub.counts(),
                }
                return self._send_json(200, stats, count=False)
            if raw == "/_weightswarm/reset" and method == "POST":
                self.hub.reset_counters()
                return self._send_json(200, {"ok": True}, count=False)
            raise HttpError(404, "Not Found")
        if method == "POST":
            raise HttpError(405, "Method Not Allowed")
        modern = self.hub.answers == "2026"
        if not modern and len(parts) >= 2 and parts[0] == "_cdn":
            return self._legacy_cdn(method, parts[1], query)
        if modern and len(parts) >= 7 and parts[:3] == ["api", "resolve-cache", "models"]:
            repo_id = f"{unquote(parts[3])}/{unquote(parts[4])}"
            return self._resolve(
                method, repo_id, unquote(parts[5]), unquote("/".join(parts[6:])), cached=True
            )
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{unquote(parts[0])}/{unquote(parts[1])}"
            return self._resolve(
                method, repo_id, unquote(parts[3]), unquote("/".join(parts[4:])), cached=False
            )
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
        raise HttpError(404, "Not Found")

    # -- access ------------------------------------------------------------------------------------

    def _check_access(self, repo_id: str, content: bool) -> None:
        exists = self.hub.store.repo_dir(repo_id) is not None
        header = self.headers.get("Authorization")
        refusal = self.hub.access.check(header, repo_id, exists=exists, content=content)
        if isinstance(refusal, Refusal):
            raise HttpError(refusal.status, refusal.message, refusal.code)

    def _snapshot(self, repo_id: str, revision: str, content: bool) -> Snapshot:
        self._check_access(repo_id, content)
        snapshot = self.hub.store.resolve(repo_id, revision)
        if snapshot is None:
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return snapshot

    def _base_url(self, port: int | None = None) -> str:
        """This hub as the client addressed it (its Host header); `port`: the same host, that port."""
        host = self.headers.get("Host")
        if not host:
            return self.hub.url if port is None else self.hub.cdn_url
        if port is None:
            return f"http://{host}"
        name = urlsplit(f"//{host}").hostname or self.hub.host
        return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"

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
                raise HttpError(400, f"Invalid expand value(s): {', '.join(unknown)}")
            info = {k: v for k, v in info.items() if k in ("_id", "id", *expand)}
        for name in self.hub.faults.model_info_omit:
            info.pop(name, None)
        for sibling in info.get("siblings", []):
            self._claim(sibling, sibling["rfilename"])
        self._send_json(200, info)

    def _claim(self, item: dict[str, Any], path: str) -> None:
        """A listing item with the size `Faults.claimed_sizes` states for `path`, if any."""
        claimed = self.hub.faults.claimed_sizes.get(path)
        if claimed is not None and "size" in item:
            item["size"] = claimed
            if isinstance(item.get("lfs"), dict):
                item["lfs"]["size"] = claimed

    def _auth_check(self, repo_id: str) -> None:
        self._check_access(repo_id, content=True)
        self._send_json(200, {})

    def _tree(self, repo_id: str, revision: str, prefix: str, query: dict[str, str]) -> None:
        snapshot = self._snapshot(repo_id, revision, content=False)
        prefix = prefix.strip("/")
        if prefix and not safe_repo_path(prefix):
            raise HttpError(400, f"Invalid path: {prefix!r}")
        recursive = query.get("recursive", "").lower() in ("1", "true")
        entries = listing.tree_entries(snapshot, prefix, recursive=recursive)
        if entries is None:
            raise HttpError(404, f"{prefix} does not exist on {revision}", "EntryNotFound")
        try:
            start = max(0, int(query.get("cursor", "0") or 0))
        except ValueError as exc:
            raise HttpError(400, "Invalid cursor") from exc
        page = entries[start : start + self.hub.tree_page_size]
        for item in page:
            self._claim(item, item["path"])
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
            raise HttpError(status, f"injected fault: HTTP {status}", headers.get("X-Error-Code"), headers)

    def _resolve(self, method: str, repo_id: str, revision: str, path: str, cached: bool) -> None:
        """`/{repo}/resolve/{rev}/{path}`, or (`cached`) `/api/resolve-cache/models/{repo}/{rev}/{path}`."""
        self._injected_status(method)
        if not safe_repo_path(path):
            raise HttpError(400, f"Invalid path: {path!r}")
        snapshot = self._snapshot(repo_id, revision, content=True)
        entry = snapshot.files.get(path)
        headers = {"X-Repo-Commit": snapshot.commit}
        if entry is None:
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound", headers)
        modern = self.hub.answers == "2026"
        if entry.sha256 is None:
            if modern and not cached:
                return self._redirect(
                    method, 307, self._resolve_cache_location(repo_id, revision, snapshot, entry)
                )
            headers["ETag"] = f'"{entry.oid}"'
            return self.send_file(method, entry, headers, (entry.path, entry.oid))
        headers.update(
            {
                "ETag": f'"{entry.sha256}"',
                "X-Linked-Etag": f'"{entry.sha256}"',
                "X-Linked-Size": str(self.hub.faults.claimed_sizes.get(entry.path, entry.size)),
            }
        )
        if not modern:
            location = self.hub.signer.legacy_location(
                self._base_url(),
                entry.sha256,
                snapshot.repo_id,
                snapshot.commit,
                entry.path,
                self.hub.cdn_url_ttl,
            )
            return self._redirect(method, 302, location, headers, body=False)
        cdn = self._base_url(self.hub.cdn_port)
        blob_path = cdn_path(snapshot.repo_id, entry.sha256)
        self.hub._serve_on_cdn(blob_path, entry.sha256)
        xet = xet_hash(entry.sha256)
        headers["X-Xet-Hash"] = xet
        headers["Link"] = (
            f"<{self._base_url()}/api/models/{snapshot.repo_id}/xet-read-token/{snapshot.commit}>; "
            'rel="xet-auth", '
            f'<{cdn}/v1/reconstructions/{xet}>; rel="xet-reconstruction-info"'
        )
        location = self.hub.signer.location(cdn, blob_path, entry.path, self.hub.cdn_url_ttl)
        self._redirect(method, 302, location, headers)

    @staticmethod
    def _resolve_cache_location(repo_id: str, revision: str, snapshot: Snapshot, entry: RepoFile) -> str:
        # The Hub's shape: the commit in the path, the original resolve path and the etag as parameters.
        asked = f"/{repo_id}/resolve/{revision}/{entry.path}"
        query = f"{quote(asked, safe='')}=&etag={quote(chr(34) + entry.oid + chr(34), safe='')}"
        return f"/api/resolve-cache/models/{repo_id}/{snapshot.commit}/{quote(entry.path)}?{query}"

    def _redirect(
        self,
        method: str,
        status: int,
        location: str,
        headers: dict[str, str] | None = None,
        body: bool = True,
    ) -> None:
        """A redirect whose Content-Length is its own short body's, as the Hub's (never the file's size)."""
        data = redirect_body(status, location) if body else b""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Location", location)
        if body:
            self.send_header("Content-Type", _TEXT)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD" and data:
            self.wfile.write(data)
            self.hub._add_egress(len(data))

    def _cdn(self, method: str, raw: str) -> None:
        """The CDN listener: signed blob URLs only, answered as S3 behind CloudFront."""
        if method not in ("GET", "HEAD"):
            raise S3Error(
                405, "MethodNotAllowed", "The specified method is not allowed against this resource."
            )
        self._injected_status(method)
        verdict, expires = self.hub.signer.check(raw, self._query_pairs)
        if verdict == "expired":
            query = dict(self._query_pairs)
            fields = {"X-Amz-Expires": query.get("X-Amz-Expires", ""), "Expires": amz_time(expires)}
            fields["ServerTime"] = amz_time(time.time())
            raise S3Error(403, "AccessDenied", "Request has expired", fields)
        if verdict == "bad":
            message = (
                "The request signature we calculated does not match the signature you provided. "
                "Check your key and signing method."
            )
            raise S3Error(403, "SignatureDoesNotMatch", message)
        with self.hub._cdn_stream(self.client_address[0], raw) if method == "GET" else _one() as admitted:
            if not admitted:
                return self._refuse_stream()
            self._cdn_blob(method, raw)

    def _refuse_stream(self) -> None:
        """One stream of a file too many (`Faults.streams_per_file`), refused as `streams_answer` says."""
        answer = self.hub.faults.streams_answer
        if answer == "reset":
            self._status = 0  # recorded as unanswered
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        raise CdnBlocked(int(answer))

    def _cdn_blob(self, method: str, raw: str) -> None:
        sha256 = self.hub._served_on_cdn(raw)
        if sha256 is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
        entry = self.hub.store.blob(sha256)
        if entry is None:
            raise S3Error(404, "NoSuchKey", "The specified key does not exist.")
        disposition = dict(self._query_pairs).get("response-content-disposition") or content_disposition(
            entry.path
        )
        headers = {
            "ETag": f'"{xet_hash(sha256)}"',
            "Cache-Control": "public, max-age=31536000",
            "Content-Disposition": disposition,
            "X-Cache": "Miss from cloudfront",
            "Via": "1.1 weightswarm-hub (CloudFront)",
        }
        self.send_file(method, entry, headers, (entry.path, sha256))

    def _legacy_cdn(self, method: str, sha256: str, query: dict[str, str]) -> None:
        """2024: `/_cdn/{sha256}` on the hub's port, repeating the Hub's X- headers."""
        self._injected_status(method)
        if not self.hub.signer.legacy_valid(sha256, query):
            raise HttpError(403, "Request has expired or its signature does not match")
        entry = self.hub.store.blob(sha256)
        if entry is None:
            raise HttpError(404, "Blob not found (its file changed on disk?)")
        headers = {
            "ETag": f'"{sha256}"',
            "X-Repo-Commit": query.get("commit", ""),
            "X-Linked-Etag": f'"{sha256}"',
            "X-Linked-Size": str(entry.size),
        }
        self.send_file(method, entry, headers, (query.get("file", ""), sha256))

    # -- responses ---------------------------------------------------------------------------------

    def _send_json(
        self, status: int, obj: Any, headers: dict[str, str] | None = None, count: bool = True
    ) -> None:
        body = json.dumps(obj).encode()
        self._send_bytes(status, body, "application/json; charset=utf-8", headers, count)

    def _send_bytes(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None, count: bool = True
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            if count:
                self.hub._add_egress(len(body))

    def _send_error(self, err: HttpError) -> None:
        headers = dict(err.headers)
        headers.pop("Content-Length", None)
        if err.code:
            headers["X-Error-Code"] = err.code
        # Header values must be one latin-1 line: paths in messages come from the client.
        headers.setdefault("X-Error-Message", "".join(c if " " <= c <= "~" else "?" for c in err.message))
        self._send_json(err.status, {"error": err.message}, headers=headers)

    def _send_s3_error(self, err: S3Error | CdnBlocked) -> None:
        self._send_bytes(err.status, err.body(self._request_id), err.content_type, err.headers)


@contextlib.contextmanager
def _one() -> Iterator[bool]:
    """A HEAD's stream: never refused (it sends no body)."""
    yield True


class Listener(ThreadingHTTPServer):
    """One listening socket of a hub: its own port (`cdn` False) or its CDN's."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a fleet asking at once (32 nodes planning a fetch) overflowed
    # it, the kernel dropped SYNs and clients waited out 10-s connect timeouts (bench.scaling, N = 32).
    request_queue_size = socket.SOMAXCONN

    def __init__(self, address: tuple[str, int], hub: HubState, cdn: bool) -> None:
        super().__init__(address, Handler)
        self.hub = hub
        self.cdn = cdn
        self.slots = Slots(hub.limits)
        self._admitted: dict[Any, str] = {}
        """Admitted connections and their client addresses (dict operations are atomic: the accepting
        thread adds, each connection's thread removes)."""

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Over its connection caps: 503 and close, before a thread is started for it."""
        if not self.slots.admit(client_address[0]):
            try:
                request.sendall(BUSY)
            except OSError:
                pass
            return False
        self._admitted[request] = client_address[0]
        return True

    def shutdown_request(self, request: Any) -> None:
        client = self._admitted.pop(request, None)
        if client is not None:
            self.slots.release(client)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client dropping a keep-alive connection (or a download it cancelled) is routine for a
        # file server; socketserver's default prints a traceback to stderr for each one.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, TimeoutError)):
            log.debug("client %s went away: %s", client_address[0], type(exc).__name__)
            return
        log.exception("error serving %s", client_address[0])
