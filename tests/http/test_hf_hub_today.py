"""The HF endpoint in front of a hub that answers as huggingface.co does in 2026 (the test hub's default):
a small file's resolve is a 307 to a relative `/api/resolve-cache/...` URL, an LFS file's a 302 to a CDN
on another host with Xet headers, and 429s say when with `RateLimit`. A real daemon, a real hub and
huggingface_hub 2.4 (with hf_xet installed), all on loopback."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import httpx2
import pytest
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import _http as hf_http
from huggingface_hub.utils._http import parse_ratelimit_headers
from huggingface_hub.utils._runtime import is_xet_available

from agent.http.hf_answers import without_xet_hashes, without_xet_links
from agent.hub.ratelimit import RateLimits
from agent.hub.records import RequestRecord
from agent.origin import location as origin_location
from tests.support.cluster import Origin, model_origin
from tests.support.procs import loop_until

SMALL = "config.json"
GATED = "acme/gated"
TOKEN = "hf_granted_token_0123456789a"


def git_sha1(data: bytes) -> str:
    """The git blob id of `data`: what the Hub gives as a small file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def shard_of(origin: Origin) -> str:
    return next(p for p in origin.files if p.endswith(".safetensors"))


def xet_in(headers: httpx.Headers | httpx2.Headers) -> list[str]:
    """Every Xet header or link in an answer's headers."""
    found = [k for k in headers if k.lower().startswith("x-xet-")]
    return found + [v for k, v in headers.items() if k.lower() == "link" and "xet-" in v.lower()]


def file_gets(origin: Origin) -> list[RequestRecord]:
    """GETs of file bytes the origin answered: resolve, resolve-cache, CDN."""
    return [r for r in origin.hub.requests if r.method == "GET" and r.bucket in ("resolvers", "cdn")]


def test_the_hub_answers_as_in_2026(origin: Origin):
    """What the other tests stand on: without it they would prove nothing."""
    small = httpx.head(f"{origin.hub.url}/{origin.repo_id}/resolve/main/{SMALL}")
    assert small.status_code == 307 and small.headers["Location"].startswith("/api/resolve-cache/")
    assert "etag" not in small.headers and int(small.headers["Content-Length"]) != len(origin.files[SMALL])
    lfs = httpx.head(f"{origin.hub.url}/{origin.repo_id}/resolve/main/{shard_of(origin)}")
    assert lfs.status_code == 302 and urlsplit(lfs.headers["Location"]).port != origin.hub.port
    assert "x-xet-hash" in lfs.headers and 'rel="xet-auth"' in lfs.headers["Link"]


def test_a_small_file_behind_a_307_downloads_through_the_endpoint_cold_and_warm(
    origin: Origin, make_agent, tmp_path: Path
):
    agent = make_agent("solo", origin, None)
    data = origin.files[SMALL]
    commit = origin.hub.commit_for(origin.repo_id)

    head = httpx.head(f"{agent.api_url}/{origin.repo_id}/resolve/main/{SMALL}", timeout=30)
    assert head.status_code == 200, head.headers.get("X-Error-Message")
    meta = get_hf_file_metadata(hf_hub_url(origin.repo_id, SMALL, endpoint=agent.api_url), token=False)
    assert (meta.commit_hash, meta.etag, meta.size) == (commit, git_sha1(data), len(data))
    # The endpoint followed the 307 on the origin's host: the metadata is the target's.
    heads = [r.path for r in origin.hub.requests if r.method == "HEAD"]
    assert f"/api/resolve-cache/models/{origin.repo_id}/{commit}/{SMALL}" in heads

    cold = hf_hub_download(
        origin.repo_id, SMALL, endpoint=agent.api_url, cache_dir=tmp_path / "c1", token=False
    )
    assert Path(cold).read_bytes() == data
    assert [j.key.repo_id for j in agent.jobs.all()] == [origin.repo_id]  # fetched through the daemon
    blob = agent.settings.cache_dir / "models--acme--tiny" / "blobs" / git_sha1(data)
    assert blob.read_bytes() == data

    origin.hub.reset_counters()
    warm = hf_hub_download(
        origin.repo_id, SMALL, endpoint=agent.api_url, cache_dir=tmp_path / "c2", token=False
    )
    assert Path(warm).read_bytes() == data
    assert file_gets(origin) == []  # from the node's cache
    part = httpx.get(f"{agent.api_url}/{origin.repo_id}/resolve/main/{SMALL}", headers={"Range": "bytes=2-9"})
    assert part.status_code == 206 and part.content == data[2:10]


