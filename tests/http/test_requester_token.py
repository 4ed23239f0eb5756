"""The requester's HF token travels with its request to the daemon and is used for that request's
origin calls (`agent fetch --agent --token`, `agent wait --token`, `POST /v1/fetch` with `X-HF-Token`);
without one the node's token is lent only to the node itself (its admin channel, pod annotations),
never on the pods' socket or the HF endpoint. Tokens never reach logs,
disk or job statuses, and a refusal says which token was used.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.core.settings import HF_TOKEN_HEADER
from agent.daemon.node import Daemon
from agent.http.agent_httpx import http_client
from tests.support.cluster import (
    BIN,
    AgentProcess,
    Origin,
    admin_request,
    agent_settings,
    assert_snapshot_verifies,
    socket_dir,
)
from tests.support.cluster import agent_cli as _cli

GOOD = "hf_requester_good_token_0123456789"
WRONG = "hf_requester_wrong_token_987654321"
NODE = "hf_node_token_abcdefabcdef0123"
SECRET = "acme/secret"


@pytest.fixture
def gated(make_origin) -> Origin:
    # The node's own token is a valid one too, so lending it would work: the tests show when it is not lent.
    return make_origin(
        SECRET, total_bytes=2**20, shards=2, seed=5, root="gated-hub", tokens=[GOOD, NODE], gated=[SECRET]
    )


def _no_token_anywhere(*places: Path) -> None:
    checked = 0
    for place in places:
        for path in [place] if place.is_file() else place.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                checked += 1
                for token in (GOOD, WRONG):
                    assert token.encode() not in data, f"{token[:10]}… found in {path}"
    assert checked >= 5, f"only {checked} files looked at"


def test_agent_fetch_and_wait_pass_the_users_token_to_the_daemon(gated, tracker, tmp_path):
    agent = AgentProcess(tmp_path, "a", gated.hub.url, tracker)  # started with no HF token of its own
    try:
        agent.start()
        r = _cli("fetch", SECRET, "--agent", agent.url)
        assert r.returncode == 4, r.stderr  # EXIT_AUTH, carried from the daemon's job
        assert "no token" in r.stderr and "Traceback" not in r.stderr

        r = _cli("fetch", SECRET, "--agent", agent.url, "--token", WRONG)
        assert r.returncode == 4 and "the requester's token" in r.stderr, r.stderr

        r = _cli("wait", SECRET, "--agent", agent.url, "--token", GOOD, "--timeout", "120")
        assert r.returncode == 0, r.stderr
        assert_snapshot_verifies(r.stdout.strip().splitlines()[-1], gated)

        # $HF_TOKEN is the user's token too, as for huggingface_hub.
        env = {"PATH": str(BIN), "HF_TOKEN": GOOD, "HOME": str(tmp_path)}
        r = subprocess.run(
            [str(BIN / "agent"), "fetch", SECRET, "--agent", agent.url],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        jobs = admin_request(agent.url, "GET", "/v1/jobs", timeout=10).text
    finally:
        agent.stop()
    assert GOOD not in jobs and WRONG not in jobs
    _no_token_anywhere(agent.log, agent.state_dir, agent.cache_dir)


def _daemon(tmp_path: Path, origin: Origin) -> Daemon:
    s = agent_settings(tmp_path, "node", origin.hub.url, None)
    pods = socket_dir() / f"pods-{tmp_path.name[-12:]}.sock"
    s = dataclasses.replace(
        s,
        origin=dataclasses.replace(s.origin, token=NODE),
        daemon=dataclasses.replace(s.daemon, pods_socket=pods),
    )
    d = Daemon(s)
    d.start()
    return d


def _fetch(url: str, token: str | None) -> dict:
    headers = {HF_TOKEN_HEADER: token} if token else {}
    with http_client(url, timeout=70) as agent:
        resp = agent.post("/v1/fetch", json={"repo_id": SECRET}, headers=headers)
        assert resp.status_code == 202, resp.text
        done: dict = agent.get(f"/v1/jobs/{resp.json()['job_id']}", params={"wait": 50}).json()
    assert done["phase"] in ("Ready", "Failed"), done
    return done


def test_the_nodes_token_is_lent_to_the_node_itself_never_to_pods(gated, tmp_path):
    daemon = _daemon(tmp_path, gated)
    try:
        pods = f"unix://{daemon.settings.daemon.pods_socket}"
        # A pod asking without a token of its own fetches anonymously: refused by the gated origin.
        anonymous = _fetch(pods, None)
        assert anonymous["phase"] == "Failed" and "no token" in anonymous["error"], anonymous
        # With its own token it gets the model.
        own = _fetch(pods, GOOD)
        assert own["phase"] == "Ready", own
        assert_snapshot_verifies(own["snapshot"], gated)
        daemon.stop()  # drop the cached model: the node's own request must fetch it again
        shutil.rmtree(daemon.settings.cache_dir)
        daemon = _daemon(tmp_path, gated)
        # The node's own channel (its operator, `agent fetch` on the node) and pod annotations borrow it.
        lent = _fetch(daemon.admin_url, None)
        assert lent["phase"] == "Ready", lent
        annotation = daemon.request_model(SECRET, lend=True)
        assert annotation.wait(30) and annotation.status().phase == "Ready"
        # request_model's default (the HF endpoint's and the pods' channel) does not lend.
        assert daemon.request_model(SECRET).key.requester == ""
    finally:
        daemon.stop()


def test_requests_with_different_tokens_do_not_join_each_others_job(gated, tmp_path):
    daemon = _daemon(tmp_path, gated)
    try:
        refused = daemon.request_model(SECRET, token=WRONG)
        allowed = daemon.request_model(SECRET, token=GOOD)
        assert allowed is not refused  # even while the refused one may still be running
        same = daemon.request_model(SECRET, token=GOOD)
        assert same is allowed or allowed.done
        assert refused.wait(60) and allowed.wait(60)
        refusal = refused.status()
        assert refusal.phase == "Failed" and "the requester's token" in (refusal.error or ""), refusal
        assert allowed.status().phase == "Ready", allowed.status()
        assert GOOD not in repr(allowed.key) and WRONG not in repr(refused.key)
    finally:
        daemon.stop()
