"""An independent client reads what weightswarm reads: skopeo (containers/image, the registry client of
Podman and CRI-O) copies the ModelPack artifact the tests push into a real registry (Debian's
docker-registry, tests.support.ocikit) to an OCI image layout, and what `agent fetch oci://…` installed
is that: its commit is the first 40 hex digits of the manifest digest skopeo reads, and each file, at
its layer's `org.cncf.model.filepath`, is byte for byte the blob skopeo copied (docs/registries.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import agent_cli, same_files, write_model
from tests.support.ocikit import REGISTRY_BIN, Pusher, Registry, bcrypt_hash, docker_config, push_model

REPO = "acme/oci-skopeo"
NAME = "models/llama-ft"
USER, PASSWORD = "puller", "skopeo-s3cret"
SKOPEO = shutil.which("skopeo")
pytestmark = pytest.mark.skipif(
    not REGISTRY_BIN.exists() or SKOPEO is None, reason="./dev installs docker-registry and skopeo"
)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    (tmp_path / "reg").mkdir()
    htpasswd = tmp_path / "reg" / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt_hash(PASSWORD)}\n")
    reg = Registry(tmp_path / "reg", {"htpasswd": {"realm": "test", "path": str(htpasswd)}})
    yield reg
    reg.stop()


def pushed(tmp_path: Path, registry: Registry, total: int, shards: int) -> tuple[dict[str, bytes], str]:
    """A test model pushed as `NAME:v1`: its files and the manifest digest the push computed."""
    files = write_model(tmp_path / "model", REPO, total_bytes=total, shards=shards, seed=37)
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return files, push_model(Pusher(registry.base, basic), NAME, "v1", files)


def fetch(tmp_path: Path, registry: Registry, auth: Path) -> Path:
    done = agent_cli("fetch", f"oci://{registry.host}/{NAME}:v1", "--repo-id", REPO, "--cache-dir",
                     str(tmp_path / "hub"), "--state-dir", str(tmp_path / "state"), "--agent", "off",
                     "--oci-plain-http", registry.host, env={"REGISTRY_AUTH_FILE": str(auth)})
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def skopeo(*args: str) -> bytes:
    done = subprocess.run([str(SKOPEO), *args], capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def test_skopeo_copies_the_manifest_and_the_bytes_agent_fetch_installed(tmp_path, registry):
    files, digest = pushed(tmp_path, registry, 3 << 20, 2)
    auth = docker_config(tmp_path, registry.host, USER, PASSWORD)
    snapshot = fetch(tmp_path, registry, auth)
    ref = f"docker://{registry.host}/{NAME}:v1"

    # The manifest as skopeo reads it (its raw bytes): the digest the push computed, and the commit the
    # agent installed is its first 40 hex digits.
    raw = skopeo("inspect", "--raw", "--tls-verify=false", "--authfile", str(auth), ref)
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    assert snapshot.name == hashlib.sha256(raw).hexdigest()[:40]

    # skopeo's copy into an OCI layout: the same manifest, and each layer's blob is the agent's file at the
    # layer's path, every file of the snapshot one layer.
    layout = tmp_path / "layout"
    skopeo("copy", "--quiet", "--src-tls-verify=false", "--src-authfile", str(auth), ref, f"oci:{layout}")
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    blobs = layout / "blobs" / "sha256"
    assert (blobs / entry["digest"].removeprefix("sha256:")).read_bytes() == raw
    copied = {}
    for layer in json.loads(raw)["layers"]:
        path = layer["annotations"]["org.cncf.model.filepath"]
        copied[path] = (blobs / layer["digest"].removeprefix("sha256:")).read_bytes()
    assert len(copied) == len(json.loads(raw)["layers"])
    same_files(snapshot, copied)
    assert copied == files


def test_a_layer_larger_than_one_range_arrives_whole(tmp_path, registry):
    # One 10-MiB shard: three of the engine's 4-MiB ranges, each asked for by the blob's URL.
    files, _ = pushed(tmp_path, registry, 10 << 20, 1)
    assert max(len(data) for data in files.values()) > 2 * (4 << 20)
    snapshot = fetch(tmp_path, registry, docker_config(tmp_path, registry.host, USER, PASSWORD))
    same_files(snapshot, files)
