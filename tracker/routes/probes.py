"""What orchestrators and Prometheus ask: liveness, readiness (with the store's epoch), metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from tracker.errors import StoreUnavailableError
from tracker.metrics import Metrics
from tracker.state_loss import StateLoss
from tracker.store import StoreLifecycle


def probe_router(store: StoreLifecycle, state_loss: StateLoss, metrics: Metrics) -> APIRouter:
    """GET /healthz, /readyz and /metrics (no token: probes and scrapers hold none)."""
    router = APIRouter(tags=["ops"])

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        """The store answers; `epoch` changes when the swarm state was lost (`Store.epoch`)."""
        try:
            await store.ping()
            epoch = await state_loss.check()
        except StoreUnavailableError as exc:
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok", "epoch": epoch})

    @router.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Prometheus exposition."""
        return Response(await metrics.render(store), media_type="text/plain; version=0.0.4")

    return router
