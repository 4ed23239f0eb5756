"""The agent's three channels (docs/security.md), tried as an attacker would: the network listener
serves probes, metrics and the HF endpoint only; the pods' socket requests models with the pod's
own token; the admin socket (mode 0600) is the node's alone. Request sizes, jobs and long polls
are bounded. Real daemons, a real test hub; the other user is a real `nobody` process.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.core.errors import DaemonError
from agent.core.settings import HF_TOKEN_HEADER
from agent.daemon.node import Daemon
from agent.http.agent_httpx import http_client
from agent.http.client import AgentClient, local_agent_answers
from tests.support.cluster import (
    Origin,
    agent_settings,
    assert_snapshot_verifies,
    socket_dir,
)

GATED = "acme/secret-1"
NODE_TOKEN = "hf_node_token_0123456789abcdef"
POD_TOKEN = "hf_pod_token_fedcba9876543210"


@pytest.fixture
def gated(make_origin) -> Origin:
    tokens = [NODE_TOKEN, POD_TOKEN]
    return make_origin(GATED, total_bytes=2**20, shards=2, seed=3, tokens=tokens, gated=[GATED])


@pytest.fixture
def node(gated: Origin, tmp_path: Path) -> Iterator[Daemon]:
    """An agent holding the node's HF token, with a pods' socket, as the chart runs it."""
    s = agent_settings(tmp_path, "node", gated.hub.url, None)
    daemon_settings = dataclasses.replace(
        s.daemon,
        pods_socket=socket_dir() / f"pods-{os.getpid()}-{tmp_path.name[-20:]}.sock",
        max_jobs_per_client=2,
    )
    s = dataclasses.replace(s, origin=dataclasses.replace(s.origin, token=NODE_TOKEN), daemon=daemon_settings)
    d = Daemon(s)
    d.start()
    try:
        yield d
    finally:
        d.stop()


def pods_url(d: Daemon) -> str:
    return f"unix://{d.settings.daemon.pods_socket}"


def test_the_network_listener_refuses_every_admin_and_model_request(node: Daemon, gated: Origin, tmp_path):
    fetch_and_wait_lent(node)
    secrets_dir = tmp_path / "serviceaccount"
    secrets_dir.mkdir()
    (secrets_dir / "token").write_text("kube-sa-token")
    with httpx.Client(base_url=node.api_url, timeout=10) as net:
        attempts = [
            net.post("/v1/publish", json={"directory": str(secrets_dir), "repo_id": "x/y"}),
            net.delete(f"/v1/models/{GATED}"),
            net.delete(f"/v1/models/{GATED}", params={"force": "true"}),
            net.post("/v1/fetch", json={"repo_id": GATED}),
            net.get("/v1/jobs"),
            net.get("/v1/models"),
            net.post("/v1/blobs/" + "a" * 64 + "/forget"),
        ]
        for resp in attempts:
            assert resp.status_code in (404, 405), (resp.request.method, resp.request.url, resp.status_code)
        # What the network may see still answers.
        assert net.get("/healthz").status_code == 200
        assert net.get("/readyz").status_code == 200
        assert "weightswarm_agent_" in net.get("/metrics").text
    # Nothing happened: the model is still there, nothing was published.
    assert [m["repo_id"] for m in node.list_models()] == [GATED]
    assert not any(p.name.startswith("models--x--y") for p in node.settings.cache_dir.iterdir())


def fetch_and_wait_lent(d: Daemon) -> None:
    job = d.request_model(GATED, lend=True)  # the node's own request (a pod annotation, its CLI)
    assert job.wait(60) and job.status().phase == "Ready", job.status()


def test_metrics_can_be_kept_off_the_network(gated: Origin, tmp_path):
    s = agent_settings(tmp_path, "quiet", gated.hub.url, None)
    s = dataclasses.replace(s, daemon=dataclasses.replace(s.daemon, metrics_on_network=False))
    d = Daemon(s)
    d.start()
    try:
        assert httpx.get(f"{d.api_url}/metrics", timeout=5).status_code == 404
        with http_client(d.admin_url, 5) as admin:
            assert "weightswarm_agent_" in admin.get("/metrics").text
    finally:
        d.stop()


def test_the_pods_socket_fetches_with_the_pods_token_and_nothing_else(node: Daemon, gated: Origin):
    with http_client(pods_url(node), 70) as pods:
        # An anonymous gated request does not spend the node's token.
        anonymous = pods.post("/v1/fetch", json={"repo_id": GATED})
        assert anonymous.status_code == 202
        done = pods.get(f"/v1/jobs/{anonymous.json()['job_id']}", params={"wait": 30}).json()
        assert done["phase"] == "Failed" and "no token" in done["error"], done
        assert not list(node.settings.cache_dir.glob("models--acme--secret-1/snapshots/*/*"))
        # Its own token works.
        own = pods.post("/v1/fetch", json={"repo_id": GATED}, headers={HF_TOKEN_HEADER: POD_TOKEN})
        done = pods.get(f"/v1/jobs/{own.json()['job_id']}", params={"wait": 50}).json()
        assert done["phase"] == "Ready", done
        assert_snapshot_verifies(done["snapshot"], gated)
        # Admin routes and listings are not on this channel.
        for resp in (
            pods.delete(f"/v1/models/{GATED}", params={"force": "true"}),
            pods.post("/v1/publish", json={"directory": "/", "repo_id": "x/y"}),
            pods.post("/v1/blobs/" + "a" * 64 + "/forget"),
            pods.get("/v1/jobs"),
            pods.get("/v1/models"),
        ):
            assert resp.status_code in (404, 405), (resp.request.method, resp.request.url, resp.status_code)
    assert [m["repo_id"] for m in node.list_models()] == [GATED]


def _connect_as_nobody(path: Path) -> str:
    """Try to connect to the unix socket `path` as user `nobody` (a separate process); its outcome."""
    code = (
        "import os, socket, sys\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_only_the_agents_user_can_reach_the_admin_socket(node: Daemon):
    admin = node.admin_socket
    assert stat.S_IMODE(admin.stat().st_mode) == 0o600
    assert _connect_as_nobody(admin) == "PermissionError"
    # The pods' socket is for any user of a pod that can mount its directory.
    pods = node.settings.daemon.pods_socket
    assert pods is not None and stat.S_IMODE(pods.stat().st_mode) == 0o666
    assert _connect_as_nobody(pods) == "connected"


def test_a_second_agent_cannot_take_over_a_live_socket_and_a_stale_one_is_replaced(
    node: Daemon, tmp_path, gated
):
    s = agent_settings(tmp_path, "second", gated.hub.url, None)
    s = dataclasses.replace(s, daemon=dataclasses.replace(s.daemon, admin_socket=node.admin_socket))
    with pytest.raises(Exception, match="another agent serves"):
        Daemon(s)
    stale = socket_dir() / f"stale-{tmp_path.name[-20:]}.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))
    dead.close()  # the file stays, nobody listens: what a killed agent leaves
    s = dataclasses.replace(s, daemon=dataclasses.replace(s.daemon, admin_socket=stale))
    d = Daemon(s)
    d.start()
    try:
        with http_client(d.admin_url, 5) as admin:
            assert admin.get("/healthz").status_code == 200
    finally:
        d.stop()
    assert not stale.exists()


def test_jobs_are_bounded_per_client_and_answer_429(node: Daemon, gated: Origin):
    gated.hub.rate_total = 64 * 1024  # keeps the jobs running
    with http_client(pods_url(node), 10) as pods:
        codes = [
            pods.post(
                "/v1/fetch",
                json={"repo_id": GATED, "include": [f"*{i}*"]},
                headers={HF_TOKEN_HEADER: POD_TOKEN},
            )
            for i in range(3)
        ]
    assert [r.status_code for r in codes] == [202, 202, 429], [r.text for r in codes]
    assert "retry later" in codes[2].json()["detail"]
    # The node itself is not limited per client.
    assert node.request_model(GATED, include=["*9*"], lend=True).key.client is None


def test_request_bodies_and_fields_are_bounded(node: Daemon):
    with http_client(pods_url(node), 10) as pods:
        big = pods.post(
            "/v1/fetch", content=b"{" + b" " * 200_000 + b"}", headers={"Content-Type": "application/json"}
        )
        assert big.status_code == 413
        chunked = pods.post(
            "/v1/fetch",
            content=iter([b"{", b" " * 100_000, b"}"]),
            headers={"Content-Type": "application/json"},
        )
        assert chunked.status_code == 413
        long_glob = pods.post("/v1/fetch", json={"repo_id": GATED, "include": ["x" * 10_000]})
        assert long_glob.status_code == 422
        many = pods.post("/v1/fetch", json={"repo_id": GATED, "include": ["*"] * 1000})
        assert many.status_code == 422
    assert node.jobs.all() == []


def test_long_polls_are_bounded_per_channel(node: Daemon, gated: Origin):
    gated.hub.rate_total = 16 * 1024  # the job stays running for the whole test
    with http_client(pods_url(node), 10) as pods:
        job = pods.post("/v1/fetch", json={"repo_id": GATED}, headers={HF_TOKEN_HEADER: POD_TOKEN}).json()
    url = f"/v1/jobs/{job['job_id']}"
    started = threading.Barrier(33)
    held: list[float] = []

    def poll() -> None:
        with http_client(pods_url(node), 30) as c:
            started.wait()
            t0 = time.monotonic()
            c.get(url, params={"wait": 6})
            held.append(time.monotonic() - t0)

    threads = [threading.Thread(target=poll) for _ in range(32)]
    for t in threads:
        t.start()
    with http_client(pods_url(node), 30) as c:
        started.wait()
        time.sleep(1.0)  # the 32 reach the agent and wait
        assert not held
        t0 = time.monotonic()
        extra = c.get(url, params={"wait": 6})
        answered_in = time.monotonic() - t0
    for t in threads:
        t.join(30)
    assert extra.status_code == 200 and extra.json()["phase"] in ("Pending", "Downloading")
    assert answered_in < 3, f"the 33rd long poll was held {answered_in:.1f}s"
    assert len(held) == 32 and min(held) > 4, held


def test_a_long_poll_ends_when_its_job_does(node: Daemon, gated: Origin):
    gated.hub.rate_total = 400 * 1024  # the 1-MiB model takes a few seconds
    with http_client(pods_url(node), 60) as pods:
        job = pods.post("/v1/fetch", json={"repo_id": GATED}, headers={HF_TOKEN_HEADER: POD_TOKEN}).json()
        t0 = time.monotonic()
        polled = pods.get(f"/v1/jobs/{job['job_id']}", params={"wait": 45})
        held = time.monotonic() - t0
    assert polled.status_code == 200 and polled.json()["phase"] == "Ready", polled.text
    assert held < 30, f"the long poll was held {held:.1f}s after its job ended"


def test_a_state_dir_deeper_than_a_socket_path_allows_still_works(gated: Origin, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "state"
    s = agent_settings(tmp_path, "deep", gated.hub.url, None)
    s = dataclasses.replace(s, state_dir=deep)
    d = Daemon(s)
    d.start()
    try:
        assert len(str(d.admin_socket)) > 107 and stat.S_IMODE(d.admin_socket.stat().st_mode) == 0o600
        with http_client(d.admin_url, 5) as admin:
            assert admin.get("/v1/models").json() == []
        # The CLI's own client (the standard library's, agent.http.client) reaches it too.
        assert local_agent_answers(d.admin_url) and AgentClient(d.admin_url).models() == []
    finally:
        d.stop()
    assert not d.admin_socket.exists()


def test_the_cli_client_says_why_an_agent_did_not_do_what_it_asked(node: Daemon, gated: Origin, tmp_path):
    """agent.http.client, the CLI's (`agent fetch --agent`, `agent ls`, `agent wait`), on each channel."""
    admin = AgentClient(node.admin_url)
    job = admin.start_fetch(GATED, "main", [], [], token=POD_TOKEN)
    while job["phase"] not in ("Ready", "Failed"):
        job = admin.job(job["job_id"], wait=1.0)
    assert job["phase"] == "Ready" and [m["repo_id"] for m in admin.models()] == [GATED]
    with pytest.raises(DaemonError, match=r"refused /v1/models/acme/absent: .*acme/absent"):
        admin.remove_model("acme/absent", None)
    # The network listener answers its probes, and no admin request.
    assert local_agent_answers(node.api_url)
    with pytest.raises(DaemonError, match=r"refused /v1/models"):
        AgentClient(node.api_url).models()
    # Nobody there: a socket that does not exist, a port nothing listens on.
    gone = f"unix://{tmp_path / 'gone.sock'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    for url in (gone, closed):
        assert not local_agent_answers(url)
        with pytest.raises(DaemonError, match=r"cannot be reached \((FileNotFound|ConnectionRefused)Error\)"):
            AgentClient(url).models()
    assert [m["repo_id"] for m in admin.models()] == [GATED]
