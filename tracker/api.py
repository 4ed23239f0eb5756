"""The JSON API (FastAPI): manifests, metainfo, leases, health and metrics.

/announce and /scrape are declared here too so that they appear in the OpenAPI
document; in a running tracker the ASGI front in `tracker.app` answers them first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from tracker import announce as bt
from tracker.auth import Role, passkey_ok, role_of
from tracker.errors import (
    ConflictError,
    PublishedRepoError,
    StoreUnavailableError,
    TrackerError,
    ValidationError,
)
from tracker.manifest import (
    check_commit,
    check_repo,
    check_revision,
    check_signature,
    validate_manifest,
)
from tracker.metainfo import check_blob_id, validate_info
from tracker.metrics import Metrics
from tracker.settings import TrackerSettings
from tracker.store import LeaseHolder, LeaseState, Store, SwarmCounts
from wirekit.tokens import bearer

BITTORRENT = "application/x-bittorrent"
NODE_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$"


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


class MetainfoReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    infohash: str = Field(pattern=r"^[0-9a-f]{40}$", description="The info dict found wrong.")
    reason: str = Field(min_length=1, max_length=500, description="What the reporting node saw.")
    node_id: str | None = Field(default=None, pattern=NODE_ID, description="The reporting node.")


class ManifestFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    path: str
    size: int
    blob_id: str
    infohash: str | None


class ManifestRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    revision: str | None = None
    files: list[ManifestFile]
    signature: str | None = Field(
        default=None,
        description="The publisher's Ed25519 signature (base64) of the manifest: required from the "
        "publisher role, refused from the agent role (agent.core.signing.manifest_payload).",
    )


class StateLoss:
    """Notices the store losing the swarm state under this running tracker (`Store.epoch` changed
    since it last looked) and says whether that was under `settings.lease_amnesty` seconds ago."""

    def __init__(self, store: Store, amnesty: float) -> None:
        self._store = store
        self._amnesty = amnesty
        self._seen: str | None = None
        self._at: float | None = None

    async def check(self) -> str:
        """The store's epoch now (noting a change)."""
        epoch = await self._store.epoch()
        if self._seen is not None and epoch != self._seen:
            self._at = time.monotonic()
        self._seen = epoch
        return epoch

    async def amnesty_left(self) -> float:
        """Seconds of amnesty left after the last loss: 0 when none is under way."""
        await self.check()
        return 0.0 if self._at is None else max(0.0, self._amnesty - (time.monotonic() - self._at))


