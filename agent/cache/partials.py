"""Partial downloads no fetch will resume, removed when the daemon starts.

A fetch that fails part-way keeps `blobs/<id>.incomplete` (its space reserved) and its resume record
(`<state_dir>/partials/<id>.json`) so that the next fetch of that blob goes on where it stopped. Those
are the agent's own files, counted against the cache's limit (agent.cache.eviction) by the disk they hold.
Some are never resumed, and without this they would hold their space forever:
- a `.incomplete` whose blob is complete beside it (a crash between the last write and the rename, or
  another fetch finished the blob from another source);
- a resume record whose `.incomplete` is gone, in any repo of the cache;
- anything untouched for `max_age` (no fetch of that blob came back for it);
- temp files of atomic writes (`.<name>.*.tmp`) older than an hour (their writer died).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.cache.layout import StateDir

log = logging.getLogger(__name__)

INCOMPLETE = ".incomplete"
TEMP_MAX_AGE = 3600.0
"""Seconds after which a temp file of an atomic write is a dead writer's."""


@dataclass(frozen=True)
class Swept:
    files: int
    bytes: int
    """Disk the removed files held (allocated blocks)."""


def sweep_partials(cache_dir: Path, state_dir: Path, max_age: float, now: float | None = None) -> Swept:
    """Remove the partial files of `cache_dir` and the resume records of `state_dir` that no fetch will
    resume (see the module doc)."""
    now = time.time() if now is None else now
    stale: list[Path] = []
    live: set[str] = set()
    for blob_dir in cache_dir.glob("models--*/blobs"):
        for path in blob_dir.iterdir():
            if "." not in path.name:
                continue
            age = _age(path, now)
            if path.name.endswith(INCOMPLETE):
                blob_id = path.name.removesuffix(INCOMPLETE)
                if (blob_dir / blob_id).exists() or age > max_age:
                    stale.append(path)
                else:
                    live.add(blob_id)
            elif path.name.startswith(".") and path.name.endswith(".tmp") and age > TEMP_MAX_AGE:
                stale.append(path)
    records = StateDir(state_dir).partials
    if records.is_dir():
        for record in records.glob("*.json"):
            if record.name.removesuffix(".json") not in live or _age(record, now) > max_age:
                stale.append(record)
    files = held = 0
    for path in stale:
        try:
            size = path.stat().st_blocks * 512
            path.unlink()
        except FileNotFoundError:
            continue
        files, held = files + 1, held + size
    if files:
        log.info("removed %d partial file(s) no fetch will resume (%.1f MiB)", files, held / 2**20)
    return Swept(files, held)


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def partials_of(repo_dir: Path, state_dir: Path) -> list[dict[str, Any]]:
    """The partial blobs of one repo folder, for `agent ls`: blob id, the disk it holds (`bytes`), and
    from its resume record, when there is one, the file's path, listed size and commit ("-" / 0 if not).
    A failed fetch's partial holds space until it is resumed, evicted, removed (`agent rm`) or swept:
    the user sees what holds it."""
    out: list[dict[str, Any]] = []
    blobs = repo_dir / "blobs"
    for path in sorted(blobs.glob("*" + INCOMPLETE)) if blobs.is_dir() else []:
        blob_id = path.name.removesuffix(INCOMPLETE)
        try:
            held = path.stat().st_blocks * 512
        except FileNotFoundError:
            continue
        record: dict[str, Any] = {}
        try:
            loaded = json.loads(StateDir(state_dir).partial_record(blob_id).read_bytes())
            record = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            pass
        out.append({
            "blob_id": blob_id,
            "path": str(record.get("path") or "-"),
            "commit": str(record.get("commit") or "-"),
            "size": int(record.get("size") or 0),
            "bytes": held,
        })
    return out
