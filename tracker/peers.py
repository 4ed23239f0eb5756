"""In-memory peer table for the single-process (SQLite) store.

Live peers are soft state: every client re-announces within `interval`, so after a
restart the table refills within one interval. Keeping them in lists and dicts is what makes
thousands of announces per second possible on a small machine.

What announces may make it hold is bounded (`SwarmLimits`): a passkey holder announcing fresh
infohashes took it to 2.4 GB. Expired peers are swept a slice of swarms at a time (`sweep_step`, driven
by the store's task), never the whole table at once: a full sweep of two million swarms held the event
loop for 6.3 s.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import overload

from tracker.settings import ADDRESS_FULL, PEERS_FULL, SWARMS_FULL, SwarmLimits
from tracker.store import (
    UNREGISTERED,
    AnnounceResult,
    OverLimitError,
    PeerAddr,
    StoreStats,
    SwarmCounts,
    UnregisteredTorrentError,
)

# (packed ip, port, expires at (monotonic), compact form: ip + port, as BEP 23 lists it, peer_id,
#  announced with the agents' passkey)
_Entry = tuple[bytes, int, float, bytes, bytes, bool]
SWEEP_SLICE = 2000
"""Swarms the sweep looks over in one step (about a millisecond's work), then it yields the loop..."""
SWEEP_PAUSE = 0.05
"""...for this many seconds: 40,000 swarms a second, every swarm many times per peer TTL."""
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

    def put(self, peer_id: bytes, entry: _Entry) -> _Entry | None:
        """Add or refresh the peer, at the end; the entry it replaced, if any."""
        where, entries, compact = self.where, self.entries, self.compact
        i = where.get(peer_id)
        old = None
        if i is None:
            where[peer_id] = len(entries)
            entries.append(entry)
            compact.append(entry[3])
        else:
            old = entries[i]
            last = len(entries) - 1
            moved = entries[i] = entries[last]
            compact[i] = compact[last]
            where[moved[4]] = i
            entries[last], compact[last], where[peer_id] = entry, entry[3], last
        if entry[2] < self.oldest:
            self.oldest = entry[2]
        return old

    def get(self, peer_id: bytes) -> _Entry | None:
        i = self.where.get(peer_id)
        return None if i is None else self.entries[i]

    def drop(self, peer_id: bytes) -> _Entry | None:
        i = self.where.pop(peer_id, None)
        if i is None:
            return None
        old = self.entries[i]
        moved, form = self.entries.pop(), self.compact.pop()
        if i < len(self.entries):
            self.entries[i], self.compact[i], self.where[moved[4]] = moved, form, i
        return old

    def sweep(self, now: float) -> list[_Entry]:
        """Drop the expired entries; they are returned."""
        live = [e for e in self.entries if e[2] > now]
        dead = []
        if len(live) < len(self.entries):
            dead = [e for e in self.entries if e[2] <= now]
            self.entries, self.compact = live, [e[3] for e in live]
            self.where = {e[4]: i for i, e in enumerate(live)}
        self.oldest = min([e[2] for e in live], default=math.inf)
        return dead

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

    def sweep(self, now: float) -> list[_Entry]:
        """Sweep the tables whose oldest entry has expired; the entries dropped."""
        dead = self.seeders.sweep(now) if now >= self.seeders.oldest else []
        if now >= self.leechers.oldest:
            dead += self.leechers.sweep(now)
        return dead


class _Ledger:
    """Entries held, per passkey (index: announced with the agents' one) in all and per address: what
    `SwarmLimits` bounds. Every entry added to or dropped from a table passes through here."""

    __slots__ = ("held", "totals")

    def __init__(self) -> None:
        self.held: tuple[dict[bytes, int], dict[bytes, int]] = ({}, {})
        self.totals = [0, 0]

    def add(self, ip: bytes, agent: bool) -> None:
        held = self.held[agent]
        held[ip] = held.get(ip, 0) + 1
        self.totals[agent] += 1

    def remove(self, entry: _Entry) -> None:
        ip, agent = entry[0], entry[5]
        held = self.held[agent]
        left = held[ip] - 1
        if left:
            held[ip] = left
        else:
            del held[ip]
        self.totals[agent] -= 1

    def room(self, ip: bytes, agent: bool, limits: SwarmLimits) -> str | None:
        """Why one more entry of `ip` with this passkey is refused, or None."""
        total, per_address = limits.peers_for(agent)
        if self.totals[0] + self.totals[1] >= limits.max_peers or self.totals[agent] >= total:
            return PEERS_FULL
        if self.held[agent].get(ip, 0) >= per_address:
            return ADDRESS_FULL
        return None


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
    """Swarms by infohash, within `limits`; expired peers are swept per swarm when it is announced to,
    and by `sweep_step` over the whole table (a round at most every ttl / 4). `registered(infohash)`:
    whether a blob's metainfo has it, asked for interop-passkey announces only (None: every one is)."""

    def __init__(
        self,
        ttl: float,
        limits: SwarmLimits | None = None,
        registered: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.ttl = ttl
        self.limits = limits or SwarmLimits()
        self._registered = registered
        self._swarms: dict[bytes, _Swarm] = {}
        self._ledger = _Ledger()
        self._round: list[bytes] = []
        """The infohashes the sweep's round looks over, from `_at` on (a copy: the dict changes)."""
        self._at = 0
        self._next_round = time.monotonic() + ttl / 4
        self._addresses: dict[bytes, float] = {}
        """packed ip -> expires at: every address that announced anything lately."""

    def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int, agent: bool = True
    ) -> AnnounceResult:
        if not agent and self._registered is not None and not self._registered(infohash):
            raise UnregisteredTorrentError(UNREGISTERED)
        now = time.monotonic()
        ledger = self._ledger
        swarm = self._swarms.get(infohash)
        peer_id, ip, port = peer
        if swarm is None:
            if event == "stopped":
                return AnnounceResult(0, 0, [])
            if len(self._swarms) >= self.limits.swarms_for(agent):
                raise OverLimitError(SWARMS_FULL)
            refused = ledger.room(ip, agent, self.limits)
            if refused:
                raise OverLimitError(refused)
            swarm = self._swarms[infohash] = _Swarm()
        else:
            for dead in swarm.sweep(now):
                ledger.remove(dead)
        if event == "stopped":
            for table in (swarm.seeders, swarm.leechers):
                left = table.drop(peer_id)
                if left is not None:
                    ledger.remove(left)
            if not swarm.seeders and not swarm.leechers:
                del self._swarms[infohash]
                return AnnounceResult(0, 0, [])
            return AnnounceResult(len(swarm.seeders), len(swarm.leechers), [])
        mine, other = (swarm.seeders, swarm.leechers) if seeder else (swarm.leechers, swarm.seeders)
        held = mine.get(peer_id) or other.get(peer_id)
        if held is None or held[0] != ip or held[5] != agent:  # a new entry for this address and passkey
            refused = ledger.room(ip, agent, self.limits)
            if refused:
                raise OverLimitError(refused)
        gone = other.drop(peer_id)
        if gone is not None:
            ledger.remove(gone)
        if event == "completed":
            swarm.downloaded += 1
        old = mine.put(peer_id, (ip, port, now + self.ttl, ip + port.to_bytes(2, "big"), peer_id, agent))
        if old is None or old[0] != ip or old[5] != agent:
            if old is not None:
                ledger.remove(old)
            ledger.add(ip, agent)
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
        return sorted({(ip, port) for ip, port, expires, *_ in swarm.seeders.entries if expires > now})

    def stats(self) -> StoreStats:
        """Totals, expired entries not yet swept included (counting them would read the whole table)."""
        seeders = sum(len(s.seeders) for s in self._swarms.values())
        leechers = sum(len(s.leechers) for s in self._swarms.values())
        return StoreStats(torrents=len(self._swarms), peers=seeders + leechers, seeders=seeders)

    def addresses(self) -> list[bytes]:
        now = time.monotonic()
        for ip in [ip for ip, expires in self._addresses.items() if expires <= now]:
            del self._addresses[ip]
        return list(self._addresses)

    def sweep_step(self, now: float, swarms: int) -> None:
        """Look over the next `swarms` swarms of the round for expired peers, dropping swarms left empty;
        a new round (a copy of the infohashes) starts at most every ttl / 4."""
        at, round_ = self._at, self._round
        if at >= len(round_):
            if now < self._next_round:
                return
            round_ = self._round = list(self._swarms)
            at = 0
            self._next_round = now + self.ttl / 4
        end = at + swarms
        table, remove = self._swarms, self._ledger.remove
        for infohash in round_[at:end]:
            swarm = table.get(infohash)
            if swarm is None:
                continue
            for gone in swarm.sweep(now):
                remove(gone)
            if not swarm.seeders and not swarm.leechers:
                del table[infohash]
        self._at = end
        if end >= len(round_):
            self._round = []
            self._at = 0
