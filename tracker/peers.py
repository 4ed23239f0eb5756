"""In-memory peer table for the single-process (SQLite) store.

Live peers are soft state: every client re-announces within `interval`, so after a
restart the table refills within one interval. Keeping them in lists and dicts is what makes
thousands of announces per second possible on a small machine.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from operator import itemgetter
from typing import overload

from tracker.store import AnnounceResult, PeerAddr, StoreStats, SwarmCounts

# (packed ip, port, expires at (monotonic), compact form: ip + port, as BEP 23 lists it, peer_id)
_Entry = tuple[bytes, int, float, bytes, bytes]
_PEER = itemgetter(4, 0, 1)


class _Table:
    """A swarm's seeders or its leechers: their entries and, at the same places, their BEP 23 forms, so
    a compact reply is a slice of a list. An announce moves its peer to the end (`pick` then leaves it
    out by taking from the others); one that leaves gives its place to the last. An announce reads only
    what it hands out: copying a table of thousands per announce cost more than the rest of it. `oldest`
    is a bound no entry expires before: the table is swept (read whole) when the clock passes it."""

    __slots__ = ("where", "entries", "compact", "oldest")

    def __init__(self) -> None:
        self.where: dict[bytes, int] = {}
        self.entries: list[_Entry] = []
        self.compact: list[bytes] = []
        self.oldest = math.inf

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, peer_id: bytes, entry: _Entry) -> None:
        """Add or refresh the peer, at the end."""
        where, entries, compact = self.where, self.entries, self.compact
        i = where.get(peer_id)
        if i is None:
            where[peer_id] = len(entries)
            entries.append(entry)
            compact.append(entry[3])
        else:
            last = len(entries) - 1
            moved = entries[i] = entries[last]
            compact[i] = compact[last]
            where[moved[4]] = i
            entries[last], compact[last], where[peer_id] = entry, entry[3], last
        if entry[2] < self.oldest:
            self.oldest = entry[2]

    def drop(self, peer_id: bytes) -> None:
        i = self.where.pop(peer_id, None)
        if i is None:
            return
        moved, form = self.entries.pop(), self.compact.pop()
        if i < len(self.entries):
            self.entries[i], self.compact[i], self.where[moved[4]] = moved, form, i

    def sweep(self, now: float) -> None:
        live = [e for e in self.entries if e[2] > now]
        if len(live) < len(self.entries):
            self.entries, self.compact = live, [e[3] for e in live]
            self.where = {e[4]: i for i, e in enumerate(live)}
        self.oldest = min([e[2] for e in live], default=math.inf)

    def pick(self, mine: bool, want: int) -> tuple[list[_Entry], list[bytes]]:
        """Up to `want` peers (`mine`: the announcing peer's table, which ends with it), as entries and
        as compact forms. From a large table, a run of peers from a random place, wrapping round: each
        peer is as likely to be handed out as any other (neighbours in the table tend to come together),
        and the work is slicing lists in C (a Python step per peer drawn was a third of an announce)."""
        n = len(self.entries) - mine
        if n <= 0 or want <= 0:
            return [], []
        entries, compact = self.entries, self.compact
        if n <= want:
            return entries[:n], compact[:n]
        start = int(random.random() * n)
        end = start + want
        if end <= n:
            return entries[start:end], compact[start:end]
        return entries[start:n] + entries[: end - n], compact[start:n] + compact[: end - n]


class _Swarm:
    __slots__ = ("seeders", "leechers", "downloaded")

    def __init__(self) -> None:
        self.seeders = _Table()
        self.leechers = _Table()
        self.downloaded = 0

    def sweep(self, now: float) -> None:
        self.seeders.sweep(now)
        self.leechers.sweep(now)


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
        if now >= swarm.seeders.oldest:
            swarm.seeders.sweep(now)
        if now >= swarm.leechers.oldest:
            swarm.leechers.sweep(now)
        peer_id, ip, port = peer
        if event == "stopped":
            swarm.seeders.drop(peer_id)
            swarm.leechers.drop(peer_id)
            return AnnounceResult(len(swarm.seeders), len(swarm.leechers), [])
        mine, other = (swarm.seeders, swarm.leechers) if seeder else (swarm.leechers, swarm.seeders)
        other.drop(peer_id)
        if event == "completed":
            swarm.downloaded += 1
        mine.put(peer_id, (ip, port, now + self.ttl, ip + port.to_bytes(2, "big"), peer_id))
        if agent:
            self._addresses[ip] = now + self.ttl
        chosen: list[_Entry] = []
        compact: list[bytes] = []
        if numwant > 0:
            # Seeders need only leechers; leechers get seeders first, then other leechers.
            for table in (swarm.leechers,) if seeder else (swarm.seeders, swarm.leechers):
                entries, forms = table.pick(table is mine, numwant - len(chosen))
                chosen += entries
                compact += forms
                if len(chosen) >= numwant:
                    break
        return AnnounceResult(len(swarm.seeders), len(swarm.leechers), _Peers(chosen), compact)

    def counts(self, infohash: bytes) -> SwarmCounts:
        swarm = self._swarms.get(infohash)
        if swarm is None:
            return SwarmCounts()
        now = time.monotonic()
        live_s = sum(1 for e in swarm.seeders.entries if e[2] > now)
        live_l = sum(1 for e in swarm.leechers.entries if e[2] > now)
        return SwarmCounts(live_s, live_l, swarm.downloaded)

    def seeders(self, infohash: bytes) -> list[tuple[bytes, int]]:
        """(packed ip, port) of the swarm's unexpired seeders, sorted (the rule of `counts`)."""
        swarm = self._swarms.get(infohash)
        if swarm is None:
            return []
        now = time.monotonic()
        return sorted({(ip, port) for ip, port, expires, _, _ in swarm.seeders.entries if expires > now})

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
