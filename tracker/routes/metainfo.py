"""Blob metainfo: publishing and reading a blob's info dict, reporting one wrong, its quarantine."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from tracker.metainfo import check_blob_id, validate_info
from tracker.metrics import Metrics
from tracker.routes.access import Access
from tracker.routes.fields import NODE_ID
from tracker.store import MetainfoStore

BITTORRENT = "application/x-bittorrent"


class MetainfoReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    infohash: str = Field(pattern=r"^[0-9a-f]{40}$", description="The info dict found wrong.")
    reason: str = Field(min_length=1, max_length=500, description="What the reporting node saw.")
    node_id: str | None = Field(default=None, pattern=NODE_ID, description="The reporting node.")


def metainfo_router(metainfo: MetainfoStore, access: Access, metrics: Metrics) -> APIRouter:
    """PUT and GET /v1/blobs/<id>/metainfo, POST .../report, GET .../quarantine."""
    router = APIRouter(tags=["blobs"])

    @router.put(
        "/v1/blobs/{blob_id}/metainfo",
        dependencies=access.agent,
        openapi_extra={
            "requestBody": {"content": {BITTORRENT: {"schema": {"type": "string", "format": "binary"}}}}
        },
    )
    async def put_metainfo(
        blob_id: str,
        request: Request,
        infohash: Annotated[str | None, Query(description="If given, must equal sha1 of the body.")] = None,
    ) -> JSONResponse:
        """Publish a blob's bencoded info dict (canonical bencode, `name` = blob id, consistent piece
        table). Re-publishing the same bytes is a no-op (200); a different dict for the blob is 409,
        and so is a dict reported wrong (`/report`) less than `quarantine_hold` seconds ago."""
        expected = infohash or request.headers.get("x-infohash")
        body = await request.body()
        ih = validate_info(blob_id, body, expected)
        created = await metainfo.put_metainfo(blob_id, ih, body)
        return JSONResponse({"infohash": ih}, status_code=201 if created else 200)

    @router.get("/v1/blobs/{blob_id}/metainfo", dependencies=access.read, response_class=Response)
    async def get_metainfo(blob_id: str) -> Response:
        """The bencoded info dict of a blob (404 if none was published)."""
        meta = await metainfo.get_metainfo(check_blob_id(blob_id))
        if meta is None:
            raise HTTPException(404, f"no metainfo for blob {blob_id}")
        return Response(meta[1], media_type=BITTORRENT, headers={"x-infohash": meta[0]})

    @router.post("/v1/blobs/{blob_id}/metainfo/report", dependencies=access.agent)
    async def report_metainfo(blob_id: str, body: MetainfoReport, request: Request) -> dict[str, Any]:
        """Report the blob's info dict wrong: a node's bytes that match every one of its piece hashes
        failed the blob's own hash (sha256 / git sha1), or bytes verified end to end do not match its
        pieces. If `infohash` is still the blob's dict it is removed and kept as a quarantine record
        (`quarantined`: true), so the next node to hold verified bytes publishes the right one; the
        same dict is refused for `quarantine_hold` seconds. A stale report removes nothing. The
        tracker cannot check a report: see docs/security.md for what that allows."""
        client = request.client
        removed = await metainfo.quarantine_metainfo(
            check_blob_id(blob_id), body.infohash, body.reason, body.node_id, client.host if client else None
        )
        if removed:
            metrics.metainfo_quarantined.inc()
        current = await metainfo.get_metainfo(blob_id)
        return {"quarantined": removed, "infohash": body.infohash, "current": current[0] if current else None}

    @router.get("/v1/blobs/{blob_id}/metainfo/quarantine", dependencies=access.read)
    async def quarantine(blob_id: str) -> dict[str, Any]:
        """The blob's info dicts reported wrong, oldest first: infohash, reason, the reporting node's
        self-declared id and its address, and when (unix time)."""
        records = await metainfo.quarantined(check_blob_id(blob_id))
        return {
            "blob_id": blob_id,
            "quarantined": [
                {
                    "infohash": r.infohash,
                    "reason": r.reason,
                    "reporter": r.reporter,
                    "address": r.address,
                    "at": r.at,
                }
                for r in records
            ],
        }

    return router
