"""Origin leases: which nodes may download a blob from the origin, kept alive by heartbeats."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from tracker.metainfo import check_blob_id
from tracker.metrics import Metrics
from tracker.routes.access import Access
from tracker.routes.fields import NODE_ID
from tracker.routes.swarm import BlobSwarms, holder_json
from tracker.settings import TrackerSettings
from tracker.state_loss import StateLoss
from tracker.store import LeaseState, LeaseStore


class LeaseRequest(BaseModel):
    node_id: str = Field(pattern=NODE_ID, description="Stable id of the asking node (e.g. its node name).")
    ttl: float = Field(
        default=60, gt=0, le=3600, description="Seconds until the lease lapses without heartbeats."
    )
    stale_after: float | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="Also take over the lease of a holder whose reported bytes have not changed for "
        "this many seconds (counted from its grant if it never reported): a holder that stalls while "
        "its heartbeats keep the lease alive.",
    )


class HeartbeatRequest(BaseModel):
    node_id: str = Field(pattern=NODE_ID)
    ttl: float = Field(default=60, gt=0, le=3600)
    progress: int | None = Field(
        default=None,
        ge=0,
        description="Bytes of the blob the holder has now. While it stays the same the holder is idle, "
        "and after `stale_after` another node may take the lease over. Omitted: counts as progress.",
    )
    reclaim: bool = Field(
        default=False,
        description="A lease this node no longer holds (it lapsed while the tracker was unreachable, or "
        "was lost with the store's state) is granted again while a slot is free, instead of a 404.",
    )


def lease_router(
    settings: TrackerSettings,
    leases: LeaseStore,
    swarms: BlobSwarms,
    state_loss: StateLoss,
    access: Access,
    metrics: Metrics,
) -> APIRouter:
    """POST /v1/leases/<id> (acquire), POST .../heartbeat, DELETE /v1/leases/<id>?node_id= (release)."""
    router = APIRouter(tags=["leases"], dependencies=access.agent)

    @router.post("/v1/leases/{blob_id}")
    async def acquire(blob_id: str, body: LeaseRequest) -> dict[str, Any]:
        """Ask for the origin lease on a blob. Granted to at most `max_lease_holders` nodes; the same
        node asking again renews it, and its stall clock starts over (it started over). Others get
        granted=false and who holds it (`leases`: each holder's reported bytes and idle seconds),
        unless `stale_after` lets them take over the lease of a holder that made no progress for
        that long. A grant says how many seeders the blob has (`seeders`, counted after it). For
        `lease_amnesty` seconds after the store lost its state, only former holders get a lease, and a
        refusal says in `retry_in` when others may ask again."""
        ttl = min(body.ttl, settings.max_lease_ttl)
        amnesty = await state_loss.amnesty_left()
        if amnesty > 0:
            holders = await leases.lease_holders(check_blob_id(blob_id))
            if all(h.node_id != body.node_id for h in holders):  # the holders reclaim theirs first
                metrics.lease_denials.inc()
                # When to ask again: with no holder, nothing else (a metainfo, a heartbeat) will
                # come to end the asker's wait sooner.
                return {
                    **_lease_json(LeaseState(False, holders), body.node_id),
                    "retry_in": round(amnesty, 3),
                }
        state = await leases.acquire_lease(
            check_blob_id(blob_id), body.node_id, ttl, settings.max_lease_holders, body.stale_after
        )
        (metrics.lease_grants if state.granted else metrics.lease_denials).inc()
        _count_dropped(state, metrics)
        reply = _lease_json(state, body.node_id)
        if state.granted:
            # Counted after the grant, so a seeder that announced since the asker last looked is in it:
            # a holder told 0 goes to the origin at once, instead of waiting for its own announce's
            # answer to say the same (agent.fetch.sources.policy `_seeder_appeared`; about a second).
            reply["seeders"] = (await swarms.counts(blob_id))[1].complete
        return reply

    @router.post("/v1/leases/{blob_id}/heartbeat")
    async def heartbeat(blob_id: str, body: HeartbeatRequest) -> dict[str, Any]:
        """Keep a held lease alive, reporting the bytes the holder has (`progress`); with `reclaim`, a
        lease the node lost while a slot is free is its own again. 404 if nobody holds it any more, 409
        if others hold it now (e.g. took it over from an idle holder)."""
        ttl = min(body.ttl, settings.max_lease_ttl)
        reclaim = settings.max_lease_holders if body.reclaim else 0
        state = await leases.renew_lease(check_blob_id(blob_id), body.node_id, ttl, body.progress, reclaim)
        _count_dropped(state, metrics)
        if not state.granted:
            if state.holders:
                holders = ", ".join(h.node_id for h in state.holders)
                raise HTTPException(409, f"lease on {blob_id} lost: held by {holders}")
            raise HTTPException(404, f"no lease on {blob_id} held by this node (expired?)")
        return _lease_json(state, body.node_id)

    @router.delete("/v1/leases/{blob_id}")
    async def release(blob_id: str, node_id: Annotated[str, Query(pattern=NODE_ID)]) -> dict[str, bool]:
        """Give a lease back (done, or failed) so another node can take it at once."""
        return {"released": await leases.release_lease(check_blob_id(blob_id), node_id)}

    return router


def _count_dropped(state: LeaseState, metrics: Metrics) -> None:
    """Count the leases the store dropped while answering: expired ones, and ones taken over."""
    metrics.lease_expiries.inc(state.expired)
    metrics.lease_takeovers.inc(state.taken_over)


def _lease_json(state: LeaseState, node_id: str) -> dict[str, Any]:
    return {
        "granted": state.granted,
        "holder": state.holders[0].node_id if state.holders else None,
        "expires_in": state.expires_in(node_id)
        if state.granted
        else (state.holders[0].expires_in if state.holders else 0),
        "holders": [h.node_id for h in state.holders],
        "leases": [holder_json(h) for h in state.holders],
    }