def test_a_head_without_length_takes_the_size_from_the_cache_or_says_it_is_missing(
    origin: Origin, make_agent
):
    agent = make_agent("solo", origin, None)
    data = origin.files[SMALL]
    assert httpx.get(f"{agent.api_url}/{origin.repo_id}/resolve/main/{SMALL}", timeout=60).content == data
    origin.hub.faults.head_without_length = True  # a mirror or proxy whose HEAD has no Content-Length
    head = httpx.head(f"{agent.api_url}/{origin.repo_id}/resolve/main/{SMALL}", timeout=30)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(data)  # not the 307's
    assert head.headers["ETag"] == f'"{git_sha1(data)}"'
    cold = httpx.head(f"{agent.api_url}/{origin.repo_id}/resolve/main/README.md", timeout=30)
    assert cold.status_code == 502 and "no size" in cold.headers["X-Error-Message"]


def test_no_xet_header_or_link_leaves_the_endpoint(origin: Origin, make_agent):
    agent = make_agent("solo", origin, None)
    shard = shard_of(origin)
    repo = origin.repo_id
    answers: dict[str, httpx.Response] = {}
    for path in (shard, SMALL):
        url = f"{agent.api_url}/{repo}/resolve/main/{path}"
        answers[f"HEAD {path}"] = httpx.head(url, timeout=30)
        answers[f"GET {path}"] = httpx.get(url, timeout=60)
        assert answers[f"GET {path}"].content == origin.files[path]
    # Answers the origin sends with Xet headers, passed through: a listing and a refusal.
    xet = {"X-Xet-Hash": "ab" * 32, "X-Xet-Cas-Url": f"{origin.hub.cdn_url}", "X-Xet-Access-Token": "secret"}
    page = f"<{origin.hub.url}/api/models/{repo}/tree/main?cursor=5>"
    links = f'{page}; rel="next", <{origin.hub.url}/api/models/{repo}/xet-read-token/main>; rel="xet-auth"'
    origin.hub.faults.path_status.update(
        {
            f"/api/models/{repo}/tree/main": (200, {**xet, "Link": links}),
            f"/{repo}/resolve/main/missing.bin": (
                404,
                {**xet, "Link": links, "X-Error-Code": "EntryNotFound"},
            ),
        }
    )
    tree = httpx.get(f"{agent.api_url}/api/models/{repo}/tree/main", timeout=30)
    answers["GET tree"] = tree
    assert tree.status_code == 200
    assert tree.headers["Link"] == f'<{agent.api_url}/api/models/{repo}/tree/main?cursor=5>; rel="next"'
    answers["HEAD missing"] = httpx.head(f"{agent.api_url}/{repo}/resolve/main/missing.bin", timeout=30)
    assert answers["HEAD missing"].status_code == 404
    assert {what: xet_in(resp.headers) for what, resp in answers.items()} == {what: [] for what in answers}
    # The Xet token route is not passed on: it would hand the client a CAS URL and token.
    token = httpx.get(f"{agent.api_url}/api/models/{repo}/xet-read-token/main", timeout=30)
    assert token.status_code == 404 and "HF_HUB_DISABLE_XET" in token.headers["X-Error-Message"]
    assert not [r for r in origin.hub.requests if "xet-read-token" in r.path]


def test_xet_links_and_hashes_are_taken_out_of_what_passes():
    link = (
        '<https://huggingface.co/api/models/a/b/tree/main?cursor=x>; rel="next", <https://huggingface.co/'
        'api/models/a/b/xet-read-token/c>; rel="xet-auth", <https://cas.example/v1/reconstructions/f>; '
        "rel=xet-reconstruction-info"
    )
    assert without_xet_links(link) == '<https://huggingface.co/api/models/a/b/tree/main?cursor=x>; rel="next"'
    assert without_xet_links('<https://cas.example/x>; rel="xet-auth"') == ""
    # A tree page as the Hub lists a Xet-backed LFS file (huggingface_hub's RepoFile reads `xetHash`).
    entry = {
        "type": "file",
        "oid": "1" * 40,
        "size": 5,
        "path": "m.safetensors",
        "xetHash": "f" * 64,
        "lfs": {"oid": "2" * 64, "size": 5, "pointerSize": 134},
    }
    stripped = json.loads(
        without_xet_hashes(json.dumps([entry, {"type": "directory", "path": "d"}]).encode())
    )
    assert stripped == [
        {k: v for k, v in entry.items() if k != "xetHash"},
        {"type": "directory", "path": "d"},
    ]
    assert without_xet_hashes(b"not json, no hash") == b"not json, no hash"


@pytest.fixture
def client_log() -> Iterator[list[httpx2.Response]]:
    """Every answer huggingface_hub's own HTTP client receives in this test."""
    seen: list[httpx2.Response] = []

    def factory() -> httpx2.Client:
        client = hf_http.default_client_factory()
        client.event_hooks["response"].append(seen.append)
        return client

    hf_http.set_client_factory(factory)
    try:
        yield seen
    finally:
        hf_http.set_client_factory(hf_http.default_client_factory)


