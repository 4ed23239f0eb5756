"""A stock libtorrent session, the independent client the swarm tests meet: no DHT, LSD, UPnP or
NAT-PMP (nothing leaves the host), and several connections per address (every peer is on loopback)."""

from __future__ import annotations

from typing import Any

import libtorrent as lt


def stock_session(listen: str = "127.0.0.1:0", **extra: object) -> Any:
    """`extra`: further settings_pack entries, e.g. uTP off or an alert mask."""
    return lt.session(
        {
            "listen_interfaces": listen,
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "allow_multiple_connections_per_ip": True,
            **extra,
        }
    )
