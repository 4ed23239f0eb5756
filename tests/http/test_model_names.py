"""Issue 62's attack 8: anonymous `GET /metrics` on the network listener naming a gated repo the node
fetched, while the HF endpoint answers 401 for it. Only repos the origin reports public keep their names
in a series (agent.core.modelnames); the admin socket says which hidden label is which model."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.core.modelnames import HIDDEN_PREFIX, ModelNames
from agent.daemon.node import Daemon
from agent.http.agent_httpx import http_client
from tests.support.cluster import AgentProcess, Origin, admin_request, agent_settings, write_models
from tests.support.procs import loop_until

GOOD = "hf_goodtoken1234567890"
SECRET = "acme/secret-project-x"


@pytest.fixture
def gated(make_origin) -> Origin:
    return make_origin(
        SECRET, total_bytes=2**20, shards=2, seed=3, root="gated-hub", tokens=[GOOD], gated=[SECRET]
    )


def _models(text: str) -> set[str]:
    return {
        s.labels["model"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "model" in s.labels
    }


def _daemon(tmp_path, gated: Origin) -> Daemon:
    settings = agent_settings(tmp_path, "node", gated.hub.url, None)
    settings = dataclasses.replace(settings, origin=dataclasses.replace(settings.origin, token=GOOD))
    daemon = Daemon(settings)
    daemon.start()
    return daemon


def test_anonymous_metrics_never_name_a_gated_repo_the_node_fetched(gated, tmp_path):
    daemon = _daemon(tmp_path, gated)
    try:
        job = daemon.request_model(SECRET, "main", lend=True)  # the node's token brings it in
        assert job.wait(90) and job.status().phase == "Ready", job.status()
        # The origin hides it from an anonymous caller, and so does the agent's HF endpoint.
        shard = next(p for p in gated.files if p.endswith(".safetensors"))
        assert httpx.get(f"{daemon.api_url}/{SECRET}/resolve/main/{shard}", timeout=30).status_code == 401

        proc = psutil.Process(os.getpid())
        text = httpx.get(f"{daemon.api_url}/metrics", timeout=10).text
        rss, fds = proc.memory_info().rss, proc.num_fds()
        for _ in range(200):  # an attacker's scrapes cost the node nothing that grows
            text = httpx.get(f"{daemon.api_url}/metrics", timeout=10).text
        assert proc.memory_info().rss - rss < 20 * 2**20
        assert proc.num_fds() - fds < 16

        assert "secret" not in text.lower() and "acme" not in text
        (label,) = _models(text)
        assert label.startswith(HIDDEN_PREFIX) and len(label) == len(HIDDEN_PREFIX) + 16
        # 23 series carried the name before: the time-to-ready histogram and the bytes by source.
        hidden = [line for line in text.splitlines() if f'model="{label}"' in line]
        assert len(hidden) >= 20

        # The node's operator reads which model a label stands for, on the admin socket only.
        admin = admin_request(daemon.admin_url, "GET", "/metrics").text
        assert f'weightswarm_agent_model_label{{model="{label}",name="{SECRET}@main"}} 1.0' in admin
        assert "weightswarm_agent_model_label" not in text
    finally:
        daemon.stop()

    # Stable: a restart (same state dir) names it the same, so its series go on.
    daemon = _daemon(tmp_path, gated)
    try:
        job = daemon.request_model(SECRET, "main", lend=True)
        assert job.wait(90) and job.status().phase == "Ready", job.status()
        assert _models(httpx.get(f"{daemon.api_url}/metrics", timeout=10).text) == {label}
    finally:
        daemon.stop()


def test_labels_are_keyed_so_a_guessed_name_cannot_be_confirmed():
    public = {"Qwen/Qwen2.5-0.5B"}
    one, other = ModelNames(b"node one", public.__contains__), ModelNames(b"node two", public.__contains__)
    assert one.label("Qwen/Qwen2.5-0.5B", "main") == "Qwen/Qwen2.5-0.5B@main"
    hidden = one.label(SECRET, "main")
    assert hidden == one.label(SECRET, "main") != other.label(SECRET, "main")
    assert one.label(SECRET, "v2") != hidden
    name = f"{SECRET}@main".encode()
    unkeyed = {hashlib.sha256(name).hexdigest(), hashlib.sha1(name).hexdigest()}
    assert not any(h.startswith(hidden.removeprefix(HIDDEN_PREFIX)) for h in unkeyed)
    # A bucket model is never its name, even under the id of a public Hub repo.
    bucket = one.label("Qwen/Qwen2.5-0.5B", "main", "s3://models/qwen")
    assert bucket.startswith(HIDDEN_PREFIX) and "qwen" not in bucket.lower()
    assert one.known()[bucket] == "Qwen/Qwen2.5-0.5B@main=s3://models/qwen"
    # A log line's text: the name in any case, URL-encoded or as its cache folder becomes the label.
    said = one.scrubber(SECRET, "main")(
        "GET /api/models/ACME/Secret-Project-X/revision/main: 503; acme%2Fsecret-project-x@main in "
        "/cache/models--acme--secret-project-x/blobs"
    )
    assert "secret" not in said.lower() and said.count(hidden) == 3, said
    public_line = "Qwen/Qwen2.5-0.5B@main: models--Qwen--Qwen2.5-0.5B"
    assert one.scrubber("Qwen/Qwen2.5-0.5B", "main")(public_line) == public_line


PUBLIC = "open/tiny-public"


def _fetch(admin_url: str, repo_id: str, revision: str) -> dict:
    """Request repo@revision on an agent's admin channel and wait for its job to end."""
    with http_client(admin_url, timeout=30) as admin:
        resp = admin.post("/v1/fetch", json={"repo_id": repo_id, "revision": revision})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["job_id"]
        return loop_until(
            lambda: (s := admin.get(f"/v1/jobs/{job_id}", params={"wait": 2}).json())["phase"]
            in ("Ready", "Failed") and s,
            timeout=90,
            what=f"the fetch of {repo_id}@{revision}",
        )


