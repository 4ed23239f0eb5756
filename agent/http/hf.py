"""The agent as a Hugging Face-compatible endpoint: `HF_ENDPOINT=http://<agent api>` and an unmodified
`huggingface_hub` / transformers / vLLM downloads through the node's cache and the swarm.

Routes (on the agent's `--api-listen` address):
    GET       /api/models/{repo...}                     proxied to the origin with the client's token
                                                        (model info, revisions, tree listings); when
                                                        the origin is unreachable, model info and tree
                                                        of a cached revision come from the local cache
    HEAD|GET  /{org}/{name}/resolve/{rev}/{path}        file metadata / bytes, the Hub's headers
                                                        (X-Repo-Commit, ETag, X-Linked-Etag,
                                                        X-Linked-Size, Accept-Ranges), Range -> 206/416

Bytes: from the local cache when the blob is complete. A GET for a blob the node does not have starts
a fetch job through the daemon (peers first, the origin once per cluster) and streams the blob while it
arrives (agent.http.stream, agent.cache.arrivals): the response starts with the first servable bytes,
carries the whole file's Content-Length (or the range's), and goes on in order, so an unmodified client
with its default read timeout sees a download, not silence. Servable means written by the origin engine
(the trust of a direct origin download) or in pieces that passed their hash check (from peers); the
last byte waits for the end-to-end check, and a blob that fails it cuts the response short. Clients
asking for the same file share one fetch; one that hangs up cancels nothing. HEAD answers from the
origin's metadata at once and fetches nothing.

Access: P2P must never widen access. A file goes out only on one of two decisions, each from a
request the agent builds itself (fixed URL, no client query string, redirects never followed: a 3xx
is no decision):
- public: the agent's own anonymous `GET {origin}/api/models/{repo}` says `"private": false` and
  `"gated": false` (on the Hub `gated` is false, "auto" or "manual"; a missing field is not public).
  Kept per repo for `ops.public_ttl` seconds and shared by every client; "not public" is kept for
  `ops.access_ttl`.
- granted: `GET {origin}/api/models/{repo}/auth-check` with the client's own Authorization answers
  200 (as `huggingface_hub.auth_check`). Kept for `ops.access_ttl` seconds under (an HMAC of the
  client's token with a per-process key, repo): never the token itself, never on disk or in logs,
  never for another token, and never for a client without one (an anonymous client gets only what
  is public).
Responses to the client's own `/api/models/...` requests are passed through and never decide
anything. A refusal is passed on with the origin's status and `X-Error-Code`, even when the blobs
are cached; a private repo is never revealed (the origin's 401/404 `RepoNotFound`). When the origin
is unreachable, only a decision still in its TTL lets cached files out; otherwise 503.

Fetches for HF clients use the client's own token, never the node's, and count against the
per-client job limit (`daemon.max_jobs_per_client`, a client being one IP): over it, 429 with
`Retry-After`.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from starlette.background import BackgroundTask

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.eviction import BlobReaders, CachedRepo, UsageLog, scan_repo
from agent.cache.layout import RepoCache, check_repo_id, is_blob_id, is_commit, safe_relpath
from agent.core.errors import BusyError, WeightswarmError
from agent.core.settings import Settings
from agent.fetch.jobs import Job, RequestModel
from agent.http.metrics import AgentMetrics
from agent.http.stream import POLL as STREAM_POLL
from agent.http.stream import arrival_response, parse_range

log = logging.getLogger(__name__)

_PASSED_HEADERS = (
    "content-type",
    "x-error-code",
    "x-error-message",
    "x-repo-commit",
    "x-request-id",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
)
_REFUSAL_HEADERS = ("x-request-id", "retry-after", "ratelimit", "ratelimit-policy")
_MAX_DECISIONS = 10_000
"""Access decisions kept at most (each kind); beyond, the oldest are dropped (asked again)."""

BUSY_RETRY_AFTER = 10
"""Seconds a client over its fetch-job limit is told to wait (`Retry-After`; huggingface_hub honours it)."""


@dataclass(frozen=True)
class FileMeta:
    commit: str
    blob_id: str
    size: int

    @property
    def is_lfs(self) -> bool:
        return len(self.blob_id) == 64

    def headers(self) -> dict[str, str]:
        h = {"X-Repo-Commit": self.commit, "ETag": f'"{self.blob_id}"', "Accept-Ranges": "bytes"}
        if self.is_lfs:
            h["X-Linked-Etag"] = f'"{self.blob_id}"'
            h["X-Linked-Size"] = str(self.size)
        return h


@dataclass(frozen=True)
class Visibility:
    """What the origin answered the agent's own anonymous model-info request."""

    public: bool
    """Explicitly `private: false` and `gated: false`."""
    private: bool
    gated: str | bool
    refusal: tuple[int, str, str | None]
    """What an anonymous client is told about this repo when it is not public: (status, message,
    X-Error-Code), the origin's own refusal where it gave one."""


