"""Issue 62's attacks 1 and 2 on `agent serve-hub` (a stdlib ThreadingHTTPServer: a thread per
connection), a real subprocess: header lines without end (431, close), a head announcing a body that never
comes (the hub reads no body and allows no POST: answered 405 and closed at once). Past its 1,024
connections a client is told 503 before a thread is started for it (agent.hub.guard)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.attack import Attack
from tests.support.procs import stop_process

MiB = 2**20
ATTACK = 8.0


def _addresses(n: int) -> list[str]:
    return [f"127.0.3.{2 + i}" for i in range(n)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode, answered", [("head", "431"), ("body", "405")])
def test_serve_hub_refuses_growing_heads_and_unsent_bodies_within_bounds(
    tmp_path: Path, mode: str, answered: str
):
    argv = [sys.executable, "-m", "agent", "serve-hub", str(tmp_path), "--port", "0", "--answers", "2024"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # bounded: EOF if it fails
        assert url.startswith("http://"), url
        port = int(url.rsplit(":", 1)[1])
        watched = psutil.Process(proc.pid)
        rss = fds = 0
        with Attack(port, 20 * 64, mode, "/api/models/acme/none", ATTACK, _addresses(20)) as attack:
            ends = time.monotonic() + ATTACK
            while time.monotonic() < ends:
                rss, fds = max(rss, watched.memory_info().rss), max(fds, watched.num_fds())
                time.sleep(0.25)
            attack.wait(timeout=ATTACK + 30)
        statuses = attack.total("statuses")
        # 1,024 connections, each with at most 16 KiB of head and an 8 KiB read buffer, and a thread.
        assert fds <= 1024 + 64, fds
        assert rss < 400 * MiB, f"{rss / MiB:.0f} MiB"
        assert statuses[answered] >= 1000, statuses
        if mode == "head":
            assert statuses["503"] > 0, statuses  # 1,280 connections held against 1,024 slots
        else:
            assert statuses[answered] >= 5 * 1280, statuses  # each answered (POST: 405) and closed at once
        assert httpx.get(f"{url}/api/models/acme/none", timeout=5).status_code in (401, 404)
    finally:
        stop_process(proc)