def test_info_logs_name_a_gated_repo_by_its_label_and_a_public_one_by_its_name(tmp_path, make_hub, tracker):
    """Issue 62 part 5: the daemon's INFO and WARNING lines (a log collector's, cluster-wide) name a model
    as its metrics do, also in errors written for its requester, and in the HTTP client's lines."""
    write_models(tmp_path / "hub", [SECRET, PUBLIC], total_bytes=2**20, shards=2, seed=3)
    hub = make_hub(tmp_path / "hub", tokens=[GOOD], gated=[SECRET])
    agent = AgentProcess(tmp_path, "node", hub.url, tracker, "--token", GOOD)
    agent.start()
    try:
        for repo_id in (SECRET, PUBLIC):
            assert _fetch(agent.url, repo_id, "main")["phase"] == "Ready"
            # A revision the origin lacks: the job's error (the requester's) names the repo.
            failed = _fetch(agent.url, repo_id, "no-such-branch")
            assert failed["phase"] == "Failed" and repo_id in failed["error"], failed
        metrics = httpx.get(f"{agent.api_url}/metrics", timeout=10).text
    finally:
        agent.stop()
    log = agent.log.read_text()
    hidden = sorted(m for m in _models(metrics) if m.startswith(HIDDEN_PREFIX))
    assert len(hidden) == 1, _models(metrics)
    assert "secret-project" not in log.lower() and "acme" not in log
    assert f"INFO agent.daemon.node: {hidden[0]}: ready in " in log
    assert f"INFO agent.daemon.node: {PUBLIC}@main: ready in " in log
    # The failure's line, and its error's own words, name the gated repo by a label (its revision's).
    failure = next(line for line in log.splitlines() if "no-such-branch" in line and HIDDEN_PREFIX in line)
    assert "WARNING agent.daemon.node: fetch of hidden-" in failure, failure
    public = f"{PUBLIC}@no-such-branch"
    assert re.search(rf"WARNING agent.daemon.node: fetch of {re.escape(public)} failed after [0-9.]+s: "
                     rf"{re.escape(public)}", log), log


