"""The tracker in-process, for the tracker's own tests and the swarm's: `run_server(settings)` (the real
app served by uvicorn in a thread on a free loopback port; a module's `tracker` fixture calls it with
its settings), `SETTINGS` as deployed, the `redis_url` and `store_settings` fixtures (loaded by
tests/conftest.py: `store_settings` runs a test against both stores), and torrent and peer helpers.

Real servers only: the real app, and a real redis-server (started from the Debian binary on a free
port, stopped by PID). `tests.support.cluster` has the tracker as a `tracker serve` subprocess.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote_from_bytes

import httpx
import pytest
import uvicorn

from servekit.limits import Gate
from servekit.protocol import uvicorn_options
from servekit.server import QuietServer
from tests.support.procs import RedisProcess, free_port, loop_until
from tracker.app import TrackerApp, create_app
from tracker.settings import TrackerSettings
from wirekit.bencode import bdecode, bencode

TOKEN = "test-write-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PASSKEY = "test-announce-passkey-0123"
PUBLISHER_TOKEN = "test-publisher-token-0123456789"
PUBLISHER = {"Authorization": f"Bearer {PUBLISHER_TOKEN}"}
SETTINGS = TrackerSettings(token=TOKEN, announce_passkey=PASSKEY, publisher_token=PUBLISHER_TOKEN)
"""A tracker as deployed: agent token, publisher token, announce passkey (tests `replace` the rest)."""
SIGNATURE = base64.b64encode(bytes(range(64))).decode()
"""A well-formed Ed25519 signature (64 bytes, base64): the tracker stores a publisher's signature but
holds no key to check it (agents verify it: tests/fetch/test_signing.py)."""


class Tracker:
    """A running tracker: its base URL, app (for metrics) and HTTP clients.

    `http` sends the agent-role token (when the tracker has one), as a node does; `anon` sends
    none. `announce`/`scrape` go through /announce/<passkey> when the tracker has a passkey.
    """

    def __init__(self, url: str, app: TrackerApp) -> None:
        self.url = url
        self.app = app
        token = app.settings.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, timeout=30, headers=headers)
        self.anon = httpx.Client(base_url=url, timeout=30)

    @property
    def announce_url(self) -> str:
        passkey = self.app.settings.announce_passkey
        return f"{self.url}/announce/{passkey}" if passkey else f"{self.url}/announce"

    @property
    def scrape_url(self) -> str:
        return self.announce_url.replace("/announce", "/scrape", 1)

    def announce(
        self, infohash: bytes, peer_id: bytes, port: int, left: int = 100, **extra: str | int
    ) -> dict:
        query = f"info_hash={quote_from_bytes(infohash)}&peer_id={quote_from_bytes(peer_id)}&port={port}"
        query += f"&uploaded=0&downloaded=0&left={left}"
        for key, value in extra.items():
            query += f"&{key}={value}"
        response = self.anon.get(f"{self.announce_url}?{query}")
        assert response.status_code == 200, response.text
        return dict(bdecode(response.content))

    def scrape(self, *infohashes: bytes) -> dict:
        query = "&".join(f"info_hash={quote_from_bytes(ih)}" for ih in infohashes)
        return dict(bdecode(self.anon.get(f"{self.scrape_url}?{query}").content))


@contextlib.contextmanager
def run_server(settings: TrackerSettings) -> Iterator[Tracker]:
    """Serve a fresh app from `settings` on a free loopback port until the block ends, as `tracker serve`
    does (its connection limits, announces answered in the protocol with the SQLite store)."""
    port = free_port()
    app = create_app(replace(settings, port=port))
    gate = Gate(settings.limits, f"tracker 127.0.0.1:{port}")
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        **uvicorn_options(gate, quick=app.quick_routes()),
    )
    server = QuietServer(config)
    thread = threading.Thread(target=server.run, name=f"tracker-{port}", daemon=True)
    thread.start()
    try:
        loop_until(lambda: server.started or not thread.is_alive(), timeout=30, what="tracker start")
        assert server.started, "tracker server did not start"
        tracker = Tracker(f"http://127.0.0.1:{port}", app)
        with tracker.http, tracker.anon:
            yield tracker
    finally:
        server.exit_now()
        thread.join(timeout=30)


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    """A private redis-server on a free port (no persistence), stopped by PID at the end."""
    server = RedisProcess(workdir)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for the session; tests flush it (store_settings) before use."""
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


def flush_redis(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        client.flushall()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> TrackerSettings:
    """Settings for each store, so one suite runs against both."""
    if request.param == "sqlite":
        return replace(SETTINGS, db_path=tmp_path / "tracker.db")
    url = request.getfixturevalue("redis_url")
    flush_redis(url)
    return replace(SETTINGS, redis_url=url)


def make_info(data: bytes, piece_length: int = 16 * 1024, name: str | None = None) -> tuple[str, bytes]:
    """(blob id = sha256 hex, canonical bencoded single-file info dict) for `data`."""
    blob_id = hashlib.sha256(data).hexdigest()
    pieces = b"".join(
        hashlib.sha1(data[i : i + piece_length]).digest() for i in range(0, len(data), piece_length)
    )
    info = {"length": len(data), "name": name or blob_id, "piece length": piece_length, "pieces": pieces}
    return blob_id, bencode(info)


def peer_id(n: int) -> bytes:
    return b"-WS0100-" + n.to_bytes(12, "big")


def infohash(n: int) -> bytes:
    return hashlib.sha1(b"torrent %d" % n).digest()


def compact_ports(blob: bytes) -> list[int]:
    return [int.from_bytes(blob[i + 4 : i + 6], "big") for i in range(0, len(blob), 6)]
