"""Who may exchange bytes with this node's libtorrent session: the IP filter that admits the cluster's
agents (agent.swarm.gate hands them in) and the hosts of the web seeds in use, refuses everyone else
both ways, and bans addresses that served a blob failing its hash (agent.swarm.trust)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import libtorrent as lt

from agent.core.swarm_settings import SwarmSettings
from agent.swarm.status import Records, WebSeed
from agent.swarm.webseed import WebSeedHosts, check_credentials

log = logging.getLogger("agent.swarm.session")  # one log for the libtorrent session, its filter included

_BLOCKED = 1
"""`ip_filter` access flag: blocked (libtorrent's ip_filter::blocked)."""


class PeerFilter:
    """The session's IP filter. Thread-safe."""

    def __init__(self, ses: Any, settings: SwarmSettings, records: Records) -> None:
        self._ses = ses
        self.settings = settings
        self._records = records
        self._lock = threading.Lock()
        self._banned: dict[str, float] = {}
        """Addresses refused whatever the gate admits (`ban`) -> when the ban ends (monotonic)."""
        self._admitted: frozenset[str] = frozenset()
        self._web_hosts = WebSeedHosts()
        self.blocked = threading.Event()
        """Set when the IP filter refused someone: the peer gate looks again at once (a new agent)."""
        self.apply()

    def admit(self, addresses: Iterable[str]) -> None:
        """Exchange bytes with these addresses only (the cluster's agents), plus the hosts of the web
        seeds in use. Every torrent applies the filter, both ways: an outsider that knows an
        infohash connects to nothing and is refused when it connects."""
        admitted = frozenset(addresses)
        if admitted != self._admitted:
            joined = admitted - self._admitted
            self._admitted = admitted
            self.apply()
            if joined:
                # libtorrent dropped these peers from its lists while they were filtered: downloads
                # ask the tracker again now rather than at their next interval.
                pending = [r for r in self._records.values() if not r.complete]
                for rec in pending:
                    rec.handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)

    def admits(self, address: str) -> bool:
        """Whether the peer gate lets this address exchange bytes (always, with the gate off). A refusal
        makes the gate ask the tracker again soon, as a refused connection does (a node that just joined)."""
        if not self.settings.peer_gate or address in self._admitted:
            return True
        self.blocked.set()
        return False

    def open_to_all(self, infohashes: set[str]) -> None:
        """Exempt these torrents from the IP filter (stock clients may exchange their bytes: only for
        blobs of models the origin reports public, with --interop-public); close every other."""
        for rec in self._records.values():
            want_open = rec.infohash in infohashes
            if want_open != rec.open_to_all:
                if want_open:
                    rec.handle.unset_flags(lt.torrent_flags.apply_ip_filter)
                else:
                    rec.handle.set_flags(lt.torrent_flags.apply_ip_filter)
                rec.open_to_all = want_open

    def resolve_web_seed_hosts(self) -> None:
        """Look up the web seeds' hosts again (a CDN's addresses change); admit what they resolve to."""
        if self._web_hosts.refresh():
            self.apply()

    def apply(self) -> None:
        """Hand libtorrent the filter: the admitted agents and web seed hosts, less the banned."""
        f = lt.ip_filter()
        if not self.settings.peer_gate:
            self._add_bans(f)
            self._ses.set_ip_filter(f)  # everyone but banned peers (--no-peer-gate)
            return
        f.add_rule("0.0.0.0", "255.255.255.255", _BLOCKED)
        f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", _BLOCKED)
        for address in self._admitted | self._web_hosts.addresses():
            f.add_rule(address, address, 0)
        self._add_bans(f)
        self._ses.set_ip_filter(f)

    def _add_bans(self, f: Any) -> None:
        """Block the banned addresses in filter `f`: added last, a ban outranks admission."""
        with self._lock:
            banned = list(self._banned)
        for address in banned:
            f.add_rule(address, address, _BLOCKED)

    def ban(self, address: str, seconds: float) -> None:
        """Refuse `address` (one IP) every connection, both ways and in every torrent, for `seconds`,
        even if the peer gate admits it: a peer that fed us a blob whose bytes failed its own hash.

        Bad pieces are libtorrent's own business: a peer whose data fails a piece hash is banned from
        that torrent (smart_ban, one of the session's default plugins, finds which peer sent the bad
        block when several did). A ban here is for what libtorrent cannot see: pieces that match a
        wrong metainfo."""
        with self._lock:
            new = address not in self._banned
            self._banned[address] = max(self._banned.get(address, 0.0), time.monotonic() + seconds)
        if new:
            log.warning("banned peer %s for %.0f s: it served a blob that failed its hash", address, seconds)
            self.apply()

    def banned(self) -> list[str]:
        """Addresses banned now (`ban`)."""
        with self._lock:
            return sorted(self._banned)

    def admit_web_seed(self, ws: WebSeed, blob_id: str) -> None:
        """Let a web seed's host through (its addresses, looked up now); refuse one with credentials."""
        check_credentials(ws, blob_id)
        if self._web_hosts.add(ws.url):
            self.apply()

    def expire_bans(self, now: float) -> None:
        """Lift the bans that ended by `now` (monotonic)."""
        with self._lock:
            ended = [address for address, until in self._banned.items() if until <= now]
            for address in ended:
                del self._banned[address]
        if ended:
            self.apply()
