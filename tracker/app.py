"""The tracker's ASGI application.

`create_app` returns a thin pure-ASGI front (`TrackerApp`) that answers /announce and
/scrape itself (a FastAPI route per announce costs several times more CPU than the
announce) and hands everything else (the JSON API, health, metrics, OpenAPI) to FastAPI,
built in `tracker.api`. The front also enforces the request-body limit (413) for every
route before any framework code buffers a byte.

Announce and scrape need the passkey (/announce/<passkey>); nothing logs it: BitTorrent
requests are not access-logged, and every logged path has it redacted (`redact_path`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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
        settings = self.settings
        raw_query: bytes = scope.get("query_string", b"")
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", _BT_HEADERS)
            return
        agent = settings.announce_passkey is None or passkey_ok(settings, path_passkey, raw_query)
        if not agent and not interop_passkey_ok(settings, path_passkey, raw_query):
            await _respond(send, 200, bt.failure(bt.PASSKEY_REFUSED), _BT_HEADERS)
            self.metrics.refusals["passkey"].inc()
            if route == "announce":
                self.metrics.announces["error"].inc()
            client = scope.get("client")
            # DEBUG only (a misconfigured node retries every interval); never the path's passkey.
            host = client[0] if client else "-"
            log.debug("%s %s refused (passkey) from %s", scope["method"], redact_path(scope["path"]), host)
            return
        client = scope.get("client")
        host = client[0] if client else None
        try:
            if route == "announce":
                body, label = await bt.announce(raw_query, host, self.store, settings, agent=agent)
                self.metrics.announces[label].inc()
            else:
                body = await bt.scrape(raw_query, self.store, settings)
                self.metrics.scrapes.inc()
        except Exception as exc:
            # A store outage (Redis down) must not turn into 500s with tracebacks per announce:
            # clients understand a failure reason and retry at their own pace. The query is not
            # logged (it may carry a passkey).
            logging.getLogger("tracker").warning("%s failed: %s: %s", route, type(exc).__name__, exc)
            body = bt.failure("tracker temporarily unavailable, retry later")
            self.metrics.announces["error"].inc()
        await _respond(send, 200, body, _BT_HEADERS)
        self.metrics.latency[route].observe(time.perf_counter() - start)

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
