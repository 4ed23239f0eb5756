"""The daemon's HTTP API (FastAPI), served on three channels (docs/security.md has who may use which).

Routes (all JSON):
    POST /v1/fetch            {repo_id, revision?, include?, exclude?} -> 202 job status (joins a running
                              job for the same request and token); header `X-HF-Token`: the requester's
                              HF token, used for this job's origin calls (never stored or logged)
    GET  /v1/jobs/{id}        one job: phase, bytes done/total, bytes from peers/origin/cache, per-file
                              progress, error, snapshot path; `?wait=S` blocks up to S s for it to finish
    GET  /v1/jobs             every known job's status                   (admin channel only)
    GET  /v1/models           models in the cache, for `agent ls`        (admin channel only)
    GET  /healthz             the process is alive
    GET  /readyz              the swarm session is up and no supervised task is failing (503 otherwise)

Which channel gets which routes, and whether it lends the node's HF token, is decided once, in
`Channel`: the admin socket gets everything above plus the admin routes (agent.http.admin) and
lends; the pods' socket gets fetch and one job by id and never lends; the network listener gets
the probes, `/metrics` and the HF-compatible endpoint (agent.http.hf) only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StringConstraints
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.core.errors import WeightswarmError
from agent.core.settings import HF_TOKEN_HEADER
from agent.fetch.jobs import Job, JobTable, RequestModel
from agent.http.errors import http_error

_MAX_JOB_WAIT = 60.0
_WAITS_PER_CHANNEL = 32
"""Long polls (`?wait=`) one channel may hold open at once; more are answered at once, not held."""
MAX_BODY_BYTES = 64 * 1024
"""Largest request body any channel accepts (a fetch request is a few hundred bytes)."""

Glob = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class FetchRequest(BaseModel):
    repo_id: str = Field(min_length=1, max_length=200)
    revision: str = Field(default="main", min_length=1, max_length=255)
    include: list[Glob] = Field(default_factory=list, max_length=256)
    exclude: list[Glob] = Field(default_factory=list, max_length=256)
    source: str = Field(default="", max_length=1024)
    """A bucket URL (s3://, gs://, az://) for a model in object storage; the node must allow it."""


@dataclass(frozen=True)
class Channel:
    """How one channel's model requests are treated."""

    name: str
    lend_node_token: bool
    """A request without an HF token of its own fetches with the node's (only the node's own channel)."""
    client: str | None
    """Who its requests count as, for the per-client job limit; None = not limited (the node itself)."""
    sees_everything: bool
    """May list every job and the cache's models."""


ADMIN = Channel("admin", lend_node_token=True, client=None, sees_everything=True)
PODS = Channel("pods", lend_node_token=False, client="pods", sees_everything=False)


@dataclass(frozen=True)
class NodeApi:
    """What the local API needs from the node, bound by the daemon."""

    request_model: RequestModel
    jobs: JobTable
    list_models: Callable[[], list[dict[str, Any]]]
    """Models in the cache (`GET /v1/models`, `agent ls`)."""
    problems: Callable[[], list[str]]
    """Why the node is not ready; empty when it is (`/readyz`)."""


async def _until_ended(job: Job, timeout: float) -> None:
    """Until `job` is Ready or Failed, at most `timeout` seconds. Woken by the job's end on the event loop,
    not waited for in a worker thread: a long poll then holds no thread, and the threads stay free for
    the requests that need them; nor polled, which woke the loop ten times a second per waiting client."""
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed (the server stopped)
            loop.call_soon_threadsafe(ended.set)

    job.on_end(wake)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), timeout)
    finally:
        job.forget(wake)


def fetch_router(node: NodeApi, channel: Channel) -> APIRouter:
    router = APIRouter(prefix="/v1")
    waits = threading.BoundedSemaphore(_WAITS_PER_CHANNEL)

    @router.post("/fetch", status_code=202)
    def start_fetch(
        body: FetchRequest,
        hf_token: str | None = Header(default=None, alias=HF_TOKEN_HEADER, max_length=4096),
    ) -> dict[str, Any]:
        try:
            job = node.request_model(
                body.repo_id,
                body.revision,
                include=body.include,
                exclude=body.exclude,
                token=hf_token,
                lend=channel.lend_node_token,
                client=channel.client,
                source=body.source,
            )
        except WeightswarmError as exc:
            raise http_error(exc) from None
        return job.status().to_json()

    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str, wait: float = 0.0) -> dict[str, Any]:
        job = node.jobs.get(job_id)
        if job is None:
            raise HTTPException(
                status_code=404, detail=f"no job {job_id!r} (finished jobs are kept for a while)"
            )
        if wait > 0 and waits.acquire(blocking=False):
            try:
                await _until_ended(job, min(wait, _MAX_JOB_WAIT))
            finally:
                waits.release()
        return job.status().to_json()

    if channel.sees_everything:

        @router.get("/jobs")
        def list_jobs() -> list[dict[str, Any]]:
            return [job.status().to_json() for job in node.jobs.all()]

        @router.get("/models")
        def list_models() -> list[dict[str, Any]]:
            return node.list_models()

    return router


def probe_router(node: NodeApi) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    def readyz() -> JSONResponse:
        problems = node.problems()
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    return router


class BodyLimit:
    """ASGI middleware: a request whose body is larger than `limit` bytes gets 413 before it reaches
    a route (by its Content-Length, or as its chunks arrive); at most `limit` bytes are buffered."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._too_large(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # e.g. a long poll listening for the client leaving
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"detail": f"request body larger than {self.limit} bytes"}, status_code=413)
        await response(scope, receive, send)


def create_app(node: NodeApi, channel: Channel | None, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """One channel's app: probes, model requests when `channel` is given (not on the network), then
    `routers` in order (metrics, admin routes, and the HF-compatible endpoint last: its
    /{org}/{name}/resolve/... pattern is broad)."""
    app = FastAPI(title="weightswarm agent", version="0.1.0")
    app.add_middleware(BodyLimit)
    app.include_router(probe_router(node))
    if channel is not None:
        app.include_router(fetch_router(node, channel))
    for router in routers:
        app.include_router(router)
    return app
