"""An object-storage origin for tests: moto's standalone S3 server as a real process (`S3Server`), IAM
authentication on, and a fault-injecting, byte-counting HTTP proxy in front of it (`FaultProxy`), which
clients talk to. Everything started here is stopped here, by PID.

Authentication in moto: with `INITIAL_NO_AUTH_ACTION_COUNT=N` the first N actions skip it and every
later one is checked (header SigV4, then the IAM user's policies). The first three create a user, its
access key and an s3:* policy; then a wrong secret gets 403 SignatureDoesNotMatch, an unknown key 403
InvalidAccessKeyId. Moto cannot check a presigned URL with authentication on: it reads the Authorization
header, which a presigned request has not, and answers 500 (moto 5.2; with authentication off it serves
any presigned URL, a forged one too). So the proxy checks a presigned URL's signature and expiry itself
(`presign_refusal`) and forwards the request signed with the user's key in headers: through the proxy a
presigned GET is refused (403) or served as S3 would; sent to the server directly it gets moto's 500.

Nothing here logs a query string: a presigned URL's carries its signature.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

import pytest

from agent.hub.state import OpenStreams, StreamRecord
from tests.support.cluster import write_model
from tests.support.procs import free_port, listening, loop_until, require, require_module, stop_process

REGION = "us-east-1"
BLOCK = 256 * 1024
"""The proxy copies bodies in blocks of this size: a large object is never held whole."""
MOTO_SERVER = Path(sys.executable).parent / "moto_server"
_S3_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
_enc = functools.partial(quote, safe="-_.~")
"""SigV4's URI encoding: all but the unreserved characters."""
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
"""Hop-by-hop headers: each side of the proxy has its own (an Expect is answered by the proxy)."""


def s3_error(code: str, message: str) -> bytes:
    """An S3 error document, as S3 answers a refused request."""
    return f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()


SLOWDOWN = s3_error("SlowDown", "Please reduce your request rate.")
"""S3's throttle: 503 with this error document ("503 Slow Down", Code SlowDown, "Please reduce your request
rate.": the S3 API reference's Error responses, its list of error codes)."""
SERVER_BUSY = (
    b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
    b"<Message>Egress is over the account limit.</Message></Error>"
)
"""Azure Storage's throttle: 503 with error code ServerBusy (Azure's "Common REST API error codes"; its body
the `<Error><Code/><Message/></Error>` of "Status and error codes", the code also in `x-ms-error-code`)."""


