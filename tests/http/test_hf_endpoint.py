"""The agent as HF_ENDPOINT: real huggingface_hub clients against real daemons, origin and tracker."""

from __future__ import annotations

import dataclasses
import hashlib

import httpx
import pytest
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
from prometheus_client.parser import text_string_to_metric_families

from agent.daemon.node import Daemon
from tests.support.cluster import Origin, agent_settings, fetch_and_wait, file_requests
from tests.support.cluster import has_files as same_files

GOOD = "hf_goodtoken1234567890"
WRONG = "hf_wrongtoken123456789"


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no metric {name}{labels} in:\n{text}")


def test_snapshot_download_through_the_agent_takes_no_file_bytes_from_the_origin(
    origin, tracker, make_agent, tmp_path
):
    a = make_agent("a", origin, tracker)
    fetch_and_wait(a, origin.repo_id)
    b = make_agent("b", origin, tracker)
    origin.hub.reset_counters()

    # As vLLM/transformers would: HF_ENDPOINT = the node agent, HF_HUB_OFFLINE unset, no token.
    path = snapshot_download(origin.repo_id, endpoint=b.api_url, cache_dir=tmp_path / "client", token=False)
    same_files(path, origin)
    assert file_requests(origin.hub) == []  # metadata only: model info, the HEAD access checks, listings
    assert metric(b.api_url, "weightswarm_agent_fetched_bytes_total", source="peers") >= origin.size * 0.99
    assert metric(b.api_url, "weightswarm_agent_fetched_bytes_total", source="origin") == 0
    assert metric(b.api_url, "weightswarm_agent_fetch_duration_seconds_count") >= 1
    assert metric(b.api_url, "weightswarm_agent_active_torrents") >= len(origin.files)
    assert metric(b.api_url, "weightswarm_agent_cache_bytes") >= origin.size
    assert metric(a.api_url, "weightswarm_agent_upload_bytes_total") >= origin.size * 0.99
    assert metric(b.api_url, "weightswarm_agent_served_bytes_total") >= origin.size
    # Per model: time-to-ready of whole models by the source most bytes came from (the HF endpoint's
    # one-file jobs are not a model's time), bytes by source, peers per blob.
    model = f"{origin.repo_id}@main"
    ready_count = "weightswarm_agent_time_to_ready_seconds_count"
    assert metric(a.api_url, ready_count, model=model, source="origin") == 1
    origin_bytes = metric(a.api_url, "weightswarm_agent_model_bytes_total", model=model, source="origin")
    assert origin_bytes >= origin.size
    text = httpx.get(f"{b.api_url}/metrics", timeout=10).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "weightswarm_agent_model_bytes"]
    from_peers = sum(
        s.value for s in family.samples if s.name.endswith("_total") and s.labels["source"] == "peers"
    )
    assert from_peers >= origin.size * 0.99
    assert ready_count not in text
    shard = next(p for p in origin.files if p.endswith(".safetensors"))
    blob = hashlib.sha256(origin.files[shard]).hexdigest()
    assert metric(a.api_url, "weightswarm_agent_blob_peers", blob=blob) >= 0
    assert metric(b.api_url, "weightswarm_agent_fetch_stage", stage="origin") == 0  # nothing running

    # A second client on the same node: every byte from the node's cache, nothing fetched again.
    before = metric(b.api_url, "weightswarm_agent_fetches_total", outcome="ready")
    again = snapshot_download(origin.repo_id, endpoint=b.api_url, cache_dir=tmp_path / "client2", token=False)
    same_files(again, origin)
    assert metric(b.api_url, "weightswarm_agent_fetches_total", outcome="ready") == before


