"""The HF-compatible hub, driven by the real huggingface_hub client, httpx and raw sockets."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from safetensors import safe_open

from agent.cli.main import main as agent_main
from agent.hub.ranges import parse_range
from agent.hub.repos import git_blob_sha1
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model, parse_size
from tests.support.cluster import repo_files, write_models
from tests.support.fetchkit import sha256
from tests.support.procs import kill_process, loop_until, require

MiB = 2**20
REPO = "org/model"
GATED = "org/gated"
PRIVATE = "org/private"
TOKEN = "hf_test_token_123"


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    make_model(root, REPO, total_bytes=8 * MiB, shards=2, seed=1)
    nested = root / REPO / "sub" / "deeper"
    nested.mkdir(parents=True)
    (nested / "notes.txt").write_text("nested file\n")
    (root / REPO / "sub" / "b.txt").write_text("b\n")
    write_models(root, (GATED, PRIVATE), total_bytes=1 * MiB, shards=1, seed=2)
    return root


@pytest.fixture
def hub(hub_root: Path, make_hub) -> HubServer:
    return make_hub(hub_root, tokens=[TOKEN], gated=[GATED], private=[PRIVATE], tree_page_size=3)


# -- the real huggingface_hub client --------------------------------------------------------------


def test_snapshot_download_is_byte_identical_and_loads(hub: HubServer, hub_root: Path, tmp_path: Path):
    path = Path(snapshot_download(REPO, endpoint=hub.url, cache_dir=tmp_path / "cache"))
    assert path.name == hub.commit_for(REPO)
    expected = repo_files(hub_root, REPO)
    got = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert got == expected
    index = json.loads(got["model.safetensors.index.json"])
    seen: dict[str, str] = {}
    for shard in sorted({*index["weight_map"].values()}):
        with safe_open(str(path / shard), framework="numpy") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                assert f.get_tensor(name).nbytes > 0
                seen[name] = shard
    assert seen == index["weight_map"]
    # LFS files went through the redirect to the CDN, small files through the one to resolve-cache.
    statuses = {(r.method, r.path.split("/")[-1]): r.status for r in hub.requests if "/resolve/" in r.path}
    assert statuses[("HEAD", "model-00001-of-00002.safetensors")] == 302
    assert statuses[("HEAD", "config.json")] == 307
    cached = [
        (r.method, r.path.split("/")[-1], r.status) for r in hub.requests if "/resolve-cache/" in r.path
    ]
    assert ("GET", "config.json", 200) in cached
    assert any(r.bucket == "cdn" and r.status == 200 for r in hub.requests)


def test_gated_repo_needs_a_valid_token(hub: HubServer, hub_root: Path, tmp_path: Path):
    path = Path(snapshot_download(GATED, endpoint=hub.url, cache_dir=tmp_path / "ok", token=TOKEN))
    assert (path / "model.safetensors").read_bytes() == (hub_root / GATED / "model.safetensors").read_bytes()
    with pytest.raises(GatedRepoError):
        snapshot_download(GATED, endpoint=hub.url, cache_dir=tmp_path / "anon", token=False)
    with pytest.raises(HfHubHTTPError) as wrong:
        hf_hub_download(GATED, "config.json", endpoint=hub.url, cache_dir=tmp_path / "bad", token="hf_wrong")
    assert wrong.value.response.status_code == 401
    assert not isinstance(wrong.value, GatedRepoError)
    # The repo's metadata stays visible without a token, as on the Hub.
    assert HfApi(endpoint=hub.url, token=False).model_info(GATED).gated == "auto"


def test_private_and_missing_repos_look_alike(hub: HubServer, tmp_path: Path):
    anon = HfApi(endpoint=hub.url, token=False)
    authed = HfApi(endpoint=hub.url, token=TOKEN)
    for api, repo_id, status in [(anon, PRIVATE, 401), (anon, "org/nope", 401), (authed, "org/nope", 404)]:
        with pytest.raises(RepositoryNotFoundError) as err:
            api.model_info(repo_id)
        assert err.value.response.status_code == status
    assert authed.model_info(PRIVATE).private is True
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(PRIVATE, "config.json", endpoint=hub.url, cache_dir=tmp_path / "c", token=False)


def test_unknown_revision_and_file(hub: HubServer, tmp_path: Path):
    api = HfApi(endpoint=hub.url, token=False)
    for revision in ("nope", "0" * 40):
        with pytest.raises(RevisionNotFoundError):
            api.model_info(REPO, revision=revision)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="dev", endpoint=hub.url, cache_dir=tmp_path / "c")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.json", endpoint=hub.url, cache_dir=tmp_path / "c")


def test_hf_hub_download_nested_file(hub: HubServer, hub_root: Path, tmp_path: Path):
    path = Path(hf_hub_download(REPO, "sub/deeper/notes.txt", endpoint=hub.url, cache_dir=tmp_path / "c"))
    assert path.read_bytes() == (hub_root / REPO / "sub/deeper/notes.txt").read_bytes()
    assert path.parent.parent.parent.name == hub.commit_for(REPO)


def test_list_repo_tree_paginates_with_hub_oids(hub: HubServer, hub_root: Path):
    api = HfApi(endpoint=hub.url, token=False)
    entries = list(api.list_repo_tree(REPO, recursive=True))
    pages = [r for r in hub.requests if "/tree/" in r.path]
    files = repo_files(hub_root, REPO)
    assert len(pages) == -(-len(entries) // 3) > 2
    listed_files = {e.path: e for e in entries if hasattr(e, "size")}
    assert set(listed_files) == set(files)
    assert {e.path for e in entries if not hasattr(e, "size")} == {"sub", "sub/deeper"}
    for path, data in files.items():
        entry = listed_files[path]
        assert entry.size == len(data)
        if path.endswith(".safetensors"):
            assert entry.lfs is not None and entry.lfs.sha256 == sha256(data) and entry.lfs.size == len(data)
        else:
            assert entry.lfs is None and entry.blob_id == git_blob_sha1(data)
    top = [e.path for e in api.list_repo_tree(REPO, path_in_repo="sub")]
    assert top == ["sub/b.txt", "sub/deeper"]


def test_model_info_with_files_metadata(hub: HubServer, hub_root: Path):
    info = HfApi(endpoint=hub.url, token=False).model_info(REPO, files_metadata=True)
    assert info.id == REPO and info.sha == hub.commit_for(REPO)
    files = repo_files(hub_root, REPO)
    assert {s.rfilename for s in info.siblings or []} == set(files)
    for sibling in info.siblings or []:
        assert sibling.size == len(files[sibling.rfilename])
        if sibling.rfilename.endswith(".safetensors"):
            assert sibling.lfs is not None and sibling.lfs.sha256 == sha256(files[sibling.rfilename])


def test_commit_moves_and_old_commits_stay_resolvable(tmp_path: Path):
    root = tmp_path / "hub"
    make_model(root, REPO, total_bytes=64 * 1024, shards=1)
    with HubServer(root) as srv, httpx.Client(base_url=srv.url, follow_redirects=True) as client:
        assert srv.warm() == 1
        old = srv.commit_for(REPO)
        assert srv.commit_for(REPO, old) == old
        (root / REPO / "README.md").write_text("changed\n")
        new = srv.commit_for(REPO)
        assert new != old
        assert client.get(f"/api/models/{REPO}/revision/{old}").json()["sha"] == old
        # Unchanged file of the old commit: served; changed file: 404 rather than the wrong bytes.
        assert client.get(f"/{REPO}/resolve/{old}/config.json").status_code == 200
        gone = client.get(f"/{REPO}/resolve/{old}/README.md")
        assert gone.status_code == 404 and gone.headers["X-Error-Code"] == "EntryNotFound"
        assert client.get(f"/{REPO}/resolve/{new}/README.md").content == b"changed\n"
        # A half-written file is not part of any commit.
        (root / REPO / "big.bin.incomplete").write_bytes(b"x" * 10)
        assert srv.commit_for(REPO) == new


# -- HTTP details ---------------------------------------------------------------------------------


def test_head_headers_small_file_and_lfs_redirect(hub: HubServer, hub_root: Path):
    commit = hub.commit_for(REPO)
    config = (hub_root / REPO / "config.json").read_bytes()
    shard = (hub_root / REPO / "model-00002-of-00002.safetensors").read_bytes()
    with httpx.Client(base_url=hub.url, follow_redirects=True) as client:
        small = client.head(f"/{REPO}/resolve/main/config.json")
        assert [r.status_code for r in small.history] == [307] and small.status_code == 200
        assert small.headers["ETag"] == f'"{git_blob_sha1(config)}"'
        assert small.headers["X-Repo-Commit"] == commit
        assert int(small.headers["Content-Length"]) == len(config)
        assert small.headers["Accept-Ranges"] == "bytes" and small.headers["X-Request-Id"]
        shard_url = f"/{REPO}/resolve/{commit}/model-00002-of-00002.safetensors"
        big = client.head(shard_url, follow_redirects=False)
        assert big.status_code == 302
        assert big.headers["X-Linked-Etag"] == f'"{sha256(shard)}"'
        assert int(big.headers["X-Linked-Size"]) == len(shard)
        assert big.headers["X-Repo-Commit"] == commit
        location = big.headers["Location"]
        assert location.startswith(f"{hub.cdn_url}/") and hub.cdn_url != hub.url
        assert client.get(location).content == shard
        tampered = client.get(location.replace("X-Amz-Signature=", "X-Amz-Signature=0"))
        assert tampered.status_code == 403


def test_cdn_url_needs_no_authorization_even_for_gated(hub: HubServer, hub_root: Path):
    with httpx.Client(base_url=hub.url) as client:
        redirect = client.head(
            f"/{GATED}/resolve/main/model.safetensors", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert redirect.status_code == 302
        body = client.get(redirect.headers["Location"]).content
    assert body == (hub_root / GATED / "model.safetensors").read_bytes()


def test_ranges(hub: HubServer, hub_root: Path):
    data = (hub_root / REPO / "config.json").read_bytes()
    size = len(data)
    url = f"/{REPO}/resolve/main/config.json"
    with httpx.Client(base_url=hub.url, follow_redirects=True) as client:
        for header, (start, end) in [
            ("bytes=2-9", (2, 9)),
            ("bytes=5-", (5, size - 1)),
            ("bytes=-7", (size - 7, size - 1)),
            (f"bytes=3-{size * 2}", (3, size - 1)),
        ]:
            r = client.get(url, headers={"Range": header})
            assert r.status_code == 206, header
            assert r.content == data[start : end + 1]
            assert r.headers["Content-Range"] == f"bytes {start}-{end}/{size}"
        r = client.get(url, headers={"Range": f"bytes={size}-"})
        assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{size}"
        assert client.get(url, headers={"Range": "bytes=0-1,4-5"}).content == data  # multi-range: whole body
    assert parse_range("bytes=-0", 10) == "unsatisfiable"
    assert parse_range("bytes=5-2", 10) is None and parse_range("items=0-1", 10) is None


def raw_get(url: str, path: str) -> int:
    """A request whose path goes out exactly as written (httpx would normalise `..`)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_rejects_dot_dot(hub: HubServer):
    (hub.root / "secret.txt").write_text("not a repo file")
    for path in [
        f"/{REPO}/resolve/main/../../secret.txt",
        f"/{REPO}/resolve/main/%2E%2E/%2E%2E/secret.txt",
        f"/{REPO}/resolve/main/sub/..%2F..%2F..%2Fsecret.txt",
        f"/api/models/{REPO}/tree/main/..%2F..",
    ]:
        assert raw_get(hub.url, path) == 400, path
    assert raw_get(hub.url, "/api/models/../org") in (401, 404)
    assert raw_get(hub.url, "/org/../resolve/main/secret.txt") in (401, 404)


