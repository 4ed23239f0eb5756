"""A stock libtorrent session, the independent client the swarm tests meet: no DHT, LSD, UPnP or
NAT-PMP (nothing leaves the host), and several connections per address (every peer is on loopback)."""

from __future__ import annotations

from pathlib import Path
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


def add_blob(ses: Any, info: bytes, save: Path) -> Any:
    """Add the torrent of a blob's bencoded `info` to `ses`, saving under `save`, started at once (not
    auto-managed, not paused); its handle."""
    atp = lt.add_torrent_params()
    atp.ti = lt.torrent_info(b"d4:info" + info + b"e")
    atp.save_path = str(save)
    atp.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
    return ses.add_torrent(atp)
