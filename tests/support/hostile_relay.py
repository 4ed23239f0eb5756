"""A relay source that misbehaves on purpose, for the attacks on a relay receiver (docs/security.md): a
raw-socket HTTP/1.1 server on its own loopback address that answers the relay route
(`GET /v1/relay/{blob}` with `Range: bytes=A-B`) with the blob's real bytes, badly:

- "close": the 206 says `Connection: close` (RFC 9112 §9.6: the server closes after the response; how
  http.client then hands its socket to the response, agent.relay.heads) and the connection ends after a
  MiB, short of the range;
- "stall": a MiB, then nothing while the connection stays open (as a process whose upstream hung);
- "trickle": a byte every `every` seconds (a slow-read attack turned round: Slowloris sends its
  request's headers a few bytes at a time to hold a server's worker, this holds the receiver's);
- "head": the reply head a byte every `every` seconds (0: as fast as the socket takes them), a header
  line that never ends (Slowloris's trick against a server's header read, turned round: RFC 9112 sets no
  limit on a head's size or time, so the reader must; Node.js stops at 16 KiB, `headersTimeout`);
- "refuse": a bare 503, to record who asks and with what credential.

Each connection runs at most `HOLD` seconds and every socket closes at `stop`. `requests` records the
head of each request (lower-case header names), `held` how long each connection lasted."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import quote_from_bytes

import httpx

from tests.support.procs import free_port
from wirekit.bencode import bdecode

MiB = 2**20
HOLD = 120.0
"""Seconds one connection is served at most, whatever the receiver does."""
_HEAD_LIMIT = 16 * 1024


class HostileRelay:
    def __init__(self, host: str, data: bytes, mode: str, every: float = 0.5) -> None:
        self.host, self.data, self.size, self.mode, self.every = host, data, len(data), mode, every
        self.port = free_port(host)
        self.requests: list[dict[str, str]] = []
        self.held: list[float] = []
        """Seconds each connection lasted, until the receiver left (a send failed) or we ended it."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server((host, self.port))
        self._listener.settimeout(0.2)
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                s.close()
        for t in self._threads:
            t.join(5)

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by `stop`
            with self._lock:
                self._socks.append(conn)
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        began = time.monotonic()
        try:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            headers[":path"] = lines[0]
            with self._lock:
                self.requests.append(headers)
            if self.mode == "refuse":
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                return
            if self.mode == "head":
                self._endless_head(conn, began)
                return
            first, _, last = headers.get("range", "bytes=0-").removeprefix("bytes=").partition("-")
            start, end = int(first), int(last) + 1 if last else self.size
            close = "Connection: close\r\n" if self.mode == "close" else ""
            conn.sendall(
                f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end - 1}/{self.size}\r\n"
                f"Content-Length: {end - start}\r\nContent-Type: application/octet-stream\r\n{close}\r\n"
                .encode()
            )
            if self.mode in ("close", "stall"):
                conn.sendall(self.data[start : min(end, start + MiB)])
                if self.mode == "close":
                    return
            at = start
            while not self._stop.is_set() and time.monotonic() - began < HOLD:
                if self.mode == "trickle" and at < end:
                    conn.sendall(self.data[at : at + 1])
                    at += 1
                conn.settimeout(self.every)
                try:
                    if conn.recv(1) == b"":
                        return  # the receiver left
                except TimeoutError:
                    pass
        except OSError:
            return  # the receiver closed the connection
        finally:
            conn.close()
            with self._lock:
                self.held.append(time.monotonic() - began)


    def _endless_head(self, conn: socket.socket, began: float) -> None:
        """A 206's status line, then a header line a byte at a time until the receiver leaves (a send
        fails: OSError), or `HOLD`, or `stop`."""
        head = b"HTTP/1.1 206 Partial Content\r\nX-Pad: "
        conn.settimeout(5)  # a receiver that stops reading without closing: sendall times out, we end
        at = 0
        while not self._stop.is_set() and time.monotonic() - began < HOLD:
            conn.sendall(head[at : at + 1] if at < len(head) else b"a")
            at += 1
            if self.every and self._stop.wait(self.every):
                return


def announce_relay_source(tracker_url: str, passkey: str, key: bytes, host: str, port: int) -> dict:
    """Announce `host:port` as a seeder of the tracker key `key` (a blob's relay key), from `host`, with
    `passkey` in the path: the agents' passkey (a stolen one) or the interop passkey (any stock client).
    The tracker's bencoded answer."""
    query = (
        f"info_hash={quote_from_bytes(key)}&peer_id={quote_from_bytes(b'-XX0001-' + b'h' * 12)}"
        f"&port={port}&left=0&event=started&compact=1"
    )
    transport = httpx.HTTPTransport(local_address=host)
    with httpx.Client(transport=transport, timeout=10) as client:
        resp = client.get(f"{tracker_url}/announce/{passkey}?{query}")
    assert resp.status_code == 200, resp.content
    return dict(bdecode(resp.content))