def test_error_headers_cannot_be_injected_from_the_path(hub: HubServer):
    host, port = hub.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", f"/{REPO}/resolve/main/a%0D%0AX-Evil:%201%C3%A9.json")
        response = conn.getresponse()
        response.read()
        assert response.status == 404 and response.getheader("X-Error-Code") == "EntryNotFound"
        assert response.getheader("X-Evil") is None
    finally:
        conn.close()


def test_keep_alive_serves_several_requests_on_one_connection(hub: HubServer):
    host, port = hub.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", f"/{REPO}/resolve/main/config.json", headers={"Range": "bytes=0-3"})
            redirect = conn.getresponse()
            assert redirect.status == 307 and redirect.read()  # its short body read: the connection goes on
            conn.request("GET", redirect.getheader("Location", ""), headers={"Range": "bytes=0-3"})
            response = conn.getresponse()
            assert response.status == 206 and response.read() == b"{\n  "
    finally:
        conn.close()


def test_a_request_is_recorded_before_its_answer_and_a_malformed_one_is_refused(hub: HubServer):
    host, port = hub.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n")  # the stdlib's limit is 100
        assert sock.recv(64).startswith(b"HTTP/1.1 431 "), "too many headers: answered, not dropped"
    for _ in range(20):  # recorded when the status line is written: the client sees it right away
        before = len(hub.requests)
        assert httpx.get(f"{hub.url}/api/models/{REPO}").status_code == 200
        assert len(hub.requests) == before + 1 and hub.requests[-1].path == f"/api/models/{REPO}"


