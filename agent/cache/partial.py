"""A blob being downloaded: `blobs/<id>.incomplete`, its space reserved up front, and its resume record
(`<state_dir>/partials/<id>.json`), which the origin engine (agent.origin.ranges) and the relay receiver
(agent.relay.receiver) both write, so that either one resumes after the other, or after a restart.

The record lists the chunks (of `chunk`, the origin engine's chunk size) that are whole and the bytes
written at the start of the others; it is written whole through `os.replace`, so concurrent writers
each leave a valid record that lists only bytes that were written.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from collections.abc import Callable

from agent.cache.layout import RepoCache, write_atomic
from agent.core.errors import CacheError, DiskSpaceError, WeightswarmError
from agent.core.plan import FetchPlan, FileEntry

RECORD_EVERY = 4 << 20
"""Bytes a writer writes between resume-record updates: a kill loses at most this much per connection."""


def load_record(cache: RepoCache, entry: FileEntry, chunk: int) -> tuple[set[int], dict[int, int]]:
    """Completed chunks (and bytes of started ones) from an earlier run, if its record fits exactly;
    otherwise the partial is discarded and nothing is resumed."""
    path = cache.partial_record_path(entry.blob_id)
    incomplete = cache.incomplete_path(entry.blob_id)
    try:
        rec = json.loads(path.read_bytes())
        ok = (
            rec["blob_id"] == entry.blob_id
            and rec["size"] == entry.size
            and rec["chunk_size"] == chunk
            # Shorter when a failed fetch gave back the unwritten rest of its reservation (the file ends
            # after its furthest written byte; agent.origin.ranges): resumed, and reserved again.
            and incomplete.stat().st_size <= entry.size
        )
        if ok:
            nchunks = -(-entry.size // chunk)
            done = {int(i) for i in rec["done"] if 0 <= int(i) < nchunks}
            written = {int(i): int(n) for i, n in rec.get("written", {}).items()}
            started = {i: n for i, n in written.items() if 0 <= i < nchunks and i not in done and n > 0}
            return done, started
    except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
        pass
    cache.discard_partial(entry.blob_id)
    return set(), {}


def write_record(
    cache: RepoCache, plan: FetchPlan, entry: FileEntry, chunk: int, done: list[int], written: dict[int, int]
) -> None:
    record = {
        "blob_id": entry.blob_id,
        "size": entry.size,
        "chunk_size": chunk,
        "done": done,
        "written": {str(i): n for i, n in written.items()},
        "repo_id": plan.repo_id,
        "commit": plan.commit,
        "path": entry.path,
    }
    write_atomic(cache.partial_record_path(entry.blob_id), json.dumps(record).encode(), fsync=False)


def contiguous_record(cache: RepoCache, entry: FileEntry, chunk: int) -> int:
    """How many bytes from the start an earlier run left written (by its resume record); 0 if none."""
    done, written = load_record(cache, entry, chunk)
    pos = 0
    while pos < entry.size:
        idx = pos // chunk
        if idx in done:
            pos = min(entry.size, pos + chunk)
            continue
        return pos + written.get(idx, 0)
    return pos


def record_prefix(cache: RepoCache, plan: FetchPlan, entry: FileEntry, end: int, chunk: int) -> None:
    """Record [0, end) of `blobs/<id>.incomplete` as written, so that whoever resumes goes on after it."""
    full = end // chunk
    written = {full: end - full * chunk} if end % chunk else {}
    write_record(cache, plan, entry, chunk, list(range(full)), written)


def write_failed(cache: RepoCache, entry: FileEntry, exc: OSError) -> WeightswarmError:
    """The error for a failed write of `blobs/<id>.incomplete`, whose partial is discarded: a full disk
    says so (DiskSpaceError), anything else names the file."""
    cache.discard_partial(entry.blob_id)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskSpaceError(str(cache.blobs_dir), entry.size, shutil.disk_usage(cache.blobs_dir).free)
    return CacheError(f"{entry.path}: cannot write {cache.incomplete_path(entry.blob_id)}: {exc.strerror}")


class Reservation:
    """A blob's space reserved (posix_fallocate) on a thread of its own while its first bytes are asked
    for, so that a full disk fails at the start of a file, not after hours. On tmpfs the call allocates
    every page: 0.15-0.6 s for 256 MiB with eight nodes on two cores, which each start used to wait out
    before its first request. Writing meanwhile is safe: fallocate (mode 0) fills only what holds no
    data, under the inode's lock. A full disk goes to `on_full` and to `check`, for the writer to raise."""

    def __init__(self, fd: int, size: int, on_full: Callable[[OSError], None] | None = None) -> None:
        self.failed: OSError | None = None
        self._thread: threading.Thread | None = None
        if os.fstat(fd).st_size == size:
            return
        os.ftruncate(fd, size)
        if size and hasattr(os, "posix_fallocate"):
            self._thread = threading.Thread(
                target=self._reserve, args=(fd, size, on_full), name="reserve", daemon=True
            )
            self._thread.start()

    def _reserve(self, fd: int, size: int, on_full: Callable[[OSError], None] | None) -> None:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            # EOPNOTSUPP etc.: the sparse file still works.
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.failed = exc
                if on_full is not None:
                    on_full(exc)

    def check(self) -> None:
        """Raise the full disk the reservation found, if it found one."""
        if self.failed is not None:
            raise self.failed

    def close(self) -> None:
        """Wait for the reservation: before the file is closed, as it uses its descriptor."""
        if self._thread is not None:
            self._thread.join()