class S3Server:
    """`moto_server` on 127.0.0.1, authentication on, one IAM user allowed s3:* (`access_key_id`,
    `secret_access_key`, set by `start`); `workdir` holds its log. `admin`: boto3, for setup."""

    region = REGION
    scheme = "s3"
    secret_env = "AWS_SECRET_ACCESS_KEY"
    """The variable holding the secret a wrong-credentials test replaces."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "moto.log"
        self.access_key_id = self.secret_access_key = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start moto in a process group of its own, create the user, prove a wrong secret is refused."""
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}  # the 3 IAM calls below
        argv = [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, start_new_session=True)
        try:
            proc = self.proc
            loop_until(lambda: listening(proc, self.port, self.log, "moto_server"), 30, what="moto listening")
            iam = self.client("iam", key=("setup", "setup"))
            iam.create_user(UserName="ws")
            key = iam.create_access_key(UserName="ws")["AccessKey"]
            iam.put_user_policy(UserName="ws", PolicyName="s3", PolicyDocument=json.dumps(_S3_ALL))
            self.access_key_id, self.secret_access_key = key["AccessKeyId"], key["SecretAccessKey"]
            self._check_auth()
        except BaseException:
            self.stop()
            raise


    def _check_auth(self) -> None:
        """From here authentication is on: a wrong secret is refused, the user's keys are not."""
        exceptions = require_module("botocore.exceptions", "boto3 sets up the S3 test server")
        with pytest.raises(exceptions.ClientError, match="SignatureDoesNotMatch"):  # else auth is off
            self.client(key=(self.access_key_id, "wrong-" + self.secret_access_key)).list_buckets()
        self.admin.list_buckets()

    def stop(self) -> None:
        """SIGTERM to its process group (moto alone), then `stop_process`: reaped either way."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            stop_process(self.proc, grace=10)  # waits; SIGKILL by PID 10 s later if need be
        self.proc = None

    def client(self, service: str = "s3", endpoint: str = "", key: tuple[str, str] | None = None) -> Any:
        """A boto3 client with the user's keys (`key`: another (access key id, secret) instead)."""
        boto3 = require_module("boto3", "boto3 talks to the S3 test server")
        config = require_module("botocore.config", "boto3 talks to the S3 test server").Config(
            connect_timeout=5, read_timeout=60, retries={"max_attempts": 3}, s3={"addressing_style": "path"}
        )
        key_id, secret = key or (self.access_key_id, self.secret_access_key)
        session = boto3.Session(key_id, secret, region_name=self.region)
        return session.client(service, endpoint_url=endpoint or self.endpoint, config=config)

    @functools.cached_property
    def admin(self) -> Any:
        """A boto3 S3 client on the server itself (no proxy), for setup."""
        return self.client()

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The `AWS_*` variables that point obstore (`S3Store.from_env`, `from_url`: the agent's) here."""
        config = {"endpoint": endpoint or self.endpoint, "region": self.region, "allow_http": "true"}
        config |= {"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key}
        return {f"AWS_{name.upper()}": value for name, value in config.items()}

    def wrong_secret(self) -> str:
        return "not-the-secret"

    def is_object_path(self, path: str) -> bool:
        return is_object_path(path)

    def create_bucket(self, bucket: str) -> None:
        create_bucket(self, bucket)

    def delete_bucket(self, bucket: str) -> None:
        """Empty `bucket` and remove it."""
        for page in self.admin.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                self.admin.delete_object(Bucket=bucket, Key=obj["Key"])
        self.admin.delete_bucket(Bucket=bucket)

    def put_object(self, bucket: str, key: str, data: bytes) -> str:
        return put_object(self, bucket, key, data)


class Store(Protocol):
    """What the bucket tests ask of a store's test server: S3Server here, tests.support.azurekit's
    AzuriteServer. `scheme`: its URLs' (`s3`, `az`); `env`: the variables pointing obstore at it (through
    `endpoint`, a proxy); `secret_env`: the one holding the secret, `wrong_secret` another of its shape."""

    scheme: str
    secret_env: str
    port: int
    endpoint: str

    def env(self, endpoint: str | None = None) -> dict[str, str]: ...
    def wrong_secret(self) -> str: ...
    def is_object_path(self, path: str) -> bool: ...
    def create_bucket(self, bucket: str) -> None: ...
    def delete_bucket(self, bucket: str) -> None: ...
    def put_object(self, bucket: str, key: str, data: bytes) -> str: ...


def create_bucket(server: S3Server, bucket: str) -> None:
    """Create `bucket` unless this user has it already."""
    with contextlib.suppress(server.admin.exceptions.BucketAlreadyOwnedByYou):
        server.admin.create_bucket(Bucket=bucket)


def put_object(server: S3Server, bucket: str, key: str, data: bytes) -> str:
    """Write one object, its key verbatim (it may be hostile: `prefix/../evil`): its ETag."""
    return str(server.admin.put_object(Bucket=bucket, Key=key, Body=data)["ETag"])


def write_bucket_model(
    server: Store, bucket: str, prefix: str, repo_id: str = "acme/bucket-model", **model: int
) -> dict[str, bytes]:
    """A realistic test model (`write_model`: config, tokenizer, .gitattributes, real safetensors shards)
    uploaded to s3://bucket/prefix/<repo path> (az://, on Azurite), the bucket created if missing:
    {repo path: bytes}. `model`: write_model's total_bytes= (3 MiB), shards= (3), seed= (7)."""
    server.create_bucket(bucket)
    with tempfile.TemporaryDirectory(prefix="ws-s3model-") as tmp:
        files = write_model(Path(tmp), repo_id, **{"total_bytes": 3 * 2**20, "shards": 3, "seed": 7, **model})
    for rel, data in files.items():
        server.put_object(bucket, f"{prefix.strip('/')}/{rel}".lstrip("/"), data)
    return files


def is_object_path(path: str) -> bool:
    """Path-style `/bucket/key`: an object, not a bucket (a listing) or the service."""
    bucket, _, key = path.lstrip("/").partition("/")
    return bool(bucket and key)


class FaultProxy:
    """HTTP/1.1 proxy on 127.0.0.1 to `server`: forwards each request with the client's Host verbatim
    (SigV4 signs it, and clients sign for the proxy's address), streams bodies in BLOCKs, counts, and
    breaks the next GETs of objects when told to. Checks S3 presigned URLs itself (see the module); an
    Azure SAS signs no host, and Azurite checks it."""

    def __init__(self, server: Store) -> None:
        self.server = server
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._bytes_served = 0
        self._requests: list[tuple[str, str]] = []
        self._faults = {"slowdown": 0, "drop": 0}
        self.rate: float | None = None
        """Bytes a second each answer's body is held to (None: as fast as moto sends): a slow store."""
        self.streams_per_object = 0
        """GETs of one object one client address may have at once (0: any): one more is refused as
        `streams_answer` says, as a store or the CDN before it may refuse "download acceleration"."""
        self.streams_answer = "503"
        """"503" (the store's throttle: S3's SlowDown, Azure's ServerBusy), "429", or "reset" (the
        connection closed unanswered)."""
        self._streams = OpenStreams()
        self._httpd = _ProxyHTTPServer(("127.0.0.1", self.port), _Handler)
        self._httpd.proxy = self
        self._thread = threading.Thread(target=lambda: self._httpd.serve_forever(0.05), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening; requests in flight end on their own (daemon threads)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    @property
    def bytes_served(self) -> int:
        """Body bytes of 2xx answers to GETs of objects passed on to clients: what the store served."""
        with self._lock:
            return self._bytes_served

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path as sent, without its query) of every request, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def streams(self) -> list[StreamRecord]:
        """Every GET of an object: how many GETs of it that address had open with it (itself included),
        whether it was admitted (`streams_per_object`), and how many objects the address was reading."""
        return self._streams.log

    def reset_counters(self) -> None:
        with self._lock:
            self._bytes_served = 0
            self._requests.clear()
        self._streams.clear()

    def _stream(self, client: str, path: str) -> contextlib.AbstractContextManager[bool]:
        """One GET of object `path` by `client` while the block runs; yields False when it is one too many."""
        return self._streams.body(client, path, self.streams_per_object)

    def slowdown(self, n: int = 1) -> None:
        """The next `n` GETs of objects get 503 SlowDown with Retry-After: 1, as S3 throttles."""
        with self._lock:
            self._faults["slowdown"] += n

    def drop_mid_body(self, n: int = 1) -> None:
        """The next `n` GETs of objects get their status, headers and half their body, then the
        connection closes: a stream cut by a dying load balancer. (After any slowdowns armed.)"""
        with self._lock:
            self._faults["drop"] += n

    def _arrived(self, method: str, path: str) -> str | None:
        """Count a request; the fault it takes, if it is a GET of an object and one is armed."""
        with self._lock:
            self._requests.append((method, path))
            takes = method == "GET" and self.server.is_object_path(path)
            fault = next((f for f, left in self._faults.items() if left > 0 and takes), None)
            if fault:
                self._faults[fault] -= 1
            return fault

    def _served(self, n: int) -> None:
        with self._lock:
            self._bytes_served += n


class _ProxyHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection, or a client that stopped reading, ends its thread
    server: _ProxyHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a request line carries a presigned URL's signature."""

    def _forward(self) -> None:
        proxy, (path, _, query) = self.server.proxy, self.path.partition("?")
        fault = proxy._arrived(self.command, path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None  # S3 clients send no chunked requests
            if fault == "slowdown":
                return self._answer(503, SLOWDOWN, {"Retry-After": "1"})
            if self.command == "GET" and proxy.server.is_object_path(path):
                with proxy._stream(self.client_address[0], path) as admitted:
                    if not admitted:
                        return self._refuse_stream()
                    return self._upstream(path, query, body, fault == "drop")
            self._upstream(path, query, body, fault == "drop")
        except OSError:  # the client or moto went away: no answer to give
            self.close_connection = True

    def _refuse_stream(self) -> None:
        """One GET of an object too many (`FaultProxy.streams_per_object`), refused as the store would."""
        answer = self.server.proxy.streams_answer
        if answer == "reset":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif answer == "429":
            self._answer(429, s3_error("TooManyRequests", "Please reduce your request rate."), {})
        elif self.server.proxy.server.scheme == "az":
            self._answer(503, SERVER_BUSY, {"x-ms-error-code": "ServerBusy"})
        else:
            self._answer(503, SLOWDOWN, {})

    def _upstream(self, path: str, query: str, body: bytes | None, drop: bool) -> None:
        """The request to the store itself, its answer relayed (`drop`: cut halfway)."""
        proxy = self.server.proxy
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if "X-Amz-Signature=" in query and isinstance(proxy.server, S3Server):
            refusal = presign_refusal(self.command, path, query, headers, proxy.server)
            if refusal is not None:
                return self._answer(403, s3_error(*refusal), {})
            query = "&".join(p for p in query.split("&") if not unquote(p).startswith("X-Amz-"))
            host = self.headers.get("Host", "")  # verbatim: the client signed for it
            headers.update(_header_auth(self.command, path, query, host, proxy.server))
        upstream = http.client.HTTPConnection("127.0.0.1", proxy.server.port, timeout=60)
        try:
            upstream.request(self.command, f"{path}?{query}" if query else path, body, headers)
            self._relay(upstream.getresponse(), drop, proxy.server.is_object_path(path))
        finally:
            upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "application/xml", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _relay(self, resp: http.client.HTTPResponse, drop: bool, is_object: bool) -> None:
        """Status, headers and body of moto's answer; with `drop`, half the body, then close."""
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in _HOP:
                self.send_header(name, value)
        length = resp.getheader("Content-Length")
        bodiless = self.command == "HEAD" or resp.status in (204, 304)
        if length is None and not bodiless:
            self.send_header("Connection", "close")  # the body ends where the connection does
        self.end_headers()
        counted = self.command == "GET" and is_object and 200 <= resp.status < 300
        left = 0 if bodiless else int(length) // 2 if drop and length is not None else -1
        rate = self.server.proxy.rate
        # Counted open (`streams_per_object`), an answer ends with its last byte, not a pause after it.
        pace_first = bool(self.server.proxy.streams_per_object)
        while left != 0 and (block := resp.read(BLOCK if left < 0 else min(BLOCK, left))):
            if rate and pace_first:
                time.sleep(len(block) / rate)
            if counted:  # before the write: a client that has the bytes sees them counted
                self.server.proxy._served(len(block))
            self.wfile.write(block)
            left -= len(block) if left > 0 else 0
            if rate and not pace_first:
                time.sleep(len(block) / rate)
        if drop:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True


def presign_refusal(
    method: str, path: str, query: str, headers: dict[str, str], server: S3Server
) -> tuple[str, str] | None:
    """Why S3 would refuse this presigned request (error code, message), or None: its SigV4 query
    signature is the one `server`'s key makes, and it has not expired."""
    pairs = [(unquote(k), unquote(v)) for k, _, v in (p.partition("=") for p in query.split("&") if p)]
    params, lower = dict(pairs), {name.lower(): value for name, value in headers.items()}
    try:
        key_id, scope = params["X-Amz-Credential"].split("/", 1)
        issued = datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        expires = timedelta(seconds=int(params["X-Amz-Expires"]))
        signed = {h: lower.get(h, "") for h in params["X-Amz-SignedHeaders"].split(";")}
    except (KeyError, ValueError):
        return "AuthorizationQueryParametersError", "Malformed presigned query parameters."
    if key_id != server.access_key_id:
        return "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    if datetime.now(UTC) > issued + expires:
        return "AccessDenied", "Request has expired"
    canonical_query = sorted((_enc(k), _enc(v)) for k, v in pairs if k != "X-Amz-Signature")
    canonical = _canonical(method, path, canonical_query, signed)
    wanted = _signature(server, canonical, scope, params["X-Amz-Date"])
    if not hmac.compare_digest(wanted, params.get("X-Amz-Signature", "")):
        return "SignatureDoesNotMatch", "The request signature we calculated does not match yours."
    return None


def _header_auth(method: str, path: str, query: str, host: str, server: S3Server) -> dict[str, str]:
    """Headers signing this request with `server`'s key for `host`, as moto checks them (botocore's
    canonical query: the raw pairs, sorted)."""
    amz_date = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    signed = {"host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-date": amz_date}
    canonical_query = sorted((k, v) for k, _, v in (p.partition("=") for p in query.split("&") if p))
    scope = f"{amz_date[:8]}/{server.region}/s3/aws4_request"
    signature = _signature(server, _canonical(method, path, canonical_query, signed), scope, amz_date)
    auth = f"AWS4-HMAC-SHA256 Credential={server.access_key_id}/{scope}, SignedHeaders={';'.join(signed)}"
    auth += f", Signature={signature}"
    return {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD", "X-Amz-Date": amz_date, "Authorization": auth}


def _canonical(method: str, path: str, query: list[tuple[str, str]], signed: dict[str, str]) -> str:
    """SigV4's canonical request, unsigned payload: `query` pairs encoded and sorted, `signed` headers
    {lower name: value}."""
    headers = "".join(f"{name}:{' '.join(value.split())}\n" for name, value in sorted(signed.items()))
    query_text = "&".join(f"{k}={v}" for k, v in query)
    return "\n".join([method, path, query_text, headers, ";".join(sorted(signed)), "UNSIGNED-PAYLOAD"])


def _signature(server: S3Server, canonical: str, scope: str, amz_date: str) -> str:
    """SigV4's signature with `server`'s secret; `scope`: day/region/service/aws4_request."""
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{server.secret_access_key}".encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto server for the session: it takes about 1 s to start and set up. Tests keep apart by
    bucket (`s3_bucket`) and proxy (`s3_proxy`). `require`d: moto[server,s3] and boto3."""
    if not MOTO_SERVER.exists():
        require("moto_server", "pip install 'moto[server,s3]' boto3 into the venv")
    server = S3Server(tmp_path_factory.mktemp("s3"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[str]:
    """A fresh bucket of this test's own, emptied and removed after it."""
    bucket = f"ws-{uuid.uuid4().hex[:20]}"
    create_bucket(s3_server, bucket)
    yield bucket
    s3_server.delete_bucket(bucket)


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A FaultProxy of this test's own (fresh counters, no faults) in front of `s3_server`."""
    proxy = FaultProxy(s3_server)
    yield proxy
    proxy.stop()
