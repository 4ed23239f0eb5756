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
arrives (agent.cache.stream, agent.cache.arrivals): the response starts with the first servable bytes,
carries the whole file's Content-Length (or the range's), and goes on in order, so an unmodified client
with its default read timeout sees a download, not silence. Servable means written by the origin engine
(the trust of a direct origin download) or in pieces that passed their hash check (from peers); the
last byte waits for the end-to-end check, and a blob that fails it cuts the response short. Clients
asking for the same file share one fetch; one that hangs up cancels nothing. HEAD answers from the
origin's metadata at once and fetches nothing.

Access (agent.http.hf_access): a file goes out only when the origin says the repo is public or grants
the client's own token; a refusal is passed on, even when the blobs are cached. What passes from the
origin's answers to a client, and that nothing Xet does: agent.http.hf_answers.

Metadata: the origin's `resolve` HEAD, followed across redirects on the origin's own host with the
client's Authorization (a small file's 307 to `/api/resolve-cache/...`) and never to another (an LFS
file's 302 to the CDN, whose headers are the metadata), read by `agent.origin.answers.file_metadata`.

The origin is reached only through its client API (agent.origin.hub_api `ClientApi`, which
agent.origin.kinds builds for the `--origin` kind): the proxied `/api/models/...` requests, the
`resolve` hops and the access checks, each with the client's own credential or none. An origin kind
without one (object storage has no Hub API to proxy) gets 501 with the reason on every route: its node
still fetches for its pods, but this endpoint has nothing to serve.

Fetches for HF clients use the client's own token, never the node's, and count against the
per-client job limit (`daemon.max_jobs_per_client`, a client being one IP): over it, 429 with
`Retry-After`.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from starlette.background import BackgroundTask

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.eviction import BlobReaders, CachedRepo, UsageLog, scan_repo
from agent.cache.layout import RepoCache, blob_homes, is_commit
from agent.cache.stream import POLL as STREAM_POLL
from agent.cache.stream import arrival_response, parse_range
from agent.core.errors import BusyError, OriginError, WeightswarmError
from agent.core.settings import Settings
from agent.fetch.jobs import Job, RequestModel
from agent.http.hf_access import AccessCache, OriginAccess, client_credential
from agent.http.hf_answers import XET_ROUTES, for_client, hub_error, passed, without_xet_hashes
from agent.http.hf_paths import ApiRequest, BadPath, ResolveRequest, api_request, resolve_request
from agent.http.metrics import AgentMetrics
from agent.origin.answers import file_metadata
from agent.origin.hub_api import ClientApi, Unreachable
from agent.origin.kinds import NoClientApi, open_client_api

log = logging.getLogger(__name__)

BUSY_RETRY_AFTER = 10
"""Seconds a client over its fetch-job limit is told to wait (`Retry-After`; huggingface_hub honours it)."""
SAY_AGAIN = 300.0
"""Seconds between the lines saying a repo is served from the cache through an outage: one line per repo,
not one per request (a snapshot_download is a request per file)."""
_MAX_SAID = 1024
"""Repos remembered for SAY_AGAIN at most (beyond, the oldest may be said again sooner)."""


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
        self.access = AccessCache(s.ops.access_ttl, s.ops.public_ttl)
        self.api: ClientApi | None = None
        self.not_served = ""
        """Why every request is refused when the origin has no client API (object storage), else ""."""
        try:
            self.api = open_client_api(s.origin)
        except NoClientApi as exc:
            # Not a start failure: the node still fetches for its pods; only this endpoint has nothing
            # to proxy. Asking such an origin's URL over HTTP would only look like an outage to a client.
            self.not_served = str(exc)
        self.checker = None if self.api is None else OriginAccess(self.api, self.access, metrics.names.repo)
        self._said: OrderedDict[str, float] = OrderedDict()
        self._said_lock = threading.Lock()

    def _serving_cached(self, repo_id: str, why: Exception) -> None:
        """One line per repo (every SAY_AGAIN seconds) that its cached files go out without the origin."""
        now = time.monotonic()
        with self._said_lock:
            if now - self._said.get(repo_id, float("-inf")) < SAY_AGAIN:
                return
            self._said[repo_id] = now
            self._said.move_to_end(repo_id)
            while len(self._said) > _MAX_SAID:
                self._said.popitem(last=False)
        scrub = self.metrics.names.scrubber(repo_id, "main")  # names it as metrics do
        log.warning("%s", scrub(f"origin unreachable ({why}): serving {repo_id} from this node's cache to "
                                "clients whose access decision is still fresh"))

    # -- metadata ---------------------------------------------------------------------------

    async def api_models(self, request: Request, rest: str) -> Response:
        if self.api is None:
            return hub_error(501, self.not_served)
        auth = request.headers.get("authorization")
        parts = [p for p in rest.split("/") if p]
        if len(parts) >= 3 and parts[2] in XET_ROUTES:
            # A Xet token would send the client to the CAS hosts, past the node (agent.http.hf_answers).
            # Only a client that planned from a listing cached before it came here asks for one.
            return hub_error(
                404,
                "Xet is not served through this endpoint: files download over HTTP (resolve). Set "
                "HF_HUB_DISABLE_XET=1, or remove the client cache's trees/ folder of this repo.",
            )
        try:
            asked = api_request(request.scope["raw_path"])
        except BadPath as exc:
            return hub_error(exc.status, str(exc))
        try:
            answer = await self.api.get(
                asked.origin_path(), asked.params(request.query_params.multi_items()), auth
            )
        except Unreachable as exc:
            log.debug("origin unreachable for /api/models/%s (%s); answering from the cache", rest, exc)
            return self._local_api(asked, auth, exc)
        # Passed through, never learnt from: the client chose this request's query (`?expand=` leaves
        # fields out) and its token; access decisions come from the agent's own requests only.
        headers = passed(answer.headers)
        link = answer.headers.get("link")
        if link:
            headers["Link"] = link.replace(self.api.endpoint, str(request.base_url).rstrip("/"))
        return Response(without_xet_hashes(answer.body), status_code=answer.status, headers=headers)

    # -- access -----------------------------------------------------------------------------

    async def check_access(self, repo_id: str, authorization: str | None) -> Response | None:
        """None when the client may read the repo's files, else the answer to send it."""
        assert self.checker is not None  # `resolve` refuses first when the origin has no client API
        return await self.checker.check(repo_id, authorization)

    def _local_api(self, asked: ApiRequest, auth: str | None, why: Unreachable) -> Response:
        """The origin unreachable: a model's info or tree from this node's cache, for a client the origin
        let read the repo within the access TTL."""
        repo_id = asked.repo_id
        if not self.access.allowed(repo_id, client_credential(auth)):
            return hub_error(503, f"origin unreachable: cannot check access to {repo_id}; retry later")
        known = self.access.visibility(repo_id)
        repo = self._scan(repo_id)
        rev = asked.revision or "main"
        commits = repo.commit_for(rev) if repo else []
        if repo is None or not commits:
            return hub_error(503, f"origin unreachable and {repo_id}@{rev} is not in this node's cache")
        snap = repo.snapshots[commits[0]]
        if asked.route in ("info", "revision", "tree"):
            self._serving_cached(repo_id, why)
        if asked.route in ("info", "revision"):
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
        if asked.route == "tree":
            prefix = asked.path
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
        assert self.api is not None  # `resolve` refuses first when the origin has no client API
        refused = await self.check_access(repo_id, auth)
        if refused is not None:
            return refused
        local = self._local_meta(repo_id, rev, path)
        if local is not None and is_commit(rev):
            return local
        # Metadata only (which commit `rev` is, the blob id and size), asked with the client's own
        # token; access was decided above.
        try:
            hops = await self.api.resolve_hops(ResolveRequest(repo_id, rev, path).origin_path(), auth)
        except Unreachable as exc:
            if local is not None:
                self._serving_cached(repo_id, exc)
                return local
            scrub = self.metrics.names.scrubber(repo_id, rev)
            said = scrub(f"origin unreachable for {repo_id}/{path} ({exc})")
            log.warning("%s and the file is not cached", said)
            return hub_error(503, f"origin unreachable and {repo_id}/{path} is not in this node's cache")
        except OriginError as exc:
            return hub_error(502, str(exc))
        last = hops[-1]
        if last.status >= 400:
            if last.status in (401, 403):
                self.access.revoke(repo_id, client_credential(auth))
            return Response(b"", status_code=last.status, headers=passed(last.headers))
        what = f"{repo_id}/{path}"
        try:
            meta = file_metadata(hops, what)
        except OriginError as exc:
            return hub_error(502, str(exc))
        commit = meta.commit or (rev if is_commit(rev) else None)
        if commit is None:
            return hub_error(502, f"{what}: the origin's resolve answer has no X-Repo-Commit")
        if meta.blob_id is None:
            return hub_error(502, f"{what}: the origin's resolve answer names no content id (no ETag)")
        size = meta.size if meta.size is not None else self._cached_size(meta.blob_id)
        if size is None:
            return hub_error(
                502,
                f"{what}: the origin's resolve answer gives no size (no X-Linked-Size, no Content-Length "
                "on its final answer) and the file is not in this node's cache",
                commit=commit,
            )
        return FileMeta(commit, meta.blob_id, size)

    def _cached_size(self, blob_id: str) -> int | None:
        """The length of a blob this node holds in any repo of its cache: `blobs/<id>` appears only
        once complete and checked, so its size is the file's."""
        for home in blob_homes(self.settings.cache_dir, blob_id):
            try:
                return home.stat().st_size
            except OSError:
                continue
        return None

    async def resolve(self, request: Request) -> Response:
        if self.api is None:
            return hub_error(501, self.not_served)
        try:
            asked = resolve_request(request.scope["raw_path"])
        except BadPath as exc:
            return hub_error(exc.status, str(exc))
        repo_id, rev, path = asked.repo_id, asked.revision, asked.path
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

    # Every answer leaves through for_client: whatever built it, no Xet header or link reaches a client.
    @router.get("/api/models/{rest:path}")
    async def api_models(rest: str, request: Request) -> Response:  # `rest` for the Xet check and logs
        resp = for_client(await endpoint.api_models(request, rest))
        metrics.hf_requests.labels("api", str(resp.status_code)).inc()
        return resp

    @router.api_route("/{org}/{name}/resolve/{rev}/{path:path}", methods=["GET", "HEAD"])
    async def resolve(request: Request) -> Response:  # the path is read raw (agent.http.hf_paths)
        resp = for_client(await endpoint.resolve(request))
        metrics.hf_requests.labels("resolve", str(resp.status_code)).inc()
        return resp

    return router
