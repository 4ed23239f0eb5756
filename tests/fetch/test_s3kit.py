"""The S3 test kit itself (tests.support.s3kit): moto refuses wrong keys, the proxy forwards signed and
presigned requests, counts what the store served, and breaks GETs when told to. The bucket origin's
tests stand on these."""

from __future__ import annotations

from datetime import timedelta

import obstore
import pytest
import urllib3
from obstore.store import S3Store, from_url

from tests.support.s3kit import FaultProxy, S3Server, put_object, write_bucket_model

PREFIX = "models/tiny"
SHARD = "model-00001-of-00003.safetensors"


def proxied_store(server: S3Server, proxy: FaultProxy, bucket: str, secret: str | None = None) -> S3Store:
    return S3Store(
        bucket,
        prefix=PREFIX,
        endpoint=proxy.endpoint,
        access_key_id=server.access_key_id,
        secret_access_key=secret or server.secret_access_key,
        region=server.region,
        client_options={"allow_http": True},
        virtual_hosted_style_request=False,
    )


def presigned(server: S3Server, proxy: FaultProxy, bucket: str, path: str, secret: str | None = None) -> str:
    return obstore.sign(proxied_store(server, proxy, bucket, secret), "GET", path, timedelta(minutes=10))


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30))


def test_wrong_secret_is_refused_through_the_proxy(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_bucket: str
) -> None:
    write_bucket_model(s3_server, s3_bucket, PREFIX)
    wrong = s3_server.client(endpoint=s3_proxy.endpoint, key=(s3_server.access_key_id, "not-the-secret"))
    with pytest.raises(wrong.exceptions.ClientError) as refused:
        wrong.list_objects_v2(Bucket=s3_bucket, Prefix=PREFIX)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(Exception, match="SignatureDoesNotMatch|403"):
        obstore.list(proxied_store(s3_server, s3_proxy, s3_bucket, secret="not-the-secret")).collect()
    assert ("GET", f"/{s3_bucket}") in s3_proxy.requests


def test_the_right_keys_list_the_model(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_bucket_model(s3_server, s3_bucket, PREFIX)
    assert {"config.json", ".gitattributes", SHARD} <= set(files)
    listed = obstore.list(proxied_store(s3_server, s3_proxy, s3_bucket)).collect()
    assert {m["path"]: m["size"] for m in listed} == {path: len(data) for path, data in files.items()}
    for name, value in s3_server.env(s3_proxy.endpoint).items():  # what the agent's from_url reads
        monkeypatch.setenv(name, value)
    assert len(obstore.list(from_url(f"s3://{s3_bucket}/{PREFIX}")).collect()) == len(files)
    assert s3_proxy.bytes_served == 0  # listings are not object bytes


def test_a_hostile_key_is_stored_verbatim(s3_server: S3Server, s3_bucket: str) -> None:
    put_object(s3_server, s3_bucket, f"{PREFIX}/../evil", b"x")
    listed = s3_server.admin.list_objects_v2(Bucket=s3_bucket)["Contents"]
    assert [o["Key"] for o in listed] == [f"{PREFIX}/../evil"]


def test_presigned_ranged_get_through_the_proxy(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_bucket: str, http: urllib3.PoolManager
) -> None:
    files = write_bucket_model(s3_server, s3_bucket, PREFIX)
    url = presigned(s3_server, s3_proxy, s3_bucket, SHARD)
    resp = http.request("GET", url, headers={"Range": "bytes=100-1099"})
    assert resp.status == 206, resp.data[:300]
    assert resp.data == files[SHARD][100:1100]
    assert s3_proxy.bytes_served == 1000
    assert s3_proxy.requests == [("GET", f"/{s3_bucket}/{PREFIX}/{SHARD}")]
    s3_proxy.reset_counters()
    assert (s3_proxy.bytes_served, s3_proxy.requests) == (0, [])
    full = http.request("GET", url)
    assert full.status == 200 and full.data == files[SHARD]
    assert s3_proxy.bytes_served == len(files[SHARD])


def test_presigned_urls_that_do_not_hold_are_refused(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_bucket: str, http: urllib3.PoolManager
) -> None:
    write_bucket_model(s3_server, s3_bucket, PREFIX)
    url = presigned(s3_server, s3_proxy, s3_bucket, SHARD)
    forged = presigned(s3_server, s3_proxy, s3_bucket, SHARD, secret="not-the-secret")
    other = presigned(s3_server, s3_proxy, s3_bucket, "config.json").split("?")[0]
    for bad in (forged, url.replace("X-Amz-Signature=", "X-Amz-Signature=0"), f"{other}?{url.split('?')[1]}"):
        resp = http.request("GET", bad)
        assert resp.status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in resp.data, resp.data
    assert http.request("GET", url.split("?")[0]).status == 403  # no signature at all
    assert s3_proxy.bytes_served == 0


def test_slowdown_answers_503_once(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_bucket: str, http: urllib3.PoolManager
) -> None:
    files = write_bucket_model(s3_server, s3_bucket, PREFIX)
    url = presigned(s3_server, s3_proxy, s3_bucket, SHARD)
    s3_proxy.slowdown(1)
    throttled = http.request("GET", url)
    assert throttled.status == 503 and throttled.headers["Retry-After"] == "1"
    assert b"<Code>SlowDown</Code>" in throttled.data
    assert s3_proxy.bytes_served == 0
    resp = http.request("GET", url)
    assert resp.status == 200 and resp.data == files[SHARD]


def test_drop_mid_body_truncates_once(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_bucket: str, http: urllib3.PoolManager
) -> None:
    files = write_bucket_model(s3_server, s3_bucket, PREFIX)
    size = len(files[SHARD])
    url = presigned(s3_server, s3_proxy, s3_bucket, SHARD)
    s3_proxy.drop_mid_body(1)
    cut = http.request("GET", url, preload_content=False)
    assert cut.status == 200 and cut.headers["Content-Length"] == str(size)
    got = bytearray()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for block in cut.stream(64 * 1024):
            got += block
    cut.release_conn()
    # urllib3 drops the last partial read when it raises: `got` is a prefix of the half that was sent
    assert len(got) <= size // 2 and files[SHARD].startswith(got)
    assert s3_proxy.bytes_served == size // 2
    resp = http.request("GET", url)
    assert resp.status == 200 and resp.data == files[SHARD]
