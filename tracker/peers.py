"""In-memory peer table for the single-process (SQLite) store.

Live peers are soft state: every client re-announces within `interval`, so after a
restart the table refills within one interval. Keeping them in dicts is what makes
thousands of announces per second possible on a small machine.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from operator import itemgetter
from typing import overload

from tracker.store import AnnounceResult, PeerAddr, StoreStats, SwarmCounts

# peer_id -> (packed ip, port, expires at (monotonic), compact form: ip + port, as BEP 23 lists it,
# peer_id)
_Entry = tuple[bytes, int, float, bytes, bytes]
_Entries = dict[bytes, _Entry]
"""In the order the entries expire (an announce moves its peer to the end)."""
_PEER = itemgetter(4, 0, 1)
_COMPACT = itemgetter(3)


class _Swarm:
    __slots__ = ("seeders", "leechers", "downloaded", "next_sweep")

    def __init__(self) -> None:
        self.seeders: _Entries = {}
        self.leechers: _Entries = {}
        self.downloaded = 0
        self.next_sweep = 0.0

    def sweep(self, now: float) -> None:
        for table in (self.seeders, self.leechers):
            dead = [pid for pid, entry in table.items() if entry[2] <= now]
            for pid in dead:
                del table[pid]


class _Peers(Sequence[PeerAddr]):
    """Chosen entries as (peer_id, ip, port), each made when read: a compact reply reads none."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> PeerAddr: ...
    @overload
    def __getitem__(self, i: slice) -> list[PeerAddr]: ...
    def __getitem__(self, i: int | slice) -> PeerAddr | list[PeerAddr]:
        if isinstance(i, slice):
            return list(map(_PEER, self._entries[i]))
        return _PEER(self._entries[i])  # type: ignore[no-any-return]


class PeerTable:
    """Swarms by infohash; expired peers are swept lazily (per swarm, and globally now and then)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._swarms: dict[bytes, _Swarm] = {}
        self._next_global_sweep = time.monotonic() + ttl
        self._addresses: dict[bytes, float] = {}
        """packed ip -> expires at: every address that announced anything lately."""

    def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int, agent: bool = True
    ) -> AnnounceResult:
        now = time.monotonic()
        if now >= self._next_global_sweep:
            self.sweep(now)
        swarm = self._swarms.get(infohash)
        if swarm is None:
            if event == "stopped":
                return AnnounceResult(0, 0, [])
            swarm = self._swarms[infohash] = _Swarm()
        if now >= swarm.next_sweep:
            swarm.sweep(now)
            # Sweeping a quarter TTL late keeps peers at most 1.25 TTL: cheap and close enough.
            swarm.next_sweep = now + self.ttl / 4
        peer_id, ip, port = peer
        if event == "stopped":
            swarm.seeders.pop(peer_id, None)
            swarm.leechers.pop(peer_id, None)
            return AnnounceResult(len(swarm.seeders), len(swarm.leechers), [])
        mine, other = (swarm.seeders, swarm.leechers) if seeder else (swarm.leechers, swarm.seeders)
        other.pop(peer_id, None)
        if event == "completed":
            swarm.downloaded += 1
        # Out and in again, not updated in place: each table stays in the order its peers expire, and
        # this peer is its last entry.
        mine.pop(peer_id, None)
        mine[peer_id] = (ip, port, now + self.ttl, ip + port.to_bytes(2, "big"), peer_id)
        if agent:
            self._addresses[ip] = now + self.ttl
        chosen: list[_Entry] = []
        if numwant > 0:
            # Seeders need only leechers; leechers get seeders first, then other leechers.
            sources = (swarm.leechers,) if seeder else (swarm.seeders, swarm.leechers)
            for table in sources:
                chosen += _pick(table, table is mine, numwant - len(chosen), now)
                if len(chosen) >= numwant:
                    break
        return AnnounceResult(
            len(swarm.seeders), len(swarm.leechers), _Peers(chosen), list(map(_COMPACT, chosen))
        )

    def counts(self, infohash: bytes) -> SwarmCounts:
        swarm = self._swarms.get(infohash)
        if swarm is None:
            return SwarmCounts()
        now = time.monotonic()
        live_s = sum(1 for e in swarm.seeders.values() if e[2] > now)
        live_l = sum(1 for e in swarm.leechers.values() if e[2] > now)
        return SwarmCounts(live_s, live_l, swarm.downloaded)

    def seeders(self, infohash: bytes) -> list[tuple[bytes, int]]:
        """(packed ip, port) of the swarm's unexpired seeders, sorted (the rule of `counts`)."""
        swarm = self._swarms.get(infohash)
        if swarm is None:
            return []
        now = time.monotonic()
        return sorted({(ip, port) for ip, port, expires, _, _ in swarm.seeders.values() if expires > now})

    def stats(self) -> StoreStats:
        self.sweep(time.monotonic())
        seeders = sum(len(s.seeders) for s in self._swarms.values())
        leechers = sum(len(s.leechers) for s in self._swarms.values())
        return StoreStats(torrents=len(self._swarms), peers=seeders + leechers, seeders=seeders)

    def addresses(self) -> list[bytes]:
        now = time.monotonic()
        for ip in [ip for ip, expires in self._addresses.items() if expires <= now]:
            del self._addresses[ip]
        return list(self._addresses)

    def sweep(self, now: float) -> None:
        for infohash in list(self._swarms):
            swarm = self._swarms[infohash]
            swarm.sweep(now)
            if not swarm.seeders and not swarm.leechers:
                del self._swarms[infohash]
        self._next_global_sweep = now + self.ttl


def _pick(table: _Entries, mine: bool, want: int, now: float) -> list[_Entry]:
    """Up to `want` live entries of `table` (`mine`: the announcing peer's table, which ends with it).
    From a large table, a run of entries from a random place, wrapping round: each peer is as likely to
    be handed out as any other (peers that last announced one after the other tend to come together),
    and the work is list operations in C, not Python per peer drawn (a Python loop over the peers was
    a third of an announce's time)."""
    if want <= 0:
        return []
    entries = list(table.values())
    if mine:
        del entries[-1:]
    if entries and entries[0][2] <= now:  # expired ones lead; the sweeps remove them soon
        entries = [e for e in entries if e[2] > now]
    n = len(entries)
    if n > want:
        start = random.randrange(n)
        entries = entries[start : start + want] + entries[: max(0, start + want - n)]
    return entries
