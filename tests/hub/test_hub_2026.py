"""The test hub answers as huggingface.co does in 2026 (the default), and as in 2024 when asked.

Expected values come from the references in agent.hub.server's docstring (the 307's query shape, the
Express redirect body, the S3 expiry body, the RateLimit header grammar) and from the real client
(huggingface_hub 2.4.0): its downloads and metadata are the proof that the shapes are the ones it reads.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest
from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.utils._http import parse_ratelimit_headers

from agent.hub.repos import git_blob_sha1
from agent.hub.server import HubServer, RateLimits
from agent.hub.testmodel import make_model
from tests.support.cluster import repo_files, write_models
from tests.support.fetchkit import sha256
from tests.support.procs import kill_process, loop_until

MiB = 2**20
REPO = "org/model"
GATED = "org/gated"
PRIVATE = "org/private"
TOKEN = "hf_test_token_2026"
SHARD = "model-00001-of-00002.safetensors"
HUB_HEADERS = ("x-repo-commit", "x-linked-", "x-xet-", "x-error-")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    make_model(root, REPO, total_bytes=4 * MiB, shards=2, seed=11)
    (root / REPO / "sub").mkdir()
    (root / REPO / "sub" / "notes.txt").write_text("nested\n")
    write_models(root, (GATED, PRIVATE), total_bytes=1 * MiB, shards=1, seed=12)
    return root


@pytest.fixture
def hub(hub_root: Path, make_hub) -> HubServer:
    return make_hub(hub_root, tokens=[TOKEN], gated=[GATED], private=[PRIVATE])


def hub_headers(response: httpx.Response) -> list[str]:
    return [k for k in response.headers if k.lower().startswith(HUB_HEADERS)]


# -- the real client --------------------------------------------------------------------------------


def test_snapshot_download_through_the_307_and_the_cdn_is_byte_identical(
    hub: HubServer, hub_root: Path, tmp_path: Path
):
    path = Path(snapshot_download(GATED, endpoint=hub.url, cache_dir=tmp_path / "c", token=TOKEN))
    assert path.name == hub.commit_for(GATED)
    got = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert got == repo_files(hub_root, GATED)
    on_main = [r for r in hub.requests if r.bucket != "cdn"]
    assert {r.status for r in on_main if "/resolve/" in r.path and r.path.endswith(".json")} == {307}
    assert {r.status for r in on_main if "/resolve/" in r.path and r.path.endswith(".safetensors")} == {302}
    assert all(r.authorized for r in on_main)  # the token went to the hub...
    cdn = [r for r in hub.requests if r.bucket == "cdn"]
    assert [r.status for r in cdn] == [200] and not cdn[0].authorized  # ...and never to the CDN
    assert cdn[0].path.startswith("/xet-bridge-us/") and "/_cdn/" not in str(hub.requests)
    counts = hub.counts()
    assert counts["cdn"] == 1 and counts["api"] >= 1 and counts["resolvers"] == len(on_main) - counts["api"]


def test_hf_hub_download_small_nested_and_lfs_files(hub: HubServer, hub_root: Path, tmp_path: Path):
    for name in ("sub/notes.txt", "config.json", SHARD):
        path = Path(hf_hub_download(REPO, name, endpoint=hub.url, cache_dir=tmp_path / "c"))
        assert path.read_bytes() == (hub_root / REPO / name).read_bytes(), name
        assert path.parent.name == hub.commit_for(REPO) or name.startswith("sub/")
    cached = [r.path for r in hub.requests if r.path.startswith("/api/resolve-cache/")]
    assert f"/api/resolve-cache/models/{REPO}/{hub.commit_for(REPO)}/sub/notes.txt" in cached


def test_get_hf_file_metadata_reads_the_right_etag_and_size(hub: HubServer, hub_root: Path):
    commit = hub.commit_for(REPO)
    config = (hub_root / REPO / "config.json").read_bytes()
    small = get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=hub.url), endpoint=hub.url)
    assert (small.etag, small.size, small.commit_hash) == (git_blob_sha1(config), len(config), commit)
    assert small.location.startswith(f"{hub.url}/api/resolve-cache/models/{REPO}/{commit}/config.json?")
    assert small.xet_file_data is None
    shard = (hub_root / REPO / SHARD).read_bytes()
    big = get_hf_file_metadata(hf_hub_url(REPO, SHARD, endpoint=hub.url), token=TOKEN, endpoint=hub.url)
    assert (big.etag, big.size, big.commit_hash) == (sha256(shard), len(shard), commit)
    assert big.location.startswith(f"{hub.cdn_url}/")  # it stopped at the 302: the CDN is another origin
    assert big.xet_file_data is not None
    assert big.xet_file_data.refresh_route == f"{hub.url}/api/models/{REPO}/xet-read-token/{commit}"
    assert len(big.xet_file_data.file_hash) == 64 and big.xet_file_data.file_hash != sha256(shard)
    assert not [r for r in hub.requests if r.bucket == "cdn"]  # metadata never touched the CDN


# -- the exact answers ------------------------------------------------------------------------------


def raw(host_url: str, method: str, target: str, headers: dict[str, str] | None = None):
    """(status, headers, body) of one request sent exactly as written."""
    parts = urlsplit(host_url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, target, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def test_a_small_file_is_a_307_to_resolve_cache_with_its_own_short_body(hub: HubServer, hub_root: Path):
    commit = hub.commit_for(REPO)
    config = (hub_root / REPO / "config.json").read_bytes()
    status, headers, body = raw(hub.url, "GET", f"/{REPO}/resolve/main/config.json")
    assert status == 307
    location = headers["Location"]
    query = f"{quote('/org/model/resolve/main/config.json', safe='')}=&etag=%22{git_blob_sha1(config)}%22"
    assert location == f"/api/resolve-cache/models/{REPO}/{commit}/config.json?{query}"
    assert body == f"Temporary Redirect. Redirecting to {location}".encode()
    assert int(headers["Content-Length"]) == len(body) != len(config)
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["ETag"] is None and headers["X-Repo-Commit"] is None and headers["X-Linked-Size"] is None
    assert headers["RateLimit"] == '"resolvers";r=2999;t=300'
    assert headers["RateLimit-Policy"] == '"fixed window";"resolvers";q=3000;w=300'
    head_status, head_headers, head_body = raw(hub.url, "HEAD", f"/{REPO}/resolve/main/config.json")
    assert (head_status, head_body, head_headers["Content-Length"]) == (307, b"", str(len(body)))


def test_resolve_cache_serves_the_file_with_the_access_checks_of_resolve(hub: HubServer, hub_root: Path):
    commit = hub.commit_for(REPO)
    config = (hub_root / REPO / "config.json").read_bytes()
    url = f"{hub.url}/api/resolve-cache/models/{REPO}/{commit}/config.json"
    head = httpx.head(url)
    assert head.status_code == 200 and head.headers["ETag"] == f'"{git_blob_sha1(config)}"'
    assert int(head.headers["Content-Length"]) == len(config) and head.headers["X-Repo-Commit"] == commit
    assert head.headers["Accept-Ranges"] == "bytes" and head.headers["RateLimit"].startswith('"resolvers";')
    part = httpx.get(url, headers={"Range": "bytes=1-4"})
    assert part.status_code == 206 and part.content == config[1:5]
    assert part.headers["Content-Range"] == f"bytes 1-4/{len(config)}"
    gated = f"{hub.url}/api/resolve-cache/models/{GATED}/{hub.commit_for(GATED)}/config.json"
    refused = httpx.get(gated)
    assert (refused.status_code, refused.headers["X-Error-Code"]) == (401, "GatedRepo")
    assert httpx.get(gated, headers={"Authorization": "Bearer hf_wrong"}).status_code == 401
    assert httpx.get(gated, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    hidden = httpx.get(f"{hub.url}/api/resolve-cache/models/{PRIVATE}/{hub.commit_for(PRIVATE)}/config.json")
    assert (hidden.status_code, hidden.headers["X-Error-Code"]) == (401, "RepoNotFound")


def test_an_lfs_file_is_a_302_with_xet_headers_to_a_signed_url_on_another_port(
    hub: HubServer, hub_root: Path
):
    commit = hub.commit_for(REPO)
    shard = (hub_root / REPO / SHARD).read_bytes()
    r = httpx.get(f"{hub.url}/{REPO}/resolve/main/{SHARD}")
    assert r.status_code == 302
    assert r.headers["X-Repo-Commit"] == commit
    assert r.headers["ETag"] == r.headers["X-Linked-Etag"] == f'"{sha256(shard)}"'
    assert int(r.headers["X-Linked-Size"]) == len(shard)
    xet = r.headers["X-Xet-Hash"]
    assert len(xet) == 64 and int(xet, 16) >= 0 and xet != sha256(shard)
    assert r.links["xet-auth"]["url"] == f"{hub.url}/api/models/{REPO}/xet-read-token/{commit}"
    assert r.links["xet-reconstruction-info"]["url"] == f"{hub.cdn_url}/v1/reconstructions/{xet}"
    location = urlsplit(r.headers["Location"])
    assert (location.hostname, location.port) == ("127.0.0.1", hub.cdn_port) and hub.cdn_port != hub.port
    signed = parse_qs(location.query)
    assert signed["X-Amz-Expires"] == ["3600"] and signed["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert len(signed["X-Amz-Date"][0]) == 16 and len(signed["X-Amz-Signature"][0]) == 64
    assert r.content == f"Found. Redirecting to {r.headers['Location']}".encode()
    assert int(r.headers["Content-Length"]) == len(r.content) != len(shard)


def test_the_cdn_answers_as_s3_and_ignores_the_token(hub: HubServer, hub_root: Path):
    shard = (hub_root / REPO / SHARD).read_bytes()
    location = httpx.head(f"{hub.url}/{REPO}/resolve/main/{SHARD}").headers["Location"]
    authed = {"Authorization": f"Bearer {TOKEN}"}
    whole = httpx.get(location, headers=authed)
    assert whole.status_code == 200 and whole.content == shard
    assert int(whole.headers["Content-Length"]) == len(shard) and whole.headers["Accept-Ranges"] == "bytes"
    etag = whole.headers["ETag"]
    assert etag.startswith('"') and len(etag) == 66 and sha256(shard) not in etag
    assert hub_headers(whole) == [] and "ratelimit" not in whole.headers
    part = httpx.get(location, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == shard[100:200]
    assert part.headers["Content-Range"] == f"bytes 100-199/{len(shard)}" and hub_headers(part) == []
    head = httpx.head(location)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(shard)
    cdn = [r for r in hub.requests if r.bucket == "cdn"]
    assert [(r.method, r.authorized) for r in cdn] == [("GET", True), ("GET", False), ("HEAD", False)]
    assert hub.counts()["cdn"] == 3 and hub.egress_bytes >= len(shard) + 100
    wrong_port = httpx.get(f"{hub.url}{urlsplit(location).path}?{urlsplit(location).query}")
    assert wrong_port.status_code == 404  # the hub's own port serves no CDN URL


def test_an_expired_or_forged_cdn_url_is_an_s3_403(hub_root: Path):
    with HubServer(hub_root, cdn_url_ttl=1) as srv:
        location = httpx.head(f"{srv.url}/{REPO}/resolve/main/{SHARD}").headers["Location"]
        assert parse_qs(urlsplit(location).query)["X-Amz-Expires"] == ["1"]
        forged = httpx.get(location.replace("X-Amz-Expires=1", "X-Amz-Expires=3600"))
        assert forged.status_code == 403 and b"<Code>SignatureDoesNotMatch</Code>" in forged.content
        time.sleep(1.5)  # the URL's own clock: past X-Amz-Date (whole seconds) + X-Amz-Expires
        expired = httpx.get(location, headers={"Range": "bytes=0-9"})
        srv.cdn_url_ttl = 30  # settable: the URLs handed out from now on live longer
        fresh = httpx.head(f"{srv.url}/{REPO}/resolve/main/{SHARD}").headers["Location"]
        assert httpx.get(fresh, headers={"Range": "bytes=0-9"}).status_code == 206
    assert expired.status_code == 403 and expired.headers["Content-Type"] == "application/xml"
    body = expired.content.decode()
    assert "<Error><Code>AccessDenied</Code><Message>Request has expired</Message>" in body
    assert "<X-Amz-Expires>1</X-Amz-Expires>" in body and "<ServerTime>" in body
    assert hub_headers(expired) == []


def test_a_body_that_started_before_the_expiry_runs_to_its_end(hub_root: Path):
    shard = (hub_root / REPO / SHARD).read_bytes()
    # 2 MiB at 0.4 MiB/s: 5 s, past the URL's 3 s (which leave at least 2 s to start in: the date is
    # in whole seconds).
    with HubServer(hub_root, cdn_url_ttl=3, rate_per_connection=0.4 * MiB) as srv:
        location = httpx.head(f"{srv.url}/{REPO}/resolve/main/{SHARD}").headers["Location"]
        started = time.monotonic()
        body = httpx.get(location, timeout=30).content
        assert time.monotonic() - started > 3.5
        assert body == shard
        assert httpx.get(location, headers={"Range": "bytes=0-0"}).status_code == 403


# -- rate limits ------------------------------------------------------------------------------------


def client_from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def test_the_default_limits_are_the_hubs():
    assert RateLimits() == RateLimits(300.0, 500, 3000, 1000, 5000, retry_after=False)


def test_over_the_api_budget_a_429_says_when_by_ratelimit(hub_root: Path):
    limits = RateLimits(window=5, api_anonymous=3, resolvers_anonymous=50, api_user=5, resolvers_user=50)
    with HubServer(hub_root, rate_limits=limits) as srv, client_from("127.0.0.1") as one:
        info = f"{srv.url}/api/models/{REPO}"
        seen = [one.get(info) for _ in range(4)]
        assert [r.status_code for r in seen] == [200, 200, 200, 429]
        assert [r.headers["RateLimit"].split(";t=")[0] for r in seen] == [
            f'"api";r={n}' for n in (2, 1, 0, 0)
        ]
        refused = seen[-1]
        parsed = parse_ratelimit_headers(refused.headers)
        assert parsed is not None and (parsed.resource_type, parsed.remaining) == ("api", 0)
        assert 1 <= parsed.reset_in_seconds <= 5 and (parsed.limit, parsed.window_seconds) == (3, 5)
        assert refused.headers["X-Error-Message"] and "error" in refused.json()
        assert "Retry-After" not in refused.headers and "X-Error-Code" not in refused.headers
        # Another address, a token, another bucket: budgets of their own.
        with client_from("127.0.0.2") as two:
            assert two.get(info).status_code == 200
        authed = {"Authorization": f"Bearer {TOKEN}"}
        assert [one.get(info, headers=authed).status_code for _ in range(6)] == [200] * 5 + [429]
        assert one.get(f"{srv.url}/{REPO}/resolve/main/config.json").status_code == 307
        # The fixed window ends: the budget is whole again.
        loop_until(lambda: one.get(info).status_code == 200, timeout=15, interval=0.5, what="a new window")
        assert [r.status for r in srv.requests if r.client == "127.0.0.1"].count(429) >= 2


def test_resolvers_are_limited_the_cdn_is_not_and_retry_after_is_a_knob(hub_root: Path):
    limits = RateLimits(window=60, resolvers_anonymous=2, retry_after=True)
    with HubServer(hub_root, rate_limits=limits) as srv, httpx.Client() as client:
        location = client.head(f"{srv.url}/{REPO}/resolve/main/{SHARD}").headers["Location"]
        cached = client.head(f"{srv.url}/{REPO}/resolve/main/config.json").headers["Location"]
        refused = client.get(srv.url + cached)  # resolve-cache is a resolver too
        assert refused.status_code == 429
        assert refused.headers["RateLimit"].startswith('"resolvers";r=0;t=')
        assert refused.headers["RateLimit-Policy"] == '"fixed window";"resolvers";q=2;w=60'
        assert refused.headers["Retry-After"] == refused.headers["RateLimit"].rsplit("t=", 1)[1]
        assert [client.get(location).status_code for _ in range(3)] == [200] * 3
        assert srv.counts() == {"api": 0, "resolvers": 3, "cdn": 3}


# -- 2024, faults, the command ----------------------------------------------------------------------


def test_answers_2024_is_the_hub_of_2024(hub_root: Path, tmp_path: Path):
    with HubServer(hub_root, answers="2024") as srv, httpx.Client(base_url=srv.url) as client:
        assert (srv.cdn_url, srv.cdn_port, srv.cdn_url_ttl, srv.rate_limits) == (
            srv.url,
            srv.port,
            86400,
            None,
        )
        config = (hub_root / REPO / "config.json").read_bytes()
        small = client.head(f"/{REPO}/resolve/main/config.json")
        assert small.status_code == 200 and small.headers["ETag"] == f'"{git_blob_sha1(config)}"'
        assert "RateLimit" not in small.headers
        shard = (hub_root / REPO / SHARD).read_bytes()
        big = client.head(f"/{REPO}/resolve/main/{SHARD}")
        assert big.status_code == 302 and big.headers["Content-Length"] == "0"
        assert "X-Xet-Hash" not in big.headers and "Link" not in big.headers
        assert big.headers["Location"].startswith(f"{srv.url}/_cdn/{sha256(shard)}?")
        cdn = client.get(big.headers["Location"])
        assert cdn.content == shard and cdn.headers["X-Linked-Etag"] == f'"{sha256(shard)}"'
        assert cdn.headers["X-Repo-Commit"] == srv.commit_for(REPO)
        commit = srv.commit_for(REPO)
        assert client.get(f"/api/resolve-cache/models/{REPO}/{commit}/config.json").status_code == 404
        path = Path(snapshot_download(REPO, endpoint=srv.url, cache_dir=tmp_path / "c"))
        got = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
        assert got == repo_files(hub_root, REPO)
        # The /_cdn/ GET above; then, per shard, the metadata HEAD that followed the same-origin 302
        # and the GET of its Location.
        assert srv.counts()["cdn"] == 1 + 2 * 2


def test_head_without_length(hub: HubServer, hub_root: Path):
    hub.faults.head_without_length = True
    shard = (hub_root / REPO / SHARD).read_bytes()
    with httpx.Client(base_url=hub.url, follow_redirects=True) as client:
        small = client.head(f"/{REPO}/resolve/main/config.json")
        assert small.status_code == 200 and "Content-Length" not in small.headers and small.headers["ETag"]
        location = client.head(f"/{REPO}/resolve/main/{SHARD}", follow_redirects=False).headers["Location"]
        head = client.head(location)
        assert head.status_code == 200 and "Content-Length" not in head.headers
        got = client.get(location)  # the GET still says how long it is
        assert got.content == shard and int(got.headers["Content-Length"]) == len(shard)
    with HubServer(hub_root, answers="2024") as old:
        old.faults.head_without_length = True
        assert "Content-Length" not in httpx.head(f"{old.url}/{REPO}/resolve/main/config.json").headers


def start_serve_hub(argv: list[str]) -> tuple[subprocess.Popen[str], str, str]:
    """`agent serve-hub` started: the process, its URL (stdout's first line), stderr's first line."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout, proc.stderr
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend([out.readline(), err.readline()]), daemon=True).start()
    loop_until(lambda: len(lines) == 2 or proc.poll() is not None, timeout=30, what="serve-hub to start")
    assert len(lines) == 2, proc.poll()
    return proc, lines[0].strip(), lines[1].strip()


def test_serve_hub_flags(hub_root: Path, unused_tcp_port: int):
    cmd = [sys.executable, "-m", "agent", "serve-hub", str(hub_root), "--port", "0"]
    modern = [*cmd, "--cdn-port", str(unused_tcp_port), "--cdn-url-ttl", "5"]
    for argv, expect in [(modern, "2026"), ([*cmd, "--answers", "2024", "--rate-limits"], "2024")]:
        proc, url, said = start_serve_hub(argv)
        try:
            big = httpx.head(f"{url}/{REPO}/resolve/main/{SHARD}")
            location = big.headers["Location"]
            if expect == "2026":
                cdn = f"http://127.0.0.1:{unused_tcp_port}"
                assert said.startswith("serve-hub: answers as the Hub of 2026") and cdn in said, said
                assert location.startswith(f"{cdn}/") and "X-Amz-Expires=5&" in location
            else:
                assert said == "serve-hub: answers as the Hub of 2024, the Hub's rate limits", said
                assert location.startswith(f"{url}/_cdn/")
            assert big.headers["RateLimit"] == '"resolvers";r=2999;t=300'  # on in 2026; asked for in 2024
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            kill_process(proc)
