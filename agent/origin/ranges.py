"""`OriginSource`: one blob from the origin with parallel HTTP range requests, resumable.

Per blob: `connections_per_file` worker threads take `chunk_size` chunks in order (at most `WINDOW`
connections' worth ahead of the oldest one still in flight) and `os.pwrite` them into the
preallocated `blobs/<id>.incomplete`; the calling thread hashes the
contiguous written prefix as it grows (`os.preadv` from the page cache), so when the last
byte lands only the tail is left to hash. A chunk whose response stalls, falls the window behind or
crawls at a fraction of a free worker's rate gets a second request for its rest (`_hedge`). A dropped
connection, truncated body or 5xx retries that chunk from the byte it had reached; a server that ignores
Range (200 instead of 206) is detected on the first request, before any other connection opens, and the
blob then comes as one sequential stream.

Resume: `state_dir/partials/<blob id>.json` lists the chunks fully written, updated
atomically after each one. Data is written before its chunk is recorded, and both go through
the page cache, so a SIGKILL loses nothing written (the kernel still owns the dirty pages).
A power loss can lose pages the record claims; the record is not fsynced for that reason
alone: the final hash over the whole blob catches it and the blob is discarded, not installed.

Parts (`Shares`): a large blob whose parts other nodes pull from the origin at the same
time. The engine then pulls only its own part and takes the others from `Shares.feeds` (the relay),
which write into the same file and record, so the hashing thread follows the contiguous prefix
whoever wrote it; a feed whose part nobody else will bring hands the rest of it to the engine's
workers (`Share.take_over`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

import urllib3

from agent.cache.layout import RepoCache, start_writeback
from agent.cache.partial import RECORD_EVERY, Reservation, load_record, write_failed, write_record
from agent.core.errors import (
    CacheError,
    IntegrityError,
    OriginError,
    OriginLengthError,
    OriginUnavailableError,
    WeightswarmError,
)
from agent.core.hashing import BlobHasher, BlobHashes
from agent.core.parts import Feed, Shares
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress
from agent.core.settings import FetchSettings
from agent.origin.answers import CdnRefusedError, Retryable
from agent.origin.client import OriginClient, body_complete, read_body_into, release
from agent.origin.location import FileLocation

log = logging.getLogger(__name__)

READ_BLOCK = 1 << 20
"""Bytes per write, read from the socket straight into a worker's own buffer (no per-block allocation)."""
READ_STEP = 64 << 10
"""The least bytes per read within a block, after each of which the chunk counts as moving
(`_Reader.seen`). A block read as one takes 1.3 s at 0.8 MB/s (4 nodes' connections sharing a shaped
10 MB/s origin): a chunk merely slow looked stalled and was hedged, and the origin served its first
4 MiB twice. A connection's reads grow to what it brings in `STEP_SECONDS` at its mean rate since its
request (not its last read's: one that found its bytes already queued takes no time), up to a whole
block: at loopback rates 64 KiB reads cost 20 % more CPU than 1 MiB ones."""
STEP_SECONDS = 0.1
WRITE_WITHIN = 0.25
"""Seconds a worker may hold bytes it has read before it writes them (else it writes a whole block).
The written prefix is what the relay and the HF endpoint stream, and its growth is what a lease
holder's heartbeats report: on an origin shared by 14 connections at 1 MB/s a 1 MiB block took
~15 s to fill, so a holder reading steadily showed no progress for longer than `holder_stall` and
another node took its lease and pulled the blob again (bench.swarm, 2 nodes: 1.46 x S of egress)."""
HASH_BLOCK = 4 << 20
WRITEBACK_EVERY = 16 << 20
SHORT_ANSWERS = 3
"""Answers in a row ending early at the same byte that make an origin's listed length a lie."""


class _Cancelled(Exception):
    """Another worker of the same blob failed; stop quietly."""


class _ChunkDone(Exception):
    """Another worker finished the chunk this one was hedging (or being hedged on): take the next."""


