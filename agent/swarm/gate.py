"""The peer gate: BitTorrent bytes flow only between the cluster's agents (docs/security.md).

An agent's announce needs the tracker's passkey, so the addresses the tracker has seen announce
lately (`GET /v1/peers`, agent role) are the agents. The gate admits exactly those in the
session's IP filter (agent.swarm.session.Swarm.admit), which every torrent applies to incoming and
outgoing connections alike: a process that knows an infohash, or even holds the metainfo, gets no
byte unless it announced with the passkey. The filter starts closed and is refreshed every
`swarm.peer_gate_refresh` seconds, and at once when it refused someone (a node that just joined).
Without a tracker the node has no peers, and the gate admits nobody.

Why an IP filter fed by authenticated announces rather than libtorrent's SSL torrents: SSL torrents
put a CA certificate in every info dict (every infohash changes, and a cert per node must be
issued and rotated), and encrypt every byte inside the datacenter; the filter costs nothing per
byte and reuses the credential the announce already checks. Its limits: it trusts addresses (an
attacker must hold a pod IP an agent announced from within the peer TTL, or the passkey), so the
chart's NetworkPolicy, which admits only agent pods to the BitTorrent port, is the second wall.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.core.errors import TrackerError
from agent.swarm.session import Swarm
from agent.tracking.client import TrackerClient

log = logging.getLogger(__name__)

_SOON = 0.5
"""Least seconds between two refreshes, however often the filter refuses someone."""


class PeerGate:
    def __init__(
        self,
        swarm: Swarm,
        tracker: TrackerClient | None,
        refresh: float,
        open_torrents: Callable[[], set[str]] | None = None,
    ) -> None:
        """`open_torrents` (with --interop-public): the infohashes stock clients may exchange, i.e. the
        blobs of models the origin reports public; None: every torrent stays closed to them."""
        self.swarm = swarm
        self.tracker = tracker
        self.refresh_every = refresh
        self.open_torrents = open_torrents

    def refresh(self) -> None:
        """Admit the agents the tracker knows now; keep the last list while it cannot be asked."""
        if self.tracker is None:
            self.swarm.admit(())
            return
        try:
            addresses = self.tracker.peer_addresses()
        except TrackerError as exc:
            log.debug("peer gate: tracker unreachable (%s); keeping the agents it named last", exc)
        else:
            self.swarm.admit(addresses)
        self.swarm.resolve_web_seed_hosts()
        if self.open_torrents is not None:
            self.swarm.open_to_all(self.open_torrents())

    def run(self, stop: threading.Event) -> None:
        """Refresh until `stop`: every `refresh_every` seconds, sooner after a refused connection."""
        while not stop.is_set():
            self.refresh()
            self.swarm.blocked.wait(self.refresh_every)
            self.swarm.blocked.clear()
            if stop.wait(_SOON):
                return
