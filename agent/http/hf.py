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

Bytes: always from the local cache. A GET for a blob that is not complete yet starts a fetch job
through the daemon (peers first, the origin once per cluster) and answers when the blob is
complete and verified; bytes do not stream while they arrive (a partial blob is written out of
order by libtorrent and by parallel ranges, so "the first N bytes are final" is not known
cheaply). A client waiting for a large cold file needs a long read timeout
(`HF_HUB_DOWNLOAD_TIMEOUT`), or pre-pulls with `agent fetch` / the pod annotation.

Access: P2P must never widen access. Before a file is served, the client's Authorization is
checked with the origin (HEAD on the same resolve URL, redirects not followed: cheap); the
decision is kept for `ops.access_ttl` seconds under an HMAC of the header with a per-process key
(never the token itself, never on disk or in logs). The origin's model info saying a repo is
neither private nor gated is trusted for `ops.public_ttl` seconds without asking again. A refusal
is passed on with the origin's status and `X-Error-Code`, even when the blobs are cached. When the
origin is unreachable, only a decision still in its TTL lets cached files out; otherwise 503.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from starlette.background import BackgroundTask

from agent.cache.eviction import BlobReaders, CachedRepo, UsageLog, scan_repo
from agent.cache.layout import RepoCache, check_repo_id, is_blob_id, is_commit, safe_relpath
from agent.core.errors import WeightswarmError
from agent.core.settings import Settings
from agent.fetch.jobs import RequestModel
from agent.http.metrics import AgentMetrics

log = logging.getLogger(__name__)

_PASSED_HEADERS = ("content-type", "x-error-code", "x-error-message", "x-repo-commit", "x-request-id")


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


class AccessCache:
    """Who may read what, as the origin last said. Keys are HMACs of the Authorization header."""

    def __init__(self, ttl: float, public_ttl: float) -> None:
        self.ttl = ttl
        self.public_ttl = public_ttl
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._granted: dict[tuple[str, str], float] = {}
        self._public: dict[str, float] = {}

    def _who(self, auth: str | None) -> str:
        return hmac.new(self._key, (auth or "").encode(), hashlib.sha256).hexdigest()

    def grant(self, repo_id: str, auth: str | None) -> None:
        with self._lock:
            if len(self._granted) > 10_000:  # bounded: drop expired decisions
                now = time.monotonic()
                self._granted = {k: v for k, v in self._granted.items() if v > now}
            self._granted[(repo_id, self._who(auth))] = time.monotonic() + self.ttl

    def revoke(self, repo_id: str, auth: str | None) -> None:
        with self._lock:
            self._granted.pop((repo_id, self._who(auth)), None)

    def set_public(self, repo_id: str, public: bool) -> None:
        with self._lock:
            if public:
                self._public[repo_id] = time.monotonic() + self.public_ttl
            else:
                self._public.pop(repo_id, None)

    def allowed(self, repo_id: str, auth: str | None) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._public.get(repo_id, 0.0) > now:
                return True
            return self._granted.get((repo_id, self._who(auth)), 0.0) > now


def hub_error(status: int, message: str, code: str | None = None, commit: str | None = None) -> JSONResponse:
    """An error as the Hub sends it, so huggingface_hub raises its usual exception class."""
    headers = {"X-Error-Message": "".join(c if " " <= c <= "~" else "?" for c in message)}
    if code:
        headers["X-Error-Code"] = code
    if commit:
        headers["X-Repo-Commit"] = commit
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _passed(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() in _PASSED_HEADERS}


class _Unreachable(Exception):
    pass


