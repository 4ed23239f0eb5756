"""`OriginSource`: one blob from the origin with parallel HTTP range requests, resumable.

Per blob: `connections_per_file` worker threads take `chunk_size` chunks in order (at most `WINDOW`
connections' worth ahead of the oldest one still in flight) and `os.pwrite` them into the
preallocated `blobs/<id>.incomplete`; the calling thread hashes the (agent.origin.prefix)
contiguous written prefix as it grows (`os.preadv` from the page cache), so when the last
byte lands only the tail is left to hash. A chunk whose response stalls, falls the window behind or
crawls at a fraction of a free worker's rate gets a second request for its rest (agent.origin.hedging).
A dropped connection, truncated body or 5xx retries that chunk from the byte it had reached; a server
that ignores Range (200 instead of 206) is detected on the first request, before any other connection
opens, and the blob then comes as one sequential stream.
A download host that refuses one more stream of the file (403, 429, a reset) while others are open sets
how many streams its files get (agent.origin.streams): the refused chunk goes back to the queue.

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

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import NoReturn

import urllib3

from agent.cache.layout import RepoCache
from agent.cache.partial import RECORD_EVERY, Reservation, load_record, write_failed, write_record
from agent.core.errors import (
    CacheError,
    IntegrityError,
    OriginError,
    OriginLengthError,
    OriginStalledError,
    OriginUnavailableError,
    WeightswarmError,
)
from agent.core.hashing import BlobHashes
from agent.core.parts import Feed, Shares
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress
from agent.core.settings import FetchSettings
from agent.origin import hedging, streams
from agent.origin.answers import CdnRefusedError, Retryable
from agent.origin.chunks import (
    READ_BLOCK,
    BlobJob,
    Cancelled,
    ChunkDone,
    Paused,
    Reader,
    Turn,
    chunks_of,
    cut_response,
)
from agent.origin.client import Origin
from agent.origin.headway import MEAGRE, SAME_BYTE, Headway
from agent.origin.hedging import HEDGE_AFTER
from agent.origin.location import FileLocation
from agent.origin.prefix import hash_prefix
from agent.origin.session import body_complete, release
from agent.origin.share import Share
from agent.origin.streams import StreamLimits, StreamRefused

log = logging.getLogger(__name__)

class OriginSource:
    """The origin hub as a `BlobSource`."""

    name = "origin"

    def __init__(
        self,
        client: Origin,
        settings: FetchSettings,
        *,
        piece_hashes: bool = True,
        turn: Turn | None = None,
        limits: StreamLimits | None = None,
    ) -> None:
        self.client = client
        self.limits = limits or streams.LIMITS
        """Streams per file each download host allows (agent.origin.streams; the process's by default)."""
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
        self.savers: dict[int, Callable[[], None]] = {}  # per open blob: save its resume record now (Ctrl-C)

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

    def streams_per_file(self) -> int:
        """Streams a file of this origin may have now (the fetch engine spends its budget by it)."""
        return self.limits.per_file(self.client.endpoint, self.settings.connections_per_file)

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
        job: BlobJob | None = None
        space: Reservation | None = None
        hopeless = finished = False
        try:
            chunk = self.settings.chunk_size
            nchunks = -(-entry.size // chunk)
            f = self.settings
            rule = (f.origin_min_rate, f.origin_rate_window, f.origin_short_answers)
            headway = Headway(*rule, since=time.monotonic())
            job = BlobJob(
                entry, location, fd, chunk, nchunks, done, progress, headway, written=written, prefix=prefix
            )
            space = Reservation(fd, entry.size, on_full=job.fail)
            mine = range(job.nchunks) if shares is None else chunks_of(shares.own, chunk)
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
            self.savers[id(job)] = lambda: self._save_record(cache, plan, job)
            hashes = self._run(plan, cache, job, shares)
            finished = True
        except IntegrityError:
            hopeless = True  # bytes the origin cannot or did not send right: no resume can help
            raise
        except WeightswarmError:
            raise
        except OSError as exc:
            raise write_failed(cache, entry, exc) from None
        finally:
            if job is not None:
                self.savers.pop(id(job), None)
                with job.write_lock:
                    job.closed = True
            if space is not None:
                space.close()
            if job is not None and not finished and not hopeless:
                job.give_back()
            os.close(fd)
            if hopeless:  # its reservation and resume record go with it
                cache.discard_partial(entry.blob_id)
        if (entry.content_known and hashes.content_id != entry.blob_id) or hashes.size != entry.size:
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
            return self.client.download_url(plan.repo_id, plan.commit, entry.path)
        meta = self.client.patiently(lambda: self.client.file_metadata(plan.repo_id, plan.commit, entry.path))
        if meta.commit and meta.commit.lower() != plan.commit:
            raise OriginError(
                f"{entry.path}: origin served commit {meta.commit[:12]}, expected {plan.commit[:12]}"
            )
        if meta.blob_id not in (None, entry.blob_id) or meta.size not in (None, entry.size):
            said = (meta.blob_id or "-")[:12]
            raise IntegrityError(
                f"{entry.path}: origin metadata (id {said}, {meta.size} B) disagrees with "
                f"its listing (id {entry.blob_id[:12]}, {entry.size} B)"
            )
        return meta.url

    # --- the download ----------------------------------------------------------------------------

    def _run(self, plan: FetchPlan, cache: RepoCache, job: BlobJob, shares: Shares | None) -> BlobHashes:
        self._start_workers(plan, cache, job)
        feeds: list[threading.Thread] = []
        for (start, end), feed in shares.feeds if shares is not None else []:
            save = functools.partial(self._save_record, cache, plan, job)
            share = Share(job, start, end, save, lambda pos, end: self._take_over(plan, cache, job, pos, end))
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
                    job.error = Cancelled()
                job.cond.notify_all()
                # A worker blocked on a trickling response would hold the blob (and its file) until its
                # read timed out: the blob has failed, so its requests close now.
                reading = [r.resp for rs in job.readers.values() for r in rs if r.resp is not None]
            for resp in reading:
                cut_response(resp)
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

    def _start_workers(self, plan: FetchPlan, cache: RepoCache, job: BlobJob) -> None:
        """Workers for the job's pending chunks, up to `connections_per_file` or the streams per file its
        download host allows (agent.origin.streams; called without `cond`)."""
        wanted = self.settings.connections_per_file
        with job.cond:
            alive = job.streams.workers
            probe = job.mode is None and not alive
            limit = self.limits.limit(job.streams.host, wanted) if job.streams.host else wanted
            for i in range(min(limit, len(job.pending)) - alive):
                job.streams.workers += 1
                t = threading.Thread(
                    target=self._worker,
                    args=(plan, cache, job, probe and i == 0),
                    name=f"fetch-{job.entry.path}-{len(job.workers)}",
                    daemon=True,
                )
                t.start()
                job.workers.append(t)

    def _take_over(self, plan: FetchPlan, cache: RepoCache, job: BlobJob, start: int, end: int) -> None:
        """Chunks of [start, end) not written yet become the engine's own (`Share.take_over`)."""
        job.location.url  # noqa: B018 - resolved on first use, outside `cond` (a request to the origin)
        with job.cond:
            if job.error is not None:
                return
            chunks = chunks_of([(start, end)], job.chunk_size)
            mine = [i for i in chunks if i not in job.done and i not in job.pending]
            job.pending.extend(mine)
            job.pending.sort()
            job.cond.notify_all()
        self._start_workers(plan, cache, job)

    @staticmethod
    def _feed(job: BlobJob, feed: Feed, share: Share) -> None:
        try:
            feed(share)
        except Cancelled:
            return
        except BaseException as exc:  # as a worker's: the hashing thread raises it
            share.fail(exc)

    def _hash(self, job: BlobJob) -> BlobHashes:
        step_aside = None if self.turn is None else self._step_aside
        return hash_prefix(job, self.piece_hashes, self._judge, step_aside)

    def _judge(self, job: BlobJob) -> None:
        """Fail the blob when it made no headway over a window (agent.origin.headway; called under
        `cond`). Waiting out an origin that said "later", or stepping aside, does not count."""
        now = time.monotonic()
        job.headway.hold(now, bool(job.waiting) or job.pausing or self.client.told_to_wait)
        why = job.headway.judge(now, job.received + job.relayed)
        if why is not None:
            raise OriginStalledError(
                f"{job.entry.path}: the origin {why}; gave up on it, keeping the {job.furthest()} bytes "
                "written for a later fetch"
            )

    def _step_aside(self, job: BlobJob) -> None:
        """When background work must step aside: close every range request of the blob now. A worker
        blocked in a read cannot look at the turn itself (a read returns when its buffer is full, a
        whole chunk at a shared rate), and an open request keeps taking the origin's bandwidth."""
        assert self.turn is not None
        if not self.turn.due():
            return
        with job.cond:
            job.pausing = True
            reading = [r for rs in job.readers.values() for r in rs if r.resp is not None]
            for reader in reading:
                reader.stepped_aside = True
            cut = [r.resp for r in reading if r.resp is not None]
        for resp in cut:
            cut_response(resp)

    def _worker(self, plan: FetchPlan, cache: RepoCache, job: BlobJob, probe: bool) -> None:
        buf = memoryview(bytearray(READ_BLOCK))
        rate = 0.0  # bytes/s at which this worker's connection brought its last chunk (0: none yet)
        counted = True  # in `job.streams.workers` until it retires
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
                    if streams.retire(job, self.limits, self.settings.connections_per_file):
                        counted = False
                        return
                    found = hedging.hedge(job, rate) if job.mode == "ranges" else None
                    idx, hedge = found if found is not None else (None, "")
                    if idx is None:
                        if job.mode == "ranges" and hedging.at_window(job):
                            job.cond.wait(HEDGE_AFTER / 4)
                            continue
                        if not job.pending:
                            unhedged = [i for i in hedging.in_flight_chunks(job) if i not in job.hedged]
                            if job.mode == "ranges" and unhedged:
                                job.cond.wait(HEDGE_AFTER / 4)  # the last chunks may still need a hand
                                continue
                            return
                        idx = job.pending.pop(0)
                    job.moved.setdefault(idx, time.monotonic())
                    job.taken.setdefault(idx, time.monotonic())
                try:
                    rate = self._fetch_chunk(plan, cache, job, idx, probe, buf, hedge) or rate
                except ChunkDone:
                    continue
                except StreamRefused:  # its chunk went back to the queue (`streams.give_back`)
                    counted = False
                    return
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
                            cut_response(other.resp)
                    job.cond.notify_all()
                self._save_record(cache, plan, job)
                self._start_workers(plan, cache, job)  # a probe of the host may allow one more
        except Cancelled:
            return
        except BaseException as exc:
            with job.cond:
                if job.mode is None:
                    job.mode = "failed"
            job.fail(exc)
        finally:
            if counted:
                with job.cond:
                    job.streams.workers -= 1

    def _fetch_chunk(
        self,
        plan: FetchPlan,
        cache: RepoCache,
        job: BlobJob,
        idx: int,
        probe: bool,
        buf: memoryview,
        hedge: str = "",
    ) -> float:
        """Bytes/s at which the chunk's last request brought it (0.0: none was needed).

        `hedge`: why this is a second worker on the chunk (`hedging.hedge`); once its bytes flow, one of
        the two responses is closed (`hedging.settle_hedge`; a "slow" hedge closes the other as it
        starts). Left open, a stall that ends (a retransmit backing off under shaping) sent the same
        bytes down both connections: up to a chunk served twice.

        Long on purpose: the request (`attempt`), its hedge bookkeeping and its retry loop share one
        reader and its position; split, each piece would take and hand back all of them."""
        start, end = job.chunk_bounds(idx)
        what = job.entry.path
        with job.cond:
            reader = Reader(pos=start + job.written.get(idx, 0), hedge=hedge)
            if reader.pos >= end:
                return 0.0
            replaced = list(job.readers.get(idx, [])) if hedge == "slow" else []
            job.readers.setdefault(idx, []).append(reader)  # until the chunk is done
            if replaced:
                # A response `SLOWER` than this worker's connection brings little while this request's
                # first bytes are on their way, and what it brought then came twice, on a shared origin
                # for nearly every chunk of a lease holder (BBR starves all but one of its connections;
                # benchmarks.md, "The origin engine on a shared origin"). Closed now.
                reader.hedge = ""
                for other in replaced:
                    other.cut = True
            open_ = [other.resp for other in replaced if other.resp is not None]
        for resp in open_:
            cut_response(resp)

        def attempt() -> None:
            pos = asked = reader.pos
            reader.start()
            with job.cond:
                if idx in job.done or reader.cut:
                    raise ChunkDone()
                if job.pausing:
                    raise Paused()  # cut by `_step_aside` (or about to be): no new request now
                reader.stepped_aside = False
            url = job.location.url
            streams.asking(job, url)
            try:
                resp = self.client.open_range(url, pos, end, what)
            except BaseException as exc:
                streams.refused(job, self.limits, exc, self.client.endpoint)  # others open: StreamRefused
                if not isinstance(exc, CdnRefusedError):
                    raise
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
                    try:
                        n = job.write_from(resp, buf, pos, end, reader)
                    except Retryable:
                        with job.cond:
                            ours = not (idx in job.done or reader.cut or reader.stepped_aside)
                        if ours:  # the connection dropped mid-answer: an answer ended early too
                            self._short_answer(job, reader, pos)
                        raise
                    if not n:
                        break
                    pos += n
                    reader.pos = pos
                    if reader.hedge:
                        hedging.settle_hedge(job, idx, reader, asked)
                    if self._wrote(job, idx, pos - start, n):
                        self._save_record(cache, plan, job)
                if pos < end:
                    with job.cond:
                        if idx in job.done or reader.cut:  # the other worker has it, and cut this one
                            raise ChunkDone()
                        paused = reader.stepped_aside
                    if paused:
                        raise Paused()  # `_step_aside` cut it: no answer of the origin's that ended early
                    self._ended_early(job, reader, pos, f"{pos}-{end - 1}")
                if not body_complete(resp):
                    raise OriginError(f"{what}: origin sent more bytes than the range asked for")
            finally:
                with job.cond:
                    reader.resp = None
                    streams.answered(job)
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
                    # Patience restarts on a MiB brought, not on any byte: an origin answering "later"
                    # between answers of a few bytes each would otherwise hold the blob for ever.
                    moved=lambda: reader.pos // MEAGRE,
                    pause=lambda seconds: self._wait_out(job, idx, seconds),
                )
                return reader.got / max(time.monotonic() - reader.began, 1e-6)
            except Paused:
                continue
            except StreamRefused:
                with job.cond:
                    streams.give_back(job, idx, reader)
                raise
            except WeightswarmError:
                with job.cond:
                    if not job.pausing:
                        raise
                # The read failed because `_step_aside` cut it: not an origin failure.

    def _wait_out(self, job: BlobJob, idx: int, seconds: float) -> bool:
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
        self, job: BlobJob, resp: urllib3.BaseHTTPResponse, reader: Reader, buf: memoryview
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

    def _ended_early(self, job: BlobJob, reader: Reader, pos: int, asked: str) -> NoReturn:
        """An answer ended before the bytes it promised: a dropped connection (asked again from `pos`), or an
        origin that lists more bytes than it has (`_short_answer`)."""
        self._short_answer(job, reader, pos)
        raise Retryable(OriginUnavailableError(f"{job.entry.path}: body ended at byte {pos} of {asked}"))

    def _short_answer(self, job: BlobJob, reader: Reader, pos: int) -> None:
        """Count an answer that ended early at `pos`. When `SAME_BYTE` answers of this reader in a row end
        there, or the blob's meagre answers reach their bound (agent.origin.headway), the origin cannot
        send what it lists: no retry or resume can bring it (OriginLengthError: the partial file goes)."""
        if reader.ended_at == pos:
            reader.short += 1
        else:
            reader.ended_at, reader.short = pos, 1
        with job.cond:
            why = job.headway.short_answer(reader.got, time.monotonic())
        entry = job.entry
        if reader.short >= SAME_BYTE:
            why = f"its answers end at byte {pos} ({reader.short} times in a row, nothing more sent)"
        if why is not None:
            raise OriginLengthError(
                f"{entry.path}: the origin lists {entry.size} bytes, but {why}: it cannot send what it "
                "lists; the partial file was discarded. Tell the origin's operator, or retry once it is fixed"
            )

    def _wrote(self, job: BlobJob, idx: int, chunk_written: int, n: int) -> bool:
        """Account for `n` bytes written; True when the resume record is due for an update."""
        with job.cond:
            if job.error is not None:
                raise Cancelled()
            if idx in job.done:
                raise ChunkDone()  # the other worker on this chunk got there first
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

    def _save_record(self, cache: RepoCache, plan: FetchPlan, job: BlobJob) -> None:
        with job.cond:
            done = sorted(job.done)
            streaming = job.mode == "stream"
            written = {i: n for i, n in job.written.items() if i not in job.done and not streaming}
        # Concurrent workers write whole records via os.replace: the last one wins and each lists
        # only chunks that were written, so any interleaving is safe.
        write_record(cache, plan, job.entry, job.chunk_size, done, written)

