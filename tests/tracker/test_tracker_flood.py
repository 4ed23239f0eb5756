"""Attack 6 of issue 62: a passkey holder announcing fresh infohashes as fast as it can. Before, 2.06
million swarms in 60 s took the tracker to 2.4 GB, the interop passkey alone got it killed under a
512 MiB limit in 14 s, and the expiry sweep held the event loop 6.3 s. Now `SwarmLimits` bounds what
announces store (a bencoded failure reason beyond a limit, nothing stored), the interop passkey has a
budget of its own (and announces only blobs with metainfo), and expired peers are swept a slice at a time.

A real `tracker serve` process with its default limits, flooded from several loopback addresses with
both passkeys (`tests.support.announce_flood`, a process per address), its RSS sampled with psutil and
its /healthz timed throughout, against SQLite and Redis.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote_from_bytes

import httpx
import psutil
import pytest

from tests.support.announce_flood import infohash
from tests.support.cluster import INTEROP_PASSKEY, PASSKEY, TrackerProcess
from tests.support.procs import loop_until, stop_process
from tests.support.trackerkit import flush_redis
from tracker.settings import ADDRESS_FULL, PEERS_FULL, SWARMS_FULL, SwarmLimits
from tracker.store import UNREGISTERED
from wirekit.bencode import bdecode

MiB = 2**20
RSS_BOUND = 300 * MiB
"""The tracker's resident memory at every sample: the issue's target is 400 MiB; at its default limits
the SQLite store holds ~1.2 KB a swarm and ~0.4 KB an entry, ~250 MiB with the interpreter."""
HEALTHZ_BOUND = 2.0
"""Seconds /healthz may take while the flood and the sweep run (the sweep held the loop 6.3 s before)."""
REDIS_LIMITS = SwarmLimits(
    max_swarms=20_000,
    max_peers=100_000,
    max_peers_per_address=10_000,
    interop_max_swarms=2_000,
    interop_max_peers=4_000,
    interop_max_peers_per_address=200,
)
"""A fifth of the defaults for Redis, whose announces (a script each, through the ASGI path) run at a
fifth of the rate on CI's two cores: the same limits hit within the test's time."""
SCALES = {"sqlite": (SwarmLimits(), 6, 1), "redis": (REDIS_LIMITS, 8, 5)}
"""Per store: the limits, the announce interval (peers expire after 2.5 of them, so the sweep runs
while the flood does; a phase takes less than that) and how much smaller the flood is."""
AGENT = "127.0.0.50"
"""An agent's address: it announces one blob it holds, and new ones, throughout."""


class Flooders:
    """`announce_flood` processes, one per (passkey, address), started together."""

    def __init__(self, port: int, plan: list[tuple[str, str, int]], seconds: float, tag: str) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.announce_flood", str(port), passkey, source, str(n)]
                + [str(seconds), tag],
                stdout=subprocess.PIPE,
                text=True,
            )
            for passkey, source, n in plan
        ]
        self.results: list[dict] = []

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def finish(self) -> list[dict]:
        for p in self.procs:
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0, f"flood process failed: {out}"
            self.results.append(json.loads(out.strip().splitlines()[-1]))
        return self.results

    def stop(self) -> None:
        for p in self.procs:
            stop_process(p, grace=5)


class Watch:
    """The tracker's RSS and /healthz time at each sample, and an agent's announces between them."""

    def __init__(self, tracker: TrackerProcess) -> None:
        self.tracker = tracker
        self.proc = psutil.Process(tracker.proc.pid)  # type: ignore[union-attr]
        self.rss: list[int] = []
        self.healthz: list[float] = []
        self.agent = httpx.Client(transport=httpx.HTTPTransport(local_address=AGENT), timeout=10)
        self.new_blobs = 0

    def announce(self, passkey: str, ih: bytes, peer: bytes, client: httpx.Client | None = None) -> dict:
        query = (
            f"info_hash={quote_from_bytes(ih)}&peer_id={quote_from_bytes(peer)}&port=6881"
            "&uploaded=0&downloaded=0&left=0&compact=1"
        )
        response = (client or self.agent).get(f"{self.tracker.url}/announce/{passkey}?{query}")
        assert response.status_code == 200
        return dict(bdecode(response.content))

    def scrape(self, ih: bytes) -> dict:
        url = f"{self.tracker.url}/scrape/{PASSKEY}?info_hash={quote_from_bytes(ih)}"
        return dict(bdecode(httpx.get(url, timeout=10).content)[b"files"][ih])

    def sample(self, new_blob: bool) -> None:
        """One round: RSS, /healthz, the agent's blob renewed (and a new blob of its own announced)."""
        self.rss.append(self.proc.memory_info().rss)
        start = time.monotonic()
        assert httpx.get(f"{self.tracker.url}/healthz", timeout=30).status_code == 200
        self.healthz.append(time.monotonic() - start)
        held = self.announce(PASSKEY, infohash("agent", 0), b"-WS0100-agent-000001")
        assert b"failure reason" not in held, held
        if new_blob:
            self.new_blobs += 1
            fresh = self.announce(PASSKEY, infohash("agent", self.new_blobs), b"-WS0100-agent-000001")
            assert b"failure reason" not in fresh, fresh

    def during(self, flood: Flooders, new_blobs: bool, limit: float) -> list[dict]:
        deadline = time.monotonic() + limit
        while flood.running():
            assert time.monotonic() < deadline, "the flood did not end in time"
            self.sample(new_blobs)
            time.sleep(0.2)  # a sampling period, not a wait for a condition
        return flood.finish()


