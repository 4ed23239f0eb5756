"""Receiving a blob from its relay sources (agent.relay.directory has the design): in order, hashed as it
comes.

The bytes go into `blobs/<id>.incomplete` at the node's own prefix, so a receiver is a source for the
nodes after it from its first byte on (the daemon's `Arrival` of the blob is told each step). When a
source breaks or stalls, the next one continues from the same byte; what was received stays recorded
in the origin engine's resume record, so that a node which later takes the origin lease (the holder
died) asks the origin only for the rest.

A blob pulled in parts (agent.relay.directory "Parts") is received part by part (`feed`): each part from
its own sources, written through the origin engine's `PartSink`, which records and hashes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import mmap
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from agent.cache.layout import RepoCache
from agent.cache.partial import RECORD_EVERY, Reservation, contiguous_record, record_prefix, write_failed
from agent.core.errors import CacheError, IntegrityError
from agent.core.hashing import BlobHasher, BlobHashes
from agent.core.parts import PartSink
from agent.core.plan import FetchPlan, FileEntry
from agent.core.progress import FileProgress
from agent.relay.batches import BatchReader
from agent.relay.directory import NEXT_HEADER, RELAY_PATH, RelayDirectory
from agent.relay.heads import BadReply, read_head, request
from agent.relay.splicing import Pipe, worth_splicing

log = logging.getLogger(__name__)

_READ = 1 << 20
_WRITE_WITHIN = 0.02
"""Seconds received bytes may wait to be written (else up to `_READ` of them are written at once). A node
relays only what it has written, so bytes held back here hold back every node below it in the tree:
read a whole MiB at a time (filling a chunk before writing any of it), each hop of a slow stream cost
seconds, and they added up down the tree (benchmarks.md, "Scaling: N = 4 to 32 nodes"). A warm chain
has a hop per node: at most 50 writes a second cost little."""
_NO_SOURCE_WAIT = 3.0
"""Seconds to keep asking for sources when the tracker lists none yet (the holder announces as it starts)."""
_BUSY_PAUSE = 0.2
_PLACE_WAIT = 4.0
"""Seconds a receiver waits for the node before it in a chain to be ahead of it (the one before that may
be a moment late) before it looks for any source."""
_PLACE_PAUSE = 0.1
_STRIKES = 3
"""Streams of one source that may end short of their range in one receive before it is not asked again:
an honest source cuts a stream when its own copy restarts (and is asked again at once, to say 410 if its
blob failed); one that cut each stream after a MiB was asked again at once without end."""


class _SourceFailed(Exception):
    """A source says the blob failed its check there: what it relayed may be wrong."""


class _TooSlow(TimeoutError):
    """A stream that brought fewer bytes than the receiver's least rate over its window."""


@dataclass
class _Receiving:
    """Bytes [pos, end) of one blob being received from the sources listed under `key` (one thread)."""

    entry: FileEntry
    key: str
    """The relay directory's id of what is received: the blob id, or a part's (`part_key`)."""
    pos: int
    end: int
    received: int = 0
    sources: set[str] = field(default_factory=set)
    """Sources that sent bytes."""
    strikes: dict[str, int] = field(default_factory=dict)
    """Source -> its streams that ended short of their range (`_STRIKES`: not asked again)."""

    def strike(self, url: str, leave: bool = False) -> None:
        """A stream from `url` ended short; `leave`: it was too slow, or answered what no relay route does."""
        self.strikes[url] = _STRIKES if leave else self.strikes.get(url, 0) + 1

    def left(self, url: str) -> bool:
        """Whether `url` is not asked again in this receive."""
        return self.strikes.get(url, 0) >= _STRIKES

    def take(self, chunk: memoryview) -> None:
        raise NotImplementedError

    def record(self) -> None:
        """Make what was taken survive a restart (each `RECORD_EVERY` bytes, and when a stream ends)."""

    @property
    def cancelled(self) -> bool:
        return False


