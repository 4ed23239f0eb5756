"""BitTorrent announce and scrape: parsing (BEP 3, 7, 23, 48) and bencoded responses.

Query strings carry raw bytes (a percent-encoded 20-byte info_hash is rarely UTF-8), so
they are split and unquoted here as bytes, never decoded as text by the framework.
Errors are bencoded `failure reason` dicts with HTTP 200, which is what clients parse.

The peer is listed at the TCP source address of its announce. The `ip` parameter is
ignored unless the tracker runs with --trust-announce-ip: honouring it lets any client
list another host's address as a peer (every leecher would then connect to it: a classic
tracker-amplification and traffic-steering trick), and the passkey does not help, since
every node holds it. Turn it on only where the source address is wrong for peers, e.g.
agents announcing through NAT or a proxy while peers must dial the node's hostNetwork
address; then it takes an IP literal only (a hostname is ignored, never resolved).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from tracker.settings import TrackerSettings
from tracker.store import AnnounceResult, PeerAddr, PeerStore, SwarmCounts
from wirekit.bencode import bencode

MAX_QUERY_BYTES = 32 * 1024  # room for a 256-hash scrape (~18 KiB)
_EVENT_ALIASES = {
    b"": "",
    b"started": "started",
    b"completed": "completed",
    b"stopped": "stopped",
    b"empty": "",
    b"paused": "",
}  # BEP 21 "paused" peers stay in the swarm.

Params = dict[bytes, list[bytes]]


class AnnounceError(Exception):
    """A bad announce/scrape request; the message becomes the bencoded `failure reason`."""


@dataclass(frozen=True, slots=True)
class AnnounceRequest:
    infohash: bytes
    peer: PeerAddr
    left: int | None
    event: str
    numwant: int
    compact: bool
    no_peer_id: bool


def parse_query(raw: bytes) -> Params:
    """Split a raw query string into byte keys and byte values (repeated keys kept in order)."""
    if len(raw) > MAX_QUERY_BYTES:
        raise AnnounceError(f"query string longer than {MAX_QUERY_BYTES} bytes")
    params: Params = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        key, _, value = part.partition(b"=")
        params.setdefault(unquote_to_bytes(key), []).append(unquote_to_bytes(value))
    return params


def _one(params: Params, name: bytes) -> bytes | None:
    values = params.get(name)
    return values[0] if values else None


def _int(params: Params, name: bytes, low: int, high: int | None = None) -> int | None:
    raw = _one(params, name)
    if raw is None or raw == b"":
        return None
    if not raw.isdigit() and not (raw[:1] == b"-" and raw[1:].isdigit()):
        raise AnnounceError(f"{name.decode()} must be an integer")
    if len(raw) > 20:
        raise AnnounceError(f"{name.decode()} out of range")
    value = int(raw)
    if value < low or (high is not None and value > high):
        raise AnnounceError(f"{name.decode()} out of range")
    return value


def packed_ip(text: str | bytes) -> bytes | None:
    """4 bytes for IPv4 (IPv4-mapped IPv6 included), 16 for IPv6, None if not an IP literal."""
    try:
        addr = ipaddress.ip_address(text.decode("ascii") if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.packed
    return addr.packed


def parse_announce(params: Params, client_host: str | None, settings: TrackerSettings) -> AnnounceRequest:
    infohash = _one(params, b"info_hash")
    if infohash is None:
        raise AnnounceError("missing info_hash")
    if len(infohash) != 20:
        raise AnnounceError(f"info_hash must be 20 bytes, got {len(infohash)}")
    peer_id = _one(params, b"peer_id")
    if peer_id is None:
        raise AnnounceError("missing peer_id")
    if len(peer_id) != 20:
        raise AnnounceError(f"peer_id must be 20 bytes, got {len(peer_id)}")
    port = _int(params, b"port", 1, 65535)
    if port is None:
        raise AnnounceError("missing port")
    left = _int(params, b"left", 0)
    event = _EVENT_ALIASES.get(_one(params, b"event") or b"")
    if event is None:
        raise AnnounceError("event must be started, completed or stopped")
    numwant = _int(params, b"numwant", -(2**31))
    numwant = settings.default_numwant if numwant is None else max(0, min(numwant, settings.max_numwant))
    ip = None
    if settings.trust_announce_ip:
        claimed = _one(params, b"ip")
        if claimed:
            ip = packed_ip(claimed)  # a hostname is ignored, never resolved
    if ip is None and client_host:
        ip = packed_ip(client_host)
    if ip is None:
        raise AnnounceError("cannot tell the peer's address from the connection")
    return AnnounceRequest(
        infohash=infohash,
        peer=(peer_id, ip, port),
        left=left,
        event=event,
        numwant=numwant,
        compact=_one(params, b"compact") != b"0",
        no_peer_id=_one(params, b"no_peer_id") == b"1",
    )


def query_passkey(raw_query: bytes) -> bytes | None:
    """The `passkey` query parameter (the path form /announce/<passkey> is the usual one)."""
    try:
        values = parse_query(raw_query).get(b"passkey")
    except AnnounceError:
        return None
    return values[0] if values else None


PASSKEY_REFUSED = "unknown or missing passkey"
"""The failure reason for an announce or scrape without the right passkey (says nothing more)."""


def failure(reason: str) -> bytes:
    return bencode({b"failure reason": reason})


def announce_response(req: AnnounceRequest, result: AnnounceResult, settings: TrackerSettings) -> bytes:
    body: dict[bytes, object] = {
        b"interval": settings.interval,
        b"min interval": settings.min_interval,
        b"complete": result.complete,
        b"incomplete": result.incomplete,
    }
    if req.compact:
        v4 = [ip + port.to_bytes(2, "big") for _, ip, port in result.peers if len(ip) == 4]
        v6 = [ip + port.to_bytes(2, "big") for _, ip, port in result.peers if len(ip) == 16]
        body[b"peers"] = b"".join(v4)
        if v6:
            body[b"peers6"] = b"".join(v6)
    else:
        peers = []
        for pid, ip, port in result.peers:
            entry: dict[bytes, object] = {b"ip": str(ipaddress.ip_address(ip)), b"port": port}
            if not req.no_peer_id:
                entry[b"peer id"] = pid
            peers.append(entry)
        body[b"peers"] = peers
    return bencode(body)


async def announce(
    raw_query: bytes, client_host: str | None, store: PeerStore, settings: TrackerSettings, agent: bool = True
) -> tuple[bytes, str]:
    """Handle one announce: (bencoded body, event label for metrics; 'error' on a refused request).
    `agent`: it carried the agents' passkey (not the interop one), so its address is an agent's."""
    try:
        req = parse_announce(parse_query(raw_query), client_host, settings)
    except AnnounceError as exc:
        return failure(str(exc)), "error"
    seeder = req.left == 0 or (req.left is None and req.event == "completed")
    result = await store.announce(req.infohash, req.peer, seeder, req.event, req.numwant, agent)
    return announce_response(req, result, settings), req.event or "update"


async def scrape(raw_query: bytes, store: PeerStore, settings: TrackerSettings) -> bytes:
    """BEP 48 scrape for the given info_hash values (at least one; unknown ones report zeros)."""
    try:
        hashes = parse_query(raw_query).get(b"info_hash", [])
        if not hashes:
            raise AnnounceError("scrape needs at least one info_hash (full scrape is not offered)")
        if len(hashes) > settings.max_scrape_hashes:
            raise AnnounceError(f"at most {settings.max_scrape_hashes} info_hash values per scrape")
        for ih in hashes:
            if len(ih) != 20:
                raise AnnounceError(f"info_hash must be 20 bytes, got {len(ih)}")
    except AnnounceError as exc:
        return failure(str(exc))
    counts: dict[bytes, SwarmCounts] = await store.scrape(list(dict.fromkeys(hashes)))
    files = {
        ih: {b"complete": c.complete, b"downloaded": c.downloaded, b"incomplete": c.incomplete}
        for ih, c in counts.items()
    }
    return bencode({b"files": files, b"flags": {b"min_request_interval": settings.min_interval}})