@pytest.mark.parametrize("xet", [True, False], ids=["xet-on", "xet-off"])
def test_huggingface_hub_downloads_through_the_node_with_xet_on_and_off(
    origin: Origin, make_agent, tmp_path: Path, client_log, monkeypatch, xet: bool
):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", not xet)
    assert is_xet_available() is xet  # with it on, a Xet header anywhere would take the client to the CAS
    agent = make_agent("solo", origin, None)
    shard = shard_of(origin)

    cold = snapshot_download(origin.repo_id, endpoint=agent.api_url, cache_dir=tmp_path / "c1", token=False)
    one = hf_hub_download(
        origin.repo_id, shard, endpoint=agent.api_url, cache_dir=tmp_path / "c2", token=False
    )
    warm = snapshot_download(origin.repo_id, endpoint=agent.api_url, cache_dir=tmp_path / "c3", token=False)
    for snapshot in (cold, warm):
        for rel, data in origin.files.items():
            assert (Path(snapshot) / rel).read_bytes() == data, rel
    assert Path(one).read_bytes() == origin.files[shard]

    endpoint = urlsplit(agent.api_url).netloc
    assert client_log and {urlsplit(str(r.request.url)).netloc for r in client_log} == {endpoint}
    assert [str(r.request.url) for r in client_log if xet_in(r.headers)] == []
    # The origin saw only the agent: no Xet token asked, nothing asked of the CAS.
    assert not [r for r in origin.hub.requests if "xet-read-token" in r.path or "/v1/" in r.path]
    assert {j.key.client for j in agent.jobs.all()} == {"hf:127.0.0.1"}  # the bytes came through fetches


@pytest.fixture
def gated(make_origin) -> Origin:
    return make_origin(GATED, total_bytes=2**20, shards=1, seed=5, root="gated-hub", gated=[GATED])


@pytest.mark.parametrize(
    ("limits", "token"),
    [
        (RateLimits(api_anonymous=0), None),  # the agent's own model-info request, as the Hub: no Retry-After
        (RateLimits(api_user=0, retry_after=True), TOKEN),  # the auth-check with the client's token
    ],
    ids=["model-info", "auth-check"],
)
def test_a_429_on_the_access_check_tells_the_client_when_to_come_back(
    gated: Origin, make_agent, limits: RateLimits, token: str | None
):
    agent = make_agent("solo", gated, None)
    gated.hub.rate_limits = limits
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    shard = shard_of(gated)
    resp = httpx.get(f"{agent.api_url}/{GATED}/resolve/main/{shard}", headers=auth, timeout=30)
    assert resp.status_code == 429 and gated.files[shard] not in resp.content
    refused = [r for r in gated.hub.requests if r.status == 429]
    assert [r.path for r in refused] == [f"/api/models/{GATED}" + ("/auth-check" if token else "")]
    info = parse_ratelimit_headers(resp.headers)  # what huggingface_hub's http_backoff sleeps on
    assert info is not None and info.remaining == 0 and 0 < info.reset_in_seconds <= 300
    assert info.limit == 0 and info.window_seconds == 300
    assert ("Retry-After" in resp.headers) is limits.retry_after
    with pytest.raises(HfHubHTTPError, match=r"Retry after \d+ seconds"):
        get_hf_file_metadata(hf_hub_url(GATED, shard, endpoint=agent.api_url), token=token or False)


def test_a_shard_that_outlives_its_signed_url_still_downloads_through_the_endpoint(
    tmp_path: Path, make_agent, monkeypatch: pytest.MonkeyPatch
):
    """The endpoint's cold path fetches through the daemon's origin engine: each range that meets an
    expired URL resolves the shard again and goes on where it stopped, and the client sees one download."""
    monkeypatch.setattr(origin_location, "FRESH", 0.5)
    with model_origin(tmp_path / "hub", "acme/long", total_bytes=6 * 2**20, shards=1, seed=13) as origin:
        origin.hub.cdn_url_ttl = 1.0
        origin.hub.rate_per_connection = 1.5 * 2**20
        agent = make_agent("solo", origin, None, fetch={"connections_per_file": 2})
        shard = shard_of(origin)
        started = time.monotonic()
        got = hf_hub_download(
            origin.repo_id, shard, endpoint=agent.api_url, cache_dir=tmp_path / "c", token=False
        )
        took = time.monotonic() - started
        hub = origin.hub
        assert Path(got).read_bytes() == origin.files[shard]
        assert took > 2.0, took  # the download did outlive its first URL
        # One fetch, not one that failed and a client's retry that resumed it. The client has its last
        # byte once the blob is checked; the job is done a moment later, when the snapshot is linked.
        loop_until(lambda: all(j.done for j in agent.jobs.all()), timeout=30, what="the fetch to end")
        assert [j.status().to_json()["phase"] for j in agent.jobs.all()] == ["Ready"]
        refused = [r for r in hub.requests if r.bucket == "cdn" and r.status == 403]
        heads = [
            r
            for r in hub.requests
            if r.method == "HEAD" and r.path.endswith(f"/resolve/{hub.commit_for(origin.repo_id)}/{shard}")
        ]
        assert refused and len(heads) >= 2, (len(refused), heads)
        assert hub.egress_bytes < 1.2 * sum(map(len, origin.files.values()))  # no range started over