def test_the_listen_backlog_holds_a_fleet_asking_at_once(hub: HubServer):
    """socketserver's default backlog (5) dropped SYNs when 32 nodes planned a fetch at once; the
    kernel's own figure for the listening socket (ss's Send-Q) is what the server asked for."""
    if shutil.which("ss") is None:
        require("ss", "Debian package iproute2 (./dev installs it)")
    port = hub.url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=10)
    (line,) = out.stdout.splitlines()
    backlog = int(line.split()[2])
    assert backlog >= 128, line


# -- faults ---------------------------------------------------------------------------------------


def test_status_queue_then_normal(hub: HubServer):
    hub.faults.status_queue = [(429, {"Retry-After": "1", "X-Error-Code": "RateLimited"}), (503, {})]
    url = f"/{REPO}/resolve/main/config.json"
    with httpx.Client(base_url=hub.url, follow_redirects=True) as client:
        first = client.get(url)
        assert first.status_code == 429 and first.headers["Retry-After"] == "1"
        assert first.headers["X-Error-Code"] == "RateLimited" and "error" in first.json()
        assert client.get(url).status_code == 503
        assert client.get(url).status_code == 200
        hub.faults.status_queue = [(500, {})]
        hub.faults.status_methods = frozenset({"GET"})
        assert client.head(url).status_code == 200
        assert client.get(url).status_code == 500
        hub.faults.reset()
        assert hub.faults.status_methods == frozenset({"GET", "HEAD"})


