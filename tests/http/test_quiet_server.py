"""The servers of both services wake once a second when idle and stop as soon as they are told to
(servekit.server)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from servekit import server as quiet
from servekit.limits import ConnectionLimits
from servekit.server import QuietServer
from tests.support.listeners import serving


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.contextmanager
def _serving() -> Iterator[tuple[QuietServer, threading.Thread, str]]:
    with serving(_hello, ConnectionLimits()) as (server, thread, port):
        yield server, thread, f"http://127.0.0.1:{port}/"


def _wakeups(thread: threading.Thread) -> int:
    """Times the thread went to sleep and was woken (the kernel's voluntary context switches)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc")


def test_an_idle_server_wakes_about_once_a_second_and_its_date_header_moves_on() -> None:
    with _serving() as (_, thread, url):
        with urllib.request.urlopen(url, timeout=10) as resp:
            first = resp.headers["Date"]
        before = _wakeups(thread)
        time.sleep(3.0)
        woke = _wakeups(thread) - before
        # uvicorn's own loop looks ten times a second: about 30 here.
        assert woke <= 3 * 2, f"woken {woke} times in 3 s"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.read() == b"ok"
            later = resp.headers["Date"]
        assert first and later and later != first, (first, later)


@pytest.mark.parametrize("how", ["exit_now", "signal"])
def test_a_server_told_to_stop_stops_before_its_next_tick(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setattr(quiet, "TICK", 120.0)
    with _serving() as (server, thread, url):
        urllib.request.urlopen(url, timeout=10).close()
        time.sleep(0.2)  # into its wait for the next tick
        if how == "exit_now":
            server.exit_now()
        else:  # what the tracker's main thread runs on SIGTERM
            server.handle_exit(signal.SIGTERM, None)
        thread.join(30)
        assert not thread.is_alive(), "the server waited for its next tick"
