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

import functools
import ipaddress
import struct
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

from tracker.settings import TrackerSettings
from tracker.store import (
    AnnounceResult,
    LocalPeers,
    OverLimitError,
    PeerAddr,
    PeerStore,
    SwarmCounts,
    UnregisteredTorrentError,
)
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

_PORTS = struct.Struct(">H")
Params = dict[bytes, list[bytes]]
Firsts = dict[bytes, bytes]
"""Each key's first value, still percent-encoded: an announce reads a few of them once."""


class AnnounceError(Exception):
    """A bad announce/scrape request; the message becomes the bencoded `failure reason`."""


class AnnounceRequest(NamedTuple):  # a tuple: made once per announce, cheaper than a frozen dataclass
    infohash: bytes
    peer: PeerAddr
    left: int | None
    event: str
    numwant: int
    compact: bool
    no_peer_id: bool

    @property
    def seeder(self) -> bool:
        return self.left == 0 or (self.left is None and self.event == "completed")


def parse_query(raw: bytes) -> Params:
    """Split a raw query string into byte keys and byte values (repeated keys kept in order)."""
    if len(raw) > MAX_QUERY_BYTES:
        raise AnnounceError(f"query string longer than {MAX_QUERY_BYTES} bytes")
    params: Params = {}
    for part in raw.split(b"&"):
        if not part:
            continue
        key, _, value = part.partition(b"=")
        params.setdefault(_unquote(key), []).append(_unquote(value))
    return params


def first_values(raw: bytes) -> Firsts:
    """Split a raw query string: decoded keys, each with its first value (still encoded)."""
    if len(raw) > MAX_QUERY_BYTES:
        raise AnnounceError(f"query string longer than {MAX_QUERY_BYTES} bytes")
    params: Firsts = {}
    for part in raw.split(b"&"):
        key, _, value = part.partition(b"=")
        if key not in params:
            params[key] = value
    if b"%" in b"".join(params):  # an escaped key (no client sends one): decode the keys, then dedupe
        params = {}
        for part in raw.split(b"&"):
            key, _, value = part.partition(b"=")
            params.setdefault(_unquote(key), value)
    return params


_DECODED: dict[bytes, bytes] = {}
"""Escaped value -> its bytes: the same info_hash and peer_id come back every interval."""
_DECODED_MAX = 16384
_DECODED_LONGEST = 60
"""An info_hash or peer_id with every byte escaped; longer values are decoded each time, not kept, so
the map stays a few MiB whatever clients send."""


def _unquote(raw: bytes) -> bytes:
    """Percent-decoding; an info_hash or peer_id (every byte escaped) in one C call, not a loop."""
    if b"%" not in raw:
        return raw
    decoded = _DECODED.get(raw)
    if decoded is not None:
        return decoded
    decoded = _decode(raw)
    if len(raw) <= _DECODED_LONGEST:
        if len(_DECODED) >= _DECODED_MAX:  # bounded in count too: start afresh
            _DECODED.clear()
        _DECODED[raw] = decoded
    return decoded


def _decode(raw: bytes) -> bytes:
    n = len(raw) // 3
    if len(raw) == 3 * n and raw[::3] == b"%" * n:
        try:
            decoded = bytes.fromhex(raw.replace(b"%", b"").decode("ascii"))
        except ValueError:
            pass
        else:
            if len(decoded) == n:  # fromhex skips spaces, which are no escapes
                return decoded
    return unquote_to_bytes(raw)


def _one(params: Firsts, name: bytes) -> bytes | None:
    value = params.get(name)
    return None if value is None else _unquote(value)


def _int(params: Firsts, name: bytes, low: int, high: int | None = None) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    if not raw.isdigit():  # empty, signed or escaped (digits need no decoding)
        raw = _unquote(raw)
        if not raw:
            return None
        if not raw.isdigit() and not (raw[:1] == b"-" and raw[1:].isdigit()):
            raise AnnounceError(f"{name.decode()} must be an integer")
    if len(raw) > 20:
        raise AnnounceError(f"{name.decode()} out of range")
    value = int(raw)
    if value < low or (high is not None and value > high):
        raise AnnounceError(f"{name.decode()} out of range")
    return value


