"""A blob's swarm state (now, or long-polled until it changes) and the addresses of the agents."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from tracker.metainfo import check_blob_id
from tracker.routes.access import Access
from tracker.routes.swarm import BlobSwarms, holder_json
from tracker.settings import TrackerSettings
from tracker.store import LeaseStore, PeerStore


def blob_router(
    settings: TrackerSettings, swarms: BlobSwarms, leases: LeaseStore, peer_store: PeerStore, access: Access
) -> APIRouter:
    """GET /v1/peers, /v1/blobs/<id> and /v1/blobs/<id>/wait."""
    router = APIRouter(tags=["blobs"])

    async def blob_state(blob_id: str) -> dict[str, Any]:
        infohash, counts = await swarms.counts(blob_id)
        holders = await leases.lease_holders(blob_id)
        return {
            "blob_id": blob_id,
            "infohash": infohash,
            "seeders": counts.complete,
            "leechers": counts.incomplete,
            "lease": holder_json(holders[0]) if holders else None,
            "holders": [h.node_id for h in holders],
        }

    @router.get("/v1/peers", dependencies=access.agent)
    async def peers() -> dict[str, list[str]]:
        """The addresses of every peer that announced lately, any swarm. An announce needs the
        passkey, so these are the cluster's agents: each agent admits BitTorrent connections from
        these only (agent.swarm.gate). Agent role: where the agents are is theirs to know."""
        return {
            "addresses": sorted(str(ipaddress.ip_address(ip)) for ip in await peer_store.peer_addresses())
        }

    @router.get("/v1/blobs/{blob_id}", dependencies=access.read)
    async def get_blob(blob_id: str) -> dict[str, Any]:
        """A blob's swarm state: infohash (or null), seeders, leechers, lease holder (or null)."""
        return await blob_state(check_blob_id(blob_id))

    @router.get("/v1/blobs/{blob_id}/wait", dependencies=access.read)
    async def wait_blob(
        blob_id: str,
        timeout: Annotated[float, Query(ge=0, description="Seconds; capped by the tracker.")] = 10.0,
    ) -> dict[str, Any]:
        """Long-poll: returns the blob state as soon as it has metainfo and a seeder, or changes
        from what it was when the request came in, or when the (capped) timeout passes."""
        check_blob_id(blob_id)
        deadline = time.monotonic() + min(timeout, settings.max_wait)
        state = await blob_state(blob_id)
        key = _state_key(state)
        while not (state["infohash"] and state["seeders"] > 0) and time.monotonic() < deadline:
            await asyncio.sleep(min(settings.wait_poll, max(deadline - time.monotonic(), 0)))
            state = await blob_state(blob_id)
            if _state_key(state) != key:
                break
        return state

    return router


def _state_key(state: dict[str, Any]) -> tuple[Any, ...]:
    return state["infohash"], state["seeders"], state["leechers"], tuple(state["holders"])
