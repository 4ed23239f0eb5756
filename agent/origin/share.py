"""A feed's handle on its part of a blob the origin engine downloads (agent.origin.ranges): the relay writes
the part into the blob's file and its resume record, as the engine's own workers do."""

from __future__ import annotations

import os
from collections.abc import Callable

from agent.cache.partial import RECORD_EVERY
from agent.origin.chunks import BlobJob, Cancelled


class Share:
    """A feed's handle on its part [start, end) of the blob (agent.core.parts `PartSink`)."""

    def __init__(
        self,
        job: BlobJob,
        start: int,
        end: int,
        save: Callable[[], None],
        take_over: Callable[[int, int], None],
    ) -> None:
        """`save`: writes the blob's resume record; `take_over(pos, end)`: the engine's workers take the
        chunks of [pos, end) not written yet."""
        self._job, self._save, self._take_over = job, save, take_over
        self.start, self.end = start, end
        self.entry = job.entry
        self._unrecorded = 0

    @property
    def pos(self) -> int:
        return min(self.end, self._job.extent(self.start))

    @property
    def cancelled(self) -> bool:
        return self._job.error is not None or self._job.closed

    def write(self, pos: int, data: bytes | memoryview) -> None:
        """Raises `Cancelled` once the blob is done with."""
        job, n = self._job, len(data)
        with job.write_lock:
            if job.closed:
                raise Cancelled()
            os.pwrite(job.fd, data, pos)
        with job.cond:
            if job.error is not None:
                raise Cancelled()
            while n and pos < self.end:
                idx = pos // job.chunk_size
                start, end = job.chunk_bounds(idx)
                step = min(n, end - pos)
                pos += step
                n -= step
                if pos >= end:
                    job.done.add(idx)
                    job.written.pop(idx, None)
                else:
                    job.written[idx] = pos - start
            job.relayed += len(data)
            job.cond.notify_all()
        self._unrecorded += len(data)
        job.progress.advance(len(data))
        if self._unrecorded >= RECORD_EVERY or pos >= self.end:
            self._unrecorded = 0
            self._save()

    def take_over(self) -> None:
        self._take_over(self.pos, self.end)

    def fail(self, exc: BaseException) -> None:
        self._job.fail(exc)