@functools.lru_cache(maxsize=4096)  # a client announces every blob from one address
def packed_ip(text: str | bytes) -> bytes | None:
    """4 bytes for IPv4 (IPv4-mapped IPv6 included), 16 for IPv6, None if not an IP literal."""
    try:
        addr = ipaddress.ip_address(text.decode("ascii") if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.packed
    return addr.packed


def parse_announce(params: Firsts, client_host: str | None, settings: TrackerSettings) -> AnnounceRequest:
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
    compact = _one(params, b"compact") != b"0"
    return AnnounceRequest(  # in field order: positional arguments bind faster than keywords
        infohash, (peer_id, ip, port), left, event, numwant, compact, _one(params, b"no_peer_id") == b"1"
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
    if req.compact:
        # The bencoding of the dict below, written out: its keys in sorted order.
        if result.compact is None:
            compact = [ip + _PORTS.pack(port) for _, ip, port in result.peers]
        else:
            compact = result.compact
        v4 = b"".join(compact)
        v6 = b""
        if len(v4) != 6 * len(compact):  # some IPv6 peers (18 bytes each)
            v4 = b"".join(addr for addr in compact if len(addr) == 6)
            v6 = b"".join(addr for addr in compact if len(addr) == 18)
        head = b"d8:completei%de10:incompletei%de8:intervali%de12:min intervali%de5:peers%d:" % (
            result.complete,
            result.incomplete,
            settings.interval,
            settings.min_interval,
            len(v4),
        )
        return head + v4 + (b"6:peers6%d:%se" % (len(v6), v6) if v6 else b"e")
    body: dict[bytes, object] = {
        b"interval": settings.interval,
        b"min interval": settings.min_interval,
        b"complete": result.complete,
        b"incomplete": result.incomplete,
    }
    peers = []
    for pid, ip, port in result.peers:
        entry: dict[bytes, object] = {b"ip": str(ipaddress.ip_address(ip)), b"port": port}
        if not req.no_peer_id:
            entry[b"peer id"] = pid
        peers.append(entry)
    body[b"peers"] = peers
    return bencode(body)


def _request(raw_query: bytes, client_host: str | None, settings: TrackerSettings) -> AnnounceRequest | bytes:
    try:
        return parse_announce(first_values(raw_query), client_host, settings)
    except AnnounceError as exc:
        return failure(str(exc))


async def announce(
    raw_query: bytes, client_host: str | None, store: PeerStore, settings: TrackerSettings, agent: bool = True
) -> tuple[bytes, str]:
    """Handle one announce: (bencoded body, event label for metrics; 'error' on a refused request,
    'limit' when the store refused it, over a `SwarmLimits` limit).
    `agent`: it carried the agents' passkey (not the interop one), so its address is an agent's."""
    req = _request(raw_query, client_host, settings)
    if isinstance(req, bytes):
        return req, "error"
    try:
        result = await store.announce(req.infohash, req.peer, req.seeder, req.event, req.numwant, agent)
    except OverLimitError as exc:
        return failure(str(exc)), "limit"
    except UnregisteredTorrentError as exc:
        return failure(str(exc)), "error"
    return announce_response(req, result, settings), req.event or "update"


def announce_now(
    raw_query: bytes,
    client_host: str | None,
    peers: LocalPeers,
    settings: TrackerSettings,
    agent: bool = True,
) -> tuple[bytes, str]:
    """`announce` on peers held in this process: the same answer, without an await."""
    req = _request(raw_query, client_host, settings)
    if isinstance(req, bytes):
        return req, "error"
    try:
        result = peers.announce(req.infohash, req.peer, req.seeder, req.event, req.numwant, agent)
    except OverLimitError as exc:
        return failure(str(exc)), "limit"
    except UnregisteredTorrentError as exc:
        return failure(str(exc)), "error"
    return announce_response(req, result, settings), req.event or "update"


def _scrape_hashes(raw_query: bytes, settings: TrackerSettings) -> list[bytes] | bytes:
    """The distinct info_hash values of a scrape, or its failure body."""
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
    return list(dict.fromkeys(hashes))


def _scrape_response(counts: dict[bytes, SwarmCounts], settings: TrackerSettings) -> bytes:
    files = {
        ih: {b"complete": c.complete, b"downloaded": c.downloaded, b"incomplete": c.incomplete}
        for ih, c in counts.items()
    }
    return bencode({b"files": files, b"flags": {b"min_request_interval": settings.min_interval}})


async def scrape(raw_query: bytes, store: PeerStore, settings: TrackerSettings) -> bytes:
    """BEP 48 scrape for the given info_hash values (at least one; unknown ones report zeros)."""
    hashes = _scrape_hashes(raw_query, settings)
    if isinstance(hashes, bytes):
        return hashes
    return _scrape_response(await store.scrape(hashes), settings)


def scrape_now(raw_query: bytes, peers: LocalPeers, settings: TrackerSettings) -> bytes:
    """`scrape` on peers held in this process."""
    hashes = _scrape_hashes(raw_query, settings)
    if isinstance(hashes, bytes):
        return hashes
    return _scrape_response({ih: peers.counts(ih) for ih in hashes}, settings)
