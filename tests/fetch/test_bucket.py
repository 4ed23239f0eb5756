"""Models from object storage, one machine: `agent fetch s3://bucket/prefix --repo-id ORG/NAME` against a
real S3 API server (moto's, tests.support.s3kit) and `az://container/prefix` against Azurite
(tests.support.azurekit; the tests taking `store` run against both), behind a proxy that counts what the
store serves and breaks answers on request; the real huggingface_hub reads the result offline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.cache.layout import repo_folder_name
from agent.core.errors import AuthError, ConfigError, IntegrityError
from agent.core.progress import Progress
from agent.core.settings import OriginSettings, Settings
from agent.fetch.engine import FetchEngine, fetch_snapshot, plan_from_origin
from agent.kube.requests import ModelRef, parse_model_ref
from agent.origin.bucket import listing_commit
from agent.origin.bucket_url import allowed_bucket, split_bucket_url
from agent.origin.kinds import open_origin
from agent.origin.ranges import OriginSource
from tests.support.cluster import agent_cli, same_files
from tests.support.s3kit import FaultProxy, S3Server, Store, put_object, write_bucket_model

REPO = "acme/bucket-model"
PREFIX = "models/m1"


@pytest.fixture
def bucket_env(s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's cloud credentials: the server's user, through the proxy."""
    env = s3_server.env(endpoint=s3_proxy.endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def settings_for(tmp_path: Path, url: str) -> Settings:
    return Settings.from_env_defaults(
        cache_dir=tmp_path / "hub", state_dir=tmp_path / "state", origin=OriginSettings(endpoint=url)
    )


def blobs_of(tmp_path: Path) -> list[Path]:
    blobs = tmp_path / "hub" / repo_folder_name(REPO) / "blobs"
    return sorted(blobs.iterdir()) if blobs.exists() else []


def url_of(store: Store, bucket: str, prefix: str = PREFIX) -> str:
    return f"{store.scheme}://{bucket}/{prefix}"


def test_the_cli_fetches_a_bucket_model_that_huggingface_hub_reads_offline(
    tmp_path, store, store_bucket, store_proxy, store_env
):
    files = write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=3 << 20, shards=3)
    total = sum(len(d) for d in files.values())
    args = ("fetch", url_of(store, store_bucket), "--repo-id", REPO, "--cache-dir", str(tmp_path / "hub"),
            "--state-dir", str(tmp_path / "state"), "--agent", "off")
    done = agent_cli(*args, env=store_env)
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip().splitlines()[-1])
    same_files(snapshot, files)
    assert store_proxy.bytes_served == total  # each object once, no more
    # Blobs are named by their sha256, as a hub's LFS files are: the same shard elsewhere is one blob.
    assert all(len(p.name) == 64 for p in blobs_of(tmp_path) if not p.name.endswith(".incomplete"))

    import huggingface_hub

    offline = huggingface_hub.snapshot_download(REPO, cache_dir=tmp_path / "hub", local_files_only=True)
    same_files(offline, files)

    # Again: the listing is the only request; the content ids learnt on the first read link the files.
    store_proxy.reset_counters()
    again = agent_cli(*args, env=store_env)
    assert again.returncode == 0, again.stderr
    assert store_proxy.bytes_served == 0
    assert "already in the cache" in again.stderr


def test_a_changed_object_is_a_new_commit_and_only_it_moves(
    tmp_path, store, store_bucket, store_proxy, store_env
):
    files = write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=2 << 20, shards=2)
    settings = settings_for(tmp_path, url_of(store, store_bucket))
    first = fetch_snapshot(settings, REPO)
    changed = dict(files)
    changed["config.json"] = b'{"model_type": "llama", "changed": true}\n'
    store.put_object(store_bucket, f"{PREFIX}/config.json", changed["config.json"])
    store_proxy.reset_counters()
    second = fetch_snapshot(settings, REPO)
    assert second.commit != first.commit
    assert store_proxy.bytes_served == len(changed["config.json"])
    same_files(second.snapshot_path, changed)
    same_files(first.snapshot_path, files)  # the old commit's snapshot stays as it was
    ref = tmp_path / "hub" / repo_folder_name(REPO) / "refs" / "main"
    assert ref.read_text().strip() == second.commit


def test_slowdown_and_a_dropped_stream_are_retried_and_lose_nothing(
    tmp_path, s3_server, s3_bucket, s3_proxy, bucket_env
):
    files = write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=2 << 20, shards=2)
    s3_proxy.slowdown(2)
    s3_proxy.drop_mid_body(2)
    result = fetch_snapshot(settings_for(tmp_path, f"s3://{s3_bucket}/{PREFIX}"), REPO)
    same_files(result.snapshot_path, files)
    # A dropped range resumes from the byte it reached: at most those halves come twice.
    assert s3_proxy.bytes_served <= sum(len(d) for d in files.values()) * 1.5