def test_eviction_and_access_lines_name_a_gated_repo_by_a_label(tmp_path, make_hub, caplog):
    """Issue 62 part 5, the lines about a repo's blobs or access rather than a job: the evictor making
    room for a public model names the gated one it evicts by a label, as does the HF endpoint's warning
    when the origin cannot be asked about the gated repo. `agent verify`'s repair lines are the CLI's
    (the operator's terminal), not the daemon's."""
    write_models(tmp_path / "hub", [SECRET, PUBLIC], total_bytes=2**20, shards=2, seed=3)
    hub = make_hub(tmp_path / "hub", tokens=[GOOD], gated=[SECRET])
    settings = agent_settings(tmp_path, "node", hub.url, None)
    settings = dataclasses.replace(
        settings,
        origin=dataclasses.replace(settings.origin, token=GOOD),
        ops=dataclasses.replace(settings.ops, cache_max_bytes=3 * 2**19),  # one model at a time
    )
    caplog.set_level("INFO")
    daemon = Daemon(settings)
    daemon.start()
    try:
        for repo_id in (SECRET, PUBLIC):
            job = daemon.request_model(repo_id, "main", lend=True)
            assert job.wait(90) and job.status().phase == "Ready", job.status()
        hub.stop()
        answer = httpx.get(f"{daemon.api_url}/{SECRET}/resolve/main/config.json", timeout=30)
        assert answer.status_code == 503, answer.text
    finally:
        daemon.stop()
    # The daemon's lines: not the test hub's access log, nor this test's own HTTP client.
    ours = [r for r in caplog.records if r.levelno >= 20 and not r.name.startswith(("agent.hub", "httpx"))]
    lines = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in ours]
    evicted = [line for line in lines if "evicted blob" in line]
    assert evicted and all(re.search(r" of hidden-[0-9a-f]{16} \(", line) for line in evicted), lines
    assert any(f"access check of {HIDDEN_PREFIX}" in line for line in lines), "\n".join(lines)
    assert not [line for line in lines if "secret-project" in line.lower()]


SOURCES = {"peers", "origin", "cache"}
"""Issue 63 item 8: where bytes came from, in every series."""
MODEL = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+@[^@\s]+|hidden-[0-9a-f]{16}")
"""A model label: `org/name@rev` (a public repo) or a hidden label, nothing else (no bare `org/name`)."""


def test_metrics_speak_one_vocabulary_of_sources_and_model_names(tmp_path, make_hub):
    write_models(tmp_path / "hub", [SECRET, PUBLIC], total_bytes=2**20, shards=2, seed=3)
    hub = make_hub(tmp_path / "hub", tokens=[GOOD], gated=[SECRET])
    daemon = _daemon(tmp_path, Origin.of(hub, SECRET, {}))
    try:
        for repo_id in (SECRET, PUBLIC, PUBLIC):  # the second time from the node's cache
            job = daemon.request_model(repo_id, "main", lend=True)
            assert job.wait(90) and job.status().phase == "Ready", job.status()
        text = httpx.get(f"{daemon.api_url}/metrics", timeout=10).text
    finally:
        daemon.stop()
    sources: dict[str, set[str]] = {}
    models: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "source" in sample.labels:
                sources.setdefault(family.name.removesuffix("_created"), set()).add(sample.labels["source"])
            if "model" in sample.labels:
                assert MODEL.fullmatch(sample.labels["model"]), sample
                models.add(sample.labels["model"])
    ready = "weightswarm_agent_time_to_ready_seconds"
    assert set(sources) == {"weightswarm_agent_fetched_bytes", "weightswarm_agent_model_bytes", ready}
    assert all(values <= SOURCES for values in sources.values()), sources
    assert sources["weightswarm_agent_fetched_bytes"] == sources["weightswarm_agent_model_bytes"] == SOURCES
    assert sources[ready] == {"origin", "cache"}
    (hidden,) = models - {f"{PUBLIC}@main"}
    assert hidden.startswith(HIDDEN_PREFIX) and f"{PUBLIC}@main" in models
