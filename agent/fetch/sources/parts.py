"""A blob that comes in parts (agent.relay.directory "Parts"): which parts this node pulls from the origin
and which it takes from their holders' relays, part by part, while the fetch policy's origin engine
writes them all into one file (agent.core.parts `Shares`).

The first node to ask holds part 0 and pulls the parts in order; whether other nodes hold parts too is
measured (agent.relay.admission: `judge` at the lead, `probe` at the others). Every part this node does
not pull comes from its holder's relay (`feed`). A part whose relay fails (its holder died or stalled)
is taken over with its lease, or without it after `daemon.max_wait_seconds`, as a whole blob's is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.core.errors import TrackerError
from agent.core.parts import PartSink, Shares
from agent.core.plan import FileEntry
from agent.core.settings import Settings
from agent.fetch.sources.leases import Leases, Present
from agent.relay.admission import MORE, ONE, Verdicts, admission_key, growing, judge, steady_rate
from agent.relay.directory import RelayDirectory, part_key
from agent.tracking.client import BlobState

log = logging.getLogger(__name__)

_TICK = 0.5
_ASK_PARTS = 1.0
"""Seconds a node keeps the tracker's answer about a part of a blob in parts (who holds it, seeders)."""

RelayPart = Callable[[str, PartSink], bool]
"""Receives one part of a blob from the nodes relaying it under a part key (agent.relay.receiver `feed`);
True once the part is whole."""


class Published(Exception):
    """A blob being pulled in parts was published, with seeders, meanwhile: BitTorrent brings the rest."""


class _Claimable:
    """A feed's handle (agent.core.parts `PartSink`) that the node may claim for the origin: a relay
    stream into it then stops at once, and the feed hands the rest of the part to the origin engine."""

    def __init__(self, share: PartSink, claimed: threading.Event) -> None:
        self.share, self.claimed = share, claimed
        self.start, self.end, self.entry = share.start, share.end, share.entry

    @property
    def pos(self) -> int:
        return self.share.pos

    @property
    def cancelled(self) -> bool:
        return self.share.cancelled or self.claimed.is_set()

    def write(self, pos: int, data: bytes | memoryview) -> None:
        self.share.write(pos, data)

    def take_over(self) -> None:
        self.share.take_over()

    def fail(self, exc: BaseException) -> None:
        self.share.fail(exc)


