"""A feed's handle on its part of a blob the origin engine downloads in parts (agent.origin.ranges)."""

from __future__ import annotations

import os
from typing import Protocol

from agent.cache.layout import RepoCache
from agent.cache.partial import RECORD_EVERY
from agent.core.plan import FetchPlan
from agent.origin.chunks import BlobJob, Cancelled


class Engine(Protocol):
    """What a share asks of the engine (`OriginSource`)."""

    def _save_record(self, cache: RepoCache, plan: FetchPlan, job: BlobJob) -> None: ...

    def _take_over(self, plan: FetchPlan, cache: RepoCache, job: BlobJob, start: int, end: int) -> None: ...


class Share:
    """A feed's handle on its part [start, end) of the blob (agent.core.parts `PartSink`)."""

    def __init__(
        self, engine: Engine, plan: FetchPlan, cache: RepoCache, job: BlobJob, start: int, end: int
    ) -> None:
        self._engine, self._plan, self._cache, self._job = engine, plan, cache, job
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
            self._engine._save_record(self._cache, self._plan, job)

    def take_over(self) -> None:
        self._engine._take_over(self._plan, self._cache, self._job, self.pos, self.end)

    def fail(self, exc: BaseException) -> None:
        self._job.fail(exc)