@dataclass
class _Reader:
    """One worker's read of one chunk (`_fetch_chunk`)."""

    pos: int
    """File offset of its next byte."""
    hedge: str
    """Why this is a second worker on its chunk ("stall" or "window", from `_hedge`) until its bytes
    flow; "" otherwise (a "slow" hedge closes the other response as it starts: `_fetch_chunk`)."""
    cut: bool = False
    """Set in the one of two that loses (`_settle_hedge`): the response a flowing hedge replaces, or a
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
    """Answers in a row that ended early at the same byte (`_ended_early`)."""
    ended_at: int = -1

    def start(self) -> None:
        self.seen = self.began = time.monotonic()
        self.got, self.step = 0, READ_STEP


HEDGE_AFTER = 1.0
"""Seconds the chunk at the head of the contiguous prefix may bring no byte, while the others keep
coming, before a free worker asks for the rest of it on its own connection. One stalled connection (a
lost segment's retransmit backing off, seen for 8 s under tc shaping) otherwise holds the prefix that
readers stream (the HF endpoint, the relay to other nodes) while the download front runs far ahead."""
WINDOW = 2
"""How far the download front may run ahead of the head chunk (the one holding the contiguous prefix
back), in connections' worth of chunks; in order it runs about one ahead. A flow that keeps moving,
only slowly (one of eight connections on a shaped origin getting a small share for seconds), held a
lease holder's prefix at 0 for 6.7 s while its front reached 166 MiB; the relayed nodes, whose
streams each carry a third of a node's uplink, then caught up 2.5-4 s after the holder had the blob
(bench.swarm, one 512-MiB shard: 1.36 x the bound, against 1.13 x when no head lagged). At the
window a free worker asks for the head's rest on its own connection (once; `_hedge`), and the others
wait for the head, which leaves it the origin's bandwidth, for at most `WINDOW_PATIENCE` seconds."""
WINDOW_PATIENCE = 5.0
"""Seconds the workers wait at the window after the head was hedged: an origin slow for one range
only (a CDN fetching it from further away) must not hold the whole download to that range's pace."""
SLOWER = 4.0
"""A free worker asks for the rest of a chunk whose response brings it this many times slower than the
worker's own connection brought its last chunk (`_hedge`, "slow"). On a shared origin TCP does not
share evenly: a trace of the 8-node benchmark (ss on the origin) showed each lease holder with one
connection at 4.6 MB/s and seven at 0.2 MB/s, for as long as they ran. A head chunk on one of those
took 20 s for its 4 MiB, never quiet for `HEDGE_AFTER` and behind the `WINDOW` for 11 s; the holder's
prefix stood at 97 MiB while its front reached the end, and its relayed nodes caught up 1.5-2.5 s after
it had the blob. A free worker on a fast connection that asks for the rest of such a chunk brings it at
its own rate."""
SLOW_LEFT = 2.0
"""Seconds the chunk's rest would still take at its response's rate, at least, for that hedge: a slow
response about to end is left to end."""
_TURN_EVERY = 0.1
"""Seconds between looks at whether background work must step aside (`Turn.due`)."""


@dataclass
class _Job:
    """Shared state of one blob's download (guarded by `cond`)."""

    entry: FileEntry
    location: FileLocation
    fd: int
    chunk_size: int
    nchunks: int
    done: set[int]
    progress: FileProgress
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
    """Seconds between a connection's reads (`_Reader.step`), smoothed over all of them: on a slow shared
    origin every chunk goes quiet that long between bytes without being stalled."""
    readers: dict[int, list[_Reader]] = field(default_factory=dict)
    """The workers on each chunk not yet done (two when hedged)."""
    waiting: set[int] = field(default_factory=set)
    """Chunks waiting out an unavailable origin (`OriginClient.patiently`): failing, not stalled, so
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
            for idx in _chunks([(start, end)], self.chunk_size):
                lo, hi = self.chunk_bounds(idx)
                total += hi - lo if idx in self.done else self.written.get(idx, 0)
            return total

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
        self, resp: urllib3.BaseHTTPResponse, buf: memoryview, pos: int, end: int, reader: _Reader
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

    def saw(self, reader: _Reader, n: int) -> None:
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
            if self.error is None or isinstance(self.error, _Cancelled):
                self.error = exc
            self.cond.notify_all()

    def quiet_since(self, idx: int) -> float:
        """When chunk `idx` (in flight) last brought bytes or was (re)started (called under `cond`)."""
        return max([self.moved[idx]] + [r.seen for r in self.readers.get(idx, [])])


class _Paused(Exception):
    """A worker gave its connection up to let other work through (`Turn`)."""


@dataclass(frozen=True)
class Turn:
    """Lets background work (a preheat) step aside: `due()` says it must stop pulling now, `wait()`
    blocks until it may go on. The blob's open range requests are then closed (`_step_aside`) and
    asked for the rest later: pausing reads alone would not do, because the socket buffers
    (megabytes per connection) keep taking the origin's bandwidth."""

    due: Callable[[], bool]
    wait: Callable[[], None]


class Share:
    """A feed's handle on its part [start, end) of the blob (agent.core.parts `PartSink`)."""

    def __init__(
        self, engine: OriginSource, plan: FetchPlan, cache: RepoCache, job: _Job, start: int, end: int
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
        """Raises `_Cancelled` once the blob is done with."""
        job, n = self._job, len(data)
        with job.write_lock:
            if job.closed:
                raise _Cancelled()
            os.pwrite(job.fd, data, pos)
        with job.cond:
            if job.error is not None:
                raise _Cancelled()
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


class OriginSource:
    """The origin hub as a `BlobSource`."""

    name = "origin"

    def __init__(
        self,
        client: OriginClient,
        settings: FetchSettings,
        *,
        piece_hashes: bool = True,
        turn: Turn | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.turn = turn
        """Background work's turn (None: this fetch never steps aside)."""
        self.piece_hashes = piece_hashes
        """Compute BitTorrent piece sha1s while hashing (the swarm publishes them as metainfo).

        About as costly as the sha256 itself; a fetch that will never publish metainfo turns it
        off and its sidecars then carry no pieces (`BlobHashes.pieces == b""`)."""
        self._lock = threading.Lock()
        self._received = 0
        self._resumed = 0
        self._relayed = 0

    @property
    def bytes_received(self) -> int:
        return self._received

    @property
    def bytes_relayed(self) -> int:
        """Bytes of parts that feeds brought (`Shares`)."""
        return self._relayed

    @property
    def bytes_resumed(self) -> int:
        return self._resumed

    def fetch_blob(
        self,
        plan: FetchPlan,
        entry: FileEntry,
        cache: RepoCache,
        progress: FileProgress,
        prefix: Callable[[int], None] | None = None,
        shares: Shares | None = None,
    ) -> BlobHashes:
        """`prefix`: called with the contiguous written prefix as it grows (a reader may serve it).
        `shares`: the blob comes in parts, most of them from feeds (see the module doc)."""
        location = FileLocation(lambda: self._resolve(plan, entry), what=entry.path)
        if shares is None or shares.own:  # one that pulls no part asks nothing unless a feed hands it one
            location.url  # noqa: B018 - resolved now: a disagreeing origin fails the blob before its file opens
        incomplete = cache.incomplete_path(entry.blob_id)
        done, written = load_record(cache, entry, self.settings.chunk_size)
        try:
            fd = os.open(incomplete, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CacheError(f"cannot write {incomplete}: {exc.strerror}") from exc
        job: _Job | None = None
        space: Reservation | None = None
        hopeless = False
        try:
            chunk = self.settings.chunk_size
            nchunks = -(-entry.size // chunk)
            job = _Job(entry, location, fd, chunk, nchunks, done, progress, written=written, prefix=prefix)
            space = Reservation(fd, entry.size, on_full=job.fail)
            mine = range(job.nchunks) if shares is None else _chunks(shares.own, chunk)
            job.pending = [i for i in mine if i not in done]
            resumed = sum(job.chunk_bounds(i)[1] - job.chunk_bounds(i)[0] for i in done)
            resumed += sum(written.values())
            if resumed:
                progress.advance(resumed)
                with self._lock:
                    self._resumed += resumed
            self._save_record(cache, plan, job)
            if shares is not None:
                shares.bind(job)
            hashes = self._run(plan, cache, job, shares)
        except IntegrityError:
            hopeless = True  # bytes the origin cannot or did not send right: no resume can help
            raise
        except WeightswarmError:
            raise
        except OSError as exc:
            raise write_failed(cache, entry, exc) from None
        finally:
            if job is not None:
                with job.write_lock:
                    job.closed = True
            if space is not None:
                space.close()
            os.close(fd)
            if hopeless:  # its reservation and resume record go with it
                cache.discard_partial(entry.blob_id)
        if hashes.content_id != entry.blob_id or hashes.size != entry.size:
            cache.discard_partial(entry.blob_id)
            kind = "sha256" if entry.is_lfs else "git sha1"
            raise IntegrityError(
                f"{entry.path}: downloaded content does not match the origin's {kind} "
                f"(expected {entry.blob_id[:16]}…, got {hashes.content_id[:16]}…); discarded, retry the fetch"
            )
        return hashes

    def _resolve(self, plan: FetchPlan, entry: FileEntry) -> str:
        """The URL the blob's bytes come from: an LFS file's signed CDN URL, once its metadata at the origin
        matches the plan (one resolve); a small file's resolve URL, asked directly (its 307 leads to the
        bytes, and its git sha1 is checked over them: a HEAD first would only cost a resolve more)."""
        if not entry.is_lfs:
            return self.client.resolve_url(plan.repo_id, plan.commit, entry.path)
        meta = self.client.patiently(lambda: self.client.file_metadata(plan.repo_id, plan.commit, entry.path))
        if meta.commit and meta.commit.lower() != plan.commit:
            raise OriginError(
                f"{entry.path}: origin served commit {meta.commit[:12]}, expected {plan.commit[:12]}"
            )
        if meta.blob_id != entry.blob_id or meta.size not in (None, entry.size):
            raise IntegrityError(
                f"{entry.path}: origin metadata (id {meta.blob_id[:12]}, {meta.size} B) disagrees with "
                f"its listing (id {entry.blob_id[:12]}, {entry.size} B)"
            )
        return meta.url

    # --- the download ----------------------------------------------------------------------------

    def _run(self, plan: FetchPlan, cache: RepoCache, job: _Job, shares: Shares | None) -> BlobHashes:
        self._start_workers(plan, cache, job)
        feeds: list[threading.Thread] = []
        for (start, end), feed in shares.feeds if shares is not None else []:
            share = Share(self, plan, cache, job, start, end)
            t = threading.Thread(
                target=self._feed, args=(job, feed, share), name=f"feed-{job.entry.path}-{start}", daemon=True
            )
            t.start()
            feeds.append(t)
        try:
            return self._hash(job)
        finally:
            with job.cond:
                if job.error is None and job.contiguous_end(0) < job.entry.size:
                    job.error = _Cancelled()
                job.cond.notify_all()
            for t in feeds:
                t.join()
            while True:  # a feed's `take_over` may have started more
                with job.cond:
                    workers, job.workers = job.workers, []
                if not workers:
                    break
                for t in workers:
                    t.join()
            with self._lock:
                self._received += job.received
                self._relayed += job.relayed

    def _start_workers(self, plan: FetchPlan, cache: RepoCache, job: _Job) -> None:
        """Workers for the job's pending chunks, up to `connections_per_file` (called without `cond`)."""
        with job.cond:
            alive = sum(t.is_alive() for t in job.workers)
            probe = job.mode is None and not alive
            for i in range(min(self.settings.connections_per_file, len(job.pending)) - alive):
                t = threading.Thread(
                    target=self._worker, args=(plan, cache, job, probe and i == 0),
                    name=f"fetch-{job.entry.path}-{len(job.workers)}", daemon=True,
                )
                t.start()
                job.workers.append(t)

    def _take_over(self, plan: FetchPlan, cache: RepoCache, job: _Job, start: int, end: int) -> None:
        """Chunks of [start, end) not written yet become the engine's own (`Share.take_over`)."""
        job.location.url  # noqa: B018 - resolved on first use, outside `cond` (a request to the origin)
        with job.cond:
            if job.error is not None:
                return
            chunks = _chunks([(start, end)], job.chunk_size)
            mine = [i for i in chunks if i not in job.done and i not in job.pending]
            job.pending.extend(mine)
            job.pending.sort()
            job.cond.notify_all()
        self._start_workers(plan, cache, job)

    @staticmethod
    def _feed(job: _Job, feed: Feed, share: Share) -> None:
        try:
            feed(share)
        except _Cancelled:
            return
        except BaseException as exc:  # as a worker's: the hashing thread raises it
            share.fail(exc)

    def _hash(self, job: _Job) -> BlobHashes:
        hasher = BlobHasher(job.entry.size, job.entry.is_lfs, pieces=self.piece_hashes)
        buf = bytearray(HASH_BLOCK)
        view = memoryview(buf)
        pos = flushed = 0
        size = job.entry.size
        checked = time.monotonic()
        while pos < size:
            if self.turn is not None and time.monotonic() - checked >= _TURN_EVERY:
                checked = time.monotonic()
                self._step_aside(job)
            with job.cond:
                while True:
                    if job.error is not None:
                        raise job.error
                    avail = job.contiguous_end(pos)
                    if avail > pos:
                        break
                    job.cond.wait(1.0 if self.turn is None else _TURN_EVERY)
                    if self.turn is not None and time.monotonic() - checked >= _TURN_EVERY:
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

    def _step_aside(self, job: _Job) -> None:
        """When background work must step aside: close every range request of the blob now. A worker
        blocked in a read cannot look at the turn itself (a read returns when its buffer is full, a
        whole chunk at a shared rate), and an open request keeps taking the origin's bandwidth."""
        assert self.turn is not None
        if not self.turn.due():
            return
        with job.cond:
            job.pausing = True
            reading = [r.resp for rs in job.readers.values() for r in rs if r.resp is not None]
        for resp in reading:
            _cut(resp)

    def _worker(self, plan: FetchPlan, cache: RepoCache, job: _Job, probe: bool) -> None:
        buf = memoryview(bytearray(READ_BLOCK))
        rate = 0.0  # bytes/s at which this worker's connection brought its last chunk (0: none yet)
        try:
            if not probe:
                with job.cond:
                    while job.mode is None and job.error is None:
                        job.cond.wait()
                    if job.mode != "ranges":
                        return
            while True:
                with job.cond:
                    if job.error is not None:
                        return
                    found = self._hedge(job, rate) if job.mode == "ranges" else None
                    idx, hedge = found if found is not None else (None, "")
                    if idx is None:
                        if job.mode == "ranges" and self._at_window(job):
                            job.cond.wait(HEDGE_AFTER / 4)
                            continue
                        if not job.pending:
                            unhedged = [i for i in self._in_flight(job) if i not in job.hedged]
                            if job.mode == "ranges" and unhedged:
                                job.cond.wait(HEDGE_AFTER / 4)  # the last chunks may still need a hand
                                continue
                            return
                        idx = job.pending.pop(0)
                    job.moved.setdefault(idx, time.monotonic())
                    job.taken.setdefault(idx, time.monotonic())
                try:
                    rate = self._fetch_chunk(plan, cache, job, idx, probe, buf, hedge) or rate
                except _ChunkDone:
                    continue
                probe = False
                with job.cond:
                    if job.mode == "stream":
                        job.done.update(range(job.nchunks))
                    else:
                        job.done.add(idx)
                    job.written.pop(idx, None)
                    job.moved.pop(idx, None)
                    job.taken.pop(idx, None)
                    for other in job.readers.pop(idx, []):
                        if other.resp is not None:  # the other worker, perhaps blocked on a stalled read
                            _cut(other.resp)
                    job.cond.notify_all()
                self._save_record(cache, plan, job)
        except _Cancelled:
            return
        except BaseException as exc:
            with job.cond:
                if job.mode is None:
                    job.mode = "failed"
            job.fail(exc)

    @staticmethod
    def _in_flight(job: _Job) -> list[int]:
        return [i for i in job.moved if i not in job.done]

    @staticmethod
    def _window(job: _Job) -> tuple[list[int], int, bool] | None:
        """(the chunks in flight, the head among them, whether the next pending chunk lies beyond the
        `WINDOW` from it); None when nothing is in flight (called under `job.cond`)."""
        in_flight = OriginSource._in_flight(job)
        if not in_flight:
            return None
        head = min(in_flight)
        span = WINDOW * max(1, len(job.workers))
        return in_flight, head, bool(job.pending) and job.pending[0] - head >= span

    @staticmethod
    def _at_window(job: _Job) -> bool:
        """A free worker waits instead of taking the next chunk: the front is at the window and the head's
        hedge is younger than `WINDOW_PATIENCE` (called under `job.cond`)."""
        window = OriginSource._window(job)
        if window is None or not window[2]:
            return False
        since = job.hedged.get(window[1])
        return since is None or time.monotonic() - since < WINDOW_PATIENCE

    @staticmethod
    def _hedge(job: _Job, rate: float) -> tuple[int, str] | None:
        """A chunk a second worker goes after, and why, if any (called under `job.cond`): the chunk holding
        the contiguous prefix back when it has stalled for `HEDGE_AFTER` seconds ("stall") or the front
        reached the `WINDOW` from it ("window"); or one whose response is `SLOWER` than the asking worker's
        connection (`rate`, bytes/s) was ("slow"): the head, or once no chunk is left to take any chunk in
        flight. A chunk is hedged once."""
        window = OriginSource._window(job)
        if window is None:
            return None
        in_flight, head, at_window = window
        now = time.monotonic()
        why = None
        if head not in job.hedged and head not in job.waiting:
            why = OriginSource._held_back(job, in_flight, head, at_window, now)
        idx = head
        if why is None:
            slow = OriginSource._slower(job, [head] if job.pending else sorted(in_flight), rate, now)
            if slow is None:
                return None
            idx, why = slow, "slow"
        job.hedged[idx] = now
        return idx, why

    @staticmethod
    def _slower(job: _Job, chunks: list[int], rate: float, now: float) -> int | None:
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

    @staticmethod
    def _held_back(job: _Job, in_flight: list[int], head: int, at_window: bool, now: float) -> str | None:
        """Why the head chunk gets a second worker ("window", "stall"), if it does (under `job.cond`)."""
        if at_window and now - job.taken.get(head, now) >= HEDGE_AFTER:
            # Slow, not stalled: the others are the proof that the origin has bandwidth for a second flow.
            return "window"
        # Quiet for longer than reads take here: at 100 KB/s per connection a 256 KiB read took 2.5 s,
        # and hedging every chunk then pulled the origin's bytes twice (1.2 x S measured, 3 nodes).
        # A step (`READ_STEP`) takes 0.65 s there.
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

    def _fetch_chunk(
        self,
        plan: FetchPlan,
        cache: RepoCache,
        job: _Job,
        idx: int,
        probe: bool,
        buf: memoryview,
        hedge: str = "",
    ) -> float:
        """Bytes/s at which the chunk's last request brought it (0.0: none was needed).

        `hedge`: why this is a second worker on the chunk (`_hedge`); once its bytes flow, one of the
        two responses is closed (`_settle_hedge`; a "slow" hedge closes the other as it starts). Left open,
        a stall that ends (a retransmit backing off under shaping) sent the same bytes down both
        connections: up to a chunk served twice."""
        start, end = job.chunk_bounds(idx)
        what = job.entry.path
        with job.cond:
            reader = _Reader(pos=start + job.written.get(idx, 0), hedge=hedge)
            if reader.pos >= end:
                return 0.0
            replaced = list(job.readers.get(idx, [])) if hedge == "slow" else []
            job.readers.setdefault(idx, []).append(reader)  # until the chunk is done
            if replaced:
                # A response `SLOWER` than this worker's connection brings little while this request's
                # first bytes are on their way, and what it brought then came twice: about 150 KB a hedge,
                # 2 % of S on the shared origin of the benchmark, where nearly every chunk of a
                # lease holder is hedged (BBR starves all but one of its connections). Closed now.
                reader.hedge = ""
                for other in replaced:
                    other.cut = True
            open_ = [other.resp for other in replaced if other.resp is not None]
        for resp in open_:
            _cut(resp)

        def attempt() -> None:
            pos = asked = reader.pos
            reader.start()
            with job.cond:
                if idx in job.done or reader.cut:
                    raise _ChunkDone()
                if job.pausing:
                    raise _Paused()  # cut by `_step_aside` (or about to be): no new request now
            url = job.location.url
            try:
                resp = self.client.request("GET", url, what, {"Range": f"bytes={pos}-{end - 1}"})
            except CdnRefusedError as exc:
                job.location.refused(url, exc)  # a renewed URL, or the refusal raised
                raise Retryable(exc, delay=0.0) from None  # asked again at once, from `reader.pos`
            job.location.worked(url)
            job.location.moved(url, resp.url or "")
            with job.cond:
                reader.resp = resp
            try:
                if resp.status == 200:
                    if not ((probe and job.mode is None) or job.mode == "stream"):
                        raise OriginError(f"{what}: origin ignored Range after honouring it")
                    self._stream_whole(job, resp, reader, buf)
                    return
                if resp.status != 206:
                    raise OriginError(f"{what}: unexpected status {resp.status} for a range request")
                crange = resp.headers.get("Content-Range", "")
                if not crange.startswith(f"bytes {pos}-"):
                    raise OriginError(f"{what}: origin sent range {crange!r}, asked for {pos}-{end - 1}")
                with job.cond:
                    if job.mode is None:
                        job.mode = "ranges"
                        job.cond.notify_all()
                while pos < end:
                    n = job.write_from(resp, buf, pos, end, reader)
                    if not n:
                        break
                    pos += n
                    reader.pos = pos
                    if reader.hedge:
                        self._settle_hedge(job, idx, reader, asked)
                    if self._wrote(job, idx, pos - start, n):
                        self._save_record(cache, plan, job)
                if pos < end:
                    with job.cond:
                        if idx in job.done or reader.cut:  # the other worker has it, and cut this one
                            raise _ChunkDone()
                    self._ended_early(job, reader, pos, f"{pos}-{end - 1}")
                if not body_complete(resp):
                    raise OriginError(f"{what}: origin sent more bytes than the range asked for")
            finally:
                with job.cond:
                    reader.resp = None
                release(resp)

        while True:
            if self.turn is not None:
                if self.turn.due():
                    self.turn.wait()  # this chunk's request was cut (or never made): none is open now
                with job.cond:
                    if job.pausing:
                        job.pausing = False
                        job.moved[idx] = time.monotonic()  # a paused chunk is no stalled one to hedge
            try:
                self.client.patiently(
                    lambda: self.client.retrying(what, attempt),
                    moved=lambda: reader.pos,
                    pause=lambda seconds: self._wait_out(job, idx, seconds),
                )
                return reader.got / max(time.monotonic() - reader.began, 1e-6)
            except _Paused:
                continue
            except WeightswarmError:
                with job.cond:
                    if not job.pausing:
                        raise
                # The read failed because `_step_aside` cut it: not an origin failure.

    @staticmethod
    def _settle_hedge(job: _Job, idx: int, reader: _Reader, asked: int) -> None:
        """The hedge's bytes flow (it asked from byte `asked`): close the response it was sent to replace,
        whose worker takes the next chunk. But a stalled response that came back meanwhile and is past
        `asked` keeps the chunk, and the hedge gives way (`_ChunkDone`); the chunk may be hedged again if
        it stalls again. On an origin shared by 16 connections a hedge took 7 s to its first byte, while
        the response it was to replace came back after 1.2 s: cut then, at 3 MiB, it had the origin send
        those 3 MiB twice (bench.swarm at 16 nodes, cold: 1.07 x S of egress)."""
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
                raise _ChunkDone()
            for other in stalled:
                other.cut = True
            open_ = [other.resp for other in stalled if other.resp is not None]
        for resp in open_:
            _cut(resp)

    def _wait_out(self, job: _Job, idx: int, seconds: float) -> bool:
        """Chunk `idx`'s pause while the origin is unavailable; over early (False) when the blob fails,
        steps aside or the daemon stops."""
        end = time.monotonic() + seconds

        def go_on() -> bool:
            return job.error is None and not job.pausing and not self.client.interrupted

        with job.cond:
            job.waiting.add(idx)
            try:
                while go_on() and time.monotonic() < end:
                    job.cond.wait(min(0.5, end - time.monotonic()))
                return go_on()
            finally:
                job.waiting.discard(idx)
                job.moved[idx] = time.monotonic()

    def _stream_whole(
        self, job: _Job, resp: urllib3.BaseHTTPResponse, reader: _Reader, buf: memoryview
    ) -> None:
        """Server ignored Range: take the whole body in order on this one connection."""
        with job.cond:
            if job.mode is None:
                log.info("%s: the origin ignores Range; one stream for the whole file", job.entry.path)
            job.mode = "stream"
            job.pending.clear()
            job.cond.notify_all()
        size = job.entry.size
        pos = 0
        while pos < size:
            n = job.write_from(resp, buf, pos, size, reader)
            if not n:
                break
            pos += n
            # A restart of this stream re-sends from 0: nothing before `pos` is re-counted as done.
            with job.cond:
                job.received += n
                idx = (pos - 1) // job.chunk_size
                job.done.update(range(idx))
                job.written[idx] = pos - idx * job.chunk_size
                job.cond.notify_all()
            job.progress.advance(n)
        reader.pos = 0
        if pos < size:
            with job.cond:
                job.done.clear()
                job.written.clear()
            self._ended_early(job, reader, pos, f"0-{size - 1}")
        if not body_complete(resp):
            raise OriginError(f"{job.entry.path}: origin sent more than {size} bytes")

    def _ended_early(self, job: _Job, reader: _Reader, pos: int, asked: str) -> NoReturn:
        """An answer ended before the bytes it promised: a dropped connection (asked again from `pos`), or,
        when `SHORT_ANSWERS` answers in a row end at the same byte, an origin that lists more bytes than
        it has: no retry or resume can bring them (OriginLengthError: the partial file goes)."""
        if reader.ended_at == pos:
            reader.short += 1
        else:
            reader.ended_at, reader.short = pos, 1
        entry = job.entry
        if reader.short >= SHORT_ANSWERS:
            raise OriginLengthError(
                f"{entry.path}: the origin lists {entry.size} bytes, but its answers end at byte {pos} "
                f"({reader.short} times in a row, nothing more sent): it cannot send what it lists; the "
                "partial file was discarded. Tell the origin's operator, or retry once it is fixed"
            )
        raise Retryable(OriginUnavailableError(f"{entry.path}: body ended at byte {pos} of {asked}"))

    def _wrote(self, job: _Job, idx: int, chunk_written: int, n: int) -> bool:
        """Account for `n` bytes written; True when the resume record is due for an update."""
        with job.cond:
            if job.error is not None:
                raise _Cancelled()
            if idx in job.done:
                raise _ChunkDone()  # the other worker on this chunk got there first
            job.written[idx] = max(job.written.get(idx, 0), chunk_written)
            job.moved[idx] = time.monotonic()
            job.received += n
            job.unrecorded += n
            due = job.unrecorded >= RECORD_EVERY
            if due:
                job.unrecorded = 0
            job.cond.notify_all()
        job.progress.advance(n)
        return due

    # --- resume records --------------------------------------------------------------------------

    def _save_record(self, cache: RepoCache, plan: FetchPlan, job: _Job) -> None:
        with job.cond:
            done = sorted(job.done)
            streaming = job.mode == "stream"
            written = {i: n for i, n in job.written.items() if i not in job.done and not streaming}
        # Concurrent workers write whole records via os.replace: the last one wins and each lists
        # only chunks that were written, so any interleaving is safe.
        write_record(cache, plan, job.entry, job.chunk_size, done, written)


def _chunks(ranges: list[tuple[int, int]], chunk: int) -> list[int]:
    """The indices of the chunks that byte ranges touch."""
    return [i for start, end in ranges for i in range(start // chunk, -(-end // chunk))]


def _cut(resp: urllib3.BaseHTTPResponse) -> None:
    """Shut the connection under a response another thread is reading: its blocked read returns."""
    conn = getattr(resp, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
