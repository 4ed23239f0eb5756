"""A passkey holder flooding a tracker with announces of fresh infohashes (docs/security.md, attack 6):
`python -m tests.support.announce_flood PORT PASSKEY SOURCES COUNT SECONDS TAG` announces COUNT distinct
infohashes (sha1 of TAG and a number) from each address of SOURCES (comma-separated) over one keep-alive
connection per address, in turn, requests pipelined 64 deep as a fast client would, and stops after
SECONDS at the latest. It prints one JSON line:
how many were answered with peers, how many refused by reason, and the last infohash refused (hex).

A process of its own, so the flood and the test's probes do not share one interpreter's lock."""

from __future__ import annotations

import collections
import hashlib
import json
import socket
import sys
import time
from urllib.parse import quote_from_bytes

from wirekit.bencode import bdecode

DEPTH = 64


def infohash(tag: str, n: int) -> bytes:
    return hashlib.sha1(f"{tag} {n}".encode()).digest()


def _request(port: int, passkey: str, ih: bytes, peer_id: bytes) -> bytes:
    query = (
        f"info_hash={quote_from_bytes(ih)}&peer_id={quote_from_bytes(peer_id)}&port=6881"
        "&uploaded=0&downloaded=0&left=0&compact=1&numwant=0&event=started"
    )
    return f"GET /announce/{passkey}?{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


def _responses(sock: socket.socket, buf: bytearray, count: int) -> list[bytes]:
    """The next `count` response bodies on the connection (Content-Length framed)."""
    bodies = []
    while len(bodies) < count:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(buf[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            if len(buf) >= end + 4 + length:
                bodies.append(bytes(buf[end + 4 : end + 4 + length]))
                del buf[: end + 4 + length]
                continue
        chunk = sock.recv(1 << 18)
        if not chunk:
            raise ConnectionError("the tracker closed the connection")
        buf += chunk
    return bodies


def flood(port: int, passkey: str, sources: str, count: int, seconds: float, tag: str) -> dict[str, object]:
    peer_id = hashlib.sha1(f"{tag} peer".encode()).digest()
    deadline = time.monotonic() + seconds
    outcomes: collections.Counter[str] = collections.Counter()
    refused = ""
    conns = []
    for source in sources.split(","):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        conns.append((sock, bytearray(), f"{tag} {source}"))
    sent = 0
    try:
        while sent < count and time.monotonic() < deadline:
            end = min(sent + DEPTH, count)
            for sock, _, name in conns:
                batch = [infohash(name, n) for n in range(sent, end)]
                sock.sendall(b"".join(_request(port, passkey, ih, peer_id) for ih in batch))
            for sock, buf, name in conns:
                batch = [infohash(name, n) for n in range(sent, end)]
                for ih, body in zip(batch, _responses(sock, buf, len(batch)), strict=True):
                    reason = bdecode(body).get(b"failure reason")
                    if reason is None:
                        outcomes["ok"] += 1
                    else:
                        outcomes[reason.decode()] += 1
                        refused = ih.hex()
            sent = end
    finally:
        for sock, _, _ in conns:
            sock.close()
    return {"sent": sent * len(conns), "outcomes": dict(outcomes), "refused": refused}


def main() -> None:
    port, passkey, sources, count, seconds, tag = sys.argv[1:7]
    print(json.dumps(flood(int(port), passkey, sources, int(count), float(seconds), tag)), flush=True)


if __name__ == "__main__":
    main()