def test_resolve_headers_ranges_and_errors_match_the_hub(origin, make_agent):
    agent = make_agent("solo", origin, None)
    shard = next(p for p in origin.files if p.endswith(".safetensors"))
    data = origin.files[shard]
    url = f"{agent.api_url}/{origin.repo_id}/resolve/main/{shard}"
    hub_head = httpx.head(f"{origin.hub.url}/{origin.repo_id}/resolve/main/{shard}")
    head = httpx.head(url, timeout=30)
    assert head.status_code == 200
    for name in ("X-Repo-Commit", "X-Linked-Etag", "X-Linked-Size"):
        assert head.headers[name] == hub_head.headers[name], name
    assert head.headers["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert int(head.headers["Content-Length"]) == len(data)
    assert head.headers["Accept-Ranges"] == "bytes"

    part = httpx.get(url, headers={"Range": "bytes=100-199"}, timeout=60)
    assert part.status_code == 206 and part.content == data[100:200]
    assert part.headers["Content-Range"] == f"bytes 100-199/{len(data)}"
    assert httpx.get(url, headers={"Range": f"bytes={len(data)}-"}, timeout=30).status_code == 416
    full = httpx.get(url, timeout=60)
    assert full.status_code == 200 and full.content == data

    missing = httpx.get(f"{agent.api_url}/{origin.repo_id}/resolve/main/nope.bin", timeout=30)
    assert missing.status_code == 404 and missing.headers["X-Error-Code"] == "EntryNotFound"
    unknown = httpx.get(f"{agent.api_url}/api/models/acme/unknown", timeout=30)
    assert unknown.status_code in (401, 404) and unknown.headers["X-Error-Code"] == "RepoNotFound"


@pytest.fixture
def gated(make_origin) -> Origin:
    secret = "acme/secret"
    return make_origin(
        secret, total_bytes=2**20, shards=2, seed=3, root="gated-hub", tokens=[GOOD], gated=[secret]
    )


def test_gated_repo_is_refused_to_a_wrong_token_although_its_blobs_are_cached(gated, tmp_path):
    settings = agent_settings(tmp_path, "node", gated.hub.url, None)
    settings = dataclasses.replace(settings, origin=dataclasses.replace(settings.origin, token=GOOD))
    daemon = Daemon(settings)
    daemon.start()
    try:
        job = daemon.request_model(gated.repo_id, "main", lend=True)  # the node's own token brings them in
        assert job.wait(90) and job.status().phase == "Ready", job.status()
        gated.hub.reset_counters()
        shard = next(p for p in gated.files if p.endswith(".safetensors"))
        url = f"{daemon.api_url}/{gated.repo_id}/resolve/main/{shard}"

        for auth, status, code in ((f"Bearer {WRONG}", 401, None), (None, 401, "GatedRepo")):
            headers = {"Authorization": auth} if auth else {}
            resp = httpx.get(url, headers=headers, timeout=30)
            assert resp.status_code == status, (auth is not None, resp.status_code)
            assert resp.content != gated.files[shard] and len(resp.content) < 1000
            if code:
                assert resp.headers["X-Error-Code"] == code
        with pytest.raises(HfHubHTTPError):
            snapshot_download(gated.repo_id, endpoint=daemon.api_url, cache_dir=tmp_path / "c1", token=WRONG)
        assert not list((tmp_path / "c1").rglob("*.safetensors"))

        path = snapshot_download(
            gated.repo_id, endpoint=daemon.api_url, cache_dir=tmp_path / "c2", token=GOOD
        )
        same_files(path, gated)
        assert file_requests(gated.hub) == []  # the right token was served from the node's cache
        # The decision is cached per token: the wrong token is still refused right after.
        assert httpx.get(url, headers={"Authorization": f"Bearer {WRONG}"}, timeout=30).status_code == 401
    finally:
        daemon.stop()


@pytest.mark.parametrize("bucket", ["s3://models/llama-ft", "gs://models/llama-ft", "az://models/llama-ft"])
def test_a_node_whose_origin_is_a_bucket_says_so_on_every_hf_route(tmp_path, bucket):
    """Object storage has no Hub API to proxy: the endpoint names the reason, never "origin unreachable",
    and never asks the bucket (no store runs here: any attempt would fail as an outage)."""
    daemon = Daemon(agent_settings(tmp_path, "node", bucket, None))
    daemon.start()
    try:
        scheme = bucket.split(":")[0]
        asked = [
            ("GET", "/api/models/acme/llama-ft"),
            ("GET", "/api/models/acme/llama-ft/revision/main"),
            ("GET", "/api/models/acme/llama-ft/tree/main"),
            ("GET", "/api/models/acme/llama-ft/xet-read-token/main"),
            ("HEAD", "/acme/llama-ft/resolve/main/config.json"),
            ("GET", "/acme/llama-ft/resolve/main/config.json"),
            ("GET", "/acme/llama-ft/resolve/main/%2e%2e/secret"),
        ]
        for method, path in asked:
            for headers in ({}, {"Authorization": f"Bearer {GOOD}"}):
                resp = httpx.request(method, daemon.api_url + path, headers=headers, timeout=30)
                message = resp.headers.get("X-Error-Message", "")
                assert resp.status_code == 501, (method, path, resp.status_code, message)
                assert f"origin is object storage ({scheme}://)" in message, message
                assert "hub origins only" in message and "unreachable" not in message, message
                assert "models/llama-ft" not in message  # the bucket's URL stays on the node
        # huggingface_hub reads the 501 as "no answer from the Hub", with the endpoint's message.
        with pytest.raises((HfHubHTTPError, LocalEntryNotFoundError), match="object storage"):
            snapshot_download("acme/llama-ft", endpoint=daemon.api_url, cache_dir=tmp_path / "c", token=False)
    finally:
        daemon.stop()
