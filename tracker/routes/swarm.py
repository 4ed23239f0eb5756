"""A blob's swarm as the routes report it: its torrent's counts, and a lease holder as JSON."""

from __future__ import annotations

from typing import Any

from tracker.store import LeaseHolder, MetainfoStore, PeerStore, SwarmCounts


class BlobSwarms:
    """The torrent of a blob (named by its published metainfo) and that torrent's peer counts."""

    def __init__(self, metainfo: MetainfoStore, peers: PeerStore) -> None:
        self._metainfo = metainfo
        self._peers = peers

    async def counts(self, blob_id: str) -> tuple[str | None, SwarmCounts]:
        """The blob's infohash (None while no metainfo is published) and its torrent's counts."""
        meta = await self._metainfo.get_metainfo(blob_id)
        infohash = meta[0] if meta else None
        if not infohash:
            return None, SwarmCounts()
        ih = bytes.fromhex(infohash)
        return infohash, (await self._peers.scrape([ih]))[ih]


def holder_json(h: LeaseHolder) -> dict[str, Any]:
    """A lease holder as the blob state and the lease answers list it."""
    return {"holder": h.node_id, "expires_in": h.expires_in, "progress": h.progress, "idle": h.idle}
