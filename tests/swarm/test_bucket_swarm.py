"""A bucket model through the swarm: real agents (libtorrent sessions, the tracker process) reading from a
real S3 API server (tests.support.s3kit) or Azurite (tests.support.azurekit, for the tests taking
`store`); the store serves each byte about once for the whole cluster, and a node whose credentials the
store refuses gets no byte from its peers."""

from __future__ import annotations

import pytest

from agent.core.errors import ConfigError
from tests.support.cluster import admin_request, same_files, wait_until_seeded
from tests.support.s3kit import FaultProxy, S3Server, write_bucket_model

REPO = "acme/bucket-model"
PREFIX = "models/m1"


@pytest.fixture
def bucket_env(s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env(endpoint=s3_proxy.endpoint).items():
        monkeypatch.setenv(name, value)


def new_weights(shard: bytes) -> bytes:
    """The same safetensors header, other tensor bytes: a fine-tune's shard."""
    data_start = 8 + int.from_bytes(shard[:8], "little")
    return shard[:data_start] + bytes(b ^ 0xFF for b in shard[data_start:])


def fetch_all(daemons, url: str, timeout: float = 120.0) -> list[dict]:
    jobs = [d.request_model(REPO, "main", source=url) for d in daemons]
    for job in jobs:
        assert job.wait(timeout), job.status()
    return [j.status().to_json() for j in jobs]


def test_four_agents_take_a_bucket_model_once_from_the_store(
    origin, tracker, make_agent, store, store_bucket, store_proxy, store_env
):
    files = write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=8 << 20, shards=8)
    total = sum(len(d) for d in files.values())
    url = f"{store.scheme}://{store_bucket}/{PREFIX}"
    allow = {"buckets": (f"{store.scheme}://{store_bucket}/models",)}
    daemons = [make_agent(f"n{i}", origin, tracker, daemon=allow) for i in range(4)]
    statuses = fetch_all(daemons, url)
    for st in statuses:
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)
    # One node read the bucket; the others took the bytes from it.
    assert store_proxy.bytes_served <= total * 1.1, (store_proxy.bytes_served, total)
    readers = [st for st in statuses if st["bytes_from_origin"] > 0]
    assert len(readers) == 1, [st["bytes_from_origin"] for st in statuses]
    assert sum(st["bytes_from_peers"] for st in statuses) >= 3 * total * 0.9
    first_commit = statuses[0]["commit"]
    assert {st["commit"] for st in statuses} == {first_commit}

    # A second revision differs by one shard: only it moves from the store, once.
    wait_until_seeded(tracker, *daemons)
    shard = sorted(p for p in files if p.endswith(".safetensors"))[0]
    changed = {**files, shard: new_weights(files[shard])}
    store.put_object(store_bucket, f"{PREFIX}/{shard}", changed[shard])
    store_proxy.reset_counters()
    again = fetch_all(daemons, url)
    for st in again:
        assert st["phase"] == "Ready", st
        assert st["commit"] != first_commit
        same_files(st["snapshot"], changed)
    assert store_proxy.bytes_served <= len(changed[shard]) * 1.1, store_proxy.bytes_served


def test_a_node_the_store_refuses_gets_no_bytes_from_its_peers(
    origin, tracker, make_agent, store, store_bucket, store_proxy, store_env, monkeypatch
):
    files = write_bucket_model(store, store_bucket, PREFIX, REPO, total_bytes=2 << 20, shards=2)
    url = f"{store.scheme}://{store_bucket}/{PREFIX}"
    allow = {"buckets": (url,)}
    holder = make_agent("holder", origin, tracker, daemon=allow)
    (st,) = fetch_all([holder], url)
    assert st["phase"] == "Ready", st
    same_files(st["snapshot"], files)
    wait_until_seeded(tracker, holder)

    # Every store client reads the credentials when it starts: from now on this process's are wrong.
    monkeypatch.setenv(store.secret_env, store.wrong_secret())
    refused = make_agent("refused", origin, tracker, daemon=allow)
    (st,) = fetch_all([refused], url)
    assert st["phase"] == "Failed", st
    assert "refused this node's credentials" in st["error"], st
    assert st["bytes_from_peers"] == 0 and not refused.held_blobs()


def test_a_bucket_the_agent_does_not_allow_is_refused_on_every_channel(
    tmp_path, origin, tracker, make_agent, s3_server, s3_bucket, s3_proxy, bucket_env
):
    write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=1 << 20, shards=1)
    pods = tmp_path / "pods.sock"
    allow = {"buckets": (f"s3://{s3_bucket}/other",), "pods_socket": pods}
    d = make_agent("n", origin, tracker, daemon=allow)
    with pytest.raises(ConfigError, match="agent serve --bucket"):
        d.request_model(REPO, "main", source=f"s3://{s3_bucket}/{PREFIX}")
    for url in (d.admin_url, f"unix://{pods}"):
        body = {"repo_id": REPO, "source": f"s3://{s3_bucket}/{PREFIX}"}
        resp = admin_request(url, "POST", "/v1/fetch", json=body)
        assert resp.status_code in (400, 403), resp.text
        assert "agent serve --bucket" in resp.text
    assert s3_proxy.bytes_served == 0


def test_a_slow_read_of_the_bucket_keeps_its_lease(
    origin, tracker, make_agent, s3_server, s3_bucket, s3_proxy, bucket_env
):
    """The reader's heartbeats report bytes as they land: a file that takes longer than a holder may stall
    does not hand the lease to a waiting node, which would read the whole bucket too."""
    files = write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=8 << 20, shards=2)
    total = sum(len(d) for d in files.values())
    s3_proxy.rate = 1 << 20  # a 4-MiB range takes 4 s, a stall is 1 s
    url = f"s3://{s3_bucket}/{PREFIX}"
    quick = {"buckets": (url,), "lease_ttl": 1.5, "lease_stall_min": 1.0}
    daemons = [make_agent(f"n{i}", origin, tracker, daemon=quick) for i in range(3)]
    statuses = fetch_all(daemons, url)
    for st in statuses:
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)
    assert [st["bytes_from_origin"] > 0 for st in statuses].count(True) == 1, statuses
    assert s3_proxy.bytes_served <= total * 1.1, (s3_proxy.bytes_served, total)