class HfEndpoint:
    """State and logic behind the routes; one per daemon."""

    def __init__(
        self,
        settings: Settings,
        readers: BlobReaders,
        usage: UsageLog,
        metrics: AgentMetrics,
        request_model: RequestModel,
    ) -> None:
        """`readers` hold a blob while a response streams it (eviction waits); `usage` records last
        use; `request_model` fetches a missing file through the node's swarm path."""
        self.settings = settings
        self.readers = readers
        self.usage = usage
        self.metrics = metrics
        self.request_model = request_model
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
        parts = rest.split("/")
        if resp.status_code == 200 and (len(parts) == 2 or (len(parts) == 4 and parts[2] == "revision")):
            self._learn_visibility(f"{parts[0]}/{parts[1]}", resp.content)
        headers = _passed(resp)
        link = resp.headers.get("link")
        if link:
            headers["Link"] = link.replace(self.origin, str(request.base_url).rstrip("/"))
        return Response(resp.content, status_code=resp.status_code, headers=headers)

    def _learn_visibility(self, repo_id: str, body: bytes) -> None:
        try:
            info = json.loads(body)
        except ValueError:
            return
        if isinstance(info, dict):
            public = info.get("private") is False and info.get("gated") in (False, None)
            self.access.set_public(repo_id, public)

    def _local_api(self, rest: str, auth: str | None) -> Response:
        parts = rest.split("/")
        if len(parts) < 2:
            return hub_error(503, "origin unreachable")
        repo_id = f"{parts[0]}/{parts[1]}"
        if not self.access.allowed(repo_id, auth):
            return hub_error(503, f"origin unreachable: cannot check access to {repo_id}; retry later")
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
                "private": False,
                "gated": False,
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
        local = self._local_meta(repo_id, rev, path)
        if local is not None and is_commit(rev) and self.access.allowed(repo_id, auth):
            return local
        url = f"{self.origin}/{repo_id}/resolve/{quote(rev, safe='')}/{quote(path)}"
        try:
            async with self._client() as client:
                resp = await client.head(url, headers=self._origin_headers(auth))
            if resp.status_code >= 500:
                raise _Unreachable(f"HTTP {resp.status_code}")
        except (httpx.TransportError, _Unreachable) as exc:
            if local is not None and self.access.allowed(repo_id, auth):
                return local
            log.warning("origin unreachable for %s/%s (%s) and no access decision cached", repo_id, path, exc)
            return hub_error(503, f"origin unreachable: cannot check access to {repo_id}; retry later")
        if resp.status_code >= 400:
            self.access.revoke(repo_id, auth)
            return Response(b"", status_code=resp.status_code, headers=_passed(resp))
        self.access.grant(repo_id, auth)
        h = resp.headers
        etag = (h.get("x-linked-etag") or h.get("etag") or "").removeprefix("W/").strip('"').lower()
        size = h.get("x-linked-size") or h.get("content-length") or ""
        commit = (h.get("x-repo-commit") or "").lower()
        if (
            not is_commit(commit)
            or not is_blob_id(etag)
            or not size.isdigit()
        ):
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
        try:
            cache = self._cache(repo_id)
            # The bytes may be in another repo's folder (shared content): served from there as they are.
            blob: Path | None = cache.blob_path(meta.blob_id)
            if not cache.blob_is_complete(meta.blob_id, meta.size):
                blob = cache.complete_elsewhere(meta.blob_id, meta.size)
            if blob is None:
                failed = await self._fetch(repo_id, meta, path, request.headers.get("authorization"))
                if failed is not None:
                    readers.release(meta.blob_id)
                    return failed
                blob = cache.blob_path(meta.blob_id)
            self.usage.touch([meta.blob_id])
            if "range" not in request.headers:
                self.metrics.served_bytes.inc(meta.size)
            return FileResponse(
                blob,
                headers=headers,
                media_type="application/octet-stream",
                background=BackgroundTask(readers.release, meta.blob_id),
            )
        except BaseException:
            readers.release(meta.blob_id)
            raise

    async def _fetch(
        self, repo_id: str, meta: FileMeta, path: str, authorization: str | None
    ) -> Response | None:
        """Bring one file into the cache through the daemon's fetch path (with the client's own token);
        an error response on failure."""
        scheme, _, token = (authorization or "").partition(" ")
        try:
            job = self.request_model(
                repo_id,
                meta.commit,
                include=[glob.escape(path)],
                token=token.strip() if scheme.lower() == "bearer" and token.strip() else None,
            )
        except WeightswarmError as exc:
            return hub_error(503, str(exc), commit=meta.commit)
        done = await asyncio.to_thread(job.wait, self.settings.ops.hf_fetch_timeout)
        status = job.status()
        if not done:
            return hub_error(504, f"{repo_id}/{path} still downloading; retry", commit=meta.commit)
        if status.phase != "Ready":
            return hub_error(502, f"fetching {repo_id}/{path} failed: {status.error}", commit=meta.commit)
        return None


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
