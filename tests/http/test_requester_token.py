"""The requester's HF token travels with its request to the daemon and is used for that request's
origin calls (`agent fetch --agent --token`, `agent wait --token`, `POST /v1/fetch` with `X-HF-Token`);
without one the node's token is lent only where the deployment allows it. Tokens never reach logs,
disk or job statuses, and a refusal says which token was used.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.core.settings import HF_TOKEN_HEADER
from agent.daemon.node import Daemon
from tests.support.cluster import (
    BIN,
    AgentProcess,
    Origin,
    agent_settings,
    assert_snapshot_verifies,
    model_origin,
)

GOOD = "hf_requester_good_token_0123456789"
WRONG = "hf_requester_wrong_token_987654321"
NODE = "hf_node_token_abcdefabcdef0123"
SECRET = "acme/secret"


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[Origin]:
    # The node's own token is a valid one too, so lending it would work: the tests show when it is not lent.
    root = tmp_path / "gated-hub"
    tokens = [GOOD, NODE]
    with model_origin(root, SECRET, total_bytes=2**20, shards=2, seed=5, tokens=tokens, gated=[SECRET]) as o:
        yield o


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "agent"), *args], capture_output=True, text=True, timeout=120)


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
        r = subprocess.run([str(BIN / "agent"), "fetch", SECRET, "--agent", agent.url],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        jobs = httpx.get(f"{agent.url}/v1/jobs", timeout=10).text
    finally:
        agent.stop()
    assert GOOD not in jobs and WRONG not in jobs
    _no_token_anywhere(agent.log, agent.state_dir, agent.cache_dir)


def _daemon(tmp_path: Path, origin: Origin, lend: bool) -> Daemon:
    s = agent_settings(tmp_path, f"node-{lend}", origin.hub.url, None)
    s = dataclasses.replace(
        s,
        origin=dataclasses.replace(s.origin, token=NODE),
        daemon=dataclasses.replace(s.daemon, lend_node_token=lend),
    )
    d = Daemon(s)
    d.start()
    return d


@pytest.mark.parametrize("lend", [True, False])
def test_the_nodes_token_is_lent_only_where_the_deployment_allows_it(gated, tmp_path, lend):
    daemon = _daemon(tmp_path, gated, lend)
    try:
        job = daemon.request_model(SECRET)
        assert job.wait(60)
        st = job.status()
        if lend:
            assert st.phase == "Ready", st
        else:
            assert st.phase == "Failed" and "no token" in (st.error or ""), st
            resp = httpx.post(f"{daemon.api_url}/v1/fetch", json={"repo_id": SECRET},
                              headers={HF_TOKEN_HEADER: GOOD}, timeout=10)
            assert resp.status_code == 202, resp.text
            done = httpx.get(f"{daemon.api_url}/v1/jobs/{resp.json()['job_id']}", params={"wait": 50},
                             timeout=60).json()
            assert done["phase"] == "Ready", done
            assert_snapshot_verifies(done["snapshot"], gated)
    finally:
        daemon.stop()


def test_requests_with_different_tokens_do_not_join_each_others_job(gated, tmp_path):
    daemon = _daemon(tmp_path, gated, lend=False)
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
