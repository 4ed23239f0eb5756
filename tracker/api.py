"""The JSON API (FastAPI): builds each router of `tracker.routes` and wires them into one app.

This is the one place that knows the whole store; every router gets only the narrow interface
of its concern. /announce and /scrape are routes here too, so that they appear in the OpenAPI
document; in a running tracker the ASGI front in `tracker.app` answers them first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tracker.errors import ConflictError, PublishedRepoError, TrackerError, ValidationError
from tracker.metrics import Metrics
from tracker.routes.access import Access
from tracker.routes.bittorrent import bittorrent_router
from tracker.routes.blobs import blob_router
from tracker.routes.leases import lease_router
from tracker.routes.manifests import manifest_router
from tracker.routes.metainfo import metainfo_router
from tracker.routes.models import model_router
from tracker.routes.probes import probe_router
from tracker.routes.swarm import BlobSwarms
from tracker.settings import TrackerSettings
from tracker.state_loss import StateLoss
from tracker.store import Store, StoreLifecycle


def create_api(settings: TrackerSettings, store: Store, metrics: Metrics) -> FastAPI:
    """The JSON API over `store`; closing the app (its lifespan's end) closes the store."""
    state_loss = StateLoss(store, settings.lease_amnesty)
    access = Access(settings, metrics)
    swarms = BlobSwarms(metainfo=store, peers=store)
    app = FastAPI(
        title="weightswarm tracker",
        version="0.1.0",
        description="BitTorrent tracker (BEP 3/7/23/48), manifest registry and origin leases.",
        lifespan=_lifespan(store, state_loss),
    )
    _answer_errors(app, metrics)
    app.include_router(bittorrent_router(settings, peers=store))
    app.include_router(probe_router(store, state_loss, metrics))
    app.include_router(metainfo_router(store, access, metrics))
    app.include_router(blob_router(settings, swarms, leases=store, peer_store=store, access=access))
    app.include_router(lease_router(settings, store, swarms, state_loss, access, metrics))
    app.include_router(manifest_router(settings, store, access))
    app.include_router(model_router(manifests=store, peers=store, access=access, metrics=metrics))
    return app


def _lifespan(
    store: StoreLifecycle, state_loss: StateLoss
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state_loss.check()  # the epoch this tracker starts with: a later change is a loss
        sweeper = asyncio.create_task(store.sweep_expired(), name="tracker sweep")
        sweeper.add_done_callback(_sweep_ended)
        try:
            yield
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
            await store.close()

    return lifespan


def _sweep_ended(task: asyncio.Task[None]) -> None:
    """The sweep never returns: its end before shutdown is logged, so peers that stop expiring show."""
    if not task.cancelled():
        logging.getLogger("tracker").error("the expired-peer sweep stopped: %r", task.exception())


def _answer_errors(app: FastAPI, metrics: Metrics) -> None:
    """The tracker's expected errors as HTTP answers with their message: 400 invalid, 409 conflict,
    403 a published repo, 503 anything else (the store unavailable)."""

    @app.exception_handler(ValidationError)
    async def _invalid(_: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(ConflictError)
    async def _conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(PublishedRepoError)
    async def _published(_: Request, exc: PublishedRepoError) -> JSONResponse:
        metrics.refusals["role"].inc()
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(TrackerError)
    async def _unavailable(_: Request, exc: TrackerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)