class InParts:
    """One blob coming in parts at this node: its parts and their lease keys, the parts this node holds,
    and what the tracker says of the others (asked at most once a second)."""

    def __init__(
        self,
        blob: FileEntry,
        parts: list[tuple[int, int]],
        settings: Settings,
        leases: Leases,
        relay: RelayDirectory,
    ) -> None:
        n = len(parts)
        self.blob, self.parts, self.settings = blob, parts, settings
        self.leases, self.relay, self.tracker = leases, relay, leases.tracker
        self.keys = [part_key(blob.blob_id, k, n) for k in range(n)]
        self.shares = Shares(own=[], feeds=[])
        self.verdicts = Verdicts(self.tracker, blob.blob_id, n)
        self.deadline = time.monotonic() + settings.daemon.max_wait_seconds
        fetch = settings.fetch
        self.ahead = fetch.chunk_size * fetch.connections_per_file
        """Bytes left of a part the lead pulls when it may take its next one: the origin engine's
        connections are then on their last chunks of it, and would idle until the next part's."""
        self.held: set[int] = set()
        """Parts whose lease this node holds (it pulls them from the origin)."""
        self.claims = [threading.Event() for _ in parts]
        """Set when `probe` holds the part: its feed hands it to the origin engine."""
        self.done = threading.Event()
        self.taking = threading.Lock()
        self._beats: dict[str, tuple[threading.Event, threading.Thread]] = {}
        self._asked: dict[str, tuple[float, BlobState | None]] = {}
        self._lock = threading.Lock()

    # -- what is known -------------------------------------------------------------------------

    def overdue(self) -> bool:
        return time.monotonic() >= self.deadline

    def whole(self, k: int) -> bool:
        start, end = self.parts[k]
        return self.shares.written_end(start) >= end

    def missing(self, k: int) -> int:
        start, end = self.parts[k]
        return end - start - self.shares.present(start, end)

    def may_add(self, k: int) -> bool:
        """Whether this node may take free part `k` to pull from the origin: only while it pulls no other
        part, and then, unless more holders pay, only as the lead (it holds a part before `k`, and every
        part before `k` is its own or in hand here: the lead takes the parts in order). Once the verdict
        is that the lead pulls them all, a part counts as pulled until no more than `ahead` bytes of it
        are missing (the lead's connections then move on to the next part without a pause)."""
        held, verdict = set(self.held), self.verdicts.current()
        ahead = self.ahead if verdict == ONE else 0
        if any(self.missing(i) > ahead for i in held):
            return False
        if verdict == MORE:
            return True
        return any(i < k for i in held) and all(i in held or self.whole(i) for i in range(k))

    def holder(self, k: int) -> str | None:
        """Who holds part `k`'s lease ("?" when the tracker cannot say); raises `Published` once the blob
        has seeders (the rest comes by BitTorrent)."""
        blob = self.state(self.blob.blob_id)
        if blob is not None and blob.seeders > 0:
            raise Published()
        part = self.state(self.keys[k])
        return "?" if part is None else part.lease_holder

    def state(self, key: str) -> BlobState | None:
        """What the tracker says of `key` (a blob, a part, an admission lease); None when it cannot say."""
        with self._lock:
            at, state = self._asked.get(key, (0.0, None))
            if time.monotonic() - at < _ASK_PARTS:
                return state
        try:
            state = self.tracker.blob_state(key)
        except TrackerError as exc:
            log.info("cannot ask about a part of %s: %s", self.blob.path, exc)
            state = None
        with self._lock:
            self._asked[key] = (time.monotonic(), state)
        return state

    # -- leases --------------------------------------------------------------------------------

    def keep(self, key: str, present: Present | None = None) -> bool:
        """Heartbeats for a lease just granted (reporting `present`), until the blob is done with; False
        (and the lease given back) when it already is."""
        stop = threading.Event()
        beat = self.leases.beat(key, stop)
        if present is not None:
            self.leases.report(key, present)
        with self._lock:
            if not self.done.is_set():
                self._beats[key] = (stop, beat)
                beat.start()
                return True
        self.leases.release(key)
        self.leases.report(key, None)
        return False

    def hold(self, k: int) -> bool:
        """Part `k`'s lease is ours: heartbeats report the bytes this node has read from the origin for the
        blob (a part held ahead of its turn does not look stalled, nor does one whose connections are
        still on their first blocks: writes come a block per connection at a time, and on an origin
        shared by many they took over 10 s), and others may relay the part from here."""
        start, end = self.parts[k]
        if not self.keep(self.keys[k], self.shares.streamed):
            return False
        self.held.add(k)
        self.relay.join(self.keys[k], end - start)
        return True

    def close(self) -> None:
        """The blob is done with: heartbeats stop, the leases go back, the relay's entries go."""
        with self._lock:
            self.done.set()
            beats, self._beats = self._beats, {}
        for stop, _beat in beats.values():
            stop.set()
        for key, (_stop, beat) in beats.items():
            beat.join(timeout=5)  # a heartbeat still in flight would take the released lease back
            self.leases.release(key)
            self.leases.report(key, None)
        for key in self.keys:
            self.relay.leave(key)

    # -- the parts -----------------------------------------------------------------------------

    def take_part(self, k: int, stale: bool) -> bool:
        """Hold part `k` to pull it from the origin: a free part when `may_add` says so, a part whose holder
        counts as stalled (`stale`), or any part once the blob is overdue; False when not."""
        with self.taking:  # one decision at a time: a node adds one part while `may_add` holds
            if not stale and not self.may_add(k) and not self.overdue():
                return False
            if not self.leases.try_lease(self.keys[k], stale=stale) and not self.overdue():
                return False
            log.info("%s: pulling its part at %d from the origin", self.blob.path, self.parts[k][0])
            return self.hold(k)

    def feed(self, k: int, relay_part: RelayPart, share: PartSink) -> None:
        """Part `k`, not this node's at the start (a feed of the origin engine's `Shares`): from its holder's
        relay while somebody pulls it; pulled from the origin here once this node holds its lease
        (`take_part`: free and `may_add`, or its holder stalled) or the prober claimed it (`probe`)."""
        claim = _Claimable(share, self.claims[k])
        while not share.cancelled:
            if claim.claimed.is_set():
                share.take_over()
                return
            holder = self.holder(k)
            if holder is not None:  # somebody pulls it: take it from the relay (nobody relays a free part)
                if relay_part(self.keys[k], claim) or share.cancelled:
                    return
                if not claim.claimed.is_set() and self.take_part(k, stale=True):
                    share.take_over()
                    return
                continue
            if (self.may_add(k) or self.overdue()) and self.take_part(k, stale=False):
                share.take_over()
                return
            self.done.wait(_TICK)

    def admit(self, lead: bool) -> None:
        """On a thread of its own: `judge` at the lead, `probe` at the others."""
        try:
            self.judge() if lead else self.probe()
        except Published:  # the blob has seeders: nothing left to decide
            pass

    def judge(self) -> None:
        """At the lead: whether more nodes pulling the blob's parts pay (agent.relay.admission). Its own
        origin rate alone, then while the prober pulls the last part; the verdict goes to the tracker as a
        lease."""
        stop, seconds = self.done, self.settings.swarm.origin_probe_seconds
        n, patience = len(self.parts), max(10.0, 3 * seconds)
        # Each rate once steady, in windows of half the setting: a new download first opens its
        # connections (one, then the rest), and other blobs' holders may still be arriving.
        origin, window = self.shares.streamed, seconds / 2
        if not growing(origin, patience, stop):
            return
        alone = steady_rate(origin, window, stop)
        if alone is None:
            self.verdicts.reached(ONE)  # here only, as below
            return
        ready = admission_key(self.blob.blob_id, n, "alone")
        if not self.leases.try_lease(ready) or not self.keep(ready):
            return
        deadline = time.monotonic() + patience
        while not any(self.holder(k) not in (None, "?", self.leases.node_id) for k in range(1, n)):
            if stop.wait(_TICK) or time.monotonic() >= deadline:
                log.info("%s: no second node came to pull a part; this node pulls them", self.blob.path)
                self.verdicts.reached(ONE)  # here only: a node that comes later still finds no verdict
                return
        shared = steady_rate(origin, window, stop)
        if shared is None:
            log.info(
                "%s: no steady origin rate with a second node; this node pulls the parts", self.blob.path
            )
            self.verdicts.reached(ONE)
            return
        verdict = judge(alone, shared)
        log.info(
            "%s: the origin brought %.1f MB/s to this node alone, %.1f MB/s while a second node pulled: %s",
            self.blob.path,
            alone / 1e6,
            shared / 1e6,
            "more holders pay" if verdict == MORE else "this node pulls the rest",
        )
        key = self.verdicts.reached(verdict)
        if self.leases.try_lease(key):
            self.keep(key)

    def probe(self) -> None:
        """At a node that does not lead: once the lead has measured its rate alone, the first such node to
        get the probe lease pulls the last free part, for the lead to measure again."""
        n = len(self.parts)
        ready, probing = (admission_key(self.blob.blob_id, n, what) for what in ("alone", "probe"))
        while not self.done.wait(_TICK):
            if self.verdicts.current() is not None:
                return
            lead_ready = self.state(ready)
            if lead_ready is None or lead_ready.lease_holder is None:
                continue
            if not self.leases.try_lease(probing) or not self.keep(probing):
                return  # another node probes
            free = (k for k in reversed(range(1, n)) if self.holder(k) is None)
            j = next((k for k in free if self.leases.try_lease(self.keys[k])), None)
            if j is not None and self.hold(j):
                log.info("%s: probing with its part at %d", self.blob.path, self.parts[j][0])
                self.claims[j].set()
            return
