"""How many concurrent streams (range requests) one file may have from a download host, learned from its
refusals; agent.origin.ranges asks before each range and tells it of each refusal.

A download host may refuse a second concurrent stream of one file from one address (403, 429, or a reset
connection: reported of the Hub's CDN as blocking "multi-threaded download acceleration"). That is
the host's limit, never a failure: the refused range goes back to its file's queue, the file's worker
retires, and the host's limit becomes the streams that were open when it refused. Later files of the fetch
start at that limit (their requests are never refused), and the fetch engine spends the stream budget it
freed on more files at once (`files_at_once`, agent.fetch.engine). Only a refusal of a file's only stream is
a refusal of the file (agent.origin.location decides whether it is an expired URL or final).

The limit is kept per host for `MEMORY` seconds after its last refusal (a daemon's next jobs start at it;
a CLI fetch ends sooner). Probing upward: `PROBE_AFTER` seconds without a refusal, one stream more per file
is allowed; a refusal of that probe lowers the limit again and doubles the wait for the next (up to
`PROBE_MAX`). Why probe at all: a limit may be a burst rule that lapses, and a CDN that also caps each
connection's rate (as the Hub's does) gives a file a fraction of its speed per stream it refuses, for as
long as the daemon runs. Why so slowly: a probe costs one refused request (no body bytes), but each one
the host sees is what such a host counts against an address; one a minute at most, fewer once refused,
stays far below what huggingface_hub's own retries send.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent.core.errors import OriginOverloadedError, OriginUnavailableError, RateLimitedError
from agent.origin.answers import CdnRefusedError, Retryable
from agent.origin.chunks import BlobJob, Reader

log = logging.getLogger(__name__)

PROBE_AFTER = 60.0
"""Seconds at a lowered limit without a refusal before one more stream per file is tried."""
PROBE_MAX = 900.0
"""Most seconds between probes of a host that keeps refusing them."""
MEMORY = 1800.0
"""Seconds after its last refusal that a host's limit is forgotten (daemon)."""


class StreamRefused(Exception):
    """A download host refused one more concurrent stream of a file: the range goes back to the queue and
    its worker retires (agent.origin.ranges)."""


@dataclass
class _Host:
    limit: int
    since: float
    """When the limit last changed (a refusal, or a probe)."""
    wait: float = PROBE_AFTER
    """Seconds at this limit before the next probe."""
    probing: bool = False
    """The limit is a probe above the last refused one."""


class StreamLimits:
    """The learned per-file stream limits of download hosts; thread-safe, one per process (`LIMITS`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._hosts: dict[str, _Host] = {}
        self._via: dict[str, str] = {}
        """Origin endpoint -> the download host whose limit its files last learned."""

    def _host(self, host: str) -> _Host | None:
        """The host's record unless forgotten (called under the lock)."""
        known = self._hosts.get(host)
        if known is not None and self._clock() - known.since >= MEMORY:
            del self._hosts[host]
            return None
        return known

    def limit(self, host: str, wanted: int) -> int:
        """Streams a file from `host` may have now, at most `wanted` (raised by one when a probe is due)."""
        with self._lock:
            known = self._host(host)
            if known is None:
                return wanted
            now = self._clock()
            if known.limit < wanted and now - known.since >= known.wait:
                known.limit, known.since, known.probing = known.limit + 1, now, True
            return min(wanted, known.limit)

    def refused(self, host: str, still_open: int, via: str = "") -> int:
        """`host` refused a stream of a file while `still_open` others were open; the new limit."""
        with self._lock:
            now = self._clock()
            limit = max(1, still_open)
            known = self._host(host)
            if known is None:
                known = self._hosts[host] = _Host(limit, now)
            else:
                if known.probing:
                    known.wait = min(PROBE_MAX, known.wait * 2)
                    known.probing = False
                known.limit, known.since = min(known.limit, limit), now
            if via:
                self._via[via] = host
            return known.limit

    def per_file(self, via: str, wanted: int) -> int:
        """Streams a file of origin `via` may have (the engine spends its budget by it), at most `wanted`."""
        with self._lock:
            host = self._via.get(via)
        return wanted if host is None else self.limit(host, wanted)


LIMITS = StreamLimits()
"""The process's limits: a CLI fetch's, or every job of a daemon (so later jobs start at them)."""


def retire(job: BlobJob, limits: StreamLimits, wanted: int) -> bool:
    """Whether a worker of `job` retires now: more work its file than its host allows (called under `cond`;
    one that does is no longer counted)."""
    streams = job.streams
    if job.mode != "ranges" or not streams.host or streams.workers <= limits.limit(streams.host, wanted):
        return False
    streams.workers -= 1
    return True


def asking(job: BlobJob, url: str) -> None:
    """A request of `job` for `url` is about to be sent (takes `cond`); `answered` ends it."""
    with job.cond:
        job.streams.host = urlsplit(url).netloc
        job.streams.open += 1


def answered(job: BlobJob) -> None:
    """A request of `job` is over (called under `cond`)."""
    job.streams.open -= 1


def refused(job: BlobJob, limits: StreamLimits, exc: BaseException, via: str) -> None:
    """A request of `job` failed with `exc` before its answer: when others of the file are open and it is
    a host's way of saying "no more streams" (a 403 that is no expired URL, a 429, a refused or reset
    connection), the host's limit is lowered and `StreamRefused` raised (takes `cond`)."""
    error = exc.error if isinstance(exc, Retryable) else exc
    if isinstance(error, CdnRefusedError):
        signal = not error.expired
    else:
        signal = isinstance(error, RateLimitedError) or (
            isinstance(error, OriginUnavailableError) and not isinstance(error, OriginOverloadedError)
        )
    with job.cond:
        answered(job)
        others = job.streams.open
        if not signal or not others:
            return
        host = job.streams.host
    now = limits.refused(host, others, via)
    log.info("%s: %s refused stream %d of the file; %d from now on", job.entry.path, host, others + 1, now)
    raise StreamRefused() from None


def give_back(job: BlobJob, idx: int, reader: Reader) -> None:
    """Chunk `idx`, refused to `reader`'s worker, goes back to the queue (unless another worker has it: a
    hedge), and the worker retires (called under `cond`)."""
    readers = job.readers.get(idx, [])
    if reader in readers:
        readers.remove(reader)
    if not readers:
        job.readers.pop(idx, None)
        job.moved.pop(idx, None)
        job.taken.pop(idx, None)
        if idx not in job.done and idx not in job.pending:
            bisect.insort(job.pending, idx)
    job.streams.workers -= 1
    job.cond.notify_all()
