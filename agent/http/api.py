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

`create_app(daemon)` builds the app; other routers (an HF-compatible read endpoint, /metrics)
are added with `app.include_router(...)` by whoever owns them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from agent.core.errors import WeightswarmError
from agent.core.settings import HF_TOKEN_HEADER

if TYPE_CHECKING:
    from agent.daemon.node import Daemon

_MAX_JOB_WAIT = 60.0


class FetchRequest(BaseModel):
    repo_id: str = Field(min_length=1, max_length=200)
    revision: str = Field(default="main", min_length=1, max_length=255)
    include: list[str] = Field(default_factory=list, max_length=256)
    exclude: list[str] = Field(default_factory=list, max_length=256)


def _daemon(request: Request) -> Daemon:
    daemon: Daemon = request.app.state.daemon
    return daemon


def fetch_router() -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.post("/fetch", status_code=202)
    def start_fetch(
        body: FetchRequest,
        request: Request,
        hf_token: str | None = Header(default=None, alias=HF_TOKEN_HEADER, max_length=4096),
    ) -> dict[str, Any]:
        try:
            job = _daemon(request).request_model(
                body.repo_id, body.revision, include=body.include, exclude=body.exclude, token=hf_token
            )
        except WeightswarmError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        return job.status().to_json()

    @router.get("/jobs")
    def list_jobs(request: Request) -> list[dict[str, Any]]:
        return [job.status().to_json() for job in _daemon(request).jobs.all()]

    @router.get("/jobs/{job_id}")
    async def get_job(job_id: str, request: Request, wait: float = 0.0) -> dict[str, Any]:
        job = _daemon(request).jobs.get(job_id)
        if job is None:
            raise HTTPException(
                status_code=404, detail=f"no job {job_id!r} (finished jobs are kept for a while)"
            )
        if wait > 0:
            await asyncio.to_thread(job.wait, min(wait, _MAX_JOB_WAIT))
        return job.status().to_json()

    @router.get("/models")
    def list_models(request: Request) -> list[dict[str, Any]]:
        return _daemon(request).list_models()

    return router


def probe_router() -> APIRouter:
    router = APIRouter()

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    def readyz(request: Request) -> JSONResponse:
        problems = _daemon(request).problems()
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    return router


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(title="weightswarm agent", version="0.1.0")
    app.state.daemon = daemon
    app.include_router(probe_router())
    app.include_router(fetch_router())
    daemon.ops.include_routes(app)  # /metrics, admin routes, the HF-compatible endpoint (nodeops)
    return app