def test_ignore_range(hub: HubServer, hub_root: Path):
    hub.faults.ignore_range = True
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    r = httpx.get(url, headers={"Range": "bytes=0-3"}, follow_redirects=True)
    assert r.status_code == 200 and r.content == (hub_root / REPO / "config.json").read_bytes()


def cdn_url(hub: HubServer, path: str) -> str:
    return httpx.head(f"{hub.url}/{REPO}/resolve/main/{path}").headers["Location"]


def test_truncated_body_drops_the_connection(hub: HubServer, hub_root: Path):
    shard = "model-00001-of-00002.safetensors"
    data = (hub_root / REPO / shard).read_bytes()
    url = cdn_url(hub, shard)
    hub.faults.truncate_after = 100_000
    hub.faults.truncate_times = 1
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream("GET", url) as r:
        assert int(r.headers["Content-Length"]) == len(data)
        for chunk in r.iter_bytes():
            received += chunk
    assert bytes(received) == data[:100_000]
    assert httpx.get(url).content == data  # truncate_times used up


def test_corrupt_all_or_some_paths(hub: HubServer, hub_root: Path):
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    data1, data2 = ((hub_root / REPO / s).read_bytes() for s in (shard1, shard2))
    url1, url2 = cdn_url(hub, shard1), cdn_url(hub, shard2)
    hub.faults.corrupt_paths = {shard1}
    got1 = httpx.get(url1).content
    assert len(got1) == len(data1) and sha256(got1) != sha256(data1)
    assert httpx.get(url2).content == data2
    ranged = httpx.get(url1, headers={"Range": "bytes=1000-1999"}).content
    assert ranged != data1[1000:2000] and ranged[1:] == data1[1001:2000]
    hub.faults.reset()
    hub.faults.corrupt = True
    hub.faults.corrupt_times = 1
    small = httpx.get(f"{hub.url}/{REPO}/resolve/main/config.json", follow_redirects=True).content
    assert small != (hub_root / REPO / "config.json").read_bytes()
    assert httpx.get(url2).content == data2