@dataclass(kw_only=True)
class _Whole(_Receiving):
    """A whole blob, hashed as it comes."""

    plan: FetchPlan
    cache: RepoCache
    chunk: int
    """The origin engine's chunk size: the unit of the resume record, which the engine resumes after."""
    fd: int
    hasher: BlobHasher
    progress: FileProgress
    prefix: Callable[[int], None]
    space: Reservation | None = None

    mapped: memoryview | None = None
    """The file, mapped read-only when bytes are spliced into it (`take_from`): hashed from there."""

    def take(self, chunk: memoryview) -> None:
        if self.space is not None:
            self.space.check()
        os.pwrite(self.fd, chunk, self.pos)
        self.hasher.update(chunk)
        self._advance(len(chunk))

    def take_from(self, pipe: Pipe) -> None:
        """What `pipe` holds, written into the file at `pos` in the kernel and hashed from the map."""
        assert self.mapped is not None
        if self.space is not None:
            self.space.check()
        n = pipe.drain(self.fd, self.pos)
        self.hasher.update(self.mapped[self.pos : self.pos + n])
        self._advance(n)

    def _advance(self, n: int) -> None:
        self.pos += n
        self.progress.advance(n)
        self.prefix(self.pos)

    def record(self) -> None:
        record_prefix(self.cache, self.plan, self.entry, self.pos, self.chunk)


@dataclass(kw_only=True)
class _Part(_Receiving):
    """One part of a blob pulled in parts, written (recorded, hashed) through the origin engine's sink."""

    share: PartSink

    def take(self, chunk: memoryview) -> None:
        self.share.write(self.pos, chunk)
        self.pos += len(chunk)

    @property
    def cancelled(self) -> bool:
        return self.share.cancelled


def as_listed(entry: FileEntry, hashes: BlobHashes) -> bool:
    """Whether received bytes are the blob the plan names: its content id, or for a bucket object whose
    sha256 nobody knows yet, the ETag this node's own listing gave (agent.origin.bucket `listed_checksum`); an
    object without one is never taken from a relay unchecked."""
    if entry.content_known:
        return hashes.content_id == entry.blob_id
    return entry.content_etag is not None and entry.content_etag in hashes.etags and hashes.size == entry.size


