"""The tracker's ASGI application.

`create_app` returns a thin pure-ASGI front (`TrackerApp`) that answers /announce and
/scrape itself (a FastAPI route per announce costs several times more CPU than the
announce) and hands everything else (the JSON API, health, metrics, OpenAPI) to FastAPI,
built in `tracker.api`. The front also enforces the request-body limit (413) for every
route before any framework code buffers a byte. With the peers in this process (the SQLite
store), `quick_routes` goes one step further: announces and scrapes are answered inside the
listener's protocol (servekit.protocol.QuickRoutes), with no ASGI cycle at all.

Announce and scrape need the passkey (/announce/<passkey>); nothing logs it: BitTorrent
requests are not access-logged, and every logged path has it redacted (`redact_path`).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from servekit.protocol import QuickRoutes
from tracker import announce as bt
from tracker.api import create_api
from tracker.auth import interop_passkey_ok, passkey_ok
from tracker.metrics import Metrics
from tracker.settings import TrackerSettings
from tracker.store import Store
from tracker.stores import open_store

log = logging.getLogger("tracker.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_BT_HEADERS = [(b"content-type", b"text/plain"), (b"cache-control", b"no-store")]
_BT_HEAD = b"".join(b"%s: %s\r\n" % header for header in _BT_HEADERS)


def _bittorrent_path(raw_path: bytes) -> bool:
    """Whether `TrackerApp` answers this (still percent-encoded) path as announce or scrape itself."""
    route, _, passkey = raw_path.lstrip(b"/").partition(b"/")
    return route in (b"announce", b"scrape") and b"/" not in passkey and b"%" not in passkey


class TrackerApp:
    def __init__(self, settings: TrackerSettings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.api = create_api(settings, store, metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        path: str = scope["path"]
        route, _, passkey = path.lstrip("/").partition("/")
        if route in ("announce", "scrape") and "/" not in passkey:
            await self._bittorrent(scope, send, route, passkey)
            return
        await self._api(scope, receive, send)

    async def _bittorrent(self, scope: Scope, send: Send, route: str, path_passkey: str) -> None:
        start = time.perf_counter()
        raw_query: bytes = scope.get("query_string", b"")
        client = scope.get("client")
        host = client[0] if client else None
        checked = self._bt_check(scope["method"], route, path_passkey, raw_query, host)
        if isinstance(checked, tuple):
            await _respond(send, checked[0], checked[1], _BT_HEADERS)
            return
        try:
            if route == "announce":
                body, label = await bt.announce(raw_query, host, self.store, self.settings, agent=checked)
                self.metrics.announce(label)
            else:
                body = await bt.scrape(raw_query, self.store, self.settings)
                self.metrics.scrapes.inc()
        except Exception as exc:
            body = self._unavailable(route, exc)
        await _respond(send, 200, body, _BT_HEADERS)
        self.metrics.latency[route].observe(time.perf_counter() - start)

    def _bt_check(
        self, method: str, route: str, path_passkey: str, raw_query: bytes, host: str | None
    ) -> tuple[int, bytes] | bool:
        """A refusal to answer with (status, body), or whether the request carries the agents' passkey
        (False: the interop one)."""
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n"
        settings = self.settings
        agent = settings.announce_passkey is None or passkey_ok(settings, path_passkey, raw_query)
        if not agent and not interop_passkey_ok(settings, path_passkey, raw_query):
            self.metrics.refusals["passkey"].inc()
            if route == "announce":
                self.metrics.announces["error"].inc()
            # DEBUG only (a misconfigured node retries every interval); never the path's passkey.
            log.debug("%s /%s/*** refused (passkey) from %s", method, route, host or "-")
            return 200, bt.failure(bt.PASSKEY_REFUSED)
        return agent

    def _unavailable(self, route: str, exc: Exception) -> bytes:
        # A store outage (Redis down) must not turn into 500s with tracebacks per announce:
        # clients understand a failure reason and retry at their own pace. The query is not
        # logged (it may carry a passkey).
        logging.getLogger("tracker").warning("%s failed: %s: %s", route, type(exc).__name__, exc)
        self.metrics.announces["error"].inc()
        return bt.failure("tracker temporarily unavailable, retry later")

    def quick_routes(self) -> QuickRoutes | None:
        """/announce and /scrape for the listener's protocol to answer itself, when the store's peers
        live in this process (nothing to await); None otherwise (Redis)."""
        peers = self.store.local_peers
        if peers is None:
            return None
        settings, metrics = self.settings, self.metrics
        agent_key = None if settings.announce_passkey is None else settings.announce_passkey.encode()

        def answer(
            method: bytes, raw_path: bytes, raw_query: bytes, host: str | None
        ) -> tuple[int, bytes, bytes]:
            start = time.perf_counter()
            checked: tuple[int, bytes] | bool
            key, _, given = raw_path.lstrip(b"/").partition(b"/")
            route = "announce" if key == b"announce" else "scrape"  # `claims` took no other path
            if agent_key is not None and method == b"GET" and hmac.compare_digest(given, agent_key):
                checked = True  # an agent's announce, as it nearly always is: the agents' passkey in the path
            else:
                passkey = given.decode("latin-1")
                checked = self._bt_check(method.decode("latin-1"), route, passkey, raw_query, host)
            if isinstance(checked, tuple):
                return checked[0], _BT_HEAD, checked[1]
            try:
                if route == "announce":
                    body, label = bt.announce_now(raw_query, host, peers, settings, agent=checked)
                    metrics.announce(label)
                else:
                    body = bt.scrape_now(raw_query, peers, settings)
                    metrics.scrapes.inc()
            except Exception as exc:
                body = self._unavailable(route, exc)
            metrics.latency[route].observe(time.perf_counter() - start)
            return 200, _BT_HEAD, body

        return QuickRoutes(claims=_bittorrent_path, answer=answer)

    async def _api(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = [0]
        limit = self.settings.max_body_bytes
        length = _content_length(scope)
        if length is not None and length > limit:
            await _too_large(send, limit)
            log.info("%s %s 413", scope["method"], redact_path(scope["path"]))
            return
        if scope["method"] in ("PUT", "POST", "PATCH", "DELETE"):
            # Read the (bounded) body up front so a chunked upload cannot grow past the limit.
            chunks, size, more = [], 0, True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await _too_large(send, limit)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = b"".join(chunks)
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            receive = replay

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.api(scope, receive, send_status)
        finally:
            self.metrics.latency["api"].observe(time.perf_counter() - start)
            # Path only (query strings may carry a passkey), passkey redacted; never headers.
            log.info("%s %s %d", scope["method"], redact_path(scope["path"]), status[0])


def create_app(settings: TrackerSettings, store: Store | None = None) -> TrackerApp:
    """The whole tracker as one ASGI app. `store` defaults to the one the settings select."""
    return TrackerApp(settings, store if store is not None else open_store(settings), Metrics())


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Send, limit: int) -> None:
    body = b'{"detail":"request body larger than %d bytes"}' % limit
    await _respond(send, 413, body, [(b"content-type", b"application/json")])


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def redact_path(path: str) -> str:
    """The path fit for a log: whatever follows /announce/ or /scrape/ (a passkey) becomes ***.

    Paths the API answers are redacted too: /announce/<passkey>/x reaches FastAPI (and a 404)."""
    route, sep, rest = path.lstrip("/").partition("/")
    if route in ("announce", "scrape") and sep and rest:
        return f"/{route}/***"
    return path