def test_an_object_changed_after_the_listing_fails_clearly_and_leaves_nothing(
    tmp_path, store, store_bucket, store_proxy, store_env
):
    files = write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    settings = settings_for(tmp_path, url_of(store, store_bucket))
    client = open_origin(settings.origin)
    try:
        plan = plan_from_origin(client, REPO, "main")
        shard = next(p for p in files if p.endswith(".safetensors"))
        store.put_object(store_bucket, f"{PREFIX}/{shard}", files[shard][::-1])
        with pytest.raises(IntegrityError, match="changed since it was listed"):
            FetchEngine(settings, OriginSource(client, settings.fetch), Progress(quiet=True)).run(plan)
    finally:
        client.close()
    snapshot = tmp_path / "hub" / repo_folder_name(REPO) / "snapshots" / plan.commit
    assert not (snapshot / shard).exists()
    # The object's HEAD told: no byte of it was asked for (the ranges' If-Match is the next line of defence).
    got = [r for r in store_proxy.requests if r[0] == "GET" and r[1].endswith(shard)]
    assert not got, store_proxy.requests


def test_a_range_of_an_object_replaced_mid_download_is_refused(
    tmp_path, store, store_bucket, store_proxy, store_env
):
    """The signed URL's ranges carry If-Match with the listed ETag: a replaced object answers 412, not bytes
    of its new content spliced into the old."""
    files = write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    client = open_origin(OriginSettings(endpoint=url_of(store, store_bucket)))
    try:
        commit, _ = client.revision(REPO, "main")
        shard = next(p for p in files if p.endswith(".safetensors"))
        url = client.file_metadata(REPO, commit, shard).url
        first = client.open_range(url, 0, 1024, shard)
        assert first.read() == files[shard][:1024]
        first.release_conn()
        store.put_object(store_bucket, f"{PREFIX}/{shard}", files[shard][::-1])
        with pytest.raises(IntegrityError, match="changed since it was listed"):
            client.open_range(url, 1024, 2048, shard)
    finally:
        client.close()


def test_wrong_credentials_get_a_clear_error_and_no_bytes(
    tmp_path, store, store_bucket, store_proxy, store_env, monkeypatch
):
    write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    monkeypatch.setenv(store.secret_env, store.wrong_secret())
    with pytest.raises(AuthError, match="refused this node's credentials") as refused:
        fetch_snapshot(settings_for(tmp_path, url_of(store, store_bucket)), REPO)
    assert "\n" not in str(refused.value)  # one line, whatever the store's error body holds
    assert store_proxy.bytes_served == 0
    assert blobs_of(tmp_path) == []


def test_a_key_that_climbs_out_of_the_prefix_refuses_the_listing(
    tmp_path, s3_server, s3_bucket, s3_proxy, bucket_env
):
    write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    put_object(s3_server, s3_bucket, f"{PREFIX}/../../../etc/evil", b"x")
    put_object(s3_server, s3_bucket, f"{PREFIX}/sub/../../evil", b"x")
    with pytest.raises(IntegrityError, match="key"):
        fetch_snapshot(settings_for(tmp_path, f"s3://{s3_bucket}/{PREFIX}"), REPO)
    assert s3_proxy.bytes_served == 0
    assert not (tmp_path / "etc").exists() and blobs_of(tmp_path) == []


def test_the_commit_follows_every_key_size_and_etag():
    from agent.origin.bucket import BucketObject

    a = {"config.json": BucketObject("config.json", 10, '"e1"', None)}
    assert listing_commit("s3://b/p", a) == listing_commit("s3://b/p", dict(a))
    assert len(listing_commit("s3://b/p", a)) == 40
    for other in (
        {"config.json": BucketObject("config.json", 11, '"e1"', None)},
        {"config.json": BucketObject("config.json", 10, '"e2"', None)},
        {"config.json": BucketObject("config.json", 10, '"e1"', "v2")},
        {**a, "x.json": BucketObject("x.json", 1, '"e3"', None)},
    ):
        assert listing_commit("s3://b/p", other) != listing_commit("s3://b/p", a)
    assert listing_commit("s3://b/q", a) != listing_commit("s3://b/p", a)


def test_bucket_urls_and_the_agents_allow_list():
    assert split_bucket_url("s3://b/models/m1/") == ("s3", "b", "models/m1")
    for bad in ("s3://", "http://b/p", "s3://b/p/../q", "s3://b/p?x=1", "s3://b/a//p"):
        with pytest.raises(ConfigError):
            split_bucket_url(bad)
    allowed = ("s3://b/models", "gs://g")
    assert allowed_bucket("s3://b/models/m1", allowed) == "s3://b/models/m1"
    assert allowed_bucket("gs://g/any/thing", allowed) == "gs://g/any/thing"
    for refused in ("s3://b/modelsX/m1", "s3://b/other", "s3://c/models", "az://b/models"):
        with pytest.raises(ConfigError, match="agent serve --bucket"):
            allowed_bucket(refused, allowed)


def test_the_annotation_names_a_bucket_model_by_repo_id_and_url():
    assert parse_model_ref("acme/m=s3://b/models/m1/") == ModelRef("acme/m", source="s3://b/models/m1")
    assert parse_model_ref("acme/m@v1") == ModelRef("acme/m", "v1")
    from agent.core.errors import AnnotationError

    for bad in ("acme/m=https://b/p", "acme/m=s3://b/../p", "../x=s3://b/p"):
        with pytest.raises(AnnotationError):
            parse_model_ref(bad)


