"""glibc malloc arenas for the daemon: two, not eight per core.

glibc gives a thread that finds the main heap locked an arena of its own, up to eight per core, and
each keeps what its thread freed. The daemon runs many threads that allocate block buffers at once
(libtorrent's disk and hashing threads, fetch workers, the HTTP servers), so its anonymous memory grew
with the arenas. 8 namespace nodes, 512 MiB (bench.swarm --nodes 8 --size 512MiB --shards 2
--scenarios warm), peak RssAnon per agent, three runs without, four with two arenas: cold 109-126 ->
86-98 MiB, warm 148-178 -> 123-158 MiB, in the same times.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

ARENAS = 2
_M_ARENA_MAX = -8
"""mallopt's parameter number for the arena cap (glibc malloc.h)."""


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at `arenas`; call before the daemon starts its threads (arenas made
    already stay). False where the C library has no mallopt (not glibc) or refused."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_ARENA_MAX, arenas))
    if not ok:
        log.info("could not cap malloc arenas (mallopt refused)")
    return ok
