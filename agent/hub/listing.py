"""The JSON documents of the hub's API routes, built from a `Snapshot` (no HTTP here)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from agent.hub.repos import Snapshot


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


EXPAND_PROPERTIES = frozenset(
    "author baseModels cardData childrenModelCount config createdAt disabled downloads downloadsAllTime "
    "evalResults gated gguf inference inferenceProviderMapping lastModified library_name likes mask_token "
    "model-index pipeline_tag private resourceGroup safetensors sha siblings spaces tags transformersInfo "
    "trendingScore usedStorage widgetData".split()
)
"""Values `?expand=` accepts on a model (huggingface_hub's `ExpandModelProperty_T`); others are a 400."""


def model_info(snapshot: Snapshot, *, private: bool, gated: str | bool, blobs: bool) -> dict[str, Any]:
    """What `GET /api/models/{repo}` answers: enough for huggingface_hub's ModelInfo. `gated`: False,
    "auto" or "manual"."""
    siblings: list[dict[str, Any]] = []
    for path in sorted(snapshot.files):
        entry = snapshot.files[path]
        sibling: dict[str, Any] = {"rfilename": path}
        if blobs:
            sibling.update(size=entry.size, blobId=entry.oid)
            if entry.sha256:
                sibling["lfs"] = {
                    "sha256": entry.sha256,
                    "size": entry.size,
                    "pointerSize": entry.pointer_size,
                }
        siblings.append(sibling)
    repo_id = snapshot.repo_id
    modified = _iso(snapshot.last_modified_ns)
    return {
        "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
        "id": repo_id,
        "modelId": repo_id,
        "author": repo_id.split("/")[0],
        "sha": snapshot.commit,
        "lastModified": modified,
        "createdAt": modified,
        "private": private,
        "gated": gated,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "library_name": "transformers",
        "siblings": siblings,
        "spaces": [],
        "usedStorage": sum(f.size for f in snapshot.files.values()),
    }


def tree_entries(snapshot: Snapshot, prefix: str, *, recursive: bool) -> list[dict[str, Any]] | None:
    """The entries under `prefix` ("" = root), sorted by path; None if there is no such folder."""
    dirs = snapshot.directories()
    if prefix and prefix not in dirs:
        return None
    under = prefix + "/" if prefix else ""

    def wanted(path: str) -> bool:
        return path.startswith(under) and (recursive or "/" not in path[len(under) :])

    entries: list[dict[str, Any]] = []
    for d in sorted(p for p in dirs if wanted(p)):
        inner = sorted((p, f.oid) for p, f in snapshot.files.items() if p.startswith(d + "/"))
        # Not git's tree hash, but stable and content-derived, which is all a client uses it for.
        tree_id = hashlib.sha1(repr(inner).encode()).hexdigest()
        entries.append({"type": "directory", "oid": tree_id, "size": 0, "path": d})
    for path in sorted(p for p in snapshot.files if wanted(p)):
        entry = snapshot.files[path]
        item: dict[str, Any] = {"type": "file", "oid": entry.oid, "size": entry.size, "path": path}
        if entry.sha256:
            item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
        entries.append(item)
    entries.sort(key=lambda e: str(e["path"]))
    return entries
