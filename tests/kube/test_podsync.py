"""The pod watcher wired into the daemon: a real agent (libtorrent, HubServer origin, a real tracker for
the end-to-end case) whose watcher talks, through a kubeconfig and the real kubernetes client, to
the fake API server in tests.support.fake_kube. Pods are annotated; the agent fetches and reports."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.daemon.node import Daemon
from agent.hub.server import HubServer
from agent.kube.requests import MODELS_ANNOTATION, STATUS_ANNOTATION, ModelRef
from tests.support.cluster import BIN, Origin, agent_settings, assert_snapshot_verifies
from tests.support.fake_kube import FakeKube
from tests.support.procs import free_port, loop_until, stop_process

NODE = "node-a"
REPO = "acme/tiny"
MODEL_BYTES = 2 * 2**20
ORIGIN_RATE = 1.5 * 2**20
"""Bytes/s: slow enough that a fetch is seen Downloading, fast enough for a short test."""


@pytest.fixture
def origin(make_origin) -> Origin:
    return make_origin(
        REPO, total_bytes=MODEL_BYTES, shards=2, seed=11, root="hub-origin", rate_total=ORIGIN_RATE
    )


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.fixture
def kube_agent(tmp_path: Path, kube: FakeKube) -> Iterator[Callable[..., Daemon]]:
    """Start an agent on NODE whose pod watcher uses the fake API server; stopped at teardown."""
    started: list[Daemon] = []

    def start(origin: Origin, tracker: Any = None, **ops: Any) -> Daemon:
        settings = agent_settings(tmp_path, "a", origin.hub.url, tracker)
        settings = dataclasses.replace(settings, ops=dataclasses.replace(settings.ops, **ops))
        kube_settings = dataclasses.replace(
            settings.kube, enabled=True, node_name=NODE,
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", kube.url),
            status_min_interval=0.3, poll_interval=0.1, watch_timeout=60, request_timeout=5.0,
            backoff_base=0.05, backoff_max=0.5,
        )
        daemon = Daemon(dataclasses.replace(settings, kube=kube_settings))
        started.append(daemon)
        daemon.start()
        loop_until(lambda: kube.open_watches() >= 1, timeout=20, what="pod watch open")
        return daemon

    yield start
    for d in reversed(started):
        d.stop()


def status_of(kube: FakeKube, pod: str) -> dict[str, Any]:
    raw = kube.get_pod(pod)["metadata"]["annotations"].get(STATUS_ANNOTATION)
    return json.loads(raw) if raw else {}


def phase_of(kube: FakeKube, pod: str, key: str) -> str | None:
    return status_of(kube, pod).get(key, {}).get("phase")


def events_for(kube: FakeKube, pod: str) -> list[tuple[str, str, str]]:
    mine = [e for e in list(kube.events) if e["involvedObject"]["name"] == pod]
    return [(e["reason"], e["type"], e["message"]) for e in mine]


def phases_patched(kube: FakeKube, pod: str, key: str) -> list[str]:
    out = []
    for p in list(kube.patches):
        if p["name"] == pod:
            out.append(json.loads(p["body"]["metadata"]["annotations"][STATUS_ANNOTATION])[key]["phase"])
    return out


KEY = f"{REPO}@main"


def test_annotated_pod_gets_the_model_and_its_status(origin, tracker, kube, kube_agent) -> None:
    daemon = kube_agent(origin, tracker)
    kube.add_pod("other", node="node-b", annotations={MODELS_ANNOTATION: REPO})
    kube.add_pod("vllm-0", annotations={MODELS_ANNOTATION: REPO})
    loop_until(lambda: phase_of(kube, "vllm-0", KEY) == "Ready", timeout=60, what="pod status Ready")

    status = status_of(kube, "vllm-0")[KEY]
    assert status["bytesDone"] == status["bytesTotal"] == origin.size
    assert status["bytesFromOrigin"] >= origin.size * 0.99 and status["bytesFromPeers"] == 0
    assert status["error"] is None
    assert_snapshot_verifies(status["snapshot"], origin)
    # Progress was visible before the end, and the end was reported once.
    seen = phases_patched(kube, "vllm-0", KEY)
    assert seen[0] in ("Pending", "Downloading") and seen[-1] == "Ready" and seen.count("Ready") == 1
    assert "Downloading" in seen
    loop_until(lambda: len(events_for(kube, "vllm-0")) >= 2, timeout=10, what="events")
    reasons = [(r, t) for r, t, _ in events_for(kube, "vllm-0")]
    assert reasons == [("ModelFetchStarted", "Normal"), ("ModelReady", "Normal")]
    assert status["snapshot"] in events_for(kube, "vllm-0")[1][2]
    # The pod on another node was never acted on.
    assert STATUS_ANNOTATION not in kube.get_pod("other")["metadata"]["annotations"]
    assert events_for(kube, "other") == []
    assert [j.key.repo_id for j in daemon.jobs.all()] == [REPO]
    # Pinned while a pod wants it.
    assert daemon.ops.extra_pins == {KEY}


def test_two_pods_one_fetch_and_unpin_when_both_are_gone(origin, kube, kube_agent) -> None:
    daemon = kube_agent(origin)
    kube.add_pod("vllm-0", annotations={MODELS_ANNOTATION: REPO})
    kube.add_pod("vllm-1", annotations={MODELS_ANNOTATION: f"{REPO}@main"})
    for pod in ("vllm-0", "vllm-1"):
        loop_until(lambda pod=pod: phase_of(kube, pod, KEY) == "Ready", timeout=60, what=f"{pod} Ready")
    assert len(daemon.jobs.all()) == 1  # one fetch for both pods
    assert origin.hub.egress_bytes < origin.size * 1.1  # file bytes once, plus API metadata
    assert status_of(kube, "vllm-0")[KEY]["snapshot"] == status_of(kube, "vllm-1")[KEY]["snapshot"]
    assert daemon.ops.extra_pins == {KEY}

    kube.delete_pod("vllm-0")
    loop_until(lambda: len(daemon.podsync.requests.pods_for(ModelRef(REPO))) == 1,
               timeout=20, what="first pod forgotten")
    assert daemon.ops.extra_pins == {KEY}  # the other pod still reads it
    kube.update_pod("vllm-1", phase="Succeeded")
    loop_until(lambda: daemon.ops.extra_pins == set(), timeout=20, what="model unpinned")


def test_bad_annotation_fails_that_pod_only(origin, kube, kube_agent) -> None:
    daemon = kube_agent(origin)
    kube.add_pod("typo", annotations={MODELS_ANNOTATION: "acme tiny"})
    kube.add_pod("good", annotations={MODELS_ANNOTATION: REPO})
    loop_until(lambda: status_of(kube, "typo"), timeout=20, what="status on the bad pod")
    (bad,) = status_of(kube, "typo").values()
    assert bad["phase"] == "Failed" and "whitespace" in bad["error"]
    loop_until(lambda: events_for(kube, "typo"), timeout=10, what="warning event")
    assert [(r, t) for r, t, _ in events_for(kube, "typo")] == [("BadAnnotation", "Warning")]
    # The agent keeps working for everybody else.
    loop_until(lambda: phase_of(kube, "good", KEY) == "Ready", timeout=60, what="good pod Ready")
    assert daemon.problems() == []


def test_unknown_repo_fails_with_the_error_and_a_warning(origin, kube, kube_agent) -> None:
    daemon = kube_agent(origin)
    kube.add_pod("lost", annotations={MODELS_ANNOTATION: f"acme/missing, {REPO}"})
    loop_until(lambda: phase_of(kube, "lost", "acme/missing@main") == "Failed", timeout=30, what="Failed")
    loop_until(lambda: phase_of(kube, "lost", KEY) == "Ready", timeout=60, what="the other model Ready")
    failed = status_of(kube, "lost")["acme/missing@main"]
    assert "acme/missing" in failed["error"] and "snapshot" not in failed
    loop_until(
        lambda: any(r == "ModelFetchFailed" for r, _, _ in events_for(kube, "lost")), timeout=10, what="event"
    )
    ((_, kind, message),) = [e for e in events_for(kube, "lost") if e[0] == "ModelFetchFailed"]
    assert kind == "Warning" and "acme/missing" in message
    assert daemon.problems() == []
    # Another pod asking for the failed model is a retry (a new job), without restarting the agent.
    missing_jobs = lambda: [j for j in daemon.jobs.all() if j.key.repo_id == "acme/missing"]  # noqa: E731
    assert len(missing_jobs()) == 1
    kube.add_pod("lost-2", annotations={MODELS_ANNOTATION: "acme/missing"})
    loop_until(lambda: len(missing_jobs()) == 2, timeout=20, what="a second attempt")
    loop_until(lambda: phase_of(kube, "lost-2", "acme/missing@main") == "Failed", timeout=30, what="Failed")


def test_model_that_cannot_fit_warns_the_pod(origin, kube, kube_agent) -> None:
    kube_agent(origin, cache_max_bytes=origin.size // 2)
    kube.add_pod("big", annotations={MODELS_ANNOTATION: REPO})
    loop_until(lambda: phase_of(kube, "big", KEY) == "Failed", timeout=30, what="Failed")
    assert "cache" in status_of(kube, "big")[KEY]["error"]
    wanted = {("ModelCacheFull", "Warning"), ("ModelFetchFailed", "Warning")}
    loop_until(lambda: wanted <= {(r, t) for r, t, _ in events_for(kube, "big")}, timeout=10, what="events")


# -- `agent serve` flags --------------------------------------------------------------------------


def serve_argv(tmp_path: Path, origin_url: str, *extra: str) -> list[str]:
    return [
        str(BIN / "agent"), "serve", "--cache-dir", str(tmp_path / "p" / "hub"),
        "--state-dir", str(tmp_path / "p" / "state"), "--origin", origin_url,
        "--bt-listen", "127.0.0.1:0", "--api-listen", f"127.0.0.1:{free_port()}", *extra,
    ]


@pytest.mark.parametrize(("flag", "env"), [("on", {}), ("auto", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})])
def test_serve_with_the_watcher_needs_the_node_name(tmp_path, flag, env) -> None:
    argv = serve_argv(tmp_path, "http://127.0.0.1:9", "--kube", flag,
                      "--kubeconfig", str(write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9")))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: the pod watcher needs this node's name")


def test_serve_cli_runs_the_watcher(tmp_path, origin, kube) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    argv = serve_argv(tmp_path, origin.hub.url, "--node-name", NODE, "--kubeconfig", str(kubeconfig),
                      "--watch-namespace", "models")  # --kube auto: KUBERNETES_SERVICE_HOST is unset...
    env = {**os.environ, "WEIGHTSWARM_KUBE": "on"}  # ...so the variable turns it on
    kube.add_pod("elsewhere", annotations={MODELS_ANNOTATION: REPO})  # namespace "default": not watched
    kube.add_pod("vllm-0", namespace="models", annotations={MODELS_ANNOTATION: REPO})
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        def ready() -> bool:
            pod = kube.get_pod("vllm-0", "models")
            raw = pod["metadata"]["annotations"].get(STATUS_ANNOTATION)
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
            return bool(raw) and json.loads(raw)[KEY]["phase"] == "Ready"

        loop_until(ready, timeout=60, what="Ready through `agent serve`")
        assert STATUS_ANNOTATION not in kube.get_pod("elsewhere")["metadata"]["annotations"]
    finally:
        stop_process(proc, grace=20)
        log.close()
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-2000:]


def test_pods_asking_for_repos_that_share_files_both_get_ready(tmp_path, tracker, kube, kube_agent) -> None:
    """A base model and its fine-tune (shared model card, tokenizer, `.gitattributes`, one shard)
    requested by two pods on one node at once: both Ready, the shared files one inode."""
    from agent.hub.testmodel import make_family

    root = tmp_path / "family-hub"
    make_family(root, "acme/base", "acme/tuned", total_bytes=MODEL_BYTES, shards=2, seed=3)
    with HubServer(root) as hub:
        kube_agent(Origin(hub, "acme/base", 0, {}), tracker)
        kube.add_pod("base-0", annotations={MODELS_ANNOTATION: "acme/base"})
        kube.add_pod("tuned-0", annotations={MODELS_ANNOTATION: "acme/tuned"})
        for pod, key in (("base-0", "acme/base@main"), ("tuned-0", "acme/tuned@main")):
            loop_until(lambda pod=pod, key=key: phase_of(kube, pod, key) in ("Ready", "Failed"),
                       timeout=90, what=f"{pod} done")
            assert phase_of(kube, pod, key) == "Ready", status_of(kube, pod)
        base = Path(status_of(kube, "base-0")["acme/base@main"]["snapshot"])
        tuned = Path(status_of(kube, "tuned-0")["acme/tuned@main"]["snapshot"])
        for name in (".gitattributes", "README.md", "tokenizer.json", "model-00001-of-00002.safetensors"):
            assert (base / name).read_bytes() == (root / "acme/tuned" / name).read_bytes()
            assert os.path.samefile(base / name, tuned / name), name
        assert (tuned / "model-00002-of-00002.safetensors").read_bytes() == (
            root / "acme/tuned/model-00002-of-00002.safetensors"
        ).read_bytes()