def create_api(settings: TrackerSettings, store: Store, metrics: Metrics) -> FastAPI:
    state_loss = StateLoss(store, settings.lease_amnesty)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state_loss.check()  # the epoch this tracker starts with: a later change is a loss
        yield
        await store.close()

    app = FastAPI(
        title="weightswarm tracker",
        version="0.1.0",
        description="BitTorrent tracker (BEP 3/7/23/48), manifest registry and origin leases.",
        lifespan=lifespan,
    )

    def allow(*roles: Role) -> Callable[[Request], Awaitable[Role]]:
        """A dependency: the caller's role if it is one of `roles`; 401 without a known token, 403
        (naming the role needed) with a token of another role."""
        needed = " or ".join(f"the {r.value} role ({r.option})" for r in roles)

        async def caller(request: Request) -> Role:
            role = role_of(bearer(request.headers.get("authorization")), settings)
            if role is None:
                metrics.refusals["token"].inc()
                raise HTTPException(
                    401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
                )
            if role not in roles:
                metrics.refusals["role"].inc()
                raise HTTPException(403, f"this needs {needed}; the token given has the {role.value} role")
            request.state.role = role
            return role

        return caller

    read = [Depends(allow(Role.AGENT, Role.PUBLISHER, Role.READER))]
    agent_only = [Depends(allow(Role.AGENT))]
    manifest_writers = [Depends(allow(Role.AGENT, Role.PUBLISHER))]

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

    # -- BitTorrent (documented here; answered by the ASGI front) -------------------------
    bt_doc = {
        "responses": {
            200: {"content": {"text/plain": {}}, "description": "bencoded dict; errors as `failure reason`"}
        }
    }

    # They check the passkey here too, so the API served alone is no way around it.
    def bt_refused(request: Request) -> Response | None:
        if passkey_ok(settings, request.path_params.get("passkey", ""), request.scope["query_string"]):
            return None
        return Response(bt.failure(bt.PASSKEY_REFUSED), media_type="text/plain")

    @app.get("/announce", tags=["bittorrent"], response_class=Response, **bt_doc)  # type: ignore[arg-type]
    @app.get("/announce/{passkey}", tags=["bittorrent"], response_class=Response, **bt_doc)  # type: ignore[arg-type]
    async def announce(request: Request) -> Response:
        """BEP 3 announce, at /announce/<passkey> (or ?passkey=): a missing or wrong passkey gets a
        `failure reason` and nothing is stored. Query: info_hash, peer_id (20 raw bytes,
        percent-encoded), port, uploaded, downloaded, left, event (started|completed|stopped),
        compact (default 1, BEP 23; IPv6 peers in `peers6`, BEP 7), no_peer_id, numwant (default 50,
        capped), ip (ignored unless the tracker runs with --trust-announce-ip: the peer is listed at
        the connection's source address)."""
        refused = bt_refused(request)
        if refused is not None:
            return refused
        client = request.client
        body, _ = await bt.announce(
            request.scope["query_string"], client.host if client else None, store, settings
        )
        return Response(body, media_type="text/plain")

    @app.get("/scrape", tags=["bittorrent"], response_class=Response, **bt_doc)  # type: ignore[arg-type]
    @app.get("/scrape/{passkey}", tags=["bittorrent"], response_class=Response, **bt_doc)  # type: ignore[arg-type]
    async def scrape(request: Request) -> Response:
        """BEP 48 scrape at /scrape/<passkey>: one or more info_hash values; unknown torrents report
        zeros."""
        refused = bt_refused(request)
        if refused is not None:
            return refused
        return Response(
            await bt.scrape(request.scope["query_string"], store, settings), media_type="text/plain"
        )

    # -- health --------------------------------------------------------------------------
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    async def readyz() -> JSONResponse:
        """The store answers; `epoch` changes when the swarm state was lost (`Store.epoch`)."""
        try:
            await store.ping()
            epoch = await state_loss.check()
        except StoreUnavailableError as exc:
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok", "epoch": epoch})

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus exposition."""
        return Response(await metrics.render(store), media_type="text/plain; version=0.0.4")

    # -- blobs ---------------------------------------------------------------------------
    async def swarm_counts(blob_id: str) -> tuple[str | None, SwarmCounts]:
        """The blob's infohash (None while no metainfo is published) and its torrent's counts."""
        meta = await store.get_metainfo(blob_id)
        infohash = meta[0] if meta else None
        if not infohash:
            return None, SwarmCounts()
        ih = bytes.fromhex(infohash)
        return infohash, (await store.scrape([ih]))[ih]

    async def blob_state(blob_id: str) -> dict[str, Any]:
        infohash, counts = await swarm_counts(blob_id)
        holders = await store.lease_holders(blob_id)
        return {
            "blob_id": blob_id,
            "infohash": infohash,
            "seeders": counts.complete,
            "leechers": counts.incomplete,
            "lease": holder_json(holders[0]) if holders else None,
            "holders": [h.node_id for h in holders],
        }

    def holder_json(h: LeaseHolder) -> dict[str, Any]:
        return {"holder": h.node_id, "expires_in": h.expires_in, "progress": h.progress, "idle": h.idle}

    @app.put(
        "/v1/blobs/{blob_id}/metainfo",
        tags=["blobs"],
        dependencies=agent_only,
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
        created = await store.put_metainfo(blob_id, ih, body)
        return JSONResponse({"infohash": ih}, status_code=201 if created else 200)

    @app.get("/v1/peers", tags=["blobs"], dependencies=agent_only)
    async def peers() -> dict[str, list[str]]:
        """The addresses of every peer that announced lately, any swarm. An announce needs the
        passkey, so these are the cluster's agents: each agent admits BitTorrent connections from
        these only (agent.swarm.gate). Agent role: where the agents are is theirs to know."""
        return {"addresses": sorted(str(ipaddress.ip_address(ip)) for ip in await store.peer_addresses())}

    @app.get("/v1/blobs/{blob_id}/metainfo", tags=["blobs"], dependencies=read, response_class=Response)
    async def get_metainfo(blob_id: str) -> Response:
        """The bencoded info dict of a blob (404 if none was published)."""
        meta = await store.get_metainfo(check_blob_id(blob_id))
        if meta is None:
            raise HTTPException(404, f"no metainfo for blob {blob_id}")
        return Response(meta[1], media_type=BITTORRENT, headers={"x-infohash": meta[0]})

    @app.post("/v1/blobs/{blob_id}/metainfo/report", tags=["blobs"], dependencies=agent_only)
    async def report_metainfo(blob_id: str, body: MetainfoReport, request: Request) -> dict[str, Any]:
        """Report the blob's info dict wrong: a node's bytes that match every one of its piece hashes
        failed the blob's own hash (sha256 / git sha1), or bytes verified end to end do not match its
        pieces. If `infohash` is still the blob's dict it is removed and kept as a quarantine record
        (`quarantined`: true), so the next node to hold verified bytes publishes the right one; the
        same dict is refused for `quarantine_hold` seconds. A stale report removes nothing. The
        tracker cannot check a report: see docs/security.md for what that allows."""
        client = request.client
        removed = await store.quarantine_metainfo(
            check_blob_id(blob_id), body.infohash, body.reason, body.node_id, client.host if client else None
        )
        if removed:
            metrics.metainfo_quarantined.inc()
        current = await store.get_metainfo(blob_id)
        return {"quarantined": removed, "infohash": body.infohash, "current": current[0] if current else None}

    @app.get("/v1/blobs/{blob_id}/metainfo/quarantine", tags=["blobs"], dependencies=read)
    async def quarantine(blob_id: str) -> dict[str, Any]:
        """The blob's info dicts reported wrong, oldest first: infohash, reason, the reporting node's
        self-declared id and its address, and when (unix time)."""
        records = await store.quarantined(check_blob_id(blob_id))
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

    @app.get("/v1/blobs/{blob_id}", tags=["blobs"], dependencies=read)
    async def get_blob(blob_id: str) -> dict[str, Any]:
        """A blob's swarm state: infohash (or null), seeders, leechers, lease holder (or null)."""
        return await blob_state(check_blob_id(blob_id))

    @app.get("/v1/blobs/{blob_id}/wait", tags=["blobs"], dependencies=read)
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

    # -- leases --------------------------------------------------------------------------
    def lease_json(state: LeaseState, node_id: str) -> dict[str, Any]:
        metrics.lease_expiries.inc(state.expired)
        metrics.lease_takeovers.inc(state.taken_over)
        return {
            "granted": state.granted,
            "holder": state.holders[0].node_id if state.holders else None,
            "expires_in": state.expires_in(node_id)
            if state.granted
            else (state.holders[0].expires_in if state.holders else 0),
            "holders": [h.node_id for h in state.holders],
            "leases": [holder_json(h) for h in state.holders],
        }

    @app.post("/v1/leases/{blob_id}", tags=["leases"], dependencies=agent_only)
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
            holders = await store.lease_holders(check_blob_id(blob_id))
            if all(h.node_id != body.node_id for h in holders):  # the holders reclaim theirs first
                metrics.lease_denials.inc()
                # When to ask again: with no holder, nothing else (a metainfo, a heartbeat) will
                # come to end the asker's wait sooner.
                return {**lease_json(LeaseState(False, holders), body.node_id), "retry_in": round(amnesty, 3)}
        state = await store.acquire_lease(
            check_blob_id(blob_id), body.node_id, ttl, settings.max_lease_holders, body.stale_after
        )
        (metrics.lease_grants if state.granted else metrics.lease_denials).inc()
        reply = lease_json(state, body.node_id)
        if state.granted:
            # Counted after the grant, so a seeder that announced since the asker last looked is in it:
            # a holder told 0 goes to the origin at once, instead of waiting for its own announce's
            # answer to say the same (agent.swarm.policy `_seeder_appeared`; about a second).
            reply["seeders"] = (await swarm_counts(blob_id))[1].complete
        return reply

    @app.post("/v1/leases/{blob_id}/heartbeat", tags=["leases"], dependencies=agent_only)
    async def heartbeat(blob_id: str, body: HeartbeatRequest) -> dict[str, Any]:
        """Keep a held lease alive, reporting the bytes the holder has (`progress`); with `reclaim`, a
        lease the node lost while a slot is free is its own again. 404 if nobody holds it any more, 409
        if others hold it now (e.g. took it over from an idle holder)."""
        ttl = min(body.ttl, settings.max_lease_ttl)
        reclaim = settings.max_lease_holders if body.reclaim else 0
        state = await store.renew_lease(check_blob_id(blob_id), body.node_id, ttl, body.progress, reclaim)
        if not state.granted:
            metrics.lease_expiries.inc(state.expired)
            if state.holders:
                holders = ", ".join(h.node_id for h in state.holders)
                raise HTTPException(409, f"lease on {blob_id} lost: held by {holders}")
            raise HTTPException(404, f"no lease on {blob_id} held by this node (expired?)")
        return lease_json(state, body.node_id)

    @app.delete("/v1/leases/{blob_id}", tags=["leases"], dependencies=agent_only)
    async def release(blob_id: str, node_id: Annotated[str, Query(pattern=NODE_ID)]) -> dict[str, bool]:
        """Give a lease back (done, or failed) so another node can take it at once."""
        return {"released": await store.release_lease(check_blob_id(blob_id), node_id)}

    # -- manifests -----------------------------------------------------------------------
    @app.put(
        "/v1/manifests/{org}/{name}/{commit}",
        tags=["manifests"],
        dependencies=manifest_writers,
        status_code=201,
        responses={
            200: {"description": "The same files were registered already (they stay)"},
            409: {"description": "repo@commit already has a manifest with other files"},
        },
    )
    async def put_manifest(
        org: str, name: str, commit: str, body: ManifestRequest, request: Request
    ) -> JSONResponse:
        """Register repo_id@commit → files (safe relative paths, sizes >= 0, hex blob ids), once: a
        commit's files never change. The same files (path, size, blob id) again: 200, the stored
        files stay (a publisher write still moves its ref and stores its signature); other files:
        409, nothing changes.

        Only the publisher role (hub-less models) moves refs: its `revision`, if given, then
        resolves to this commit (the latest publisher write wins, also for a commit registered
        before). Its manifests must carry the publisher's `signature` (400 without), which every
        agent verifies. It marks the repo published; from then on the agent role's writes for that
        repo are refused (403), so no node can overwrite or shadow it. The agent role (hub models,
        registered after a fetch) never moves a ref: its `revision` is ignored, the answer's
        `revision` is null."""
        repo_id, commit = check_repo(org, name), check_commit(commit)
        fields = body.model_dump(exclude={"signature"})
        revision, files = validate_manifest(fields, settings.max_manifest_files)
        publisher = request.state.role is Role.PUBLISHER
        signature = check_signature(body.signature, publisher)
        ref = revision if publisher else None
        created = await store.put_manifest(
            repo_id, commit, {"files": files, "signature": signature}, ref, publisher=publisher
        )
        return JSONResponse(
            {
                "repo_id": repo_id,
                "commit": commit,
                "revision": ref,
                "files": len(files),
                "published": publisher,
            },
            status_code=201 if created else 200,
        )

    @app.get("/v1/manifests/{org}/{name}/{commit}", tags=["manifests"], dependencies=read)
    async def get_manifest(org: str, name: str, commit: str) -> dict[str, Any]:
        """The manifest of repo_id@commit (404 if unknown): `files`, `published` (the publisher role
        wrote it) and `signature` (the publisher's, which agents verify; null for agent-written)."""
        repo_id, commit = check_repo(org, name), check_commit(commit)
        manifest = await store.get_manifest(repo_id, commit)
        if manifest is None:
            raise HTTPException(404, f"no manifest for {repo_id}@{commit}")
        return {"repo_id": repo_id, "commit": commit, **manifest}

    @app.get("/v1/resolve/{org}/{name}/{revision:path}", tags=["manifests"], dependencies=read)
    async def resolve(org: str, name: str, revision: str) -> dict[str, str]:
        """The commit that repo_id@revision points at: refs are the publisher's alone (hub-less
        models), so a hub model's revision is 404 here (the origin resolves those)."""
        repo_id, revision = check_repo(org, name), check_revision(revision)
        commit = await store.resolve(repo_id, revision)
        if commit is None:
            raise HTTPException(404, f"unknown revision {repo_id}@{revision}")
        return {"commit": commit}

    @app.get("/v1/models", tags=["manifests"], dependencies=read)
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
        entries = await store.list_models()
        hashes = sorted(
            {
                bytes.fromhex(f["infohash"])
                for e in entries
                for m in e.manifests.values()
                for f in m["files"]
                if f["infohash"]
            }
        )
        counts = await store.scrape(hashes) if hashes else {}
        seeders = await store.seeder_addresses(hashes) if holders and hashes else {}
        out = []
        for entry in entries:
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
            out.append(
                {
                    "repo_id": entry.repo_id,
                    "published": entry.published,
                    "revisions": entry.revisions,
                    "commits": commits,
                }
            )
        return {"models": out}

    return app


def _hostport(ip: bytes, port: int) -> str:
    """A BitTorrent listen address as "ip:port" ("[ip]:port" for IPv6)."""
    address = ipaddress.ip_address(ip)
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _state_key(state: dict[str, Any]) -> tuple[Any, ...]:
    return state["infohash"], state["seeders"], state["leechers"], tuple(state["holders"])
