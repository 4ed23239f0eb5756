"""The in-memory peer table (tracker.peers): which peers an announce is handed. A swarm larger than
numwant gives a run of its peers from a random place, so every peer must come out about as often as any
other, never the asker itself, never twice in one answer, and never a peer whose time is up. The clock
is the table's own `time.monotonic`, stepped by the test."""

from __future__ import annotations

import collections
import random
import types

import pytest

import tracker.peers as peers_module
from tracker.peers import PeerTable

IP = b"\x0a\x00\x00\x01"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(peers_module, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


def pid(n: int) -> bytes:
    return b"-WS0100-" + n.to_bytes(12, "big")


def announce(table: PeerTable, n: int, seeder: bool = False, numwant: int = 50) -> list[bytes]:
    result = table.announce(b"h" * 20, (pid(n), IP, 10000 + n), seeder, "", numwant)
    assert len(result.compact or []) == len(result.peers)
    for (peer_id, ip, port), addr in zip(result.peers, result.compact or [], strict=True):
        assert addr == ip + port.to_bytes(2, "big") and int.from_bytes(peer_id[8:], "big") == port - 10000
    return [p[0] for p in result.peers]


def test_a_large_swarm_hands_each_peer_out_alike_never_the_asker_never_twice(clock: Clock) -> None:
    table = PeerTable(ttl=600)
    for n in range(200):
        announce(table, n)
    for asker in range(0, 200, 7):
        got = announce(table, asker)  # its re-announce moves it to the end of the table
        assert len(got) == 50 and len(set(got)) == 50 and pid(asker) not in got
    # A seeder asks again and again: the leechers' table keeps its order, so only the random place
    # of each run spreads the answers.
    counts: collections.Counter[bytes] = collections.Counter()
    draws = 2000
    for _ in range(draws):
        got = announce(table, 500, seeder=True)
        assert len(got) == 50 and len(set(got)) == 50
        counts.update(got)
        clock.now += 0.01
    # Each draw takes 50 of the 200: 500 each on average (binomial, sd ~19); runs that favoured some
    # place in the table would leave some far off.
    assert len(counts) == 200
    assert 400 < min(counts.values()) and max(counts.values()) < 600, counts.most_common(3)


def test_a_leecher_gets_seeders_first_then_leechers_and_a_seeder_only_leechers(clock: Clock) -> None:
    table = PeerTable(ttl=600)
    for n in range(3):
        announce(table, n, seeder=True)
    for n in range(3, 13):
        announce(table, n)
    got = announce(table, 20, numwant=5)
    assert got[:3] and set(got[:3]) == {pid(0), pid(1), pid(2)}
    assert len(got) == 5 and all(p not in {pid(0), pid(1), pid(2)} for p in got[3:])
    seeder_view = announce(table, 0, seeder=True, numwant=100)
    assert set(seeder_view) == {pid(n) for n in [*range(3, 13), 20]}
    assert announce(table, 21, numwant=0) == []


def test_a_peer_whose_time_is_up_is_neither_handed_out_nor_counted(clock: Clock) -> None:
    table = PeerTable(ttl=100)
    announce(table, 1)  # expires at +100
    clock.now += 10
    announce(table, 2)  # expires at +110
    clock.now += 80
    announce(table, 3)  # at +90: nobody's time is up
    clock.now += 15  # +105: peer 1's is
    assert set(announce(table, 4)) == {pid(2), pid(3)}
    assert table.counts(b"h" * 20).incomplete == 3  # 2, 3 and 4
    # A peer that announces again is live again.
    announce(table, 1)
    clock.now += 6  # +111: peer 2's time is up too
    assert set(announce(table, 5)) == {pid(1), pid(3), pid(4)}


def test_joins_leaves_and_role_changes_in_any_order_keep_every_live_peer_and_no_other(clock: Clock) -> None:
    """A leaver's place goes to the last peer and a re-announce moves its peer to the end: after any mix
    of them, a large numwant hands out exactly the live peers of the right role."""
    rng = random.Random(7)
    table = PeerTable(ttl=100)
    live: dict[int, tuple[bool, float]] = {}  # peer -> (seeder, expires at)
    for step in range(3000):
        n = rng.randrange(60)
        if rng.random() < 0.15:
            table.announce(b"h" * 20, (pid(n), IP, 10000 + n), False, "stopped", 0)
            live.pop(n, None)
        else:
            seeder = rng.random() < 0.3
            announce(table, n, seeder=seeder, numwant=0)
            live[n] = (seeder, clock.now + 100)
        clock.now += rng.choice([0.0, 0.5, 3.0])
        if step % 50 == 0:
            asker = 1000 + step  # a leecher new to the swarm: it is handed every live peer
            got = announce(table, asker, numwant=200)
            live[asker] = (False, clock.now + 100)
            expected = {pid(p) for p, (_, expires) in live.items() if expires > clock.now and p != asker}
            assert sorted(got) == sorted(expected) and len(got) == len(set(got))
            counts = table.counts(b"h" * 20)
            alive = [s for s, expires in live.values() if expires > clock.now]
            assert (counts.complete, counts.incomplete) == (sum(alive), len(alive) - sum(alive))


def test_limits_refuse_new_entries_per_address_per_passkey_and_in_all(clock: Clock) -> None:
    from tracker.settings import ADDRESS_FULL, PEERS_FULL, SWARMS_FULL, SwarmLimits
    from tracker.store import OverLimitError

    limits = SwarmLimits(
        max_swarms=10, max_peers=12, max_peers_per_address=4, interop_max_swarms=3,
        interop_max_peers=5, interop_max_peers_per_address=2,
    )  # fmt: skip
    table = PeerTable(ttl=100, limits=limits)

    def put(n: int, ip: bytes, agent: bool = True, peer: int = 1) -> str | None:
        try:
            table.announce(bytes([n]) * 20, (pid(peer), ip, 6881), False, "", 0, agent)
        except OverLimitError as exc:
            return str(exc)
        return None

    a, b, c = b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", b"\x0a\x00\x00\x03"
    assert [put(n, a, agent=False) for n in range(3)] == [None, None, ADDRESS_FULL]
    assert [put(n, b, agent=False) for n in (3, 4)] == [None, SWARMS_FULL]  # interop: 3 swarms in all
    assert [put(n, a) for n in range(10, 15)] == [None, None, None, None, ADDRESS_FULL]  # agents: 4
    assert put(0, b, agent=False, peer=2) is None and put(1, c, agent=False, peer=3) is None
    assert put(10, c, agent=False, peer=3) == PEERS_FULL  # interop: 5 entries in all
    assert put(10, a) is None  # a renewal is never refused
    assert [put(n, b) for n in range(20, 24)] == [None, None, None, SWARMS_FULL]  # 10 swarms in all
    assert put(0, c, peer=4) == PEERS_FULL  # 12 entries in all, both passkeys
    assert bytes([23]) * 20 not in table._swarms  # refused: nothing stored
    clock.now += 101
    table.sweep_step(clock.now, 100)  # a round starts at most every ttl / 4: this is one
    assert put(30, c) is None and len(table._swarms) == 1  # everything expired was swept
