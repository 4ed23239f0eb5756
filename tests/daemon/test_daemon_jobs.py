"""A daemon job beside the other writers of its cache, and what it says when it ends: real `agent serve`
and in-process daemons, a real test hub, huggingface_hub's own lock (filelock's FileLock on
`.locks/models--org--name/<blob>.lock`, as `file_download._hf_hub_download_to_cache_dir` takes it)."""

from __future__ import annotations

import hashlib
import re
import signal
import subprocess
import time

import psutil
from filelock import FileLock

from agent.cache.locks import blob_lock_path
from tests.support.cluster import (
    BIN,
    REPO,
    AgentProcess,
    admin_request,
    agent_cli,
    assert_snapshot_verifies,
)
from tests.support.procs import kill_process, loop_until

SHARD = "model-00001-of-00003.safetensors"
STOP_BOUND = 15.0
"""Seconds a stopping agent may take with a job waiting on a lock (its shutdown timeout is 10 s)."""


def _shard_lock(origin, cache_dir) -> FileLock:
    blob = hashlib.sha256(origin.files[SHARD]).hexdigest()
    path = blob_lock_path(cache_dir, REPO, blob)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def test_a_job_waits_for_the_cache_writer_holding_a_blob_and_says_so(origin, make_agent):
    a = make_agent("a", origin, None)
    with _shard_lock(origin, a.settings.cache_dir):
        job = a.request_model(REPO, "main")
        loop_until(lambda: job.status().stage == "locked", timeout=60, what="the job's stage: locked")
        assert job.status().phase == "Downloading"
    assert job.wait(60), job.status()  # released: it goes on
    status = job.status()
    assert status.phase == "Ready", status
    assert_snapshot_verifies(str(status.snapshot), origin)


def test_a_stopping_agent_does_not_wait_for_a_held_lock(tmp_path, origin, tracker):
    """docs/security.md: a local user who can write the cache holds a blob's `.locks/` file. The wait is
    visible (the init container's `agent wait` names the stage), costs the agent no memory or descriptors
    while it lasts, and SIGTERM still ends the agent within a bound."""
    agent = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    agent.start()
    try:
        with _shard_lock(origin, agent.cache_dir):
            job_id = admin_request(agent.url, "POST", "/v1/fetch", json={"repo_id": REPO}).json()["job_id"]
            loop_until(
                lambda: admin_request(agent.url, "GET", f"/v1/jobs/{job_id}").json()["stage"] == "locked",
                timeout=60, what="the job's stage: locked",
            )
            assert agent.proc is not None
            proc = psutil.Process(agent.proc.pid)
            rss, fds = proc.memory_info().rss, proc.num_fds()
            res = agent_cli("wait", REPO, "--agent", agent.url, "--timeout", "3")
            assert res.returncode == 7, res.stderr
            last = res.stderr.strip().splitlines()[-1]
            assert "(waiting for another writer of this node's cache to finish the file)" in last, last
            assert proc.memory_info().rss - rss < 16 * 2**20
            assert proc.num_fds() - fds < 8
            started = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            assert agent.proc.wait(STOP_BOUND + 5) == 0
            assert time.monotonic() - started < STOP_BOUND
        log = agent.log.read_text()
        assert "the agent is stopping" in log and "Traceback" not in log, log[-3000:]
    finally:
        agent.stop()


def _job_lines(log: str) -> list[str]:
    job_line = re.compile(r"agent\.daemon\.node: (\S+: ready in|fetch of) ")
    return [line for line in log.splitlines() if job_line.search(line)]


def test_one_info_line_per_finished_job_and_one_warning_without_traceback_per_failure(
    tmp_path, origin, tracker
):
    agent = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    agent.start()
    try:
        assert agent_cli("wait", REPO, "--agent", agent.url, "--timeout", "60").returncode == 0
        assert agent_cli("wait", "acme/missing", "--agent", agent.url, "--timeout", "30").returncode == 3
        log = agent.log.read_text()
    finally:
        agent.stop()
    lines = _job_lines(log)
    assert len(lines) == 2, lines
    done, failed = lines
    assert " INFO " in done and f"{REPO}@main: ready in " in done, done
    end = r"in \d+\.\ds \(commit [0-9a-f]{12}\): 0 B from peers, 3\.0 MiB from the origin, 0 B cached$"
    assert re.search(end, done), done
    assert f"{origin.size / 2**20:.1f} MiB from the origin" in done
    # A repo the origin does not report public (a missing one looks like a private one) is named by its label.
    assert " WARNING " in failed and re.search(r"fetch of hidden-[0-9a-f]{16} failed after ", failed), failed
    assert "Traceback" not in log


def test_ctrl_c_of_a_fetch_attached_to_the_agent_leaves_the_job_running(tmp_path, make_origin, tracker):
    slow = make_origin(REPO, seed=9, root="slow", rate_total=1024 * 1024)  # ~3 s for the model
    agent = AgentProcess(tmp_path, "a", slow.hub.url, tracker)
    agent.start()
    cli = subprocess.Popen(
        [str(BIN / "agent"), "fetch", REPO, "--agent", agent.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        jobs = loop_until(lambda: admin_request(agent.url, "GET", "/v1/jobs", timeout=5).json(), timeout=30)
        assert [j["phase"] for j in jobs] in (["Pending"], ["Downloading"]), jobs
        started = time.monotonic()
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=10)
        assert time.monotonic() - started < 3.0
        assert cli.returncode == 130, err
        assert out == ""
        # docs/agent.md: "the agent at <url> keeps fetching <repo>@<rev>; run the same command again"
        said = err.strip().splitlines()[-1]
        assert said == (f"interrupted: the agent at {agent.url} keeps fetching {REPO}@main; "
                        "run the same command again to follow it"), err
        job_id = jobs[0]["job_id"]
        done = loop_until(
            lambda: (s := admin_request(agent.url, "GET", f"/v1/jobs/{job_id}", params={"wait": 2}).json())[
                "phase"] in ("Ready", "Failed") and s,
            timeout=60,
        )
        assert done["phase"] == "Ready", done
        assert_snapshot_verifies(done["snapshot"], slow)
    finally:
        kill_process(cli)
        agent.stop()
