"""Models from OCI registries, one machine: `agent fetch oci://… --repo-id ORG/NAME` against a real
registry (Debian's docker-registry, distribution v2: tests.support.ocikit) with Basic auth and with the
Bearer token flow, artifacts pushed by the OCI API by hand; huggingface_hub reads the result offline."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cache.layout import repo_folder_name
from tests.support.cluster import agent_cli, same_files, write_model
from tests.support.ocikit import (
    ISSUER,
    REGISTRY_BIN,
    SERVICE,
    Pusher,
    Registry,
    Storage,
    TokenService,
    bcrypt_hash,
    docker_config,
    push_model,
)

REPO = "acme/oci-model"
NAME = "models/llama-ft"
USER, PASSWORD = "puller", "s3cret-pass"
pytestmark = pytest.mark.skipif(not REGISTRY_BIN.exists(), reason="./dev installs docker-registry")


def model_files(total: int = 3 << 20, shards: int = 2) -> dict[str, bytes]:
    """A realistic test model (config, tokenizer, .gitattributes, real safetensors shards)."""
    with tempfile.TemporaryDirectory(prefix="ws-ocimodel-") as tmp:
        return write_model(Path(tmp), REPO, total_bytes=total, shards=shards, seed=11)


@pytest.fixture
def basic_registry(tmp_path: Path) -> Iterator[Registry]:
    (tmp_path / "reg").mkdir()
    htpasswd = tmp_path / "reg" / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt_hash(PASSWORD)}\n")
    registry = Registry(tmp_path / "reg", {"htpasswd": {"realm": "test", "path": str(htpasswd)}})
    yield registry
    registry.stop()


@pytest.fixture
def token_registry(tmp_path: Path) -> Iterator[tuple[Registry, TokenService]]:
    (tmp_path / "reg").mkdir()
    service = TokenService(tmp_path / "reg", {USER: PASSWORD, "pusher": "push-pass"},
                           {USER: ["pull"], "pusher": ["pull", "push"]})
    token = {"realm": service.realm, "service": SERVICE, "issuer": ISSUER,
             "rootcertbundle": str(service.cert_file)}
    registry = Registry(tmp_path / "reg", {"token": token})
    yield registry, service
    registry.stop()
    service.stop()


@pytest.fixture
def redirecting_registry(tmp_path: Path) -> Iterator[tuple[Registry, Storage]]:
    """A registry that answers blob reads with a 307 to its storage host (distribution's `redirect`
    storage middleware, as it does with S3 or GCS storage), the storage host on another address."""
    (tmp_path / "reg").mkdir()
    htpasswd = tmp_path / "reg" / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt_hash(PASSWORD)}\n")
    storage = Storage(tmp_path / "reg" / "storage")
    registry = Registry(tmp_path / "reg", {"htpasswd": {"realm": "test", "path": str(htpasswd)}},
                        redirect_to=storage.base)
    yield registry, storage
    registry.stop()
    storage.stop()


def basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def fetch_args(tmp_path: Path, url: str, registry: Registry) -> tuple[str, ...]:
    return ("fetch", url, "--repo-id", REPO, "--cache-dir", str(tmp_path / "hub"), "--state-dir",
            str(tmp_path / "state"), "--agent", "off", "--oci-plain-http", registry.host)


def test_the_cli_fetches_a_modelpack_artifact_with_basic_auth_and_huggingface_hub_reads_it(
    tmp_path, basic_registry
):
    files = model_files()
    digest = push_model(Pusher(basic_registry.base, basic(USER, PASSWORD)), NAME, "v1", files)
    config = docker_config(tmp_path, basic_registry.host, USER, PASSWORD)
    url = f"oci://{basic_registry.host}/{NAME}:v1"
    done = agent_cli(*fetch_args(tmp_path, url, basic_registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip().splitlines()[-1])
    same_files(snapshot, files)
    # The commit is the manifest digest's first 40 hex; refs/<tag> points at it.
    commit = digest.removeprefix("sha256:")[:40]
    assert snapshot.name == commit
    refs = tmp_path / "hub" / repo_folder_name(REPO) / "refs" / "v1"
    assert refs.read_text() == commit
    # Blobs are named by the layer digests, which are the files' sha256 (the Hub's LFS oids).
    blobs = tmp_path / "hub" / repo_folder_name(REPO) / "blobs"
    assert {p.name for p in blobs.iterdir()} == {hashlib.sha256(d).hexdigest() for d in files.values()}
    assert PASSWORD not in done.stderr and "Authorization" not in done.stderr

    import huggingface_hub

    offline = huggingface_hub.snapshot_download(REPO, revision="v1", cache_dir=tmp_path / "hub",
                                                local_files_only=True)
    same_files(offline, files)


def test_without_credentials_the_registry_refuses_and_nothing_is_kept(tmp_path, basic_registry):
    push_model(Pusher(basic_registry.base, basic(USER, PASSWORD)), NAME, "v1", model_files(1 << 20, 1))
    url = f"oci://{basic_registry.host}/{NAME}:v1"
    anonymous = agent_cli(*fetch_args(tmp_path, url, basic_registry),
                          env={"REGISTRY_AUTH_FILE": str(tmp_path / "none.json")})
    assert anonymous.returncode == 4, anonymous.stderr
    assert "docker config has none" in anonymous.stderr
    wrong = docker_config(tmp_path, basic_registry.host, USER, "wrong")
    refused = agent_cli(*fetch_args(tmp_path, url, basic_registry), env={"REGISTRY_AUTH_FILE": str(wrong)})
    assert refused.returncode == 4, refused.stderr
    assert "refused the docker config's login" in refused.stderr
    assert "wrong" not in refused.stderr
    assert not (tmp_path / "hub" / repo_folder_name(REPO) / "blobs").exists() or not any(
        (tmp_path / "hub" / repo_folder_name(REPO) / "blobs").iterdir())


def test_the_bearer_token_flow_as_registries_do_it(tmp_path, token_registry):
    registry, service = token_registry
    files = model_files(1 << 20, 1)
    push = service.token("pusher", [f"repository:{NAME}:pull,push"])
    push_model(Pusher(registry.base, f"Bearer {push}"), NAME, "latest", files)
    config = docker_config(tmp_path, registry.host, USER, PASSWORD)
    url = f"oci://{registry.host}/{NAME}"  # no tag: latest, as docker reads it
    issued = service.issued
    done = agent_cli(*fetch_args(tmp_path, url, registry), "--revision", "latest",
                     env={"REGISTRY_AUTH_FILE": str(config), "DOCKER_CONFIG": str(tmp_path / "elsewhere")})
    assert done.returncode == 0, done.stderr
    same_files(Path(done.stdout.strip().splitlines()[-1]), files)
    assert service.issued > issued  # the token came from the token service, with the login
    wrong = docker_config(tmp_path, registry.host, USER, "wrong")
    refused = agent_cli(*fetch_args(tmp_path, url, registry), env={"REGISTRY_AUTH_FILE": str(wrong)})
    assert refused.returncode == 4, refused.stderr
    assert "token service" in refused.stderr


def test_a_layer_whose_bytes_do_not_match_its_digest_is_refused(tmp_path, basic_registry):
    files = model_files(1 << 20, 1)
    push_model(Pusher(basic_registry.base, basic(USER, PASSWORD)), NAME, "v1", files)
    weights = next(d for p, d in files.items() if p.endswith(".safetensors"))
    stored = basic_registry.blob_file(hashlib.sha256(weights).hexdigest())
    stored.write_bytes(bytes(len(weights)))  # the same size, other bytes
    config = docker_config(tmp_path, basic_registry.host, USER, PASSWORD)
    url = f"oci://{basic_registry.host}/{NAME}:v1"
    done = agent_cli(*fetch_args(tmp_path, url, basic_registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert done.returncode == 6, done.stderr
    snapshot = tmp_path / "hub" / repo_folder_name(REPO) / "snapshots"
    assert not any(p.name.endswith(".safetensors") for p in snapshot.rglob("*"))


def test_blobs_redirected_to_storage_are_read_there_without_the_registry_login(
    tmp_path, redirecting_registry
):
    registry, storage = redirecting_registry
    files = model_files()
    push_model(Pusher(registry.base, basic(USER, PASSWORD)), NAME, "v1", files)
    config = docker_config(tmp_path, registry.host, USER, PASSWORD)
    url = f"oci://{registry.host}/{NAME}:v1"
    done = agent_cli(*fetch_args(tmp_path, url, registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert done.returncode == 0, done.stderr
    same_files(Path(done.stdout.strip().splitlines()[-1]), files)
    # Every blob's bytes came from the storage host, and no request there carried the registry's login.
    read = {path.split("/")[-2] for path, _ in storage.requests if path.endswith("/data")}
    assert read >= {hashlib.sha256(d).hexdigest() for d in files.values()}, read
    assert storage.bytes_served >= sum(len(d) for d in files.values())
    assert [auth for _, auth in storage.requests if auth is not None] == []

    # The storage host refusing (an expired or wrongly signed URL): one clear line, nothing installed.
    storage.refuse = True
    again = tmp_path / "again"
    again.mkdir()
    refused = agent_cli(*fetch_args(again, url, registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    # The storage host named, the registry not blamed, the URL not shown (a signed one carries its key).
    assert "download host 127.0.0.2" in last and "refused the signed URL (403)" in last, last
    assert "granted access" in last and "/docker/registry/v2" not in refused.stderr, last
    assert not any((again / "hub").rglob("snapshots/*/*.safetensors"))


def test_tar_layers_packed_by_tarfile_come_from_the_registry_and_unpack_into_their_files(
    tmp_path, basic_registry
):
    """The tar layer path end to end but for the fetch engine (not wired yet, docs/registries.md): layers
    written by Python's tarfile, pushed by the OCI API, read back with the agent's registry client and
    checked against their digests, then unpacked with their files' sha256."""
    import gzip
    import io
    import tarfile

    from agent.core.settings import OriginSettings
    from agent.origin.oci.modelpack import layers_of
    from agent.origin.oci.tarlayer import unpack_layer
    from agent.origin.oci_origin import OciOrigin

    files = model_files(1 << 20, 1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    layers = {"application/vnd.cncf.model.weight.v1.tar": buf.getvalue(),
              "application/vnd.cncf.model.weight.v1.tar+gzip": gzip.compress(buf.getvalue())}
    pusher = Pusher(basic_registry.base, basic(USER, PASSWORD))
    config = b"{}"
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.cncf.model.manifest.v1+json",
        "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
                   "digest": pusher.blob(NAME, config), "size": len(config)},
        "layers": [{"mediaType": media, "digest": pusher.blob(NAME, data), "size": len(data),
                    "annotations": {"org.cncf.model.filepath": f"weights{i}"}}
                   for i, (media, data) in enumerate(layers.items())],
    }
    pusher.manifest(NAME, "tars", manifest)
    auth = docker_config(tmp_path, basic_registry.host, USER, PASSWORD)
    settings = OriginSettings(endpoint=f"oci://{basic_registry.host}/{NAME}:tars",
                              oci_plain_http=(basic_registry.host,), oci_auth_file=auth)
    origin = OciOrigin(settings)
    try:
        found = origin.registry.manifest("tars", "acme/m")
        listed = layers_of(found.body, "acme/m")
        assert [layer.archive for layer in listed] == [True, True]
        for layer in listed:
            resp = origin.registry.open_blob("sha256:" + layer.sha256, 0, layer.size, "acme/m")
            blob = resp.read()
            resp.release_conn()
            assert hashlib.sha256(blob).hexdigest() == layer.sha256
            (tmp_path / layer.sha256).write_bytes(blob)
            dest = tmp_path / f"unpacked-{layer.path}"
            dest.mkdir()
            got = unpack_layer(tmp_path / layer.sha256, layer.media_type, dest, "acme/m", max_bytes=1 << 30)
            want = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
            assert {u.path: u.sha256 for u in got} == want
            same_files(dest, files)
    finally:
        origin.close()
