"""A bucket model through the swarm: real agents (libtorrent sessions, the tracker process) reading from a
real S3 API server (tests.support.s3kit) or Azurite (tests.support.azurekit, for the tests taking
`store`); the store serves each byte about once for the whole cluster, and a node whose credentials the
store refuses gets no byte from its peers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import huggingface_hub
import psutil
import pytest

from agent.cache.arrivals import Arrival
from agent.core.errors import ConfigError
from agent.origin.bucket import listed_checksum
from tests.support.cluster import admin_request, same_files, wait_until_seeded
from tests.support.procs import loop_until
from tests.support.s3kit import FaultProxy, S3Server, write_bucket_model

REPO = "acme/bucket-model"
PREFIX = "models/m1"


@pytest.fixture
def bucket_env(s3_server: S3Server, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env(endpoint=s3_proxy.endpoint).items():
        monkeypatch.setenv(name, value)


SLOW_STORE = 384 << 10
"""Bytes a second of each of the store's answers: 1-MiB ranges (`FEW`) come in four blocks 0.7 s apart,
never silent long enough for the engine to hedge (a second range of the same bytes is egress too)."""
FEW = {"chunk_size": 1 << 20, "connections_per_file": 2}
"""The reader's read held to a few answers at once: 1.5 MiB/s of the slow store for two shards."""


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


def test_the_others_take_a_bucket_model_from_its_reader_while_it_reads(
    tmp_path, origin, tracker, make_agent, s3_server, s3_bucket, s3_proxy, bucket_env
):
    """S3's single-part ETag is the MD5 of the bytes: each node checks the relayed bytes against its own
    listing's, so nobody waits for the reader's whole read (as a hub model's cold start overlaps it)."""
    files = write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=6 << 20, shards=2)
    total = sum(len(d) for d in files.values())
    s3_proxy.rate = SLOW_STORE  # the read takes seconds
    url = f"s3://{s3_bucket}/{PREFIX}"
    daemons = [make_agent(f"n{i}", origin, tracker, daemon={"buckets": (url,)}, fetch=FEW) for i in range(3)]
    jobs = [d.request_model(REPO, "main", source=url) for d in daemons]
    early = []  # what each node had in place while the store had served less than 80 % of the model

    def sampled() -> bool:
        served = s3_proxy.bytes_served
        done = [sum(f["done"] for f in j.status().to_json()["files"]) for j in jobs]
        if served < 0.8 * total:
            early.append(done)
        return all(j.status().phase in ("Ready", "Failed") for j in jobs)

    loop_until(sampled, timeout=120, interval=0.1, what="every job's end")
    statuses = [j.status().to_json() for j in jobs]
    for st in statuses:
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)
    assert s3_proxy.bytes_served <= total * 1.05, (s3_proxy.bytes_served, total)
    readers = [i for i, st in enumerate(statuses) if st["bytes_from_origin"] > 0]
    assert len(readers) == 1, [st["bytes_from_origin"] for st in statuses]
    others = [i for i in range(3) if i not in readers]
    for i in others:
        assert statuses[i]["bytes_from_peers"] >= total * 0.9, statuses[i]
        # Bytes in place on a node that never read the store, long before the store's last byte.
        assert max(sample[i] for sample in early) >= total * 0.3, (i, early[-3:])
    for d in daemons:
        d.stop()
    offline = huggingface_hub.snapshot_download(
        REPO, cache_dir=daemons[others[0]].settings.cache_dir, local_files_only=True
    )
    same_files(offline, files)


def corrupt_holder_streams(
    monkeypatch: pytest.MonkeyPatch, holder_dir: Path, files: dict[str, bytes]
) -> None:
    """The holder's relay route serves each arriving object with one byte flipped (its disk copy and its
    own reads stay right): a peer that lies, or a flipped bit on its way."""
    bad: dict[int, Path] = {}
    for data in files.values():
        copy, mid = holder_dir.parent / f"corrupt-{len(data)}", len(data) // 2
        copy.write_bytes(data[:mid] + bytes([data[mid] ^ 1]) + data[mid + 1 :])
        bad[len(data)] = copy
    real = Arrival.open_at

    def open_at(self: Arrival, pos: int, n: int, checked: bool = False):
        opened = real(self, pos, n, checked)
        if opened is None or not checked or holder_dir not in self.path.parents or self.size not in bad:
            return opened
        fd, n, generation = opened
        os.close(fd)
        return os.open(bad[self.size], os.O_RDONLY), n, generation

    monkeypatch.setattr(Arrival, "open_at", open_at)


