"""How many nodes pull one blob's parts from the origin at once, decided from measured rates.

Parts (agent.relay.directory "Parts") pay only where the origin gives more clients more rate: an origin
that caps each client (a CDN's per-IP limit) gives K holders K times what one gets, one that caps its
total (or a cluster behind one NAT address, a single client to the origin) gives them the same rate
between them, and then parts only cost: each node hashes most of the blob once all its parts are in
(sha256 is sequential), and more relay streams cross the cluster. A new client cannot tell the two
apart (it always gets a fair share), but the client already there can, by what it keeps:

- The first node to ask holds part 0 and pulls the parts in order, one after another, while no
  verdict says more holders pay (the *lead*: a node holding a part with every part before it in hand).
- The lead measures its own origin rate, once two consecutive windows of half
  `swarm.origin_probe_seconds` agree, and then says so (it holds the blob's "alone" lease). One other
  node then wins the probe lease and takes the lease of the last free part. The lead measures again,
  as steadily, once that node pulls: if it kept at least `KEEP` of its rate the origin gives the
  second client rate of its own, and the verdict is MORE: every node may hold a free part, one at a
  time, up to `swarm.origin_holders` parts. Otherwise ONE: the prober finishes its part and the lead
  pulls the rest. (Rates are the lead's bytes read from the origin, which grow smoothly; what is
  written or relayed comes a block per connection at a time.)
- Each of these is a tracker lease, held while its holder has the blob in hand, so nodes read them
  from the tracker and the tracker needs nothing new.

The limit of the test: it sees one client's rate, not the origin's. A total cap already shared by N
other clients leaves each N/(N+1) when one more joins, and while several blobs are pulled at once the
lead's rate also moves as the other blobs' holders come and go (up, when one finishes), and the
verdict was wrong for some shards of a model (benchmarks.md, "An origin that caps each client: a blob
in parts"). So parts are off by default (`swarm.origin_holders` 1).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from agent.core.errors import TrackerError
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)

Verdict = Literal["more", "one"]
MORE: Verdict = "more"
ONE: Verdict = "one"

KEEP = 0.85
"""The share of its rate the lead must keep while a second holder pulls for more holders to pay: about 1
from an origin that caps each client, 1/2 from one that caps its total (4/5 with four clients on it
already); below 1 for the noise of a few seconds' measurement."""

STEADY = 0.15
"""How far two consecutive windows' rates may differ for the rate to count as steady."""

_ASK_EVERY = 1.0
"""Seconds between a node's questions to the tracker about a blob's verdict."""


def admission_key(blob_id: str, parts: int, what: Literal["alone", "probe"] | Verdict) -> str:
    """The lease whose holding says, for the blob's parts: "alone", the lead has measured its rate alone;
    "probe", a node pulls the last part to probe; or the verdict."""
    return hashlib.sha256(f"weightswarm-parts-{what}:{blob_id}/{parts}".encode()).hexdigest()


def judge(alone: float, shared: float) -> Verdict:
    """The verdict from the lead's origin rate alone and while a second holder pulls (bytes/s)."""
    return MORE if alone > 0 and shared >= KEEP * alone else ONE


def rate(present: Callable[[], int], seconds: float, stop: threading.Event) -> float | None:
    """Bytes per second by which `present` grows over `seconds`; None when stopped first."""
    t0, b0 = time.monotonic(), present()
    if stop.wait(seconds):
        return None
    return (present() - b0) / max(1e-3, time.monotonic() - t0)


def steady_rate(
    present: Callable[[], int], window: float, stop: threading.Event, tries: int = 8
) -> float | None:
    """The rate of `present` once two consecutive windows agree within `STEADY`: a download still opening
    its connections, or an origin whose other clients are still arriving, is not measured. None when
    stopped, or when no two windows agreed in `tries`."""
    before = rate(present, window, stop)
    for _ in range(tries):
        now = rate(present, window, stop)
        if before is None or now is None:
            return None
        if abs(now - before) <= STEADY * max(now, before):
            return (now + before) / 2
        before = now
    return None


def growing(present: Callable[[], int], timeout: float, stop: threading.Event) -> bool:
    """Whether `present` grows within `timeout` (a stream has started: rates measured before that are
    the stream's start, not its rate)."""
    first, deadline = present(), time.monotonic() + timeout
    while not stop.wait(0.1):
        if present() > first:
            return True
        if time.monotonic() >= deadline:
            return False
    return False


class Verdicts:
    """The verdict on one blob's parts as the tracker has it; asked at most every `_ASK_EVERY` seconds,
    and kept once known (it does not change while the prober holds it). Thread-safe."""

    def __init__(self, tracker: TrackerClient, blob_id: str, parts: int) -> None:
        self._tracker = tracker
        self._keys = {v: admission_key(blob_id, parts, v) for v in (MORE, ONE)}
        self._known: Verdict | None = None
        self._asked = 0.0
        self._lock = threading.Lock()

    def current(self) -> Verdict | None:
        with self._lock:
            if self._known is not None or time.monotonic() - self._asked < _ASK_EVERY:
                return self._known
            self._asked = time.monotonic()
            for verdict, key in self._keys.items():
                try:
                    if self._tracker.blob_state(key).lease_holder is not None:
                        self._known = verdict
                        break
                except TrackerError as exc:
                    log.info("cannot ask for the verdict on a blob's parts: %s", exc)
                    break
            return self._known

    def reached(self, verdict: Verdict) -> str:
        """This node's own verdict, known here at once; the key of the lease that tells the others."""
        with self._lock:
            self._known = verdict
        return self._keys[verdict]
