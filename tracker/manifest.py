"""Validation of a published manifest: repo_id@commit → files (path, size, blob id, infohash).

Paths end up as symlinks in every node's hub cache, so anything that could escape the
snapshot directory is refused here, before it reaches a single node.
"""

from __future__ import annotations

import re
from typing import Any

from tracker.errors import ValidationError
from tracker.metainfo import BLOB_ID, INFOHASH

REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAX_PATH = 1024


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
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValidationError(f"size of {path[:100]!r} must be an integer >= 0")
        blob_id = entry.get("blob_id")
        if not isinstance(blob_id, str) or not BLOB_ID.match(blob_id):
            raise ValidationError(f"blob_id of {path[:100]!r} must be 40 or 64 lowercase hex characters")
        infohash = entry.get("infohash")
        if infohash is not None and (not isinstance(infohash, str) or not INFOHASH.match(infohash)):
            raise ValidationError(f"infohash of {path[:100]!r} must be 40 lowercase hex characters or null")
        out.append({"path": path, "size": size, "blob_id": blob_id, "infohash": infohash})
    return revision, out
