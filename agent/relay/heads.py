"""A relay request on a socket the receiver owns, and the head of its reply read within a deadline.

http.client hands the socket to the response and drops its own reference when a reply says
`Connection: close` (`HTTPConnection.sock` becomes None), and reads a head line by line with a timeout
per read, up to 100 lines of 64 KiB each: a source answering `Connection: close` made the receiver fail
the whole fetch (it reads the body from the socket itself), and one sending its head a byte every few
seconds held it for as long as it liked. Here the receiver keeps the socket, and a head must be whole
within `within` seconds and `HEAD_LIMIT` bytes (Node.js's default limit of a request's headers).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

HEAD_LIMIT = 16 * 1024


class BadReply(Exception):
    """A source's reply that is not HTTP/1.x, too large, or not whole in time (the source is left)."""


@dataclass(frozen=True)
class Head:
    status: int
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    early: bytes
    """Body bytes that came with the head."""


def request(sock: socket.socket, host: str, path: str, headers: dict[str, str]) -> None:
    """Send `GET path` (the socket's timeout bounds it)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def read_head(sock: socket.socket, within: float) -> Head:
    """The reply's status line and headers, whole within `within` seconds (`BadReply` if not; an
    OSError if the connection breaks); the socket is left with a timeout."""
    deadline = time.monotonic() + within
    got = bytearray()
    while True:
        end = got.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(got) > HEAD_LIMIT:
            raise BadReply(f"a reply head over {HEAD_LIMIT} bytes")
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadReply(f"no whole reply head within {within:.0f}s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(HEAD_LIMIT + 4 - len(got))
        except TimeoutError:
            raise BadReply(f"no whole reply head within {within:.0f}s") from None
        if not chunk:
            raise ConnectionResetError("the source closed the connection before its reply head")
        got += chunk
    if end > HEAD_LIMIT:
        raise BadReply(f"a reply head over {HEAD_LIMIT} bytes")
    lines = bytes(got[:end]).decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise BadReply("not an HTTP/1.x reply")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise BadReply("a malformed header line")
        headers[name.strip().lower()] = value.strip()
    return Head(int(code), headers, bytes(got[end + 4 :]))