def test_the_hub_token_never_goes_to_a_store(tmp_path, s3_server, s3_bucket, s3_proxy, bucket_env):
    write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    origin = dataclasses.replace(
        OriginSettings(endpoint=f"s3://{s3_bucket}/{PREFIX}"), token="hf_secret_token_value"
    )
    client = open_origin(origin)
    assert client.settings.token is None
    commit, _ = client.revision(REPO, "main")
    url = client.file_metadata(REPO, commit, "config.json").url
    assert "Authorization" not in client.kind.http.headers_for(url)
    client.close()


def test_a_listed_key_must_be_a_safe_snapshot_path():
    """Whatever the store's client lets through (obstore refuses `..` itself), the listing's own check."""
    from agent.origin.bucket import listed_object

    assert listed_object({"path": "a/b.json", "size": 2, "e_tag": '"e"'}, "w").path == "a/b.json"
    assert listed_object({"path": "dir/", "size": 0, "e_tag": '"e"'}, "w") is None  # a directory marker
    for bad in ("../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\..\\b", "a/\x00b"):
        with pytest.raises(IntegrityError, match="unsafe key"):
            listed_object({"path": bad, "size": 1, "e_tag": '"e"'}, "w")


def test_the_same_shard_in_two_buckets_is_stored_once(tmp_path, s3_server, s3_bucket, s3_proxy, bucket_env):
    files = write_bucket_model(s3_server, s3_bucket, "a", REPO, total_bytes=1 << 20, shards=1)
    write_bucket_model(s3_server, s3_bucket, "b", REPO, total_bytes=1 << 20, shards=1)
    first = fetch_snapshot(settings_for(tmp_path, f"s3://{s3_bucket}/a"), REPO)
    second = fetch_snapshot(settings_for(tmp_path, f"s3://{s3_bucket}/b"), "acme/same-shard")
    shard = next(p for p in files if p.endswith(".safetensors"))
    a, b = (Path(r.snapshot_path) / shard for r in (first, second))
    assert a.resolve() != b.resolve() and a.stat().st_ino == b.stat().st_ino
    same_files(second.snapshot_path, files)


def test_a_bucket_models_plan_records_no_entitlement_a_hub_repo_could_use(
    tmp_path, s3_server, s3_bucket, s3_proxy, bucket_env
):
    """Entitlement records are per repo id and hub token: a bucket read under `acme/x` must not let a node
    plan the Hub's `acme/x` from the tracker while the Hub is down."""
    from agent.cache.layout import StateDir
    from agent.fetch.entitlement import Entitlements
    from agent.fetch.planning import plan_fetch

    write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    entitlements = Entitlements(StateDir(tmp_path / "state"))
    client = open_origin(OriginSettings(endpoint=f"s3://{s3_bucket}/{PREFIX}"))
    try:
        plan = plan_fetch(client, None, REPO, "main", entitlements=entitlements, publisher_key=None)
    finally:
        client.close()
    assert not all(e.content_known for e in plan.files)
    assert entitlements.allows(REPO, None) is None and entitlements.commit_for(REPO, "main") is None


def test_an_etag_listed_bare_is_the_same_one_quoted():
    """Azure gives one blob's ETag in two shapes: List Blobs bare, Get Blob Properties (the HEAD) and Get
    Blob in quotes ("if the request version is 2011-08-18 or newer, the ETag value will be in quotes",
    Azure's REST reference; "the service directly returns ETag without quotes for list blobs",
    Azure/azure-storage-node#586; Azurite does the same, Azure/Azurite#361). S3 quotes both. The HEAD's
    check and the ranges' If-Match must take either, and still tell two versions apart."""
    from agent.origin.bucket import listed_object, quoted_etag, same_etag

    azure_listed = listed_object({"path": "a.bin", "size": 1, "e_tag": "0x8D88739958C9830"}, "w")
    assert azure_listed.etag == "0x8D88739958C9830"  # kept as listed: the commit derives from it
    assert same_etag('"0x8D88739958C9830"', azure_listed.etag)
    assert quoted_etag(azure_listed.etag) == '"0x8D88739958C9830"'
    assert same_etag('"XrY7u+Ae7tCTyyK7j1rNww=="', "XrY7u+Ae7tCTyyK7j1rNww==")  # fake-gcs-server's HEAD, list
    s3 = '"9b2cf535f27731c974343645a3985328"'
    assert same_etag(s3, s3) and quoted_etag(s3) == s3
    assert same_etag('"d41d8cd98f00b204e9800998ecf8427e-3"', '"d41d8cd98f00b204e9800998ecf8427e-3"')
    for other in ('"0x8D88739958C9831"', "0x8D88739958C9831", 'W/"0x8D88739958C9830"', ""):
        assert not same_etag(other, azure_listed.etag), other
    assert quoted_etag('W/"x"') == 'W/"x"'
