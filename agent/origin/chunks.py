"""The state of one blob's download from the origin (agent.origin.ranges): its chunks, the workers'
readers, what is done and written, and the exceptions its workers signal each other with."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import urllib3

from agent.core.plan import FileEntry
from agent.core.progress import FileProgress
from agent.origin.headway import Headway
from agent.origin.location import FileLocation
from agent.origin.session import read_body_into

READ_BLOCK = 1 << 20
"""Bytes per write, read from the socket straight into a worker's own buffer (no per-block allocation)."""
READ_STEP = 64 << 10
"""The least bytes per read within a block, after each of which the chunk counts as moving
(`Reader.seen`). A block read as one takes over a second on a slow shared origin: a chunk merely slow
looked stalled and was hedged, and the origin served its first bytes twice. A connection's reads grow
to what it brings in `STEP_SECONDS` at its mean rate since its request (not its last read's: one that
found its bytes already queued takes no time), up to a whole block, since small reads cost more CPU at
loopback rates (benchmarks.md, "The origin engine on a shared origin")."""
STEP_SECONDS = 0.1
WRITE_WITHIN = 0.25
"""Seconds a worker may hold bytes it has read before it writes them (else it writes a whole block).
The written prefix is what the relay and the HF endpoint stream, and its growth is what a lease
holder's heartbeats report: on a slow shared origin a whole block took longer than `holder_stall` to
fill, so a holder reading steadily showed no progress and another node took its lease and pulled the
blob again (benchmarks.md, "The origin engine on a shared origin")."""


class Cancelled(Exception):
    """Another worker of the same blob failed; stop quietly."""


class ChunkDone(Exception):
    """Another worker finished the chunk this one was hedging (or being hedged on): take the next."""


@dataclass
class Reader:
    """One worker's read of one chunk (`OriginSource._fetch_chunk`)."""

    pos: int
    """File offset of its next byte."""
    hedge: str
    """Why this is a second worker on its chunk ("stall" or "window", from `hedging.hedge`) until its
    bytes flow; "" otherwise (a "slow" hedge closes the other response as it starts:
    `OriginSource._fetch_chunk`)."""
    cut: bool = False
    """Set in the one of two that loses (`hedging.settle_hedge`): the response a flowing hedge replaces, or a
    hedge that gives way."""
    resp: urllib3.BaseHTTPResponse | None = None
    """Its open response, if any (guarded by the job's `cond`)."""
    seen: float = field(default_factory=time.monotonic)
    """When its connection last brought a step's bytes (or the request began)."""
    step: int = READ_STEP
    """Bytes for its next read."""
    began: float = 0.0
    got: int = 0
    """When its current request began, and the bytes it has brought since."""
    short: int = 0
    """Answers in a row that ended early at the same byte (`OriginSource._short_answer`)."""
    stepped_aside: bool = False
    """Its open response was cut for background work to step aside (`OriginSource._step_aside`): that answer
    ended early by our doing, not the origin's (guarded by the job's `cond`; cleared as it asks anew)."""
    ended_at: int = -1

    def start(self) -> None:
        self.seen = self.began = time.monotonic()
        self.got, self.step = 0, READ_STEP


