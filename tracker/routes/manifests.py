"""Manifests (repo@commit -> files) and the publisher's refs (repo@revision -> commit)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tracker.auth import Role
from tracker.manifest import (
    check_commit,
    check_repo,
    check_revision,
    check_signature,
    validate_manifest,
)
from tracker.routes.access import Access
from tracker.settings import TrackerSettings
from tracker.store import ManifestStore


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


def manifest_router(settings: TrackerSettings, manifests: ManifestStore, access: Access) -> APIRouter:
    """PUT and GET /v1/manifests/<org>/<name>/<commit>, GET /v1/resolve/<org>/<name>/<revision>."""
    router = APIRouter(tags=["manifests"])

    @router.put(
        "/v1/manifests/{org}/{name}/{commit}",
        dependencies=access.manifest_writers,
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
        created = await manifests.put_manifest(
            repo_id, commit, {"files": files, "signature": signature}, ref, publisher=publisher
        )
        reply = {
            "repo_id": repo_id,
            "commit": commit,
            "revision": ref,
            "files": len(files),
            "published": publisher,
        }
        return JSONResponse(reply, status_code=201 if created else 200)

    @router.get("/v1/manifests/{org}/{name}/{commit}", dependencies=access.read)
    async def get_manifest(org: str, name: str, commit: str) -> dict[str, Any]:
        """The manifest of repo_id@commit (404 if unknown): `files`, `published` (the publisher role
        wrote it) and `signature` (the publisher's, which agents verify; null for agent-written)."""
        repo_id, commit = check_repo(org, name), check_commit(commit)
        manifest = await manifests.get_manifest(repo_id, commit)
        if manifest is None:
            raise HTTPException(404, f"no manifest for {repo_id}@{commit}")
        return {"repo_id": repo_id, "commit": commit, **manifest}

    @router.get("/v1/resolve/{org}/{name}/{revision:path}", dependencies=access.read)
    async def resolve(org: str, name: str, revision: str) -> dict[str, str]:
        """The commit that repo_id@revision points at: refs are the publisher's alone (hub-less
        models), so a hub model's revision is 404 here (the origin resolves those)."""
        repo_id, revision = check_repo(org, name), check_revision(revision)
        commit = await manifests.resolve(repo_id, revision)
        if commit is None:
            raise HTTPException(404, f"unknown revision {repo_id}@{revision}")
        return {"commit": commit}

    return router
