"""Issue 62's attack 8: anonymous `GET /metrics` on the network listener naming a gated repo the node
fetched, while the HF endpoint answers 401 for it. Only repos the origin reports public keep their names
in a series (agent.core.modelnames); the admin socket says which hidden label is which model."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.core.modelnames import HIDDEN_PREFIX, ModelNames
from agent.daemon.node import Daemon
from tests.support.cluster import Origin, admin_request, agent_settings

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