def test_stall_triggers_a_read_timeout(hub: HubServer):
    url = cdn_url(hub, "model-00001-of-00002.safetensors")
    hub.faults.stall_seconds = 2.0
    hub.faults.stall_after = 50_000
    received = bytearray()
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout), httpx.stream("GET", url, timeout=httpx.Timeout(10, read=0.5)) as r:
        for chunk in r.iter_bytes():
            received += chunk
    assert len(received) == 50_000
    assert time.monotonic() - started < 5


# -- bandwidth and counters -----------------------------------------------------------------------


def timed_get(
    url: str, headers: dict[str, str], results: list[tuple[int, float]], local_address: str | None = None
) -> None:
    started = time.monotonic()
    with httpx.Client(transport=httpx.HTTPTransport(local_address=local_address), timeout=30) as client:
        body = client.get(url, headers=headers).content
    results.append((len(body), time.monotonic() - started))


def run_all(threads: list[threading.Thread]) -> float:
    """Start the threads, wait for them all (30 s each at most); how long that took."""
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return time.monotonic() - started


@pytest.mark.parametrize("cap", ["total", "per_connection"])
def test_rate_caps(hub_root: Path, cap: str):
    rate, part, conns = 2 * MiB, MiB, 4
    kwargs = {"rate_total": rate} if cap == "total" else {"rate_per_connection": rate}
    with HubServer(hub_root, **kwargs) as srv:  # type: ignore[arg-type]
        url = cdn_url(srv, "model-00001-of-00002.safetensors")
        results: list[tuple[int, float]] = []
        threads = [
            threading.Thread(
                target=timed_get, args=(url, {"Range": f"bytes={i * part}-{(i + 1) * part - 1}"}, results)
            )
            for i in range(conns)
        ]
        elapsed = run_all(threads)
    assert [n for n, _ in results] == [part] * conns
    rates = sorted(n / dt for n, dt in results)
    # The caps are upper bounds, which load cannot break; the lower bounds leave a loaded machine 2x.
    if cap == "total":  # 4 MiB through one 2 MiB/s bucket, whatever the connections
        measured = conns * part / elapsed
        assert 0.5 * rate <= measured <= 1.15 * rate, f"{measured / MiB:.2f} MiB/s vs cap {rate / MiB} MiB/s"
    else:  # each connection on its own 2 MiB/s: one bucket shared by all 4 would give each 0.5 MiB/s
        assert 0.5 * rate <= rates[0] and rates[-1] <= 1.15 * rate, [f"{r / MiB:.2f}" for r in rates]


def test_egress_counter_and_stats_route(hub: HubServer):
    hub.reset_counters()
    with httpx.Client(base_url=hub.url, follow_redirects=True) as client:
        r = client.get(f"/{REPO}/resolve/main/config.json", headers={"Range": "bytes=0-99"})
        assert len(r.content) == 100
        redirect_body = int(r.history[0].headers["Content-Length"])  # the 307's own short body
        client.head(f"/{REPO}/resolve/main/config.json")
        info = client.get(f"/api/models/{REPO}")
        stats = client.get("/_weightswarm/stats").json()
        counts = {"api": 1, "resolvers": 4, "cdn": 0}
        egress = redirect_body + 100 + len(info.content)
        assert stats == {"egress_bytes": egress, "requests": 5, "counts": counts}
        assert hub.egress_bytes == stats["egress_bytes"] and hub.counts() == counts
        assert [(r.method, r.range, r.status) for r in hub.requests] == [
            ("GET", "bytes=0-99", 307),
            ("GET", "bytes=0-99", 206),
            ("HEAD", None, 307),
            ("HEAD", None, 200),
            ("GET", None, 200),
        ]
        assert client.post("/_weightswarm/reset").status_code == 200
    assert hub.egress_bytes == 0 and hub.requests == []


