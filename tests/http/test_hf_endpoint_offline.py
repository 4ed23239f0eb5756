"""README "HF-compatible endpoint": with the origin down, cached files go only to clients with an access
decision still in its TTL. Real huggingface_hub against real daemons; the origin really stopped."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import httpx
import pytest
from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from agent.daemon.node import Daemon
from tests.support.cluster import agent_settings, fetch_and_wait, same_files


def test_origin_down_a_cached_model_is_served_to_clients_with_a_fresh_access_decision_only(
    origin, make_agent, tmp_path
):
    seen = make_agent("seen", origin, None)  # will have answered a client while the origin was up
    unseen = make_agent("unseen", origin, None)  # same cache contents, never asked about access
    for daemon in (seen, unseen):
        fetch_and_wait(daemon, origin.repo_id)
    first = snapshot_download(origin.repo_id, endpoint=seen.api_url, cache_dir=tmp_path / "c1", token=False)
    same_files(first, origin)

    origin.hub.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{origin.hub.url}/api/models/{origin.repo_id}", timeout=5)

    # Model info, listing and every file from the node's cache: the origin said "public" < 10 min ago.
    path = snapshot_download(origin.repo_id, endpoint=seen.api_url, cache_dir=tmp_path / "c2", token=False)
    same_files(path, origin)
    shard = next(p for p in origin.files if p.endswith(".safetensors"))
    resp = httpx.get(f"{seen.api_url}/{origin.repo_id}/resolve/main/{shard}", timeout=30)
    assert resp.status_code == 200 and resp.content == origin.files[shard]

    # No decision in its TTL: the same cached bytes stay in (503, retry later), never served unchecked.
    resp = httpx.get(f"{unseen.api_url}/{origin.repo_id}/resolve/main/{shard}", timeout=30)
    assert resp.status_code == 503 and resp.content != origin.files[shard]
    with pytest.raises((HfHubHTTPError, LocalEntryNotFoundError), match="503"):
        snapshot_download(origin.repo_id, endpoint=unseen.api_url, cache_dir=tmp_path / "c3", token=False)
    assert not list((tmp_path / "c3").rglob("*.safetensors"))


def _served_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "from this node's cache to clients" in r.getMessage()]


def test_origin_down_hf_hub_download_and_a_head_of_a_cached_file_with_one_line_per_repo(
    origin, make_agent, tmp_path, caplog
):
    """huggingface_hub's HEAD then GET (file_download.py), as a client with HF_ENDPOINT at the node
    does; the node says once, not per request, that it serves the repo without the origin."""
    seen = make_agent("seen", origin, None)
    fetch_and_wait(seen, origin.repo_id)
    shard = next(p for p in origin.files if p.endswith(".safetensors"))
    url = f"{seen.api_url}/{origin.repo_id}/resolve/main/{shard}"
    up = httpx.head(url, timeout=30)  # the origin decides "public" now
    assert up.status_code == 200

    origin.hub.stop()
    with caplog.at_level(logging.WARNING, logger="agent.http.hf"):
        head = httpx.head(url, timeout=30)
        assert head.status_code == 200
        for name in ("X-Repo-Commit", "ETag", "X-Linked-Etag", "X-Linked-Size"):
            assert head.headers[name] == up.headers[name], name
        assert int(head.headers["X-Linked-Size"]) == len(origin.files[shard])
        for i, name in enumerate([shard, "config.json"]):
            got = hf_hub_download(origin.repo_id, name, endpoint=seen.api_url, cache_dir=tmp_path / f"c{i}",
                                  token=False)
            assert Path(got).read_bytes() == origin.files[name]
        said = _served_lines(caplog)
        assert len(said) == 1 and origin.repo_id in said[0], said
        snapshot_download(origin.repo_id, endpoint=seen.api_url, cache_dir=tmp_path / "all", token=False)
    assert _served_lines(caplog) == said


GOOD, LATE = "hf_good_token_0001", "hf_late_token_0002"


def test_origin_down_a_gated_model_goes_only_to_the_token_granted_within_the_ttl(make_origin, tmp_path):
    gated = make_origin("acme/secret", total_bytes=2**20, shards=2, seed=3, root="gated-hub",
                        tokens=[GOOD, LATE], gated=["acme/secret"])
    settings = agent_settings(tmp_path, "node", gated.hub.url, None)
    settings = dataclasses.replace(settings, origin=dataclasses.replace(settings.origin, token=GOOD))
    daemon = Daemon(settings)
    daemon.start()
    try:
        job = daemon.request_model(gated.repo_id, "main", lend=True)  # the node's own token brings them in
        assert job.wait(90) and job.status().phase == "Ready", job.status()
        shard = next(p for p in gated.files if p.endswith(".safetensors"))
        hf_hub_download(gated.repo_id, shard, endpoint=daemon.api_url, cache_dir=tmp_path / "up", token=GOOD)

        gated.hub.stop()
        got = hf_hub_download(gated.repo_id, shard, endpoint=daemon.api_url, cache_dir=tmp_path / "good",
                              token=GOOD)
        assert Path(got).read_bytes() == gated.files[shard]
        # LATE would be granted by the origin, but it was never asked: no decision, no bytes.
        url = f"{daemon.api_url}/{gated.repo_id}/resolve/main/{shard}"
        for auth in (f"Bearer {LATE}", None):
            resp = httpx.get(url, headers={"Authorization": auth} if auth else {}, timeout=30)
            assert resp.status_code in (401, 503) and resp.content != gated.files[shard], auth is None
            assert len(resp.content) < 1000
        late = httpx.get(url, headers={"Authorization": f"Bearer {LATE}"}, timeout=30)
        assert late.status_code == 503
        with pytest.raises((HfHubHTTPError, LocalEntryNotFoundError)):
            hf_hub_download(gated.repo_id, shard, endpoint=daemon.api_url, cache_dir=tmp_path / "late",
                            token=LATE)
        assert not list((tmp_path / "late").rglob("*.safetensors"))
    finally:
        daemon.stop()
