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
    RAW_WEIGHT,
    REGISTRY_BIN,
    SERVICE,
    TAR_GZIP_WEIGHT,
    TAR_WEIGHT,
    Pusher,
    Registry,
    Storage,
    TokenService,
    bcrypt_hash,
    docker_config,
    push_artifact,
    push_model,
    tar_layer,
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
    registry = Registry(tmp_path / "reg", {"htpasswd": {"realm": "test", "path": str(htpasswd)}},
                        access_log=True)
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


def layered_model(files: dict[str, bytes]) -> list[tuple[str, bytes, str]]:
    """The model as a ModelPack artifact of three layers: the weights raw, the tokenizer files in a `.tar`
    layer, the rest in a `.tar+gzip` layer (as modctl packs a model's directories)."""
    weights = {p: d for p, d in files.items() if p.endswith(".safetensors")}
    tokenizer = {p: d for p, d in files.items() if p.startswith("tokenizer")}
    rest = {p: d for p, d in files.items() if p not in weights and p not in tokenizer}
    assert weights and tokenizer and rest, sorted(files)
    return [*((RAW_WEIGHT, d, p) for p, d in weights.items()),
            (TAR_WEIGHT, tar_layer(tokenizer), "tokenizer"),
            (TAR_GZIP_WEIGHT, tar_layer(rest, compress=True), "config")]


def test_tar_and_tar_gzip_layers_are_unpacked_into_the_snapshot_as_blobs_of_the_cache(
    tmp_path, basic_registry
):
    files = model_files(1 << 20, 1)
    files["tokenizer/nested/merges.txt"] = b"a b\n" * 3000
    layers = layered_model(files)
    push_artifact(Pusher(basic_registry.base, basic(USER, PASSWORD)), NAME, "v1", layers)
    config = docker_config(tmp_path, basic_registry.host, USER, PASSWORD)
    url = f"oci://{basic_registry.host}/{NAME}:v1"
    done = agent_cli(*fetch_args(tmp_path, url, basic_registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip().splitlines()[-1])
    same_files(snapshot, files)
    # Every file, raw or unpacked, is a blob named by its sha256 (the HF layout); no layer is in the hub
    # cache, and the standalone CLI (which seeds nothing) kept none in its state dir either.
    blobs = tmp_path / "hub" / repo_folder_name(REPO) / "blobs"
    assert {p.name for p in blobs.iterdir()} == {hashlib.sha256(d).hexdigest() for d in files.values()}
    assert not list((tmp_path / "state").rglob("layers/*/blobs/*"))

    import huggingface_hub

    offline = huggingface_hub.snapshot_download(REPO, revision="v1", cache_dir=tmp_path / "hub",
                                                local_files_only=True)
    same_files(offline, files)

    # Fetched again: planned from what this node unpacked, no layer read from the registry again.
    before = basic_registry.blob_bytes_served()
    assert before >= sum(len(data) for _, data, _ in layers)
    again = agent_cli(*fetch_args(tmp_path, url, basic_registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert again.returncode == 0, again.stderr
    assert basic_registry.blob_bytes_served() == before


@pytest.mark.parametrize("hostile", ["../escape.txt", "/etc/escape.txt", "link", "raw"])
def test_a_hostile_tar_layer_fails_the_fetch_with_one_line_and_writes_nothing(
    tmp_path, basic_registry, hostile
):
    import tarfile

    files = model_files(1 << 20, 1)
    bad = tarfile.TarInfo(hostile)
    if hostile == "link":
        bad.type, bad.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif hostile == "raw":  # the path of the raw weights layer: one layer would overwrite another's file
        bad.name, bad.size = next(p for p in files if p.endswith(".safetensors")), 5
    else:
        bad.size = 5
    layers = [*layered_model(files)[:-1], (TAR_GZIP_WEIGHT, tar_layer({"ok.txt": b"ok"}, True, [bad]), "x")]
    push_artifact(Pusher(basic_registry.base, basic(USER, PASSWORD)), NAME, "v1", layers)
    config = docker_config(tmp_path, basic_registry.host, USER, PASSWORD)
    url = f"oci://{basic_registry.host}/{NAME}:v1"
    done = agent_cli(*fetch_args(tmp_path, url, basic_registry), env={"REGISTRY_AUTH_FILE": str(config)})
    assert done.returncode == 6, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    said = ("unsafe path", "symbolic link", "also a file of another layer")
    assert "refused" in last and any(why in last for why in said), done.stderr
    # Nothing in any snapshot, no unpacked file among the blobs, nothing outside the cache.
    root = tmp_path / "hub" / repo_folder_name(REPO)
    assert not [p for p in (root / "snapshots").rglob("*") if not p.is_dir()]
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "hub" / "escape.txt").exists()
    unpacked = {hashlib.sha256(d).hexdigest() for p, d in files.items() if not p.endswith(".safetensors")}
    assert not unpacked & {p.name for p in (root / "blobs").iterdir()}
    assert not [p for p in (root / "blobs").iterdir() if p.name.startswith(".")]