@dataclass
class BlobJob:
    """Shared state of one blob's download (guarded by `cond`)."""

    entry: FileEntry
    location: FileLocation
    fd: int
    chunk_size: int
    nchunks: int
    done: set[int]
    progress: FileProgress
    headway: Headway
    """Whether the blob makes headway (agent.origin.headway), guarded by `cond`."""
    cond: threading.Condition = field(default_factory=threading.Condition)
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held around each pwrite. ext4 (and most filesystems) serialise buffered writes to one inode
    anyway; waiting here sleeps, whereas the kernel's inode lock spins optimistically and, with 8
    writers per file on a 2-core node, burnt up to a core that hashing needed (perf: rwsem_spin_on_owner)."""
    written: dict[int, int] = field(default_factory=dict)
    """Contiguous bytes written from each chunk's start (for chunks in flight)."""
    moved: dict[int, float] = field(default_factory=dict)
    """When each chunk in flight last brought bytes (monotonic)."""
    hedged: dict[int, float] = field(default_factory=dict)
    """Chunks a second worker was sent after (at most once each), and when."""
    taken: dict[int, float] = field(default_factory=dict)
    """When each chunk in flight was taken (monotonic)."""
    read_gap: float = 0.0
    """Seconds between a connection's reads (`Reader.step`), smoothed over all of them: on a slow shared
    origin every chunk goes quiet that long between bytes without being stalled."""
    readers: dict[int, list[Reader]] = field(default_factory=dict)
    """The workers on each chunk not yet done (two when hedged)."""
    waiting: set[int] = field(default_factory=set)
    """Chunks waiting out an unavailable origin (`Origin.patiently`): failing, not stalled, so
    not hedged (a hedge would only wait beside it, and then both would fetch the chunk)."""
    pausing: bool = False
    """Background work stepping aside (`OriginSource._step_aside`): requests were cut, none start."""
    pending: list[int] = field(default_factory=list)
    mode: str | None = None
    """None until the first response: 'ranges' (206) or 'stream' (server ignored Range)."""
    error: BaseException | None = None
    closed: bool = False
    """The file is closed (set under `write_lock`): a feed still running must not write."""
    relayed: int = 0
    """Bytes written by feeds (not from the origin)."""
    workers: list[threading.Thread] = field(default_factory=list)
    streams: FileStreams = field(default_factory=lambda: FileStreams())
    prefix: Callable[[int], None] | None = None
    """Told the contiguous written prefix as it grows (agent.cache.arrivals: readers stream it)."""
    received: int = 0
    unrecorded: int = 0
    streamed: int = 0
    """Bytes read from origin connections, written or not yet (agent.core.parts `Written`); like `saw`'s
    counters not under `cond`: a lost update is a few KiB in a rate."""

    def extent(self, pos: int) -> int:
        """`contiguous_end` for other threads (takes `cond`)."""
        with self.cond:
            return self.contiguous_end(pos)

    def present(self, start: int, end: int) -> int:
        """Bytes of the chunks of [start, end) written so far (takes `cond`); `start` chunk-aligned."""
        with self.cond:
            total = 0
            for idx in chunks_of([(start, end)], self.chunk_size):
                lo, hi = self.chunk_bounds(idx)
                total += hi - lo if idx in self.done else self.written.get(idx, 0)
            return total

    def furthest(self) -> int:
        """The end of the furthest byte written (called under `cond`, or once the workers are done)."""
        ends = [self.chunk_bounds(i)[1] for i in self.done]
        ends += [i * self.chunk_size + n for i, n in self.written.items() if n]
        return max(ends, default=0)

    def give_back(self) -> None:
        """A blob that failed and may be resumed keeps the bytes it has and gives the rest of its
        reservation back: the file ends after its furthest written byte (a later fetch reserves the rest
        again). An origin that listed 10 GiB and then failed held all of it until the partial aged out."""
        with self.cond:
            keep = self.furthest()
        try:
            os.ftruncate(self.fd, keep)
        except OSError:
            pass  # the partial then holds its reservation until it is resumed, evicted or swept

    def chunk_bounds(self, idx: int) -> tuple[int, int]:
        start = idx * self.chunk_size
        return start, min(start + self.chunk_size, self.entry.size)

    def contiguous_end(self, pos: int) -> int:
        """How far from `pos` the file is known to be written."""
        while pos < self.entry.size:
            idx = pos // self.chunk_size
            start, end = self.chunk_bounds(idx)
            if idx in self.done:
                pos = end
                continue
            return max(pos, start + self.written.get(idx, 0))
        return pos

    def write_from(
        self, resp: urllib3.BaseHTTPResponse, buf: memoryview, pos: int, end: int, reader: Reader
    ) -> int:
        """Read up to `end - pos` body bytes into `buf` (for at most `WRITE_WITHIN` seconds), write them to
        the file at `pos`; 0 = body ended."""
        want = min(len(buf), end - pos)
        n = 0
        write_by = time.monotonic() + WRITE_WITHIN
        while n < want:
            got = read_body_into(resp, buf[n : min(want, n + reader.step)])
            if not got:
                break
            n += got
            self.saw(reader, got)
            if reader.seen >= write_by:  # `saw` stamped the read
                break
        if n:
            with self.write_lock:
                os.pwrite(self.fd, buf[:n], pos)
        return n

    def saw(self, reader: Reader, n: int) -> None:
        """`reader`'s connection brought `n` bytes. Not under `cond`: a lost update of these floats (two
        workers at once) costs nothing, a lock per step would."""
        now = time.monotonic()
        gap = now - reader.seen
        reader.seen = now
        reader.got += n
        self.streamed += n
        rate = reader.got / max(now - reader.began, 1e-6)
        reader.step = max(READ_STEP, min(READ_BLOCK, int(rate * STEP_SECONDS)))
        self.read_gap = gap if not self.read_gap else 0.8 * self.read_gap + 0.2 * gap

    def fail(self, exc: BaseException) -> None:
        """Hand `exc` to the hashing thread, which raises it (takes `cond`)."""
        with self.cond:
            if self.error is None or isinstance(self.error, Cancelled):
                self.error = exc
            self.cond.notify_all()

    def quiet_since(self, idx: int) -> float:
        """When chunk `idx` (in flight) last brought bytes or was (re)started (called under `cond`)."""
        return max([self.moved[idx]] + [r.seen for r in self.readers.get(idx, [])])


@dataclass
class FileStreams:
    """One blob's streams to its download host (guarded by its job's `cond`; agent.origin.streams)."""

    host: str = ""
    """The download host of its URL, once asked."""
    workers: int = 0
    """Workers taking chunks, not yet retired or ended."""
    open: int = 0
    """Requests asked or being answered now."""


class Paused(Exception):
    """A worker gave its connection up to let other work through (`Turn`)."""


@dataclass(frozen=True)
class Turn:
    """Lets background work (a preheat) step aside: `due()` says it must stop pulling now, `wait()`
    blocks until it may go on. The blob's open range requests are then closed (`OriginSource._step_aside`) and
    asked for the rest later: pausing reads alone would not do, because the socket buffers
    (megabytes per connection) keep taking the origin's bandwidth."""

    due: Callable[[], bool]
    wait: Callable[[], None]


def chunks_of(ranges: list[tuple[int, int]], chunk: int) -> list[int]:
    """The indices of the chunks that byte ranges touch."""
    return [i for start, end in ranges for i in range(start // chunk, -(-end // chunk))]


def cut_response(resp: urllib3.BaseHTTPResponse) -> None:
    """Shut the connection under a response another thread is reading: its blocked read returns."""
    conn = getattr(resp, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
