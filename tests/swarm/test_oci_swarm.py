"""A registry model through the swarm: real `agent serve` daemons (libtorrent, the tracker process) asked
by the CLI (`agent fetch --agent`, `agent wait org/name=oci://…`) for a ModelPack artifact in a real
registry (Debian's docker-registry, tests.support.ocikit). The registry's own access log counts what it
served: about one copy for the cluster. A node the registry refuses gets no byte from its peers, a
registry outside `--registry` is refused on every channel, and the login never leaves the node."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import BIN, AgentProcess, admin_request, same_files
from tests.support.fake_kube import FakeKube
from tests.support.ocikit import REGISTRY_BIN, Pusher, Registry, bcrypt_hash, docker_config, push_model
from tests.support.procs import loop_until

REPO = "acme/oci-swarm"
NAME = "models/llama-ft"
USER, PASSWORD = "puller", "swarm-s3cret-pass"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
pytestmark = pytest.mark.skipif(not REGISTRY_BIN.exists(), reason="./dev installs docker-registry")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    (tmp_path / "reg").mkdir()
    htpasswd = tmp_path / "reg" / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt_hash(PASSWORD)}\n")
    reg = Registry(tmp_path / "reg", {"htpasswd": {"realm": "test", "path": str(htpasswd)}}, access_log=True)
    yield reg
    reg.stop()


@pytest.fixture
def agents(tmp_path: Path, origin, tracker, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """`start(name, auth_file, *options)`: an `agent serve` process reading registry credentials from
    `auth_file` (its REGISTRY_AUTH_FILE), stopped at the end."""
    started: list[AgentProcess] = []

    def start(name: str, auth_file: Path, *options: str) -> AgentProcess:
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_file))
        agent = AgentProcess(tmp_path, name, origin.hub.url, tracker, *options)
        started.append(agent)
        agent.start()
        return agent

    yield start
    for agent in reversed(started):
        agent.stop()


def model_files(tmp_path: Path, total: int, shards: int) -> dict[str, bytes]:
    from tests.support.cluster import write_model

    return write_model(tmp_path / "model", REPO, total_bytes=total, shards=shards, seed=23)


def jobs_of(agent: AgentProcess) -> list[dict]:
    resp = admin_request(agent.url, "GET", "/v1/jobs")
    assert resp.status_code == 200, resp.text
    jobs: list[dict] = resp.json()
    return jobs


def secrets_absent(text: str, where: str) -> None:
    for secret in (PASSWORD, BASIC.removeprefix("Basic ")):
        assert secret not in text, f"{secret[:4]}… in {where}"


def test_three_daemons_read_a_registry_model_once_and_a_node_without_credentials_gets_nothing(
    tmp_path, registry, tracker, agents
):
    files = model_files(tmp_path, 8 << 20, 4)
    total = sum(len(d) for d in files.values())
    push_model(Pusher(registry.base, BASIC), NAME, "v1", files)
    pushed = registry.blob_bytes_served()
    config = docker_config(tmp_path, registry.host, USER, PASSWORD)
    options = ("--registry", f"oci://{registry.host}/models", "--oci-plain-http", registry.host)
    daemons = [agents(f"n{i}", config, *options) for i in range(3)]
    url = f"oci://{registry.host}/{NAME}:v1"

    # All three asked at once: two by `agent fetch --agent`, one by `agent wait org/name=oci://…`.
    fetch = [str(BIN / "agent"), "fetch", url, "--repo-id", REPO, "--quiet"]
    procs = [subprocess.Popen([*fetch, "--agent", d.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for d in daemons[:2]]
    procs.append(subprocess.Popen(
        [str(BIN / "agent"), "wait", f"{REPO}={url}", "--timeout", "120", "--agent", daemons[2].url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    statuses = [job for d in daemons for job in jobs_of(d)]
    assert len(statuses) == 3
    commits = {st["commit"] for st in statuses}
    assert len(commits) == 1
    for st in statuses:
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)
    # The registry served the model's blobs about once for the three (its own access log says).
    served = registry.blob_bytes_served() - pushed
    assert total * 0.9 <= served <= total * 1.1, (served, total)
    assert sum(st["bytes_from_peers"] for st in statuses) >= 2 * total * 0.9, statuses

    # A fourth node whose docker config has no login for the registry, then one with a wrong one: the
    # registry refuses each, and its peers (which hold every blob) send it nothing.
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for name, auth in (("anonymous", tmp_path / "none.json"),
                       ("wrong", docker_config(wrong, registry.host, USER, "not-the-password"))):
        before = registry.blob_bytes_served()
        refused = agents(name, auth, *options)
        done = subprocess.run([*fetch, "--agent", refused.url], capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 4, (done.stdout, done.stderr)
        assert "registry" in done.stderr and ("has none" in done.stderr or "refused" in done.stderr)
        (st,) = jobs_of(refused)
        assert st["phase"] == "Failed" and st["bytes_from_peers"] == 0 and st["bytes_from_origin"] == 0, st
        assert not any((refused.cache_dir).rglob("blobs/*")), "a refused node holds blobs"
        assert registry.blob_bytes_served() == before
        assert "not-the-password" not in refused.log.read_text()

    # The login stays on the nodes: not in a daemon's log, a job's status or the tracker's manifest.
    for d in daemons:
        secrets_absent(d.log.read_text(), f"{d.log.name}")
        secrets_absent(json.dumps(jobs_of(d)), "the job status")
    (commit,) = commits
    manifest = httpx.get(f"{tracker.url}/v1/manifests/{REPO}/{commit}", headers=tracker.auth, timeout=10)
    assert manifest.status_code == 200, manifest.text
    assert {f["path"] for f in manifest.json()["files"]} == set(files)
    secrets_absent(manifest.text, "the tracker's manifest")


def test_a_registry_outside_the_allow_list_is_refused_on_every_channel(tmp_path, registry, agents):
    push_model(Pusher(registry.base, BASIC), NAME, "v1", model_files(tmp_path, 1 << 20, 1))
    config = docker_config(tmp_path, registry.host, USER, PASSWORD)
    url = f"oci://{registry.host}/{NAME}:v1"
    pods = tmp_path / "pods.sock"
    kubeconfig = tmp_path / "kubeconfig"
    with FakeKube() as kube:
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        }))
        node = agents("n", config, "--registry", f"oci://{registry.host}/other", "--oci-plain-http",
                      registry.host, "--pods-socket", str(pods), "--kube", "on", "--kubeconfig",
                      str(kubeconfig), "--kube-preheat", "off", "--kube-node-labels", "off")
        # The admin socket and the pods' socket refuse the request itself.
        for channel in (node.url, f"unix://{pods}"):
            resp = admin_request(channel, "POST", "/v1/fetch", json={"repo_id": REPO, "source": url})
            assert resp.status_code in (400, 403), resp.text
            assert "agent serve --registry" in resp.text
        # The CLI through the admin socket: one line, exit 9 (the agent refused).
        done = subprocess.run([str(BIN / "agent"), "fetch", url, "--repo-id", REPO, "--agent", node.url],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode != 0 and "agent serve --registry" in done.stderr, done.stderr
        # A pod annotation: its status says why.
        kube.add_pod("vllm", node="n", annotations={"weightswarm.io/models": f"{REPO}={url}"})

        def status() -> dict | None:
            value = kube.get_pod("vllm")["metadata"]["annotations"].get("weightswarm.io/status")
            return json.loads(value) if value else None

        loop_until(status, timeout=30, what="the pod's status annotation")
        (entry,) = status().values()  # type: ignore[union-attr]
        assert entry["phase"] == "Failed" and "agent serve --registry" in entry["error"], entry
    assert registry.blob_bytes_served() == 0


def test_two_daemons_move_a_tar_layer_once_and_each_unpacks_it(tmp_path, registry, agents):
    """The tar layer is the blob the cluster moves (one lease holder reads it, the other node takes it
    from its peer), and each node unpacks it itself into blobs of its cache."""
    from tests.support.ocikit import RAW_WEIGHT, TAR_GZIP_WEIGHT, TAR_WEIGHT, push_artifact, tar_layer

    files = model_files(tmp_path, 8 << 20, 2)
    weights = {p: d for p, d in files.items() if p.endswith(".safetensors")}
    first, *rest = sorted(weights)
    others = {p: d for p, d in files.items() if p not in weights}
    layers = [(RAW_WEIGHT, files[first], first),
              (TAR_WEIGHT, tar_layer({p: files[p] for p in rest}), "shards"),
              (TAR_GZIP_WEIGHT, tar_layer(others, compress=True), "config")]
    push_artifact(Pusher(registry.base, BASIC), NAME, "v1", layers)
    layer_bytes = sum(len(data) for _, data, _ in layers)
    pushed = registry.blob_bytes_served()
    config = docker_config(tmp_path, registry.host, USER, PASSWORD)
    options = ("--registry", f"oci://{registry.host}/models", "--oci-plain-http", registry.host)
    daemons = [agents(f"n{i}", config, *options) for i in range(2)]
    url = f"oci://{registry.host}/{NAME}:v1"
    fetch = [str(BIN / "agent"), "fetch", url, "--repo-id", REPO, "--quiet"]
    procs = [subprocess.Popen([*fetch, "--agent", d.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for d in daemons]
    for proc in procs:
        _out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    statuses = [job for d in daemons for job in jobs_of(d)]
    for st in statuses:
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)  # read through the snapshot's links: each file's bytes verified
    served = registry.blob_bytes_served() - pushed
    assert layer_bytes * 0.9 <= served <= layer_bytes * 1.1, (served, layer_bytes)
    assert sum(st["bytes_from_peers"] for st in statuses) >= layer_bytes * 0.9, statuses
    for d in daemons:
        # Each unpacked file is a blob named by its sha256; the layers live in the state dir, not the cache.
        blobs = {p.name for p in d.cache_dir.rglob("blobs/*")}
        assert blobs == {hashlib.sha256(data).hexdigest() for data in files.values()}, d.name
        held = {p.name for p in d.state_dir.rglob("layers/*/blobs/*")}
        assert held == {hashlib.sha256(data).hexdigest() for media, data, _ in layers if media != RAW_WEIGHT}
