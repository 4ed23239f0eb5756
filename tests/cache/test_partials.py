"""Partial downloads no fetch will resume are removed when the daemon starts (agent.cache.partials); the
ones a fetch will resume stay, and the next fetch goes on from them."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.cache.layout import RepoCache
from tests.support.cluster import Origin, fetch_and_wait

DAY = 86400


def _partial(cache: RepoCache, blob_id: str, size: int, age: float = 0.0, record: bool = True) -> list[Path]:
    """A `.incomplete` of `size` bytes (reserved) and its resume record, `age` seconds old."""
    cache.blobs_dir.mkdir(parents=True, exist_ok=True)
    incomplete = cache.incomplete_path(blob_id)
    with open(incomplete, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    paths = [incomplete]
    if record:
        rec = cache.partial_record_path(blob_id)
        rec.parent.mkdir(parents=True, exist_ok=True)
        rec.write_text(f'{{"blob_id": "{blob_id}"}}')
        paths.append(rec)
    when = time.time() - age
    for p in paths:
        os.utime(p, (when, when))
    return paths


def test_the_daemon_removes_at_start_only_the_partials_no_fetch_will_resume(
    tmp_path: Path, origin: Origin, make_agent
):
    name = "solo"
    settings_dir = tmp_path / name
    cache = RepoCache(settings_dir / "hub", settings_dir / "state", origin.repo_id)
    done_id, gone_id, old_id, fresh_id = "a" * 64, "b" * 64, "c" * 64, "d" * 64
    # A blob complete beside its .incomplete: the rename happened elsewhere, or the crash came after it.
    complete = _partial(cache, done_id, 1 << 20)
    cache.blob_path(done_id).write_bytes(b"x")
    # A resume record whose file is gone.
    orphan = cache.partial_record_path(gone_id)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_text("{}")
    # Untouched for eight days; and one from an hour ago that the next fetch will resume.
    old = _partial(cache, old_id, 4 << 20, age=8 * DAY)
    fresh = _partial(cache, fresh_id, 2 << 20, age=3600)
    temp = cache.blobs_dir / f".{done_id}.abc123.tmp"
    temp.write_bytes(b"t")
    os.utime(temp, (time.time() - 2 * 3600,) * 2)

    agent = make_agent(name, origin, None)
    assert agent.settings.cache_dir == settings_dir / "hub"  # the layout the leftovers were made in

    assert [p for p in (*complete, orphan, *old, temp) if p.exists()] == []
    assert all(p.exists() for p in fresh)
    assert cache.blob_path(done_id).exists()
    # The daemon works as before on the same cache.
    status = fetch_and_wait(agent, origin.repo_id)
    assert status["phase"] == "Ready"
