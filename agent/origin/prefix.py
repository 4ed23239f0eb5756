"""The hashing side of a blob the origin engine downloads (agent.origin.ranges): one thread follows the
contiguous written prefix as workers and feeds extend it, hashing from the page cache, so when the last
byte lands only the tail is left to hash."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

from agent.cache.layout import start_writeback
from agent.core.hashing import BlobHasher, BlobHashes
from agent.origin.chunks import BlobJob

HASH_BLOCK = 4 << 20
WRITEBACK_EVERY = 16 << 20
TURN_EVERY = 0.1
"""Seconds between looks at whether background work must step aside (`Turn.due`)."""


def hash_prefix(
    job: BlobJob,
    piece_hashes: bool,
    judge: Callable[[BlobJob], None],
    step_aside: Callable[[BlobJob], None] | None,
) -> BlobHashes:
    """Hash `job`'s file as its contiguous prefix grows, to its end. `judge` (under the job's lock) raises
    when the blob makes no headway; `step_aside`, when given, is asked every `TURN_EVERY` seconds whether
    background work must make way. Raises the job's error as soon as it has one."""
    hasher = BlobHasher(job.entry.size, job.entry.is_lfs, pieces=piece_hashes)
    view = memoryview(bytearray(HASH_BLOCK))
    pos = flushed = 0
    size = job.entry.size
    checked = time.monotonic()
    while pos < size:
        if step_aside is not None and time.monotonic() - checked >= TURN_EVERY:
            checked = time.monotonic()
            step_aside(job)
        with job.cond:
            while True:
                if job.error is not None:
                    raise job.error
                judge(job)
                avail = job.contiguous_end(pos)
                if avail > pos:
                    break
                job.cond.wait(1.0 if step_aside is None else TURN_EVERY)
                if step_aside is not None and time.monotonic() - checked >= TURN_EVERY:
                    break
        if avail <= pos:
            continue  # woken to look at the turn, nothing new to hash
        if job.prefix is not None:
            job.prefix(avail)
        while pos < avail:
            n = os.preadv(job.fd, [view[: min(HASH_BLOCK, avail - pos)]], pos)
            if n <= 0:
                raise OSError(errno.EIO, "short read of a written range", str(job.entry.path))
            hasher.update(view[:n])
            pos += n
        if pos - flushed >= WRITEBACK_EVERY or pos == size:
            start_writeback(job.fd, flushed, pos - flushed)
            flushed = pos
    return hasher.finish()
