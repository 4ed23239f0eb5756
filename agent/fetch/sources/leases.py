"""Origin leases held by this node: asking for one (spread among nodes), keeping it with heartbeats that
report the bytes present, giving it back.

Stalled lease holders. A holder's heartbeats report the bytes it has; a node asking for the lease
passes `stale_after` (`holder_stall`: two heartbeat periods, at least `daemon.lease_stall_min`), and
the tracker hands it the lease of a holder whose bytes did not move for that long. So a waiter re-asks
as soon as the holder could count as stalled, and does not wait a lease TTL (30 s by default; the
bound is 20 s), let alone `max_wait_seconds`, on a holder whose heartbeats keep a dead download alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.core.errors import TrackerError
from agent.core.plan import FileEntry
from agent.core.settings import Settings
from agent.tracking.client import Lease, TrackerClient

log = logging.getLogger(__name__)

Present = Callable[[], "int | None"]
"""The bytes of a blob (or part) present now, for heartbeats; None while the origin told the download
to wait (that is no stall)."""


def holder_stall(settings: Settings) -> float:
    """Seconds a lease holder's reported bytes may stay the same before another node takes its lease
    over: two heartbeat periods (heartbeats every ttl/3), less than one lease TTL, but at least
    `daemon.lease_stall_min` (progress shows in whole reads)."""
    d = settings.daemon
    return max(1.0, 2 * d.lease_ttl / 3, d.lease_stall_min)


class Leases:
    """This node's origin leases (of blobs, parts of blobs and admission verdicts). Thread-safe."""

    def __init__(self, settings: Settings, tracker: TrackerClient, node_id: str) -> None:
        self.settings = settings
        self.tracker = tracker
        self.node_id = node_id
        self._lock = threading.Lock()
        self._asking: set[str] = set()
        """Blobs whose lease this node holds or is asking for (see `acquire`)."""
        self._present: dict[str, Present] = {}
        """Lease key -> what its heartbeats report."""

    @property
    def holder_stall(self) -> float:
        return holder_stall(self.settings)

    def report(self, key: str, present: Present | None) -> None:
        """What the heartbeats of lease `key` report from now on (None: nothing)."""
        with self._lock:
            if present is None:
                self._present.pop(key, None)
            else:
                self._present[key] = present

    def acquire(self, blob: FileEntry, held_elsewhere: bool = False, key: str | None = None) -> Lease:
        """Ask for the blob's origin lease (or `key`'s: the first part of a blob in parts); a node already
        holding one first lets others ask (unless another node held this lease a moment ago: then there is
        nothing to spread, and the wait would only delay taking the blob as it arrives).

        Nodes asked for a model at once race for its shards' leases, and one fast node could win
        them all: it then pulls every shard from the origin and is the only source of each new
        piece for all peers, so its uplink saturates and its own origin download slows (benchmarks.md,
        "The swarm on shaped links (8 nodes)"). Waiting `swarm.lease_spread`
        seconds before a second lease lets idle nodes take them; a lone node only loses that.
        """
        with self._lock:
            holding = len(self._asking)
            if not blob.small:  # only large leases make the next one wait (a small one is over at once)
                self._asking.add(blob.blob_id)
        try:
            if holding and not blob.small and not held_elsewhere:
                time.sleep(self.settings.swarm.lease_spread)
            ttl, stall = self.settings.daemon.lease_ttl, self.holder_stall
            lease = self.tracker.acquire_lease(key or blob.blob_id, self.node_id, ttl, stale_after=stall)
        except BaseException:
            self.forget(blob.blob_id)
            raise
        if not lease.granted:
            self.forget(blob.blob_id)
        return lease

    def try_lease(self, key: str, stale: bool = False) -> bool:
        """Whether this node now holds the lease `key` (`stale`: also taken from a stalled holder)."""
        stale_after = self.holder_stall if stale else None
        try:
            return self.tracker.acquire_lease(
                key, self.node_id, self.settings.daemon.lease_ttl, stale_after=stale_after
            ).granted
        except TrackerError as exc:
            log.info("cannot ask for a lease of a blob's parts: %s", exc)
            return False

    def forget(self, blob_id: str) -> None:
        with self._lock:
            self._asking.discard(blob_id)

    def release(self, key: str) -> None:
        self.forget(key)
        try:
            self.tracker.release_lease(key, self.node_id)
        except TrackerError as exc:
            log.info("could not release the lease on %s: %s", key, exc)

    def beat(self, key: str, stop: threading.Event) -> threading.Thread:
        """A thread (not started) that renews lease `key` until `stop` is set."""
        return threading.Thread(
            target=self._heartbeat, args=(key, stop), name=f"lease-{key[:12]}", daemon=True
        )

    def _heartbeat(self, key: str, stop: threading.Event) -> None:
        """Renew the lease every ttl/3 with the bytes present: while they stay the same for
        `holder_stall`, another node may take the lease over. After a failed heartbeat the next comes
        within a second: a lease the tracker lost (a Redis restart) is the holder's again on its next
        heartbeat only while no other node took it (`lease_amnesty` at the tracker)."""
        ttl = self.settings.daemon.lease_ttl
        wait = ttl / 3
        while not stop.wait(wait):
            with self._lock:
                present = self._present.get(key)
            wait = ttl / 3
            try:
                if not self.tracker.heartbeat(
                    key, self.node_id, ttl=ttl, progress=present() if present else None
                ):
                    log.warning("lost the origin lease on %s; finishing the download anyway", key)
                    return
            except TrackerError as exc:
                log.info("lease heartbeat for %s failed: %s", key, exc)
                wait = 1.0