def test_a_body_the_client_closes_halfway_counts_the_bytes_it_sent(tmp_path: Path):
    """The fetch engine closes a hedged range halfway. Counted per whole sendfile call, none of such a
    body reached the stats, and a cold start, which cannot take less than one copy from the origin,
    read 0.95 x S (bench.swarm, 8 nodes). Counted as the kernel took it, it counted the send buffer
    too, which the kernel drops with the connection: what the client acknowledged is what went out."""
    make_model(tmp_path, REPO, total_bytes=64 * MiB, shards=1, seed=4)
    shard = next(p.name for p in (tmp_path / REPO).glob("*.safetensors"))
    with HubServer(tmp_path) as srv:
        cdn = httpx.head(f"{srv.url}/{REPO}/resolve/main/{shard}").headers["location"]  # LFS: a redirect
        path = httpx.URL(cdn).raw_path.decode()
        sock = socket.create_connection(("127.0.0.1", srv.cdn_port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        request = f"GET {path} HTTP/1.1\r\nHost: x\r\nRange: bytes=0-\r\n\r\n"
        sock.sendall(request.encode())
        got = 0
        while got < 4 * MiB:
            data = sock.recv(MiB)
            assert data, "the origin closed the connection first"
            got += len(data)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # with unread data and linger 0: a reset, as a closed hedged range
        loop_until(
            lambda: srv.counts()["cdn"] >= 1, timeout=10, what="the body to end (its request recorded)"
        )
        time.sleep(0.5)
        # What the client took, and at most its receive buffer more: not the origin's send buffer
        # (megabytes the kernel had taken and dropped with the connection), nor the whole body.
        assert 4 * MiB <= srv.egress_bytes <= 5 * MiB, srv.egress_bytes


# -- test models ----------------------------------------------------------------------------------


def test_make_model_is_deterministic_and_valid(tmp_path: Path):
    a = make_model(tmp_path / "a", "org/m", total_bytes=3 * MiB + 6, shards=1, seed=7, dtype="BF16")
    b = make_model(tmp_path / "b", "org/m", total_bytes=3 * MiB + 6, shards=1, seed=7, dtype="BF16")
    make_model(tmp_path / "c", "org/m", total_bytes=3 * MiB + 6, shards=1, seed=8, dtype="BF16")
    names = sorted(p.name for p in a)
    assert "model.safetensors" in names and "model.safetensors.index.json" not in names
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert (tmp_path / "a/org/m/model.safetensors").read_bytes() != (
        tmp_path / "c/org/m/model.safetensors"
    ).read_bytes()
    shard = tmp_path / "a/org/m/model.safetensors"
    header_len = int.from_bytes(shard.read_bytes()[:8], "little")
    header = json.loads(shard.read_bytes()[8 : 8 + header_len])
    spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] == 3 * MiB + 6 == shard.stat().st_size - 8 - header_len
    with safe_open(str(shard), framework="numpy") as f:
        assert len(list(f.keys())) == len(spans)
    assert not list((tmp_path / "a").rglob("*.incomplete"))


def test_parse_size():
    assert parse_size("64MiB") == 64 * MiB and parse_size("2GB") == 2 * 10**9
    assert parse_size("1.5KiB") == 1536 and parse_size("123") == 123
    with pytest.raises(ValueError):
        parse_size("lots")


# -- CLI ------------------------------------------------------------------------------------------


def test_make_test_model_command(tmp_path: Path):
    result = CliRunner().invoke(
        agent_main, ["make-test-model", str(tmp_path), "org/cli", "--size", "1MiB", "--shards", "2"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "org/cli/model-00002-of-00002.safetensors").is_file()
    bad = CliRunner().invoke(agent_main, ["make-test-model", str(tmp_path), "org/cli", "--size", "huge"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "not a size" in bad.output


def test_serve_hub_command_bad_input(tmp_path: Path):
    missing = CliRunner().invoke(agent_main, ["serve-hub", str(tmp_path / "nope"), "--port", "0"])
    assert missing.exit_code == 2 and "not a directory" in missing.output
    (tmp_path / "empty").write_text("# no tokens\n")
    empty = CliRunner().invoke(
        agent_main, ["serve-hub", str(tmp_path), "--token-file", str(tmp_path / "empty")]
    )
    assert empty.exit_code == 2 and "holds no token" in empty.output


def test_serve_hub_command_serves_until_sigterm(hub_root: Path, tmp_path: Path):
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# accepted tokens\n{TOKEN}\n")
    cmd = [
        sys.executable,
        "-m",
        "agent",
        "serve-hub",
        str(hub_root),
        "--port",
        "0",
        "--token-file",
        str(token_file),
        "--gated",
        GATED,
        "--access-log",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert proc.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        loop_until(lambda: line or proc.poll() is not None, timeout=30, what="serve-hub to print its URL")
        url = line[0].strip() if line else ""
        assert url.startswith("http://127.0.0.1:"), (
            url,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        assert httpx.get(f"{url}/api/models/{REPO}").json()["sha"]
        gated = f"{url}/{GATED}/resolve/main/config.json"
        assert httpx.get(gated).status_code == 401
        authed = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(gated, headers=authed, follow_redirects=True).status_code == 200
        signed = f"{url}/{REPO}/resolve/main/config.json?sig=s3cr3t"
        assert httpx.get(signed, headers={"Range": "bytes=0-9"}, follow_redirects=True).status_code == 206
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
        assert TOKEN not in stderr and "s3cr3t" not in stderr
        # The access log: a line per request, the client first (who asked the origin for what).
        access = [line.split(" ", 2)[2] for line in stderr.splitlines() if " GET /" in line]
        gated_commit, commit = (HubServer(hub_root).commit_for(r) for r in (GATED, REPO))
        assert access == [
            f"127.0.0.1 GET /api/models/{REPO} - 200",
            f"127.0.0.1 GET /{GATED}/resolve/main/config.json - 401",
            f"127.0.0.1 GET /{GATED}/resolve/main/config.json - 307",
            f"127.0.0.1 GET /api/resolve-cache/models/{GATED}/{gated_commit}/config.json - 200",
            f"127.0.0.1 GET /{REPO}/resolve/main/config.json bytes=0-9 307",
            f"127.0.0.1 GET /api/resolve-cache/models/{REPO}/{commit}/config.json bytes=0-9 206",
        ], stderr
    finally:
        kill_process(proc)


def test_a_per_client_cap_is_shared_by_one_address_and_not_by_two(hub_root: Path):
    """As a CDN's per-IP limit: four connections from one address share one 2 MiB/s bucket, a second
    address has a bucket of its own (two loopback addresses stand for two nodes)."""
    rate, part = 2 * MiB, MiB
    with HubServer(hub_root, rate_per_client=rate) as srv:
        url = cdn_url(srv, "model-00001-of-00002.safetensors")
        results: dict[str, list[tuple[int, float]]] = {"127.0.0.1": [], "127.0.0.2": []}
        threads = [
            threading.Thread(
                target=timed_get,
                args=(url, {"Range": f"bytes={i * part}-{(i + 1) * part - 1}"}, results[address]),
                kwargs={"local_address": address},
            )
            for address in results
            for i in range(4 if address == "127.0.0.1" else 1)
        ]
        elapsed = run_all(threads)
    assert [n for n, _ in results["127.0.0.1"]] == [part] * 4
    shared = 4 * part / max(dt for _, dt in results["127.0.0.1"])
    assert shared <= 1.15 * rate, f"one address drew {shared / MiB:.2f} MiB/s, cap {rate / MiB} MiB/s"
    ((n, dt),) = results["127.0.0.2"]
    # Its own bucket: 1 MiB in about half a second, not in the 2 s of a fifth share of one bucket.
    assert n == part and dt < 1.0 < elapsed, (dt, elapsed)
