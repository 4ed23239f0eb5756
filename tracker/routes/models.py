"""The model list: every registered model, its revisions and files, and the swarm health of each."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from tracker.auth import Role
from tracker.metrics import Metrics
from tracker.routes.access import Access
from tracker.store import ManifestStore, ModelEntry, PeerStore, SwarmCounts

Seeders = dict[bytes, list[tuple[bytes, int]]]
"""(packed IP, port) of the live seeders per infohash (`PeerStore.seeder_addresses`)."""


def model_router(manifests: ManifestStore, peers: PeerStore, access: Access, metrics: Metrics) -> APIRouter:
    """GET /v1/models."""
    router = APIRouter(tags=["manifests"])

    @router.get("/v1/models", dependencies=access.read)
    async def models(
        request: Request,
        holders: Annotated[
            bool,
            Query(
                description="Also list, per file and per commit, the BitTorrent listen addresses "
                "(ip:port) of the peers seeding it (per commit: every file with an infohash). "
                "Agent role only, as /v1/peers: where the agents are is theirs to know."
            ),
        ] = False,
    ) -> dict[str, Any]:
        """Every registered model with its revisions (the publisher's refs; a hub model has none),
        files and swarm health per commit (seeders/leechers per blob; complete_copies = fewest
        seeders over its blobs). With holders=true (agent role; 403 for the others): `holders`, the
        sorted "ip:port" of the seeders, per file and per commit (those seeding all its hashed files)."""
        role: Role = request.state.role
        if holders and role is not Role.AGENT:
            metrics.refusals["role"].inc()
            raise HTTPException(
                403,
                f"holders=true needs the agent role ({Role.AGENT.option}): peer addresses are the "
                f"agents' alone; the token given has the {role.value} role (leave holders out)",
            )
        entries = await manifests.list_models()
        hashes = sorted(
            {
                bytes.fromhex(f["infohash"])
                for e in entries
                for m in e.manifests.values()
                for f in m["files"]
                if f["infohash"]
            }
        )
        counts = await peers.scrape(hashes) if hashes else {}
        seeders = await peers.seeder_addresses(hashes) if holders and hashes else {}
        return {"models": [_model_json(entry, counts, seeders, holders) for entry in entries]}

    return router


def _model_json(
    entry: ModelEntry, counts: dict[bytes, SwarmCounts], seeders: Seeders, holders: bool
) -> dict[str, Any]:
    """One model: its commits, each with its files' swarm counts (and, with `holders`, seeders)."""
    commits = []
    for commit, manifest in entry.manifests.items():
        files = []
        everyone: set[str] | None = None
        for f in manifest["files"]:
            ih = bytes.fromhex(f["infohash"]) if f["infohash"] else None
            c = counts.get(ih, SwarmCounts()) if ih else SwarmCounts()
            row = {**f, "seeders": c.complete, "leechers": c.incomplete}
            if holders:
                addrs = sorted({_hostport(*a) for a in seeders.get(ih, [])}) if ih else []
                row["holders"] = addrs
                if ih:
                    everyone = set(addrs) if everyone is None else everyone & set(addrs)
            files.append(row)
        copies = min((f["seeders"] for f in files), default=0)
        item: dict[str, Any] = {
            "commit": commit,
            "published": bool(manifest.get("published")),
            "files": files,
            "complete_copies": copies,
        }
        if holders:
            item["holders"] = sorted(everyone or ())
        commits.append(item)
    return {
        "repo_id": entry.repo_id,
        "published": entry.published,
        "revisions": entry.revisions,
        "commits": commits,
    }


def _hostport(ip: bytes, port: int) -> str:
    """A BitTorrent listen address as "ip:port" ("[ip]:port" for IPv6)."""
    address = ipaddress.ip_address(ip)
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
