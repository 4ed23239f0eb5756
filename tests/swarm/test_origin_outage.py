"""The origin answering 503, or 429, in the middle of a cluster's cold fetch, for longer than the origin
client retries one request: the lease holders wait it out where they stand, keeping their partial blobs
and their leases (also past the time after which a holder that brings no bytes counts as stalled), and
no node starts a blob over from the origin."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.support.cluster import fetch_all_and_verify, model_origin
from tests.support.procs import loop_until

MODEL_BYTES = 24 * 2**20
ORIGIN_RATE = 4 * 2**20
OUTAGE = {503: 6.0, 429: 10.0}
"""Seconds of each answer: beyond the agents' origin retries (below); the 429s also beyond the 6 s after
which a holder whose bytes do not move counts as stalled here (`holder_stall`, `lease_stall_min` 4 s)."""


@pytest.mark.parametrize("status", sorted(OUTAGE))
def test_the_lease_holders_wait_out_an_unavailable_origin(status, tmp_path, tracker, make_agent, caplog):
    with model_origin(
        tmp_path / "hub", "acme/down", total_bytes=MODEL_BYTES, shards=4, seed=5, rate_total=ORIGIN_RATE
    ) as origin:
        # 503s: retries spent in < 1 s, then the patience. 429s: the client's own 6 retries, each after
        # the Retry-After of 2 s, are longer than a holder's stall limit already.
        quick = {"max_retries": 3, "backoff_base": 0.05, "backoff_max": 0.2} if status == 503 else {}
        daemon = {"origin_patience": 30.0, "lease_stall_min": 4.0}
        agents = [make_agent(n, origin, tracker, daemon=daemon, origin_client=quick) for n in ("a", "b", "c")]
        origin.hub.reset_counters()
        outage: list[float] = []
        burst = threading.Thread(target=unavailable_when_busy, args=(origin, status, outage), daemon=True)
        burst.start()
        with caplog.at_level(logging.INFO, logger="agent.origin.client"):
            fetch_all_and_verify(agents, origin)
        burst.join(30)
        assert outage and outage[0] < origin.size * 0.8, "the origin did not fail mid-fetch"
        said = [r.getMessage() for r in caplog.records if r.name == "agent.origin.client"]
        assert any(str(status) in m and (status == 429 or "asking again" in m) for m in said)
        # Failing instead hands the holder's lease to a node that starts the blob over (1.5 x S measured),
        # and so does a holder that looks stalled while it waits (1.5 x S through a 30-s rate limit).
        assert origin.hub.egress_bytes <= 1.05 * origin.size, origin.hub.egress_bytes / origin.size


def unavailable_when_busy(origin, status: int, outage: list[float]) -> None:
    """Once a quarter of the model has left the origin, answer every file request `status` for
    `OUTAGE[status]` seconds. `outage`: origin egress when it began."""
    loop_until(lambda: origin.hub.egress_bytes > origin.size / 4, timeout=60, what="fetch under way")
    faults = origin.hub.faults
    outage.append(origin.hub.egress_bytes)
    answer = (429, {"Retry-After": "2", "X-Error-Code": "RateLimited"}) if status == 429 else (503, {})
    end = time.monotonic() + OUTAGE[status]
    while time.monotonic() < end:
        with faults._lock:
            faults.status_queue[:] = [answer] * 64
        time.sleep(0.05)
    with faults._lock:
        faults.status_queue.clear()
