"""Relay sources that misbehave (docs/security.md, attacks tried): a receiver leaves each within a bounded
time for the next source or way, never failing the job, and sends the relay credential to agents only.

The hostile source (tests.support.hostile_relay) listens on an address of its own and is listed as the
only relay source of a blob that an honest seed holds and offers by BitTorrent only: the receiver asks
it first (its place in the seeds' chains), then has to find its way to the seed."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agent.relay.directory import relay_infohash
from tests.support.cluster import (
    INTEROP_PASSKEY,
    PASSKEY,
    Origin,
    assert_snapshot_verifies,
    fetch_and_wait,
    model_origin,
)
from tests.support.hostile_relay import HostileRelay, announce_relay_source
from tests.support.procs import loop_until

MiB = 2**20
SHARD = 24 * MiB  # relayed: 16 MiB or more
STALL = 3.0
RELAY_STALL = {"lease_stall_min": STALL, "lease_ttl": STALL}
"""The receiver's relay stall time (the lease holder's): its window for a source's rate."""
BOUND = 45.0
"""Seconds the receiver's fetch may take: the hostile source costs it at most three streams of about
`STALL` seconds (agent.relay.receiver `_STRIKES`), the rest is BitTorrent from the seed on loopback."""
MEMORY = 64 * MiB
"""Growth of the test process's RSS (the receiver runs in it) the attack may cause: a receive holds one
MiB buffer and one pipe."""
FDS = 48
"""Open files the test process may hold after b's fetch more than before it: b's torrent, its connections
to the seed and the tracker (16-25 measured). The receiver's sockets to the hostile source are counted
apart (`SocketsTo`): one at a time, none left."""


@pytest.fixture
def one_shard(tmp_path: Path) -> Iterator[Origin]:
    with model_origin(tmp_path / "hub", "acme/hostile", total_bytes=SHARD, shards=1, seed=71) as o:
        yield o


def shard(origin: Origin) -> tuple[str, bytes]:
    path = next(p for p in origin.files if p.endswith(".safetensors"))
    return path, origin.files[path]


@pytest.fixture
def seeded(one_shard, tracker, make_agent):
    """A seed that has the shard and serves it by BitTorrent only (it offers no relay stream)."""
    good = make_agent("good", one_shard, tracker, relay_seeds=False)
    fetch_and_wait(good, one_shard.repo_id)
    one_shard.hub.reset_counters()
    return good


