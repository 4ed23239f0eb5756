"""A tracker restart in the middle of a cluster's cold fetch: the agents keep swarming with the peers
they know and ask the tracker again, instead of each pulling the rest of the model from the origin."""

from __future__ import annotations

import threading
import time

from tests.support.cluster import fetch_all_and_verify, model_origin
from tests.support.procs import loop_until

MODEL_BYTES = 24 * 2**20
ORIGIN_RATE = 4 * 2**20


def test_a_tracker_restart_mid_fetch_costs_no_extra_origin_bytes(tmp_path, tracker, make_agent) -> None:
    with model_origin(
        tmp_path / "hub", "acme/outage", total_bytes=MODEL_BYTES, shards=4, seed=9, rate_total=ORIGIN_RATE
    ) as origin:
        agents = [make_agent(n, origin, tracker) for n in ("a", "b", "c")]
        origin.hub.reset_counters()
        restarted: list[float] = []
        blip = threading.Thread(target=restart_when_busy, args=(tracker, origin, restarted), daemon=True)
        blip.start()
        statuses = fetch_all_and_verify(agents, origin)
        blip.join(30)
        assert restarted and restarted[0] < origin.size * 0.9, "the tracker was not restarted mid-fetch"
        # Before: each node fetched the rest of the model from the origin (2.51 x S measured with 3).
        assert origin.hub.egress_bytes <= 1.1 * origin.size, (origin.hub.egress_bytes / origin.size)
        assert sum(st["bytes_from_peers"] for st in statuses) >= 1.5 * origin.size


def restart_when_busy(tracker, origin, restarted: list[float]) -> None:
    """SIGKILL the tracker once a quarter of the model has left the origin; start it again 3 s later
    (same SQLite file, an empty peer table). `restarted`: origin egress at the kill."""
    loop_until(lambda: origin.hub.egress_bytes > origin.size / 4, timeout=60, what="fetch under way")
    restarted.append(origin.hub.egress_bytes)
    tracker.kill()
    time.sleep(3)
    tracker.start()
