"""glibc malloc for the daemon: two arenas, not eight per core, and their free pages handed back.

glibc gives a thread that finds the main heap locked an arena of its own, up to eight per core, and
each keeps what its thread freed. The daemon runs many threads that allocate block buffers at once
(libtorrent's disk and hashing threads, fetch workers, the HTTP servers), so its anonymous memory grew
with the arenas; two keep it lower in the same times (benchmarks.md, "Memory").

What the arenas keep: a chunk freed in the middle of an arena stays resident (glibc returns only the
top of a heap), so a burst of block buffers (a warm fetch: the receive, send and disk buffers of
seven peers and four blobs) left the agent's RssAnon at its high-water mark for good, with two of its
64 MiB arena heaps fully resident. `trim_heaps` (glibc's malloc_trim, which hands every free page of
every arena back to the kernel) runs every `TRIM_EVERY` seconds, which lowers a warm round's peak
RssAnon in the same times (benchmarks.md, "Memory").
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

ARENAS = 2
TRIM_EVERY = 1.0
"""Seconds between two `trim_heaps`: each takes milliseconds, and a burst of buffers lasts seconds."""
_M_ARENA_MAX = -8
"""mallopt's parameter number for the arena cap (glibc malloc.h)."""


@functools.cache
def libc_function(name: str) -> Any:
    """The C library's function `name`, looked up once; None where it has none (not glibc)."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at `arenas`; call before the daemon starts its threads (arenas made
    already stay). False where the C library has no mallopt (not glibc) or refused."""
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    ok = bool(mallopt(_M_ARENA_MAX, arenas))
    if not ok:
        log.info("could not cap malloc arenas (mallopt refused)")
    return ok


def trim_heaps() -> bool:
    """Hand the free pages of every malloc arena back to the kernel (glibc malloc_trim). False where the
    C library has none (not glibc) or had nothing to give back."""
    trim = libc_function("malloc_trim")
    return trim is not None and bool(trim(0))


def trim_loop(stop: threading.Event) -> None:
    """The daemon's background task: `trim_heaps` every `TRIM_EVERY` seconds until `stop`."""
    while not stop.wait(TRIM_EVERY):
        trim_heaps()
