"""/announce and /scrape as FastAPI routes, so that they appear in the OpenAPI document.

In a running tracker the ASGI front (`tracker.app.TrackerApp`) answers them before FastAPI
sees them; these answer only when the API is served alone, and check the passkey too so
that serving it alone is no way around it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tracker import announce as bt
from tracker.auth import passkey_ok
from tracker.settings import TrackerSettings
from tracker.store import PeerStore

_DOC: dict[str, Any] = {
    "tags": ["bittorrent"],
    "response_class": Response,
    "responses": {
        200: {"content": {"text/plain": {}}, "description": "bencoded dict; errors as `failure reason`"}
    },
}


def bittorrent_router(settings: TrackerSettings, peers: PeerStore) -> APIRouter:
    """GET /announce and /scrape, with or without the passkey in the path."""
    router = APIRouter()

    def refused(request: Request) -> Response | None:
        if passkey_ok(settings, request.path_params.get("passkey", ""), request.scope["query_string"]):
            return None
        return Response(bt.failure(bt.PASSKEY_REFUSED), media_type="text/plain")

    @router.get("/announce", **_DOC)
    @router.get("/announce/{passkey}", **_DOC)
    async def announce(request: Request) -> Response:
        """BEP 3 announce, at /announce/<passkey> (or ?passkey=): a missing or wrong passkey gets a
        `failure reason` and nothing is stored. Query: info_hash, peer_id (20 raw bytes,
        percent-encoded), port, uploaded, downloaded, left, event (started|completed|stopped),
        compact (default 1, BEP 23; IPv6 peers in `peers6`, BEP 7), no_peer_id, numwant (default 50,
        capped), ip (ignored unless the tracker runs with --trust-announce-ip: the peer is listed at
        the connection's source address)."""
        if (refusal := refused(request)) is not None:
            return refusal
        client = request.client
        body, _ = await bt.announce(
            request.scope["query_string"], client.host if client else None, peers, settings
        )
        return Response(body, media_type="text/plain")

    @router.get("/scrape", **_DOC)
    @router.get("/scrape/{passkey}", **_DOC)
    async def scrape(request: Request) -> Response:
        """BEP 48 scrape at /scrape/<passkey>: one or more info_hash values; unknown torrents report
        zeros."""
        if (refusal := refused(request)) is not None:
            return refusal
        return Response(
            await bt.scrape(request.scope["query_string"], peers, settings), media_type="text/plain"
        )

    return router
