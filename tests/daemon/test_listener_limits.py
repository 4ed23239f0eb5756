"""Hostile load on the listeners (servekit.limits): idle connections by the thousand, headers sent slowly,
one address taking every connection. A real `agent serve` and a real `tracker serve`, each a subprocess;
the attacker is this process, from several loopback addresses (127.0.0.2, ...: all of 127/8 is local).

The attack that broke the agent before: ~21,000 idle connections to --api-listen exhausted its open files,
`/healthz` on the pods' socket failed, resume data could not be written and a running fetch failed with
EMFILE. Here the agent runs with 2,048 open files, as that report's did.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.http.agent_httpx import http_client
from tests.support.cluster import (
    PASSKEY,
    AgentProcess,
    Origin,
    TrackerProcess,
    admin_request,
    assert_snapshot_verifies,
    model_origin,
)
from tests.support.flood import Flood, hold
from tests.support.procs import loop_until

MiB = 2**20
FLOOD = 20_000
ADDRESSES = [f"127.0.0.{i}" for i in range(2, 7)]


def closed_by_peer(s: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before it closed `s` within `timeout`; None while it is still open."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


@pytest.fixture
def slow_origin(tmp_path: Path) -> Iterator[Origin]:
    """Two 12-MiB shards at 4 MB/s: a fetch of ~6 s, long enough to run under the flood."""
    with model_origin(tmp_path / "hub", "acme/flood", total_bytes=24 * MiB, shards=2, seed=44) as o:
        o.hub.rate_total = 4e6
        yield o


def _follow(agent: AgentProcess, job: dict, deadline: float) -> dict:
    while job["phase"] not in ("Ready", "Failed"):
        assert time.monotonic() < deadline, job
        job = admin_request(
            agent.url, "GET", f"/v1/jobs/{job['job_id']}", params={"wait": 2}, timeout=15
        ).json()
    return job


@pytest.mark.timeout(240)
def test_twenty_thousand_idle_connections_do_not_starve_the_agent(
    tmp_path: Path, tracker: TrackerProcess, slow_origin: Origin
):
    pods = tmp_path / "pods" / "pods.sock"
    agent = AgentProcess(tmp_path, "a", slow_origin.hub.url, tracker, "--pods-socket", str(pods))
    agent.start(open_files=2048)
    try:
        with http_client(f"unix://{pods}", 5) as pods_client:
            partials = agent.state_dir / "partials"
            body = {"repo_id": slow_origin.repo_id}
            job = admin_request(agent.url, "POST", "/v1/fetch", json=body).json()
            with Flood(agent.api_port, FLOOD, ADDRESSES):
                deadline = time.monotonic() + 120
                slowest, records = 0.0, set()
                while job["phase"] not in ("Ready", "Failed") and time.monotonic() < deadline:
                    started = time.monotonic()
                    assert pods_client.get("/healthz").status_code == 200
                    slowest = max(slowest, time.monotonic() - started)
                    for record in partials.glob("*.json"):  # the origin engine's resume records
                        with contextlib.suppress(OSError):
                            records.add((record.name, record.stat().st_mtime_ns))
                    job = admin_request(agent.url, "GET", f"/v1/jobs/{job['job_id']}", timeout=15).json()
                    time.sleep(0.2)
                job = _follow(agent, job, deadline)
                # The network listener still answers a client that is not among the flood's addresses.
                assert httpx.get(f"{agent.api_url}/healthz", timeout=5).status_code == 200
        assert job["phase"] == "Ready", job
        assert_snapshot_verifies(job["snapshot"], slow_origin)
        assert slowest < 1.0, slowest
        assert len(records) >= 2, records  # resume records kept being written under the flood
        log = agent.log.read_text()
        assert "Too many open files" not in log and "Errno 24" not in log, log[-3000:]
        assert "refused" in log and "over its limits" in log  # the flood was seen, and counted once a minute
    finally:
        agent.stop()


def test_the_network_listener_closes_slow_headers_idle_sockets_and_one_address_over_its_cap(
    tmp_path: Path, tracker: TrackerProcess, origin: Origin
):
    extra = ["--api-header-timeout", "2", "--api-max-connections-per-client", "8"]
    agent = AgentProcess(tmp_path, "a", origin.hub.url, tracker, *extra)
    agent.start()
    try:
        _assert_limits(agent.api_port, per_client=8, header_timeout=2.0)
    finally:
        agent.stop()


def test_the_tracker_closes_slow_headers_idle_sockets_and_one_address_over_its_cap(tmp_path: Path):
    tracker = TrackerProcess(tmp_path, extra=["--header-timeout", "2", "--max-connections-per-client", "8"])
    tracker.start()
    try:
        _assert_limits(tracker.port, per_client=8, header_timeout=2.0)
        # Announces still work from another address meanwhile.
        resp = httpx.get(f"{tracker.url}/announce/{PASSKEY}", params={"info_hash": b"\x01" * 20}, timeout=5)
        assert resp.status_code in (200, 400), resp.text
    finally:
        tracker.stop()


def _assert_limits(port: int, per_client: int, header_timeout: float) -> None:
    # One address holds `per_client` connections; the next one is told 503 and closed at once.
    held = hold(port, per_client, ["127.0.0.9"])
    try:
        loop_until(lambda: _all_connected(held), timeout=5, what="connections accepted")
        time.sleep(0.3)  # the server has admitted them (accepted is not yet admitted)
        [extra] = hold(port, 1, ["127.0.0.9"])
        answer = closed_by_peer(extra, timeout=header_timeout / 2)
        extra.close()
        assert answer is not None and answer.startswith(b"HTTP/1.1 503"), answer
        # Another address is not affected.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200

        # A client that sends its headers a byte at a time is closed at the timeout, not served.
        slow = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.10", 0))
        started = time.monotonic()
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        closed = None
        for byte in request:
            try:
                slow.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = time.monotonic() - started
                break
            time.sleep(0.1)
        if closed is None:
            assert closed_by_peer(slow, timeout=5) == b""
            closed = time.monotonic() - started
        slow.close()
        assert header_timeout - 0.5 <= closed <= header_timeout + 2, closed

        # The held connections sent nothing: closed at the timeout too, with no answer.
        for s in held:
            assert closed_by_peer(s, timeout=header_timeout + 2) == b""
    finally:
        for s in held:
            s.close()


def _all_connected(socks: list[socket.socket]) -> bool:
    for s in socks:
        try:
            s.getpeername()
        except OSError:
            return False
    return True
