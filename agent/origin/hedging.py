"""When a second worker asks for the rest of a chunk of a blob downloading from the origin (a hedge),
and which of the two responses goes on once the hedge's bytes flow (agent.origin.ranges calls these
under the job's lock, except `settle_hedge`)."""

from __future__ import annotations

import time

from agent.origin.chunks import BlobJob, ChunkDone, Reader, cut_response

HEDGE_AFTER = 1.0
"""Seconds the chunk at the head of the contiguous prefix may bring no byte, while the others keep
coming, before a free worker asks for the rest of it on its own connection. One stalled connection (a
lost segment's retransmit backing off for seconds) otherwise holds the prefix that readers stream (the
HF endpoint, the relay to other nodes) while the download front runs far ahead."""
WINDOW = 2
"""How far the download front may run ahead of the head chunk (the one holding the contiguous prefix
back), in connections' worth of chunks; in order it runs about one ahead. A flow that keeps moving,
only slowly (one of eight connections on a shaped origin getting a small share for seconds), held a
lease holder's prefix back while its front ran far ahead, and the relayed nodes, whose streams each
carry a third of a node's uplink, caught up seconds after the holder had the blob (benchmarks.md, "The
origin engine on a shared origin"). At the window a free worker asks for the head's rest on its own
connection (once; `hedge`), and the others wait for the head, which leaves it the origin's bandwidth,
for at most `WINDOW_PATIENCE` seconds."""
WINDOW_PATIENCE = 5.0
"""Seconds the workers wait at the window after the head was hedged: an origin slow for one range
only (a CDN fetching it from further away) must not hold the whole download to that range's pace."""
SLOWER = 4.0
"""A free worker asks for the rest of a chunk whose response brings it this many times slower than the
worker's own connection brought its last chunk (`hedge`, "slow"). On a shared origin TCP does not
share evenly: a lease holder's connections split into one fast and several starved for as long as they
ran, and a head chunk on a starved one, never quiet for `HEDGE_AFTER` and long behind the `WINDOW`, held
the holder's prefix and its relayed nodes back until its front reached the end (benchmarks.md, "The
origin engine on a shared origin"). A free worker on a fast connection that asks for the rest of
such a chunk brings it at its own rate."""
SLOW_LEFT = 2.0
"""Seconds the chunk's rest would still take at its response's rate, at least, for that hedge: a slow
response about to end is left to end."""


def in_flight_chunks(job: BlobJob) -> list[int]:
    return [i for i in job.moved if i not in job.done]


def window_of(job: BlobJob) -> tuple[list[int], int, bool] | None:
    """(the chunks in flight, the head among them, whether the next pending chunk lies beyond the
    `WINDOW` from it); None when nothing is in flight (called under `job.cond`)."""
    in_flight = in_flight_chunks(job)
    if not in_flight:
        return None
    head = min(in_flight)
    span = WINDOW * max(1, len(job.workers))
    return in_flight, head, bool(job.pending) and job.pending[0] - head >= span


def at_window(job: BlobJob) -> bool:
    """A free worker waits instead of taking the next chunk: the front is at the window and the head's
    hedge is younger than `WINDOW_PATIENCE` (called under `job.cond`)."""
    window = window_of(job)
    if window is None or not window[2]:
        return False
    since = job.hedged.get(window[1])
    return since is None or time.monotonic() - since < WINDOW_PATIENCE


def hedge(job: BlobJob, rate: float) -> tuple[int, str] | None:
    """A chunk a second worker goes after, and why, if any (called under `job.cond`): the chunk holding
    the contiguous prefix back when it has stalled for `HEDGE_AFTER` seconds ("stall") or the front
    reached the `WINDOW` from it ("window"); or one whose response is `SLOWER` than the asking worker's
    connection (`rate`, bytes/s) was ("slow"): the head, or once no chunk is left to take any chunk in
    flight. A chunk is hedged once."""
    window = window_of(job)
    if window is None:
        return None
    in_flight, head, at_window = window
    now = time.monotonic()
    why = None
    if head not in job.hedged and head not in job.waiting:
        why = held_back(job, in_flight, head, at_window, now)
    idx = head
    if why is None:
        slow = slower(job, [head] if job.pending else sorted(in_flight), rate, now)
        if slow is None:
            return None
        idx, why = slow, "slow"
    job.hedged[idx] = now
    return idx, why


def slower(job: BlobJob, chunks: list[int], rate: float, now: float) -> int | None:
    """The first of `chunks` whose one response brings it `SLOWER` than `rate` with more than `SLOW_LEFT`
    seconds of it to go (called under `job.cond`)."""
    if rate <= 0:
        return None
    for idx in chunks:
        readers = job.readers.get(idx, [])
        if idx in job.hedged or idx in job.waiting or len(readers) != 1:
            continue
        reader = readers[0]
        took = now - reader.began
        if reader.resp is None or took < HEDGE_AFTER:
            continue
        its = reader.got / took
        left = job.chunk_bounds(idx)[1] - reader.pos
        if rate >= SLOWER * its and left > SLOW_LEFT * its:
            return idx
    return None


def held_back(job: BlobJob, in_flight: list[int], head: int, at_window: bool, now: float) -> str | None:
    """Why the head chunk gets a second worker ("window", "stall"), if it does (under `job.cond`)."""
    if at_window and now - job.taken.get(head, now) >= HEDGE_AFTER:
        # Slow, not stalled: the others are the proof that the origin has bandwidth for a second flow.
        return "window"
    # Quiet for longer than reads take here: on a slow origin one read takes seconds, and hedging every
    # chunk quiet for `HEDGE_AFTER` then pulled the origin's bytes twice.
    quiet = max(HEDGE_AFTER, 3 * job.read_gap)
    if not job.read_gap:
        # No read has returned yet, so nothing says how long one takes here: a slow start (a loaded
        # node, a far origin) is no stall, and a hedge now asks for the whole chunk again.
        return None
    if now - job.quiet_since(head) < quiet:
        return None
    if not any(now - job.quiet_since(i) < quiet for i in in_flight if i != head) and job.pending:
        return None  # everything is slow: a second request would only share the same link
    return "stall"


def settle_hedge(job: BlobJob, idx: int, reader: Reader, asked: int) -> None:
    """The hedge's bytes flow (it asked from byte `asked`): close the response it was sent to replace,
    whose worker takes the next chunk. But a stalled response that came back meanwhile and is past
    `asked` keeps the chunk, and the hedge gives way (`ChunkDone`); the chunk may be hedged again if
    it stalls again. On a busy shared origin a hedge can take longer to its first byte than the response
    it was to replace takes to come back: cut then, it had the origin send what that response had
    brought twice (benchmarks.md, "The origin engine on a shared origin")."""
    kind, reader.hedge = reader.hedge, ""
    now = time.monotonic()
    with job.cond:
        readers = job.readers.get(idx, [])
        stalled = [other for other in readers if other is not reader]
        back = [o for o in stalled if not o.cut and o.pos > asked and now - o.seen < HEDGE_AFTER]
        if kind == "stall" and back:
            reader.cut = True
            readers.remove(reader)
            job.hedged.pop(idx, None)
            raise ChunkDone()
        for other in stalled:
            other.cut = True
        open_ = [other.resp for other in stalled if other.resp is not None]
    for resp in open_:
        cut_response(resp)