def client_credential(authorization: str | None) -> str | None:
    """What identifies a client to the origin: its bearer token, or the whole header for another
    scheme (marked, so that it never equals a bearer token); None for an anonymous client."""
    if not authorization or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return "\0" + authorization.strip()  # a NUL cannot be in a header, hence in a token


class AccessCache:
    """Who may read what, as the origin last said: a shared public decision per repo, and grants per
    (keyed hash of the client's token, repo)."""

    def __init__(self, ttl: float, public_ttl: float) -> None:
        self.ttl = ttl
        self.public_ttl = public_ttl
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._granted: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._visibility: OrderedDict[str, tuple[Visibility, float]] = OrderedDict()

    def _who(self, credential: str) -> str:
        return hmac.new(self._key, credential.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def _bound(table: OrderedDict[Any, Any], now: float) -> None:
        if len(table) <= _MAX_DECISIONS:
            return
        for key in [k for k, v in table.items() if (v[1] if isinstance(v, tuple) else v) <= now]:
            del table[key]
        while len(table) > _MAX_DECISIONS:
            table.popitem(last=False)

    def grant(self, repo_id: str, credential: str) -> None:
        with self._lock:
            now = time.monotonic()
            key = (self._who(credential), repo_id)
            self._granted.pop(key, None)
            self._granted[key] = now + self.ttl
            self._bound(self._granted, now)

    def revoke(self, repo_id: str, credential: str | None) -> None:
        if credential is None:
            return
        with self._lock:
            self._granted.pop((self._who(credential), repo_id), None)

    def granted(self, repo_id: str, credential: str | None) -> bool:
        if credential is None:  # no token, no grant: anonymous clients get what is public only
            return False
        with self._lock:
            return self._granted.get((self._who(credential), repo_id), 0.0) > time.monotonic()

    def set_visibility(self, repo_id: str, visibility: Visibility) -> None:
        with self._lock:
            now = time.monotonic()
            self._visibility.pop(repo_id, None)
            ttl = self.public_ttl if visibility.public else self.ttl
            self._visibility[repo_id] = (visibility, now + ttl)
            self._bound(self._visibility, now)

    def visibility(self, repo_id: str) -> Visibility | None:
        """The origin's last answer about the repo, while in its TTL; None: ask again."""
        with self._lock:
            known = self._visibility.get(repo_id)
            return known[0] if known is not None and known[1] > time.monotonic() else None

    def allowed(self, repo_id: str, credential: str | None) -> bool:
        known = self.visibility(repo_id)
        return (known is not None and known.public) or self.granted(repo_id, credential)


def hub_error(
    status: int,
    message: str,
    code: str | None = None,
    commit: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error as the Hub sends it, so huggingface_hub raises its usual exception class."""
    h = {"X-Error-Message": "".join(c if " " <= c <= "~" else "?" for c in message), **(headers or {})}
    if code:
        h["X-Error-Code"] = code
    if commit:
        h["X-Repo-Commit"] = commit
    return JSONResponse({"error": message}, status_code=status, headers=h)


def _redirected(what: str, repo_id: str, status: int) -> tuple[int, str]:
    """A redirect on an access request: no decision (not followed, so no other URL decides)."""
    log.warning("the origin answered the %s of %s with HTTP %d; not followed", what, repo_id, status)
    return 502, f"the origin answered the {what} of {repo_id} with a redirect (HTTP {status}); not followed"


def visibility_of(repo_id: str, resp: httpx.Response) -> Visibility:
    """The origin's answer to the agent's anonymous model-info request, read strictly: public only
    with `"private": false` and `"gated": false` both present in a 200 JSON object."""
    status = resp.status_code
    info: Any = None
    if status == 200:
        try:
            info = json.loads(resp.content)
        except ValueError:
            info = None
    if isinstance(info, dict):
        private, gated = info.get("private"), info.get("gated")
        if private is False and gated is False:
            return Visibility(True, False, False, (200, "", None))
        if private is False and gated in ("auto", "manual"):
            msg = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            return Visibility(False, False, gated, (401, msg, "GatedRepo"))
        log.warning("the origin's model info of %s does not say it is public: tokens only", repo_id)
        msg = f"the origin does not say that {repo_id} is public; send a token that may read it"
        return Visibility(False, private is not False, gated or "auto", (403, msg, None))
    if 300 <= status < 400:
        return Visibility(False, True, False, (*_redirected("model info", repo_id, status), None))
    if status >= 400:  # private or missing: the origin's own refusal, which does not say which
        message = resp.headers.get("x-error-message") or "Repository not found"
        return Visibility(False, True, False, (status, message, resp.headers.get("x-error-code")))
    msg = f"the origin sent no usable model info for {repo_id} (HTTP {status})"
    return Visibility(False, True, False, (502, msg, None))


def _origin_refusal(resp: httpx.Response, fallback: str) -> JSONResponse:
    """The origin's refusal of a request, in the Hub's format (its status, code, message, and the
    rate-limit headers of a 429)."""
    h = resp.headers
    passed = {k: v for k, v in h.items() if k.lower() in _REFUSAL_HEADERS}
    message = h.get("x-error-message") or fallback
    return hub_error(resp.status_code, message, h.get("x-error-code"), headers=passed)


def _passed(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() in _PASSED_HEADERS}


class _Unreachable(Exception):
    pass


class _Throttled(Exception):
    """The origin answered an access request with 429: passed on, so the client backs off."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


class HfEndpoint:
    """State and logic behind the routes; one per daemon."""

    def __init__(
        self,
        settings: Settings,
        readers: BlobReaders,
        usage: UsageLog,
        metrics: AgentMetrics,
        request_model: RequestModel,
        arrivals: Arrivals,
    ) -> None:
        """`readers` hold a blob while a response streams it (eviction waits); `usage` records last
        use; `request_model` fetches a missing file through the node's swarm path, and `arrivals` say how
        much of a file still arriving may be streamed."""
        self.settings = settings
        self.readers = readers
        self.usage = usage
        self.metrics = metrics
        self.request_model = request_model
        self.arrivals = arrivals
        s = settings
        self.origin = s.origin.endpoint.rstrip("/")
        self.access = AccessCache(s.ops.access_ttl, s.ops.public_ttl)
        self._timeout = httpx.Timeout(s.origin.read_timeout, connect=s.origin.connect_timeout)

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout, follow_redirects=False, trust_env=False)

    def _origin_headers(self, auth: str | None) -> dict[str, str]:
        h = {"User-Agent": self.settings.origin.user_agent, "Accept-Encoding": "identity"}
        if auth:
            h["Authorization"] = auth
        return h

    # -- metadata ---------------------------------------------------------------------------

    async def api_models(self, request: Request, rest: str) -> Response:
        auth = request.headers.get("authorization")
        url = f"{self.origin}/api/models/{rest}"
        try:
            async with self._client() as client:
                resp = await client.get(url, params=request.query_params, headers=self._origin_headers(auth))
            if resp.status_code >= 500:
                raise _Unreachable(f"HTTP {resp.status_code}")
        except (httpx.TransportError, _Unreachable) as exc:
            log.warning("origin unreachable for /api/models/%s (%s); answering from the cache", rest, exc)
            return self._local_api(rest, auth)
        # Passed through, never learnt from: the client chose this request's query (`?expand=` leaves
        # fields out) and its token; access decisions come from the agent's own requests only.
        headers = _passed(resp)
        link = resp.headers.get("link")
        if link:
            headers["Link"] = link.replace(self.origin, str(request.base_url).rstrip("/"))
        return Response(resp.content, status_code=resp.status_code, headers=headers)

    # -- access -----------------------------------------------------------------------------

    async def check_access(self, repo_id: str, authorization: str | None) -> Response | None:
        """None when the client may read the repo's files, else the answer to send it (the origin's
        refusal, or 503 when the origin cannot be asked and no decision is in its TTL)."""
        credential = client_credential(authorization)
        if self.access.allowed(repo_id, credential):
            return None
        try:
            async with self._client() as client:
                visibility = self.access.visibility(repo_id) or await self._ask_visibility(client, repo_id)
                if visibility.public:
                    return None
                if credential is None:
                    status, message, code = visibility.refusal
                    return hub_error(status, message, code)
                return await self._ask_grant(client, repo_id, authorization, credential)
        except _Throttled as exc:
            return _origin_refusal(exc.response, "the origin is rate limiting this node; retry later")
        except (httpx.TransportError, _Unreachable) as exc:
            log.warning("origin unreachable for the access check of %s (%s)", repo_id, exc)
            return hub_error(503, f"origin unreachable: cannot check access to {repo_id}; retry later")

    async def _ask_visibility(self, client: httpx.AsyncClient, repo_id: str) -> Visibility:
        """The agent's own anonymous model-info request (fixed URL, no query, no client header)."""
        resp = await client.get(f"{self.origin}/api/models/{repo_id}", headers=self._origin_headers(None))
        if resp.status_code == 429:
            raise _Throttled(resp)
        if resp.status_code >= 500:
            raise _Unreachable(f"HTTP {resp.status_code}")
        visibility = visibility_of(repo_id, resp)
        self.access.set_visibility(repo_id, visibility)
        return visibility

    async def _ask_grant(
        self, client: httpx.AsyncClient, repo_id: str, authorization: str | None, credential: str
    ) -> Response | None:
        """The origin's `auth-check` with the client's own Authorization: 200 grants, nothing else does."""
        url = f"{self.origin}/api/models/{repo_id}/auth-check"
        resp = await client.get(url, headers=self._origin_headers(authorization))
        status = resp.status_code
        if status == 429:
            raise _Throttled(resp)
        if status >= 500:
            raise _Unreachable(f"HTTP {status}")
        if status == 200:
            self.access.grant(repo_id, credential)
            return None
        self.access.revoke(repo_id, credential)
        if 300 <= status < 400:
            return hub_error(*_redirected("auth check", repo_id, status))
        return _origin_refusal(resp, f"the origin refused access to {repo_id}")

    def _local_api(self, rest: str, auth: str | None) -> Response:
        parts = rest.split("/")
        if len(parts) < 2:
            return hub_error(503, "origin unreachable")
        repo_id = f"{parts[0]}/{parts[1]}"
        if not self.access.allowed(repo_id, client_credential(auth)):
            return hub_error(503, f"origin unreachable: cannot check access to {repo_id}; retry later")
        known = self.access.visibility(repo_id)
        repo = self._scan(repo_id)
        tail = parts[2:]
        rev = tail[1] if len(tail) >= 2 and tail[0] in ("revision", "tree") else "main"
        commits = repo.commit_for(rev) if repo else []
        if repo is None or not commits:
            return hub_error(503, f"origin unreachable and {repo_id}@{rev} is not in this node's cache")
        snap = repo.snapshots[commits[0]]
        if not tail or tail[0] == "revision":
            siblings = [self._sibling(repo.blobs, p, b) for p, b in sorted(snap.files.items())]
            body: Any = {
                "id": repo_id,
                "modelId": repo_id,
                "sha": snap.commit,
                "private": known.private if known else True,
                "gated": known.gated if known else False,
                "siblings": siblings,
            }
            return JSONResponse(body)
        if tail[0] == "tree":
            prefix = "/".join(tail[2:]).strip("/")
            entries = [
                self._tree_entry(repo.blobs, p, b)
                for p, b in sorted(snap.files.items())
                if not prefix or p.startswith(prefix + "/")
            ]
            return JSONResponse(entries)
        return hub_error(503, "origin unreachable")

    @staticmethod
    def _sibling(blobs: dict[str, int], path: str, blob_id: str) -> dict[str, Any]:
        size = blobs.get(blob_id, 0)
        s: dict[str, Any] = {"rfilename": path, "size": size, "blobId": blob_id}
        if len(blob_id) == 64:
            s["lfs"] = {"sha256": blob_id, "size": size, "pointerSize": 134}
        return s

    @staticmethod
    def _tree_entry(blobs: dict[str, int], path: str, blob_id: str) -> dict[str, Any]:
        size = blobs.get(blob_id, 0)
        e: dict[str, Any] = {"type": "file", "path": path, "size": size, "oid": blob_id}
        if len(blob_id) == 64:
            e["lfs"] = {"oid": blob_id, "size": size, "pointerSize": 134}
        return e

    def _cache(self, repo_id: str) -> RepoCache:
        return RepoCache(self.settings.cache_dir, self.settings.state_dir, repo_id)

    def _scan(self, repo_id: str) -> CachedRepo | None:
        return scan_repo(self._cache(repo_id).root)

    # -- files ------------------------------------------------------------------------------

    def _local_meta(self, repo_id: str, rev: str, path: str) -> FileMeta | None:
        cache = self._cache(repo_id)
        commit = rev if is_commit(rev) else cache.read_ref(rev)
        if not commit:
            return None
        try:
            link = cache.snapshot_file(commit, path)
            blob_id = os.path.basename(os.readlink(link))
            size = cache.blob_path(blob_id).stat().st_size
        except (OSError, WeightswarmError):
            return None
        return FileMeta(commit, blob_id, size)

    async def file_meta(self, repo_id: str, rev: str, path: str, auth: str | None) -> FileMeta | Response:
        refused = await self.check_access(repo_id, auth)
        if refused is not None:
            return refused
        local = self._local_meta(repo_id, rev, path)
        if local is not None and is_commit(rev):
            return local
        # Metadata only (which commit `rev` is, the blob id and size), asked with the client's own
        # token; access was decided above. An LFS file answers 302 here: its headers are the metadata.
        url = f"{self.origin}/{repo_id}/resolve/{quote(rev, safe='')}/{quote(path)}"
        try:
            async with self._client() as client:
                resp = await client.head(url, headers=self._origin_headers(auth))
            if resp.status_code >= 500:
                raise _Unreachable(f"HTTP {resp.status_code}")
        except (httpx.TransportError, _Unreachable) as exc:
            if local is not None:
                return local
            log.warning("origin unreachable for %s/%s (%s) and the file is not cached", repo_id, path, exc)
            return hub_error(503, f"origin unreachable and {repo_id}/{path} is not in this node's cache")
        if resp.status_code >= 400:
            if resp.status_code in (401, 403):
                self.access.revoke(repo_id, client_credential(auth))
            return Response(b"", status_code=resp.status_code, headers=_passed(resp))
        h = resp.headers
        etag = (h.get("x-linked-etag") or h.get("etag") or "").removeprefix("W/").strip('"').lower()
        size = h.get("x-linked-size") or h.get("content-length") or ""
        commit = (h.get("x-repo-commit") or "").lower()
        if not is_commit(commit) or not is_blob_id(etag) or not size.isdigit():
            return hub_error(502, f"the origin sent no usable commit/ETag/size for {repo_id}/{path}")
        return FileMeta(commit, etag, int(size))

    async def resolve(self, request: Request, org: str, name: str, rev: str, path: str) -> Response:
        repo_id = f"{org}/{name}"
        try:
            check_repo_id(repo_id)
            safe_relpath(path)
        except WeightswarmError as exc:
            return hub_error(400, str(exc))
        meta = await self.file_meta(repo_id, rev, path, request.headers.get("authorization"))
        if isinstance(meta, Response):
            return meta
        headers = meta.headers()
        if request.method == "HEAD":
            headers["Content-Length"] = str(meta.size)
            return Response(b"", headers=headers, media_type="application/octet-stream")
        readers = self.readers
        await asyncio.to_thread(readers.acquire, meta.blob_id)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                readers.release(meta.blob_id)

        try:
            cache = self._cache(repo_id)
            # The bytes may be in another repo's folder (shared content): served from there as they are.
            blob: Path | None = cache.blob_path(meta.blob_id)
            if not cache.blob_is_complete(meta.blob_id, meta.size):
                blob = cache.complete_elsewhere(meta.blob_id, meta.size)
            wanted = parse_range(request.headers.get("range"), meta.size)
            if wanted is not None and self.arrivals.failed_recently(meta.blob_id):
                # A stream of this blob was cut after a failed check: a ranged request may be the client
                # resuming on top of bytes that were wrong. The whole file (200, as a server may answer a
                # Range) makes it start over: huggingface_hub truncates its partial file then.
                wanted = None
            elif wanted == "unsatisfiable":
                release()
                return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{meta.size}"})
            elif blob is not None:
                self.usage.touch([meta.blob_id])
                if wanted is None:
                    self.metrics.served_bytes.inc(meta.size)
                return FileResponse(
                    blob,
                    headers=headers,
                    media_type="application/octet-stream",
                    background=BackgroundTask(release),
                )
            if blob is not None:
                arrival: Arrival | Response = Arrival.whole(meta.blob_id, meta.size, blob)
            else:
                first = wanted[0] if isinstance(wanted, tuple) else 0
                arrival = await self._arriving(repo_id, meta, path, request, first)
            if isinstance(arrival, Response):
                release()
                return arrival
            self.usage.touch([meta.blob_id])
            if wanted is None:
                self.metrics.served_bytes.inc(meta.size)
            span = wanted if isinstance(wanted, tuple) else None
            return arrival_response(arrival, span, headers, self.settings.ops.hf_fetch_timeout, release)
        except BaseException:
            release()
            raise

    async def _arriving(
        self, repo_id: str, meta: FileMeta, path: str, request: Request, start: int
    ) -> Arrival | Response:
        """Start fetching a file the node does not have, and return its arrival once bytes from `start` on
        are servable (or it is whole); an error response when the fetch cannot start or fails first.

        Waiting for the first byte (not answering at once) keeps the Hub's error statuses for fetches
        that fail early (no access, not found); once bytes flow, the client's read timeout sees them."""
        job = self._fetch(repo_id, meta, path, request.headers.get("authorization"), request)
        if isinstance(job, Response):
            return job
        cache = self._cache(repo_id)
        deadline = time.monotonic() + self.settings.ops.hf_fetch_timeout
        waiter = id(object())
        waited: Arrival | None = None
        try:
            while True:
                arrival = self.arrivals.get(meta.blob_id)
                if arrival is not waited:
                    if waited is not None:
                        waited.want(waiter, None)
                    waited = arrival
                if arrival is not None:
                    if arrival.ready > start or arrival.state == "finished":
                        return arrival
                    # A producer that picks its piece order (libtorrent) starts where this client reads.
                    arrival.want(waiter, start)
                blob = cache.blob_path(meta.blob_id)
                if cache.blob_is_complete(meta.blob_id, meta.size):
                    return Arrival.whole(meta.blob_id, meta.size, blob)
                if job.done:
                    status = job.status()
                    if status.phase != "Ready":
                        failed = f"fetching {repo_id}/{path} failed: {status.error}"
                        return hub_error(502, failed, commit=meta.commit)
                if time.monotonic() > deadline or self.arrivals.closed:
                    return hub_error(504, f"{repo_id}/{path} still downloading; retry", commit=meta.commit)
                await asyncio.sleep(STREAM_POLL)
        finally:
            if waited is not None:
                waited.want(waiter, None)

    def _fetch(
        self, repo_id: str, meta: FileMeta, path: str, authorization: str | None, request: Request
    ) -> Job | Response:
        """Bring one file into the cache through the daemon's fetch path with the client's own token
        (never the node's: `lend` stays False), counted against the client's job limit (a client being
        one IP). Clients asking for the same file join one job, and a client that goes away cancels
        nothing: the job runs on for the others and for the cache."""
        scheme, _, token = (authorization or "").partition(" ")
        who = f"hf:{request.client.host if request.client else 'unknown'}"
        try:
            return self.request_model(
                repo_id,
                meta.commit,
                include=[glob.escape(path)],
                token=token.strip() if scheme.lower() == "bearer" and token.strip() else None,
                lend=False,
                client=who,
            )
        except BusyError as exc:
            retry = {"Retry-After": str(BUSY_RETRY_AFTER)}
            return hub_error(429, str(exc), commit=meta.commit, headers=retry)
        except WeightswarmError as exc:
            return hub_error(503, str(exc), commit=meta.commit)


def hf_router(endpoint: HfEndpoint) -> APIRouter:
    router = APIRouter(tags=["huggingface"])
    metrics = endpoint.metrics

    @router.get("/api/models/{rest:path}")
    async def api_models(rest: str, request: Request) -> Response:
        resp = await endpoint.api_models(request, rest)
        metrics.hf_requests.labels("api", str(resp.status_code)).inc()
        return resp

    @router.api_route("/{org}/{name}/resolve/{rev}/{path:path}", methods=["GET", "HEAD"])
    async def resolve(org: str, name: str, rev: str, path: str, request: Request) -> Response:
        resp = await endpoint.resolve(request, org, name, rev, path)
        metrics.hf_requests.labels("resolve", str(resp.status_code)).inc()
        return resp

    return router
