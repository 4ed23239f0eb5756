"""What one listener may hold: connections in total and per client address, how long a connection may
take to send a request's headers, and how long it may sit idle; and the process's open-file limit
that all of it comes out of.

uvicorn bounds none of this by itself: a connection that sends nothing is kept until the client goes
away (its keep-alive timer starts only after a first response), so a few thousand idle connections
from anyone who can reach a port use up the process's file descriptors, and then the agent's other
listeners, its resume data and its cache writes fail with EMFILE. Here each listener's uvicorn runs a
protocol (servekit.protocol) that, for each new connection:
- answers 503 and closes it at once when the listener holds `max_connections`, or its client address
  holds `max_per_client` (TCP only: a unix socket has no client address);
- closes it when a request's headers are not complete `header_timeout` seconds after the connection
  opened or after its previous response ended (a client that never sends, or sends slowly);
- answers 431 (414 for the request target) and closes it when a request's head grows past
  `max_head_bytes`, `max_headers` lines or `max_url_bytes`, counted as the bytes arrive, before the parser
  keeps them: otherwise each connection keeps every header line until the header timeout (a few hundred
  connections sending 64 KiB lines had a 512 MiB process killed for memory in about a second), and a
  request target grown a byte at a time made the parser copy it over and over on the event loop;
- answers 408 (or closes, once a response has started) when a request's body, announced by its head,
  has not arrived within `body_timeout` at `min_body_rate`: the header timeout ends with the head, and a
  client that announced a body and sent nothing held its connection for ever;
and uvicorn's own `timeout_keep_alive` closes a connection idle between requests.

The file-descriptor reserve: `raise_open_file_limit` lifts the soft limit to the hard one at start, and
the caller sizes its listeners' caps so that the caps together leave `reserve` descriptors free for the
process's own work (agent.daemon.listeners, tracker.cli): a full listener then refuses connections
before the reserve is touched.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

_REFUSALS_LOGGED_EVERY = 60.0
"""Seconds between log lines that count refused connections (a flood must not flood the log)."""


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of one listener."""

    max_connections: int = 1024
    """Connections the listener holds at once; one more is answered 503 and closed."""

    max_per_client: int | None = 64
    """Connections one client address may hold on the listener (TCP); None: no per-address cap (a unix
    socket, whose clients have no address)."""

    header_timeout: float = 10.0
    """Seconds a connection has to complete a request's headers, counted from its connect or from the end
    of its previous response; then it is closed. Bounds clients that send nothing, or send slowly."""

    keepalive_timeout: float = 5.0
    """Seconds a connection may sit idle between requests (uvicorn's `timeout_keep_alive`)."""

    max_head_bytes: int = 16 << 10
    """Bytes of a request's head (request line and header lines) before it is answered 431 and closed.
    16 KiB, as uvicorn's h11 protocol (`h11_max_incomplete_event_size`); nginx allows 4 x 8 KiB lines."""

    max_headers: int = 100
    """Header lines of one request before it is answered 431 and closed (Python's http.client's cap)."""

    max_url_bytes: int = 8 << 10
    """Bytes of a request's target (path and query) before it is answered 414 and closed; 8 KiB, one of
    nginx's `large_client_header_buffers`."""

    body_timeout: float = 10.0
    """Seconds a request's announced body may take to start, and its grace before `min_body_rate` applies;
    then 408 and close (nginx's `client_body_timeout`, 60 s, allows one byte a minute for ever)."""

    min_body_rate: int = 64 << 10
    """Bytes a second a request's body must average from the end of its head (after `body_timeout`'s
    grace), while the server is reading it: 64 KiB/s sends the tracker's largest body (4 MiB) in about a
    minute; a client that dribbles holds its connection no longer than that."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1: {self.max_connections}")
        if self.max_per_client is not None and self.max_per_client < 1:
            raise ValueError(f"max_per_client must be at least 1: {self.max_per_client}")
        if min(self.header_timeout, self.keepalive_timeout, self.body_timeout) <= 0:
            raise ValueError("header_timeout, keepalive_timeout and body_timeout must be positive")
        if min(self.max_head_bytes, self.max_headers, self.max_url_bytes, self.min_body_rate) < 1:
            raise ValueError("max_head_bytes, max_headers, max_url_bytes and min_body_rate must be positive")


PROBE_LIMITS = ConnectionLimits(
    max_connections=64, max_per_client=8, header_timeout=2.0, max_head_bytes=4096, max_headers=32,
    max_url_bytes=256,
)
"""A probe port's limits (servekit.protocol.ProbePort): kubelet sends a short GET at once, a few at a
time; a connection that does not is closed within 2 s."""


def raise_open_file_limit() -> int:
    """Lift the soft limit on open files to the hard limit (as far as the kernel allows); the soft limit
    now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass  # e.g. above fs.nr_open: keep what there is
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Gate:
    """Counts one listener's open connections, in total and per client address; used on its event loop's
    thread only (the counters may be read from others)."""

    def __init__(self, limits: ConnectionLimits, name: str) -> None:
        self.limits = limits
        self.name = name
        self.open = 0
        self.refused = 0
        """Connections refused since start."""
        self._by_client: dict[str, int] = {}
        self._refused_since_log = 0
        self._logged_at = 0.0

    def admit(self, client: str | None) -> bool:
        limits = self.limits
        held = self._by_client.get(client, 0) if client is not None else 0
        if self.open >= limits.max_connections or (
            client is not None and limits.max_per_client is not None and held >= limits.max_per_client
        ):
            self._refuse(client)
            return False
        self.open += 1
        if client is not None:
            self._by_client[client] = held + 1
        return True

    def release(self, client: str | None) -> None:
        self.open -= 1
        if client is not None:
            left = self._by_client.get(client, 1) - 1
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)

    def _refuse(self, client: str | None) -> None:
        self.refused += 1
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._logged_at >= _REFUSALS_LOGGED_EVERY:
            log.warning(
                "%s: refused %d connection(s) over its limits (%d open, at most %d, %s per client); last "
                "from %s",
                self.name,
                self._refused_since_log,
                self.open,
                self.limits.max_connections,
                self.limits.max_per_client or "no cap",
                client or "a local client",
            )
            self._refused_since_log, self._logged_at = 0, now