class RelayReceiver:
    """One per daemon; `receive` is called per blob by a fetch job's thread."""

    def __init__(
        self, directory: RelayDirectory, stall: float, connect_timeout: float, min_rate: int
    ) -> None:
        self.directory = directory
        self.stall = stall
        """Seconds without a byte from a source before the next one is asked; also the window over which a
        stream's rate, and a receive's, is judged, and the time a source has to send its reply's head."""
        self.connect_timeout = connect_timeout
        self.min_rate = min_rate
        """Bytes a second a stream must bring over each window (`swarm.relay_min_rate`)."""
        self._local = threading.local()
        self._headers = {"Authorization": f"Bearer {directory.credential}", "Accept-Encoding": "identity"}

    def close(self) -> None:
        """Nothing is held between streams (each has a connection of its own)."""

    def receive(
        self,
        plan: FetchPlan,
        entry: FileEntry,
        cache: RepoCache,
        chunk: int,
        progress: FileProgress,
        prefix: Callable[[int], None],
        chain: bool = False,
        pieces: bytes | None = None,
    ) -> tuple[BlobHashes, int] | None:
        """The blob from relay sources, hashed: (hashes, bytes received), the file still `.incomplete`
        for the caller to install; None when no source could finish it (what arrived stays recorded, in
        `chunk`s of the origin engine, which resumes after it).
        `chain`: from seeds (a warm start), first from this node's place in their chains
        (agent.relay.directory `place`), and None at once when no source is listed; else (from a holder,
        which announces as it starts) a first source is waited for up to `_NO_SOURCE_WAIT`.
        `pieces`: the piece sha1s of the metainfo the tracker lists (agent.core.metainfo `listed_pieces`),
        taken as the blob's instead of hashing its pieces here, a third of a receiver's CPU: the sha256
        checks the bytes, and a seed's libtorrent checks each piece before serving it (and never writes to
        the blob: agent.swarm.session `_add`)."""
        path = cache.incomplete_path(entry.blob_id)
        start = contiguous_record(cache, entry, chunk)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise CacheError(f"cannot write {path}: {exc.strerror}") from exc
        hasher = BlobHasher(entry.size, entry.is_lfs, pieces=pieces is None, etag=entry.content_etag)
        r = _Whole(entry, entry.blob_id, 0, entry.size, plan=plan, cache=cache, chunk=chunk, fd=fd,
                   hasher=hasher, progress=progress, prefix=prefix)
        started = time.monotonic()
        mapping: mmap.mmap | None = None
        try:
            r.space = Reservation(fd, entry.size)
            if entry.size and worth_splicing(path.parent):
                with contextlib.suppress(OSError):  # a file system that maps no files: written from memory
                    mapping = mmap.mmap(fd, entry.size, prot=mmap.PROT_READ)
                    r.mapped = memoryview(mapping)
            while r.pos < start:  # an earlier run's prefix: hashed, not fetched again
                data = os.pread(fd, min(_READ * 4, start - r.pos), r.pos)
                if not data:
                    raise OSError(errno.EIO, "short read of a recorded prefix", str(path))
                hasher.update(data)
                r.pos += len(data)
            progress.advance(r.pos)
            prefix(r.pos)
            if chain:
                before = self.directory.place(entry.blob_id, entry.size - r.pos)
                if before is not None:
                    self._from_place(r, before)
            self._from_sources(r, 0.0 if chain else _NO_SOURCE_WAIT)
        except _SourceFailed as exc:
            log.warning("%s: %s; dropping what was relayed", entry.path, exc)
            cache.discard_partial(entry.blob_id)
            return None
        except OSError as exc:
            raise write_failed(cache, entry, exc) from None
        finally:
            if r.space is not None:
                r.space.close()
            if mapping is not None:
                assert r.mapped is not None
                r.mapped.release()
                mapping.close()
            os.close(fd)
            self.directory.leave(entry.blob_id)
        if r.pos < entry.size:
            return None
        hashes = hasher.finish()
        if pieces is not None:
            hashes = dataclasses.replace(hashes, pieces=pieces)
        if not as_listed(entry, hashes):
            cache.discard_partial(entry.blob_id)
            kind = "sha256" if entry.content_known else "listed ETag"
            log.warning("%s: relayed bytes fail the blob's %s; discarded, fetching it again", entry.path,
                        kind)
            return None
        took = time.monotonic() - started
        n = len(r.sources)
        log.info("%s: %d bytes relayed from %d sources in %.1fs", entry.path, r.received, n, took)
        return hashes, r.received

    def feed(self, key: str, share: PartSink) -> bool:
        """Part [share.start, share.end) of a blob from the sources relaying it under `key`, from where the
        file has it up to; True once the part is whole, False when no source could finish it."""
        r = _Part(share.entry, key, share.pos, share.end, share=share)
        try:
            # This node stays listed as a source of the part until the caller leaves (the blob is whole).
            self._from_sources(r)
        except _SourceFailed as exc:
            # What this node took from it may be wrong: the whole blob starts over (the caller discards it).
            share.fail(IntegrityError(f"{share.entry.path}: {exc}"))
            return False
        if r.received:
            n, at = len(r.sources), share.start
            log.info("%s: %d bytes of the part at %d relayed by %d sources", r.entry.path, r.received, at, n)
        return r.pos >= r.end

    def _from_place(self, r: _Receiving, url: str) -> None:
        """From the node before this one in a chain (`url`), as long as it sends bytes, or is not ahead of
        this node yet for at most `_PLACE_WAIT` seconds; the caller then looks for any source."""
        waited = time.monotonic()
        while r.pos < r.end and not r.cancelled:
            status, got, named = self._stream(url, r)
            if status == 410:
                raise _SourceFailed(f"relay source {url} says the blob failed its check there")
            if r.left(url):
                log.info("%s: leaving relay source %s, before this node in its chain", r.entry.path, url)
                return
            if got:
                r.sources.add(url)
                waited = time.monotonic()
                continue
            # Gone, or streaming to another node (its place is taken): any source will do.
            if status != 503 or named or time.monotonic() - waited > _PLACE_WAIT:
                log.info("%s: %s, before this node in its chain, did not stream it", r.entry.path, url)
                return
            time.sleep(_PLACE_PAUSE)  # not ahead yet (the source waited `AHEAD_WAIT`), or its gate asks

    def _from_sources(self, r: _Receiving, no_source_wait: float = _NO_SOURCE_WAIT) -> None:
        """From the sources listed under `r.key`, round after round, until the range is whole, nobody
        relays it, or a round ends with the receive slower than `min_rate` over the last `stall` seconds
        (the caller then takes another way). A round asks each source at most once (less those left)."""
        end = r.end
        first_ask = time.monotonic()
        judged, judged_pos = first_ask, r.pos
        known: list[str] = []
        while r.pos < end and not r.cancelled:
            found = self.directory.join(r.key, end - r.pos)
            # The tracker down (None): the sources it named are agents, and they still relay.
            sources = known if found is None else found
            known = sources
            random.shuffle(sources)
            queue, asked = list(sources), 0
            busy = gone = 0
            # Each source once, and the nodes a busy one names (walking down a chain) once more each.
            while queue and asked < 2 * len(sources):
                url = queue.pop(0)
                asked += 1
                if r.left(url):
                    gone += 1
                    continue
                while True:
                    status, got, named = self._stream(url, r)
                    if got:
                        r.sources.add(url)
                    if status == 410:
                        raise _SourceFailed(f"relay source {url} says the blob failed its check there")
                    if not got or r.pos >= end or r.cancelled or r.left(url):
                        break
                    # Cut short after some bytes: asked again at once, it says 410 if its blob failed.
                busy += status == 503
                # Not relaying it, unreachable (the tracker lists a dead source for a while), or left.
                gone += status in (0, 404) or r.left(url)
                if r.pos >= end or r.cancelled:
                    return
                if named:  # busy, streaming to these: one of them may have room, so ask them first
                    first = [u for u in sources if urlsplit(u).hostname in named and u != url]
                    queue = first + [u for u in queue if u not in first]
            now = time.monotonic()
            if not sources and now - first_ask < no_source_wait:
                time.sleep(_BUSY_PAUSE)
                continue
            if not sources or (gone >= len(sources) and not busy):
                return  # nobody is relaying it (not yet, or no more): the caller asks the tracker again
            if now - judged >= self.stall:
                # Bytes over time, not "a byte": sources that each send a little and stop held it forever.
                if r.pos - judged_pos < max(1, self.min_rate * (now - judged)):
                    log.info("%s: %d bytes relayed in %.0fs; taking another way", r.entry.path,
                             r.pos - judged_pos, now - judged)
                    return
                judged, judged_pos = now, r.pos
            time.sleep(_BUSY_PAUSE)

    def _stream(self, url: str, r: _Receiving) -> tuple[int, int, set[str]]:
        """From one source, [r.pos, r.end): (its status, bytes taken, the nodes it says it streams to); status
        0 when the source could not be reached or broke off. A stream that ends short of the range (cut, or
        no byte for `stall` seconds) is a strike against the source (`_Receiving.strike`); one that brings
        fewer than `min_rate` bytes a second over a window of `stall` seconds, or answers what no relay
        route does (its head not whole within `stall` seconds included), leaves it.

        The body goes from the socket straight into one buffer, a batch per `recv` (agent.relay.batches),
        from which it is written and hashed. httpx's stream parsed every socket read and copied each byte
        three times, a third of a receiver's CPU (benchmarks.md, "The relay: seed and receiver"), and a
        warm start on two cores is bound by what its receivers cost. Into a mapped whole blob it
        goes from the socket through a pipe into the file instead, a pipe's worth a wait
        (agent.relay.splicing). The request and the reply's head are this module's own (agent.relay.heads)."""
        start, unrecorded, end = r.pos, 0, r.end
        view = memoryview(self._buffer())
        pipe: Pipe | None = None
        held = 0
        since = 0.0
        connected = False

        def write() -> None:
            nonlocal unrecorded, held
            if held:
                if pipe is not None:
                    assert isinstance(r, _Whole)
                    r.take_from(pipe)
                else:
                    r.take(view[:held])
                r.received += held
                unrecorded += held
                held = 0
            if unrecorded >= RECORD_EVERY:
                r.record()
                unrecorded = 0

        where = urlsplit(url)
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((where.hostname or "", where.port or 80), self.connect_timeout)
            connected = True
            request(sock, where.netloc, f"{RELAY_PATH}{r.entry.blob_id}", {
                **self._headers, "Range": f"bytes={r.pos}-{end - 1}",
            })
            head = read_head(sock, self.stall)  # the route waits up to AHEAD_WAIT before it answers
            if head.status != 206:
                named = head.headers.get(NEXT_HEADER.lower(), "") if head.status == 503 else ""
                return head.status, 0, {h.strip() for h in named.split(",") if h.strip()}
            if head.headers.get("content-range") != f"bytes {r.pos}-{end - 1}/{r.entry.size}" or (
                head.headers.get("transfer-encoding", "identity").lower() != "identity"
            ):
                raise BadReply("a 206 that is not the range asked for, as it was asked for")
            # The body after the head is read to `end` here, the connection closed after. What came with
            # the head goes into the file first.
            early = head.early[: end - r.pos]
            if early:
                r.take(memoryview(early))
                r.received += len(early)
                unrecorded += len(early)
            reader: BatchReader | None = None
            if isinstance(r, _Whole) and r.mapped is not None:  # only for a body: many asks end in a 503
                sock.settimeout(self.stall)
                pipe = Pipe(sock, _READ, self.stall)
            else:
                reader = BatchReader(sock, _WRITE_WITHIN, self.stall)
            batch = pipe.capacity if pipe is not None else len(view)
            judged, judged_pos = time.monotonic(), start
            while r.pos + held < end:
                if not held:
                    since = time.monotonic()
                left = end - r.pos - held
                if reader is not None:
                    got = reader.read_into(view[held : held + min(batch - held, left)])
                else:
                    assert pipe is not None
                    got = pipe.fill(left, since + _WRITE_WITHIN - time.monotonic())
                if got == 0:  # closed before the range's end: the source cut the stream short
                    raise ConnectionResetError(f"the stream ended {end - r.pos - held} bytes short")
                held += got or 0
                now = time.monotonic()
                if now - judged >= self.stall:
                    # A byte now and then is no progress: judged in bytes over the window.
                    if r.pos + held - judged_pos < self.min_rate * (now - judged):
                        raise _TooSlow(f"{r.pos + held - judged_pos} bytes in {now - judged:.0f}s")
                    judged, judged_pos = now, r.pos + held
                # None: the pipe is full, or the wait ran out (what is held is written now).
                full = got is None or held >= batch
                if not full and now - since < _WRITE_WITHIN and r.pos + held < end:
                    continue
                write()
                if r.cancelled:
                    break
            write()
            return 206, r.pos - start, set()
        except (OSError, BadReply) as exc:
            write()  # what came before the source broke is as good as the rest
            if connected:  # else unreachable: a source gone, asked again next round
                # Too slow, or not a relay route's answer: left; cut short or stalled: a strike.
                r.strike(url, leave=isinstance(exc, (_TooSlow, BadReply)))
            log.info("relay source %s stopped at byte %d of %s: %s: %s", url, r.pos, r.entry.path,
                     type(exc).__name__, exc)
            return 0, r.pos - start, set()
        finally:
            if sock is not None:
                sock.close()
            if pipe is not None:
                pipe.close()
            if r.pos > start:
                r.record()

    def _buffer(self) -> bytearray:
        """This thread's receive buffer (a receiver runs one stream per thread, several threads at once)."""
        buf: bytearray | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(_READ)
        return buf