class SocketsTo:
    """The test process's sockets connected to `host:port` (the receiver's, to the hostile source), counted
    every 0.1 s from another thread while it runs: `most` at once."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port, self.most = host, port, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def now(self) -> int:
        peer = (self.host, self.port)
        return sum(1 for c in psutil.Process().net_connections("tcp") if c.raddr and tuple(c.raddr) == peer)

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            self.most = max(self.most, self.now())

    def __enter__(self) -> SocketsTo:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def list_source(hostile: HostileRelay, one_shard, tracker, passkey: str) -> dict:
    """Announce `hostile` on the blob's relay key with `passkey`: the tracker's answer."""
    blob = hashlib.sha256(shard(one_shard)[1]).hexdigest()
    return announce_relay_source(tracker.url, passkey, relay_infohash(blob), hostile.host, hostile.port)


def receive_past(hostile: HostileRelay, one_shard, tracker, make_agent) -> float:
    """Fetch the model on a new node b, `hostile` listed (or not) as the blob's relay source: the seconds
    its fetch took, with the shard from peers, and memory and open files bounded."""
    path, _ = shard(one_shard)
    b = make_agent("b", one_shard, tracker, daemon=RELAY_STALL)
    me = psutil.Process()
    rss, fds = me.memory_info().rss, me.num_fds()
    began = time.monotonic()
    with SocketsTo(hostile.host, hostile.port) as sockets:
        status = fetch_and_wait(b, one_shard.repo_id, timeout=BOUND)
        took = time.monotonic() - began
    assert_snapshot_verifies(status["snapshot"], one_shard)
    # The next source was the seed: the shard came from peers, the origin sent the small files only.
    assert next(f for f in status["files"] if f["path"] == path)["source"] == "peers", status
    assert one_shard.hub.egress_bytes < MiB
    grown = me.memory_info().rss - rss
    assert grown < MEMORY, f"RSS grew {grown / MiB:.0f} MiB"
    assert me.num_fds() - fds <= FDS, (fds, me.num_fds())
    assert sockets.most <= 1 and sockets.now() == 0, (sockets.most, sockets.now())
    return took


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("mode", "every", "asked"),
    [
        ("close", 0.0, 3),  # Connection: close, a MiB, closed: cut short three times, then left
        ("stall", 0.0, 3),  # a MiB, then nothing: stalled three times, then left
        ("trickle", 0.5, 1),  # a byte every half second: too slow over the first window, left at once
        ("trickle", 5.0, 3),  # a byte every 5 s: a stall per byte, three times, then left
    ],
)
def test_a_relay_source_that_misbehaves_costs_the_receiver_a_bounded_time_then_the_next_source(
    one_shard, tracker, make_agent, seeded, mode, every, asked
):
    """Attacks 3 and 4 of issue 62: a `Connection: close` answer failed the receiver's whole fetch
    (http.client had dropped the socket the receiver reads the body from), and a source that trickled, or
    sent a MiB and stalled, held it for good (it was asked again at once after each stream that brought a
    byte). The source here holds the agents' passkey (a compromised node): the gate admits its address."""
    _, data = shard(one_shard)
    hostile = HostileRelay("127.0.0.3", data, mode, every=every or 0.5)
    try:
        assert b"failure reason" not in list_source(hostile, one_shard, tracker, PASSKEY)
        took = receive_past(hostile, one_shard, tracker, make_agent)
        assert took < BOUND
        # Asked (with the credential: it holds an agent's address), and not again without bound.
        assert hostile.requests, "the receiver never asked the hostile source: no test"
        assert len(hostile.requests) <= asked, [r[":path"] for r in hostile.requests]
    finally:
        hostile.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("every", [0.5, 0.0])
def test_a_relay_source_sending_its_reply_head_a_byte_at_a_time_is_left_within_the_stall_time(
    one_shard, tracker, make_agent, seeded, every
):
    """A source (holding the agents' passkey) that sends its reply head a byte every half second, or an
    endless head as fast as the socket takes it: http.client read a head line by line with a timeout per
    read (100 lines of 64 KiB), so a byte within each timeout held the receiver as long as the source
    liked. The head must be whole within the relay's stall time and 16 KiB (agent.relay.heads): the
    source is left after one request, within the stall time, and the blob comes from the seed."""
    _, data = shard(one_shard)
    hostile = HostileRelay("127.0.0.4", data, "head", every=every)
    try:
        assert b"failure reason" not in list_source(hostile, one_shard, tracker, PASSKEY)
        took = receive_past(hostile, one_shard, tracker, make_agent)
        assert took < BOUND
        assert len(hostile.requests) == 1, [r[":path"] for r in hostile.requests]
        loop_until(lambda: len(hostile.held) == 1, timeout=10, what="the hostile connection to end")
        # Left at the stall time (a byte every 0.5 s) or at 16 KiB (at once); the source notices at its
        # next byte, up to `every` later.
        assert hostile.held[0] < STALL + 1.5, hostile.held
    finally:
        hostile.stop()


@pytest.mark.timeout(120)
def test_a_stock_client_cannot_list_itself_as_a_relay_source_nor_is_it_asked(
    one_shard, tracker, make_agent, seeded
):
    """Attack 5 of issue 62: anyone with the interop passkey (handed to stock clients) announced a blob's
    relay key, was listed as a relay source, and was sent the relay credential with the receiver's first
    request. The tracker now refuses an interop announce of a key no blob's metainfo has (a relay key),
    and a receiver asks only the sources the peer gate admits as agents besides."""
    _, data = shard(one_shard)
    hostile = HostileRelay("127.0.0.2", data, "refuse")
    try:
        answer = list_source(hostile, one_shard, tracker, INTEROP_PASSKEY)
        assert answer.get(b"failure reason", b"").startswith(b"unregistered torrent"), answer
        receive_past(hostile, one_shard, tracker, make_agent)
        assert hostile.requests == [], hostile.requests
    finally:
        hostile.stop()

