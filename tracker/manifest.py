"""Validation of a published manifest: repo_id@commit → files (path, size, blob id, infohash).

Paths end up as symlinks in every node's hub cache, so anything that could escape the
snapshot directory is refused here, before it reaches a single node.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from tracker.errors import ValidationError
from tracker.metainfo import BLOB_ID, INFOHASH

REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_PATH = 1024
MAX_SIZE = 2**53 - 1
"""Sizes stay exact as JSON numbers everywhere (the Redis store compares manifests in Lua)."""
SIGNATURE = re.compile(r"^[A-Za-z0-9+/]{86}==$")
"""An Ed25519 signature (64 bytes) in base64."""


def check_repo(org: str, name: str) -> str:
    for part in (org, name):
        if not REPO_PART.match(part) or ".." in part:
            raise ValidationError(f"invalid repo id part {part[:100]!r}: letters, digits, '.', '_', '-' only")
    return f"{org}/{name}"


def check_commit(commit: str) -> str:
    if not COMMIT.match(commit):
        raise ValidationError("commit must be 40 lowercase hex characters")
    return commit


def check_revision(revision: str) -> str:
    if not 1 <= len(revision) <= 255 or any(not c.isprintable() or c.isspace() for c in revision):
        raise ValidationError("revision must be 1-255 printable characters without spaces")
    if revision.startswith("/") or ".." in revision.split("/") or "" in revision.split("/"):
        raise ValidationError(f"invalid revision {revision[:100]!r}")
    return revision


def check_path(path: object) -> str:
    if not isinstance(path, str) or not path:
        raise ValidationError("file path must be a non-empty string")
    shown = repr(path[:100])
    if len(path) > MAX_PATH:
        raise ValidationError(f"file path longer than {MAX_PATH} characters: {shown}")
    if "\0" in path or "\\" in path or any(not c.isprintable() for c in path):
        raise ValidationError(f"file path has NUL, backslash or control characters: {shown}")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise ValidationError(f"file path must be relative: {shown}")
    if any(seg in ("", ".", "..") for seg in path.split("/")):
        raise ValidationError(f"file path has an empty, '.' or '..' segment: {shown}")
    return path


def validate_manifest(body: Any, max_files: int) -> tuple[str | None, list[dict[str, Any]]]:
    """(revision or None, normalised file list) from a PUT body, or ValidationError."""
    if not isinstance(body, dict):
        raise ValidationError("manifest must be a JSON object with 'files'")
    unknown = set(body) - {"revision", "files"}
    if unknown:
        raise ValidationError(f"unknown manifest fields: {sorted(unknown)[:5]}")
    revision = body.get("revision")
    if revision is not None:
        if not isinstance(revision, str):
            raise ValidationError("revision must be a string or null")
        check_revision(revision)
    files = body.get("files")
    if not isinstance(files, list):
        raise ValidationError("'files' must be a list")
    if len(files) > max_files:
        raise ValidationError(f"at most {max_files} files per manifest, got {len(files)}")
    seen: set[str] = set()
    out = []
    for entry in files:
        if not isinstance(entry, dict):
            raise ValidationError("each file must be an object with path, size, blob_id, infohash")
        path = check_path(entry.get("path"))
        if path in seen:
            raise ValidationError(f"duplicate file path {path[:100]!r}")
        seen.add(path)
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_SIZE:
            raise ValidationError(f"size of {path[:100]!r} must be an integer from 0 to 2^53-1")
        blob_id = entry.get("blob_id")
        if not isinstance(blob_id, str) or not BLOB_ID.match(blob_id):
            raise ValidationError(f"blob_id of {path[:100]!r} must be 40 or 64 lowercase hex characters")
        infohash = entry.get("infohash")
        if infohash is not None and (not isinstance(infohash, str) or not INFOHASH.match(infohash)):
            raise ValidationError(f"infohash of {path[:100]!r} must be 40 lowercase hex characters or null")
        out.append({"path": path, "size": size, "blob_id": blob_id, "infohash": infohash})
    return revision, out


def check_signature(signature: object, publisher: bool) -> str | None:
    """The manifest's publisher signature (base64 Ed25519, 64 bytes), required from the publisher role
    and refused from the agent role. The tracker does not verify it (it holds no publisher key);
    every agent does before planning from the manifest (agent.core.signing)."""
    if not publisher:
        if signature is not None:
            raise ValidationError(
                "only the publisher role signs manifests; an agent-role manifest has no signature"
            )
        return None
    if signature is None:
        raise ValidationError(
            "a publisher-role manifest must carry its Ed25519 signature ('signature', base64): publish with "
            "`agent publish` on an agent given --publisher-signing-key-file"
        )
    if not isinstance(signature, str) or not SIGNATURE.match(signature):
        raise ValidationError("signature must be a base64 Ed25519 signature (88 characters)")
    try:
        base64.b64decode(signature, validate=True)
    except binascii.Error:
        raise ValidationError("signature must be a base64 Ed25519 signature (88 characters)") from None
    return signature


def same_files(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two manifests of one repo@commit name the same files: the same (path, size, blob id)
    set. Infohashes are not compared: a blob's metainfo is fixed by its own PUT (a second info dict
    is 409), and a node that seeds only some blobs yet leaves the others null."""

    def key(files: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
        return sorted((str(f["path"]), int(f["size"]), str(f["blob_id"])) for f in files)

    return key(a) == key(b)