def test_a_reader_that_relays_a_wrong_byte_is_refused_and_the_object_comes_by_its_sha256(
    origin, tracker, make_agent, s3_server, s3_bucket, s3_proxy, bucket_env, monkeypatch, caplog
):
    files = write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=4 << 20, shards=2)
    total = sum(len(d) for d in files.values())
    s3_proxy.rate = SLOW_STORE
    url = f"s3://{s3_bucket}/{PREFIX}"
    holder = make_agent("holder", origin, tracker, daemon={"buckets": (url,)}, fetch=FEW)
    corrupt_holder_streams(monkeypatch, holder.settings.cache_dir, files)
    first = holder.request_model(REPO, "main", source=url)
    loop_until(lambda: s3_proxy.bytes_served > 0, timeout=30, what="the holder's first store byte")
    receiver = make_agent("receiver", origin, tracker, daemon={"buckets": (url,)}, fetch=FEW)
    me = psutil.Process()
    rss, fds = me.memory_info().rss, me.num_fds()
    with caplog.at_level(logging.INFO, logger="agent.relay.receiver"):
        second = receiver.request_model(REPO, "main", source=url)
        assert first.wait(120) and second.wait(120), second.status()
    # The refusal holds nothing: no buffer of the model's size, no descriptor left open per try.
    assert me.memory_info().rss - rss < 64 << 20, me.memory_info().rss - rss
    assert me.num_fds() - fds < 32, me.num_fds() - fds
    refused = [r.getMessage() for r in caplog.records if "fail the blob's listed ETag" in r.getMessage()]
    assert refused, "no relayed object was refused"
    for job in (first, second):
        st = job.status().to_json()
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)
    assert second.status().bytes_from_origin == 0
    assert s3_proxy.bytes_served <= total * 1.05, (s3_proxy.bytes_served, total)


def test_an_object_written_in_parts_is_checked_by_its_parts_md5s(
    origin, tracker, make_agent, s3_server, s3_bucket, s3_proxy, bucket_env, caplog
):
    """A multipart ETag is `md5(md5(part 1) || ... || md5(part N))-N`: a receiver that cuts the bytes at the
    uploader's part size computes it, so such an object comes from the relay too."""
    files = write_bucket_model(s3_server, s3_bucket, PREFIX, REPO, total_bytes=4 << 20, shards=2)
    shard = sorted(p for p in files if p.endswith(".safetensors"))[0]
    s3 = s3_server.admin
    key = f"{PREFIX}/{shard}"
    up = s3.create_multipart_upload(Bucket=s3_bucket, Key=key)
    part = s3.upload_part(Bucket=s3_bucket, Key=key, PartNumber=1, UploadId=up["UploadId"], Body=files[shard])
    s3.complete_multipart_upload(Bucket=s3_bucket, Key=key, UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    etag = s3.head_object(Bucket=s3_bucket, Key=key)["ETag"]
    assert etag.endswith('-1"') and listed_checksum("s3", etag, len(files[shard])) == etag.strip('"')
    total = sum(len(d) for d in files.values())
    s3_proxy.rate = SLOW_STORE
    url = f"s3://{s3_bucket}/{PREFIX}"
    daemons = [make_agent(f"n{i}", origin, tracker, daemon={"buckets": (url,)}, fetch=FEW) for i in range(3)]
    with caplog.at_level(logging.INFO):
        statuses = fetch_all(daemons, url)
    for st in statuses:
        assert st["phase"] == "Ready", st
        same_files(st["snapshot"], files)
    assert s3_proxy.bytes_served <= total * 1.05, (s3_proxy.bytes_served, total)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "fail the blob's listed ETag" in m]
    taken = [m for m in said if "objects taken from the reader's relay" in m]
    assert len(taken) == 2 and all(f"{len(files)} of {len(files)} objects" in m for m in taken), taken


def test_which_etags_a_receiver_can_check():
    """S3's ETag shapes (one PUT: the MD5; N parts: the MD5 of the parts' MD5s, `-N`), Azure's (no hash):
    an object whose ETag no common part size explains waits for the reader's sha256."""
    md5 = "9b2cf535f27731c974343645a3985328"
    assert listed_checksum("s3", f'"{md5}"', 10) == md5
    assert listed_checksum("s3", f'"{md5}-3"', 20 << 20) == f"{md5}-3"  # 8-MiB parts (boto3, the AWS CLI)
    assert listed_checksum("s3", f'"{md5}-5"', 30 << 20) is None  # 6-MiB parts: no common size gives 5
    assert listed_checksum("az", "0x8D88739958C9830", 10) is None
    assert listed_checksum("az", f'"{md5}"', 10) is None  # only S3 and GCS ETags are MD5s
    assert listed_checksum("s3", 'W/"abc"', 10) is None
