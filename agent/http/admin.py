"""The node's admin routes on the local API: remove a model, stop seeding a blob, publish a folder.

    DELETE /v1/models/{org}/{name}[?revision=&force=]   agent rm (content other repos share stays,
                                   seeded); a model in use (pods, a fetch, --pin) only with force
    POST   /v1/blobs/{id}/forget                  stop seeding a blob (before `agent verify` repairs it)
    POST   /v1/publish {directory, repo_id, revision}   a local model into the cache and the swarm

The routes get the operations as callables from the daemon; they only translate HTTP. They are
mounted on the admin channel only (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from agent.cache.eviction import Removed
from agent.core.errors import WeightswarmError
from agent.fetch.publish import PublishResult
from agent.http.errors import http_error


class PublishRequest(BaseModel):
    directory: str = Field(min_length=1, max_length=4096)
    repo_id: str = Field(min_length=1, max_length=200)
    revision: str = Field(default="main", min_length=1, max_length=255)


@dataclass(frozen=True)
class AdminOps:
    """What the admin routes do, bound by the daemon to its cache, seeder and tracker."""

    remove: Callable[[str, str | None, bool], Removed]
    """(repo id, revision or None for all, force) -> what was removed."""
    forget: Callable[[str], None]
    """Stop seeding a blob id."""
    publish: Callable[[Path, str, str], PublishResult]
    """(directory, repo id, revision) -> the published commit."""


def admin_router(ops: AdminOps) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.delete("/models/{org}/{name}")
    def delete_model(org: str, name: str, revision: str | None = None, force: bool = False) -> dict[str, Any]:
        try:
            removed = ops.remove(f"{org}/{name}", revision, force)
        except WeightswarmError as exc:
            raise http_error(exc) from None
        return {
            "repo_id": removed.repo_id,
            "snapshots": list(removed.snapshots),
            "blobs": list(removed.blobs),
            "bytes_freed": removed.bytes_freed,
            "shared": list(removed.shared),
            "partials": list(removed.partials),
        }

    @router.post("/blobs/{blob_id}/forget")
    def forget_blob(blob_id: str) -> dict[str, str]:
        """Stop seeding a blob (before `agent verify` deletes a corrupt copy and fetches it again)."""
        ops.forget(blob_id)
        return {"blob_id": blob_id}

    @router.post("/publish")
    def publish(body: PublishRequest) -> dict[str, Any]:
        try:
            result = ops.publish(Path(body.directory), body.repo_id, body.revision)
        except WeightswarmError as exc:
            raise http_error(exc) from None
        return result.to_json()

    return router