def _refused(results: list[dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in results:
        for reason, n in r["outcomes"].items():
            if reason != "ok":
                total[reason] = total.get(reason, 0) + n
    return total


@pytest.mark.parametrize("store", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_passkey_holders_flood_of_fresh_swarms_keeps_the_tracker_bounded_and_answering(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis_url = None
    if store == "redis":
        redis_url = request.getfixturevalue("redis_url")
        flush_redis(redis_url)
    limits, interval, smaller = SCALES[store]
    options = [f"--{k.replace('_', '-')}={v}" for k, v in dataclasses.asdict(limits).items()]
    tracker = TrackerProcess(tmp_path, redis_url, interval=interval, extra=options)
    tracker.start()
    try:
        watch = Watch(tracker)
        watch.sample(new_blob=False)

        # The interop passkey's holders, from twelve addresses: fresh infohashes have no metainfo, so each
        # announce is refused before it is stored (`--interop-max-swarms` bounds the swarms of blobs with
        # metainfo: tests/tracker/test_peer_table.py), while the agent keeps announcing new blobs (each a
        # new swarm) and renewing the one it holds.
        plan = [
            (INTEROP_PASSKEY, ",".join(f"127.0.1.{i}" for i in range(first, first + 4)), 4_000 // smaller)
            for first in (1, 5, 9)
        ]
        interop = Flooders(tracker.port, plan, 40, "interop")
        try:
            results = watch.during(interop, new_blobs=True, limit=60)
        finally:
            interop.stop()
        assert sum(r["outcomes"].get("ok", 0) for r in results) == 0, results
        assert set(_refused(results)) == {UNREGISTERED}, results
        assert watch.new_blobs > 0
        # A refused announce stored nothing: its swarm is unknown, asked at once.
        ih = infohash("interop probe", 1)
        probe = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.1.1"), timeout=10)
        with probe:
            answer = watch.announce(INTEROP_PASSKEY, ih, b"-XX0100-interop-0001", probe)
        assert answer.get(b"failure reason") == UNREGISTERED.encode(), answer
        assert watch.scrape(ih) == {b"complete": 0, b"downloaded": 0, b"incomplete": 0}

        # Now holders of the agents' passkey too, from three more addresses, stopped at the swarms' limit;
        # the agent's blob still renews. The flood outlives the peer TTL, so the sweep runs.
        plan = [(PASSKEY, f"127.0.2.{i}", 40_000 // smaller) for i in (1, 2, 3)]
        plan += [(INTEROP_PASSKEY, "127.0.1.4", 10_000 // smaller)]
        agents = Flooders(tracker.port, plan, 45, "agents")
        try:
            results = watch.during(agents, new_blobs=False, limit=70)
        finally:
            agents.stop()
        refused = _refused(results)
        assert set(refused) <= {ADDRESS_FULL, PEERS_FULL, SWARMS_FULL, UNREGISTERED} and refused, results
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.2.1"), timeout=10) as probe:
            fresh = infohash("agent probe", 1)
            answer = watch.announce(PASSKEY, fresh, hashlib.sha1(b"agents peer").digest(), probe)
        if b"failure reason" in answer:
            assert watch.scrape(fresh) == {b"complete": 0, b"downloaded": 0, b"incomplete": 0}

        # After the flood: the sweep drops what expired, and the agent's own swarms stay.
        swept = lambda: _torrents(tracker) <= watch.new_blobs + 1  # noqa: E731
        loop_until(swept, timeout=3 * interval * 2.5, what="the sweep")
        watch.sample(new_blob=True)
        print(
            f"{store}: RSS max {max(watch.rss) / MiB:.0f} MiB, /healthz max {max(watch.healthz):.3f} s, "
            f"{len(watch.rss)} samples, refused {refused}"
        )
        assert max(watch.rss) < RSS_BOUND, [r // MiB for r in watch.rss]
        assert max(watch.healthz) < HEALTHZ_BOUND, watch.healthz
        assert psutil.Process(tracker.proc.pid).num_fds() < 100  # type: ignore[union-attr]
    finally:
        tracker.stop()


def _torrents(tracker: TrackerProcess) -> int:
    text = httpx.get(f"{tracker.url}/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("tracker_torrents "))
    return int(float(line.split()[1]))
