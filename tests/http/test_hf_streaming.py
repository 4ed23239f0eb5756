"""The HF endpoint on a cold file (issue 17): bytes stream while they arrive, with the real
huggingface_hub client at its default timeouts, a real daemon and a rate-limited test hub."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from huggingface_hub import constants, hf_hub_download

from tests.support.cluster import Origin, model_origin
from tests.support.procs import loop_until

MiB = 2**20


@pytest.fixture
def slow_origin(tmp_path: Path) -> Iterator[Origin]:
    """One 24 MiB shard from a hub sending 2 MiB/s in all: ~12 s to arrive, longer than
    huggingface_hub's default read timeout (10 s)."""
    with model_origin(tmp_path / "hub", "acme/cold-1", total_bytes=24 * MiB, shards=1, seed=31) as o:
        o.hub.rate_total = 2 * MiB
        yield o


def shard_of(origin: Origin) -> str:
    return next(p for p in origin.files if p.endswith(".safetensors"))


def client_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub") and r.levelno >= 30
    ]


def assert_slow_download_without_a_retry(origin: Origin, endpoint: str, tmp_path: Path, caplog) -> None:
    """huggingface_hub at its defaults downloads the shard through `endpoint`, right, with no warning,
    and more slowly than its read timeout (else the test would prove nothing)."""
    shard = shard_of(origin)
    caplog.set_level(logging.WARNING, logger="huggingface_hub")
    started = time.monotonic()
    client = tmp_path / "client"
    path = hf_hub_download(origin.repo_id, shard, endpoint=endpoint, cache_dir=client, token=False)
    took = time.monotonic() - started
    assert Path(path).read_bytes() == origin.files[shard]
    assert took > constants.HF_HUB_DOWNLOAD_TIMEOUT, took
    assert client_warnings(caplog) == []  # no "timed out", no "Trying to resume download"


def test_a_cold_shard_slower_than_the_clients_read_timeout_downloads_without_a_retry(
    slow_origin, make_agent, tmp_path, caplog
):
    agent = make_agent("a", slow_origin, None)
    assert_slow_download_without_a_retry(slow_origin, agent.api_url, tmp_path, caplog)


def test_head_answers_at_once_while_cold_and_fetches_nothing(slow_origin, make_agent):
    agent = make_agent("a", slow_origin, None)
    shard = shard_of(slow_origin)
    head = httpx.head(f"{agent.api_url}/{slow_origin.repo_id}/resolve/main/{shard}", timeout=5)
    assert head.status_code == 200
    assert head.headers["x-linked-size"] == str(len(slow_origin.files[shard]))
    assert head.headers["x-linked-etag"].strip('"') == hashlib.sha256(slow_origin.files[shard]).hexdigest()
    assert len(head.headers["x-repo-commit"]) == 40
    assert agent.jobs.all() == []


def test_a_corrupt_origin_byte_cuts_the_response_and_the_clients_retry_gets_the_right_bytes(
    tmp_path, make_agent, caplog
):
    with model_origin(tmp_path / "hub", "acme/cold-2", total_bytes=6 * MiB, shards=1, seed=32) as origin:
        shard = shard_of(origin)
        origin.hub.rate_total = 3 * MiB
        origin.hub.faults.corrupt_paths = {shard}
        origin.hub.faults.corrupt_times = 1  # one range of the first download has its first byte flipped
        agent = make_agent("a", origin, None)
        caplog.set_level(logging.WARNING)
        path = hf_hub_download(
            origin.repo_id, shard, endpoint=agent.api_url, cache_dir=tmp_path / "client", token=False
        )
        assert Path(path).read_bytes() == origin.files[shard]
        messages = [r.getMessage() for r in caplog.records]
        # The first response was cut (the client says it resumes), not completed with the flipped byte ...
        assert any("Trying to resume download" in m for m in messages), messages
        # ... because the agent's end-to-end check failed and discarded the blob.
        assert any("does not match the origin's sha256" in m for m in messages), messages
        loop_until(lambda: all(j.done for j in agent.jobs.all()), timeout=30, what="the fetches to end")
        jobs = sorted(agent.jobs.all(), key=lambda j: j.status().created)
        assert [j.status().phase for j in jobs] == ["Failed", "Ready"]


def test_clients_share_one_fetch_and_one_leaving_early_cancels_nothing(tmp_path, make_agent):
    with model_origin(tmp_path / "hub", "acme/cold-3", total_bytes=8 * MiB, shards=1, seed=33) as origin:
        shard = shard_of(origin)
        data = origin.files[shard]
        origin.hub.rate_total = 2 * MiB
        agent = make_agent("a", origin, None)
        url = f"{agent.api_url}/{origin.repo_id}/resolve/main/{shard}"
        results: dict[str, bytes] = {}

        def whole(name: str) -> None:
            results[name] = httpx.get(url, timeout=10).content

        def ranged(name: str, first: int, last: int) -> None:
            resp = httpx.get(url, headers={"Range": f"bytes={first}-{last}"}, timeout=10)
            assert resp.status_code == 206
            assert resp.headers["content-range"] == f"bytes {first}-{last}/{len(data)}"
            results[name] = resp.content

        threads = [
            threading.Thread(target=whole, args=("one",)),
            threading.Thread(target=whole, args=("two",)),
            threading.Thread(target=ranged, args=("tail", len(data) - 3 * MiB, len(data) - 1)),
        ]
        for t in threads:
            t.start()
        # A client that reads the first MiB and hangs up while the file is still arriving.
        with httpx.stream("GET", url, timeout=10) as resp:
            assert resp.headers["content-length"] == str(len(data))
            got = 0
            for chunk in resp.iter_bytes():
                got += len(chunk)
                if got >= MiB:
                    break
        for t in threads:
            t.join(timeout=60)
        assert results["one"] == data and results["two"] == data
        assert results["tail"] == data[-3 * MiB :]
        assert origin.hub.egress_bytes < 1.05 * len(data) + MiB  # fetched once, not once per client
        # The clients have their last bytes once the blob is checked; the job ends a moment later.
        loop_until(lambda: all(j.done for j in agent.jobs.all()), timeout=30, what="the fetch to end")
        assert [j.status().phase for j in agent.jobs.all()] == ["Ready"] * len(agent.jobs.all())


def test_a_shard_arriving_from_a_slow_peer_streams_in_verified_pieces_without_a_retry(
    slow_origin, tracker, make_agent, tmp_path, caplog
):
    """The other source of bytes: peers. Node a has the shard and uploads at 2 MiB/s; node b takes it by
    BitTorrent (pieces rarest first) and streams to the client only pieces that passed their hash check,
    asking libtorrent for the ones the client waits for first."""
    slow_origin.hub.rate_total = None
    a = make_agent("a", slow_origin, tracker, upload_rate_limit=2 * MiB)
    job = a.request_model(slow_origin.repo_id, "main")
    assert job.wait(60) and job.status().phase == "Ready", job.status()
    b = make_agent("b", slow_origin, tracker)
    slow_origin.hub.reset_counters()
    assert_slow_download_without_a_retry(slow_origin, b.api_url, tmp_path, caplog)
    assert slow_origin.hub.egress_bytes < MiB  # metadata only: the bytes came from node a
