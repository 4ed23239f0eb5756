"""The daemon's local HTTP API (FastAPI), used by `agent fetch --agent`, `agent ls` and probes.

Routes (all JSON):
    POST /v1/fetch            {repo_id, revision?, include?, exclude?} -> 202 job status (joins a running
                              job for the same request and token); header `X-HF-Token`: the requester's
                              HF token, used for this job's origin calls (never stored or logged)
    GET  /v1/jobs             every known job's status
    GET  /v1/jobs/{id}        one job: phase, bytes done/total, bytes from peers/origin/cache, per-file
                              progress, error, snapshot path; `?wait=S` blocks up to S s for it to finish
    GET  /v1/models           models in the cache (for `agent ls`)
    GET  /healthz             the process is alive
    GET  /readyz              the swarm session is up and no supervised task is failing (503 otherwise)

`create_app(node, routers)` builds the app from a `NodeApi` (the daemon's callables, never the
daemon) plus the routers others own (metrics, admin routes, the HF-compatible endpoint).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from agent.core.errors import WeightswarmError
from agent.core.settings import HF_TOKEN_HEADER
from agent.fetch.jobs import JobTable, RequestModel
from agent.http.errors import http_error

_MAX_JOB_WAIT = 60.0


class FetchRequest(BaseModel):
    repo_id: str = Field(min_length=1, max_length=200)
    revision: str = Field(default="main", min_length=1, max_length=255)
    include: list[str] = Field(default_factory=list, max_length=256)
    exclude: list[str] = Field(default_factory=list, max_length=256)


@dataclass(frozen=True)
class NodeApi:
    """What the local API needs from the node, bound by the daemon."""

    request_model: RequestModel
    jobs: JobTable
    list_models: Callable[[], list[dict[str, Any]]]
    """Models in the cache (`GET /v1/models`, `agent ls`)."""
    problems: Callable[[], list[str]]
    """Why the node is not ready; empty when it is (`/readyz`)."""


def fetch_router(node: NodeApi) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.post("/fetch", status_code=202)
    def start_fetch(
        body: FetchRequest,
        hf_token: str | None = Header(default=None, alias=HF_TOKEN_HEADER, max_length=4096),
    ) -> dict[str, Any]:
        try:
            job = node.request_model(
                body.repo_id, body.revision, include=body.include, exclude=body.exclude, token=hf_token
            )
        except WeightswarmError as exc:
            raise http_error(exc) from None
        return job.status().to_json()

    @router.get("/jobs")
    def list_jobs() -> list[dict[str, Any]]:
        return [job.status().to_json() for job in node.jobs.all()]

    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str, wait: float = 0.0) -> dict[str, Any]:
        job = node.jobs.get(job_id)
        if job is None:
            raise HTTPException(
                status_code=404, detail=f"no job {job_id!r} (finished jobs are kept for a while)"
            )
        if wait > 0:
            await asyncio.to_thread(job.wait, min(wait, _MAX_JOB_WAIT))
        return job.status().to_json()

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


def create_app(node: NodeApi, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The API app: probes, fetch and jobs, then `routers` in order (metrics, admin routes, and the
    HF-compatible endpoint last: its /{org}/{name}/resolve/... pattern is broad)."""
    app = FastAPI(title="weightswarm agent", version="0.1.0")
    app.include_router(probe_router(node))
    app.include_router(fetch_router(node))
    for router in routers:
        app.include_router(router)
    return app
