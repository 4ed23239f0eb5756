"""The daemon end to end on loopback: real origin, real tracker, real agents and libtorrent."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import httpx

from agent.cache.layout import RepoCache
from agent.daemon.node import Daemon
from agent.http.agent_httpx import http_client
from tests.support.cluster import (
    PASSKEY,
    PUBLISHER_TOKEN,
    TOKEN,
    assert_snapshot_verifies,
    fetch_all_and_verify,
    fetch_and_wait,
    file_requests,
    wait_until_seeded,
)
from tests.support.procs import loop_until


def test_warm_fetch_takes_nothing_from_the_origin(origin, tracker, make_agent):
    a = make_agent("a", origin, tracker)
    status_a = fetch_and_wait(a, origin.repo_id)
    assert_snapshot_verifies(status_a["snapshot"], origin)
    assert origin.size * 0.99 <= status_a["bytes_from_origin"] <= origin.size * 1.01

    wait_until_seeded(tracker, a)
    origin.hub.reset_counters()
    b = make_agent("b", origin, tracker)
    status_b = fetch_and_wait(b, origin.repo_id)
    assert_snapshot_verifies(status_b["snapshot"], origin)
    # Only metadata (revision + tree listing) reached the origin; every file byte came from A.
    assert file_requests(origin.hub) == []
    assert origin.hub.egress_bytes < 16 * 1024
    assert status_b["bytes_from_origin"] == 0
    assert status_b["bytes_from_peers"] >= origin.size
    assert all(f["source"] == "peers" for f in status_b["files"])


def test_three_cold_agents_take_each_blob_from_the_origin_once(origin, tracker, make_agent):
    agents = [make_agent(n, origin, tracker) for n in ("a", "b", "c")]
    origin.hub.reset_counters()
    statuses = fetch_all_and_verify(agents, origin)
    assert origin.hub.egress_bytes <= 1.1 * origin.size, (origin.hub.egress_bytes, origin.size)
    assert sum(st["bytes_from_peers"] for st in statuses) >= 2 * origin.size * 0.9


def test_tracker_down_fetch_from_origin_then_reregister(origin, tracker, make_agent):
    # A node that knows no peer goes to the origin once the outage outlasts the grace (short here).
    a = make_agent("a", origin, tracker, daemon={"tracker_outage_grace": 2.0})
    tracker.stop()
    started = time.monotonic()
    status = fetch_and_wait(a, origin.repo_id)
    assert time.monotonic() - started >= 2.0  # it asked the tracker again before giving up on it
    assert_snapshot_verifies(status["snapshot"], origin)
    assert origin.size * 0.99 <= status["bytes_from_origin"] <= origin.size * 1.01

    tracker.start()
    cache = RepoCache(a.settings.cache_dir, a.settings.state_dir, origin.repo_id)
    blobs = {f["blob_id"] for f in status["files"]}
    assert all(cache.blob_is_complete(f["blob_id"], f["size"]) for f in status["files"])
    # Back up: the agent publishes what it holds and announces it as a seeder.
    loop_until(
        lambda: all(tracker.blob(b).get("infohash") and tracker.blob(b).get("seeders") for b in blobs),
        timeout=60,
        what="blobs re-registered",
    )


def test_api_fetch_jobs_models_and_probes(origin, tracker, make_agent):
    a = make_agent("a", origin, tracker)
    url = a.api_url
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    loop_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=10)
    with http_client(a.admin_url, timeout=10) as admin:
        # An origin at 1 MiB/s keeps the job running for seconds: the second request certainly finds it.
        origin.hub.rate_total = 2**20
        resp = admin.post("/v1/fetch", json={"repo_id": origin.repo_id})
        assert resp.status_code == 202
        job_id = resp.json()["job_id"]
        # A second identical request joins the running job.
        again = admin.post("/v1/fetch", json={"repo_id": origin.repo_id})
        assert again.status_code == 202
        joined = again.json()
        assert joined["job_id"] == job_id and joined["phase"] in ("Pending", "Downloading"), joined
        assert [j["job_id"] for j in admin.get("/v1/jobs").json()] == [job_id]
        st = loop_until(
            lambda: (
                (s := admin.get(f"/v1/jobs/{job_id}", params={"wait": 2}).json())["phase"]
                in ("Ready", "Failed")
                and s
            ),
            timeout=90,
        )
        assert st["phase"] == "Ready", st
        assert st["bytes_done"] == st["bytes_total"] == origin.size
        models = admin.get("/v1/models").json()
        assert [m["repo_id"] for m in models] == [origin.repo_id]
        assert models[0]["refs"]["main"] == st["commit"]
        assert models[0]["snapshots"][0]["files"] == len(origin.files)
        assert admin.get("/v1/jobs/nope").status_code == 404
        bad = admin.post("/v1/fetch", json={"repo_id": "../etc"})
        assert bad.status_code == 400 and "invalid repo id" in bad.json()["detail"]


def test_concurrent_requests_for_one_model_share_a_job(origin, tracker, make_agent):
    a = make_agent("a", origin, tracker)
    jobs = []
    threads = [
        threading.Thread(target=lambda: jobs.append(a.request_model(origin.repo_id))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({j.id for j in jobs}) == 1
    assert jobs[0].wait(90) and jobs[0].status().phase == "Ready"


def test_a_standalone_fetched_cache_is_hashed_once_then_seeded(tmp_path, origin, tracker, make_agent):
    # `agent fetch` without a daemon writes no piece hashes; `agent serve` on that cache must still
    # seed it (after one verifying re-hash in the background), so peers never go to the origin.
    from agent.core.settings import Settings
    from agent.fetch.engine import fetch_snapshot

    settings = Settings.from_env_defaults(
        cache_dir=tmp_path / "a" / "hub", state_dir=tmp_path / "a" / "state"
    )
    origin_settings = dataclasses.replace(settings.origin, endpoint=origin.hub.url)
    settings = dataclasses.replace(settings, origin=origin_settings)
    fetch_snapshot(settings, origin.repo_id)
    cache = RepoCache(settings.cache_dir, settings.state_dir, origin.repo_id)
    assert any(not cache.read_sidecar(b.name).pieces for b in cache.blobs_dir.iterdir())

    a = make_agent("a", origin, tracker)
    loop_until(lambda: len(a.held_blobs()) == len(origin.files), timeout=30, what="A seeds the cache")
    assert all(cache.read_sidecar(b.name).pieces for b in cache.blobs_dir.iterdir())
    wait_until_seeded(tracker, a)
    origin.hub.reset_counters()
    status_b = fetch_and_wait(make_agent("b", origin, tracker), origin.repo_id)
    assert_snapshot_verifies(status_b["snapshot"], origin)
    assert file_requests(origin.hub) == [] and status_b["bytes_from_origin"] == 0


def test_tracker_credentials_reach_no_file_and_no_log_and_a_restart_announces(
    origin, tracker, make_agent, caplog
):
    caplog.set_level(logging.DEBUG)
    a = make_agent("a", origin, tracker)
    fetch_and_wait(a, origin.repo_id)
    wait_until_seeded(tracker, a)
    a.stop()  # saves resume data: it must not keep the announce URL (it holds the passkey)
    secrets = [s.encode() for s in (TOKEN, PASSKEY, PUBLISHER_TOKEN)]
    files = [
        p for root in (a.settings.state_dir, a.settings.cache_dir) for p in root.rglob("*") if p.is_file()
    ]
    assert any(p.suffix == ".resume" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(s in data for s in secrets), path
    assert not any(s.decode() in caplog.text for s in secrets)
    # A restart announces to the tracker it is configured with now (resume data names none).
    tracker.stop()
    tracker.start()  # a fresh tracker process forgets every peer
    b = Daemon(a.settings)
    b.start()
    try:
        wait_until_seeded(tracker, b)
    finally:
        b.stop()


def test_a_rate_limited_then_failing_origin_is_a_wait_for_a_daemon_job(origin, make_agent, caplog):
    """More 429s, then 503s, than the origin client retries one request: the job waits them out
    (Retry-After honoured by the client, then the origin patience) and ends Ready, no byte fetched twice.
    With `origin_patience` 0 the same job fails (checked)."""
    quick = {"max_retries": 2, "backoff_base": 0.05}  # the client's own retries spent at once
    a = make_agent("a", origin, None, daemon={"origin_patience": 60.0}, origin_client=quick)
    limited = (429, {"Retry-After": "0", "X-Error-Code": "RateLimited"})
    origin.hub.faults.status_queue = [limited] * 40 + [(503, {})] * 30
    origin.hub.reset_counters()
    with caplog.at_level(logging.WARNING, logger="agent.origin.client"):
        status = fetch_and_wait(a, origin.repo_id, timeout=120)
    assert_snapshot_verifies(status["snapshot"], origin)
    assert origin.hub.faults.status_queue == []  # every fault was answered
    waits = [r.getMessage() for r in caplog.records if "asking again" in r.getMessage()]
    assert any("429" in w for w in waits) and any("503" in w for w in waits)  # beyond the client's retries
    assert origin.hub.egress_bytes <= origin.size * 1.01


def test_a_job_waiting_out_the_origin_ends_when_the_daemon_stops(origin, make_agent, caplog):
    """Patience (10 minutes by default) must not hold a stopping agent, nor its process's exit."""
    quick = {"max_retries": 1}
    a = make_agent("a", origin, None, daemon={"origin_patience": 600.0}, origin_client=quick)
    origin.hub.faults.status_methods = frozenset({"GET"})  # the plan's HEAD passes, the downloads 503
    origin.hub.faults.status_queue = [(503, {})] * 100_000
    with caplog.at_level(logging.WARNING, logger="agent.origin.client"):
        job = a.request_model(origin.repo_id, "main")
        loop_until(lambda: any("asking again" in r.getMessage() for r in caplog.records), timeout=60)
    started = time.monotonic()
    a.stop()
    assert job.wait(10), job.status()
    assert time.monotonic() - started < 15
    assert job.status().to_json()["phase"] == "Failed"
