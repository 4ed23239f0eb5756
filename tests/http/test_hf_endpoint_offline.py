"""README "HF-compatible endpoint": with the origin down, cached files go only to clients with an access
decision still in its TTL. Real huggingface_hub against real daemons; the origin really stopped."""

from __future__ import annotations

import httpx
import pytest
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from tests.support.cluster import fetch_and_wait, same_files


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
