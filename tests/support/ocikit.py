"""A real OCI registry for tests: Debian's `docker-registry` (distribution v2, the CNCF reference
registry), started per test on a free loopback port with its config in tmp and stopped by its PID.

Auth as registries do it: `htpasswd` (distribution's Basic auth, bcrypt entries only) or `token`
(distribution's token auth spec: a 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…`, a token
service that answers `{"token": JWT}`; the registry checks the JWT's signature against `rootcertbundle`,
and its `iss`, `aud` (the service), `exp` and `access` claims). The token service here is a small one
on loopback: it signs RS256 JWTs with a key made per run and puts the certificate in the `x5c` header.

Blob reads redirected to storage (`Registry(redirect_to=…)` and `Storage`) use distribution's own
`redirect` storage middleware (distribution.github.io/distribution/storage-drivers/middleware), which
answers a blob GET or HEAD with a 307 to its storage path under a base URL, as registries on S3 or GCS
answer with a signed URL.

Artifacts are pushed by the OCI API by hand (bench.oci_push, shared with the registry benchmark: a
monolithic blob upload, POST then PUT with `?digest=`, then a PUT of the manifest), an independent client
of the registry, not the agent's.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import io
import json
import os
import re
import subprocess
import tarfile
import threading
import time
import warnings
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

# Re-exported: the tests push with these (the push client is bench.oci_push's, shared with the benchmark).
from bench.oci_push import MODEL_ARTIFACT as MODEL_ARTIFACT
from bench.oci_push import MODEL_CONFIG as MODEL_CONFIG
from bench.oci_push import RAW_CONFIG as RAW_CONFIG
from bench.oci_push import RAW_WEIGHT as RAW_WEIGHT
from bench.oci_push import Pusher as Pusher
from bench.oci_push import push_artifact as push_artifact
from bench.oci_push import push_model as push_model
from tests.support.procs import free_port, loop_until

REGISTRY_BIN = Path("/usr/bin/docker-registry")
SERVICE = "weightswarm-test-registry"
ISSUER = "weightswarm-test-token-service"
_BLOB_GET = re.compile(r'"GET /v2/[^ "]+/blobs/sha256:[0-9a-f]{64} HTTP/[0-9.]+" ([0-9]{3}) ([0-9]+)')
"""A blob GET in the access log (`… "GET /v2/…/blobs/sha256:… HTTP/1.1" 206 1048576 …`)."""


def bcrypt_hash(password: str) -> str:
    """A bcrypt entry for htpasswd: distribution accepts bcrypt only. Python's `crypt` (libxcrypt's
    `$2b$`) is what is installed; Go's bcrypt reads any `$2?$` minor version."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # noqa: PLC0415 - its import warns

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()



class _Served:
    """A quiet threaded HTTP server on host:port that hands every GET and HEAD to `answer`, until `stop`."""

    def __init__(self, host: str, port: int, answer: Callable[[BaseHTTPRequestHandler], None]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                answer(self)

            do_HEAD = do_GET  # noqa: N815

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=lambda: self._httpd.serve_forever(0.05), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

class TokenService:
    """distribution's token auth spec, the service side: GET /token?service=&scope= with Basic auth of a
    known user -> {"token": RS256 JWT}; `grants`: user -> the actions it gets on every repository."""

    def __init__(self, directory: Path, users: dict[str, str], grants: dict[str, list[str]]) -> None:
        self.users, self.grants = users, grants
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_file = directory / "token-cert.pem"
        self.cert_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.port = free_port()
        self.realm = f"http://127.0.0.1:{self.port}/token"
        self.issued = 0
        self._server = _Served("127.0.0.1", self.port, self._answer)

    def stop(self) -> None:
        self._server.stop()

    def token(self, user: str, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, _ = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": self.grants.get(user, [])})
        now = int(time.time())
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": ISSUER, "sub": user, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": os.urandom(8).hex(), "access": access}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        sig = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64url(sig)}"

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        query = parse_qs(urlsplit(h.path).query)
        user = ""
        auth = h.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            name, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            if self.users.get(name) != password:
                h.send_response(401)
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            user = name
        self.issued += 1
        body = json.dumps({"token": self.token(user, query.get("scope", [])), "expires_in": 300}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


class Registry:
    """`docker-registry serve CONFIG` on 127.0.0.1:<free port>, filesystem storage in `directory`."""

    def __init__(
        self, directory: Path, auth: dict[str, Any], access_log: bool = False, redirect_to: str | None = None
    ) -> None:
        """`access_log`: the registry logs every request (gorilla's combined format, body bytes included):
        `blob_bytes_served` counts its egress from its own account. `redirect_to`: a base URL the registry
        answers blob GETs and HEADs with a 307 to (distribution's `redirect` storage middleware, as with
        S3 or GCS storage: the blob's storage path under that URL; a `Storage` serves it)."""
        self.directory = directory
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.base = f"http://{self.host}"
        config = {
            "version": 0.1,
            "log": {"level": "error", "accesslog": {"disabled": not access_log}},
            "storage": {"filesystem": {"rootdirectory": str(directory / "storage")}},
            "http": {"addr": self.host, "secret": os.urandom(16).hex()},
            "auth": auth,
        }
        if redirect_to:
            config["middleware"] = {"storage": [{"name": "redirect", "options": {"baseurl": redirect_to}}]}
        (directory / "config.yml").write_text(json.dumps(config))  # YAML reads JSON
        self.log = (directory / "registry.log").open("wb")
        self.proc = subprocess.Popen([str(REGISTRY_BIN), "serve", str(directory / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        pool = urllib3.PoolManager(retries=False, timeout=2)
        loop_until(lambda: self._up(pool), timeout=30, what=f"docker-registry on {self.host}")

    def _up(self, pool: urllib3.PoolManager) -> bool:
        if self.proc.poll() is not None:
            said = (self.directory / "registry.log").read_text()[-2000:]
            raise AssertionError(f"docker-registry exited: {said}")
        try:
            return pool.request("GET", f"{self.base}/v2/").status in (200, 401)
        except urllib3.exceptions.HTTPError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()

    def blob_bytes_served(self) -> int:
        """Body bytes of the blob GETs the registry answered 200 or 206, from its own access log."""
        self.log.flush()
        text = (self.directory / "registry.log").read_text(errors="replace")
        return sum(int(m.group(2)) for m in _BLOB_GET.finditer(text) if m.group(1) in ("200", "206"))

    def blob_file(self, digest_hex: str) -> Path:
        """Where the filesystem driver keeps a blob's bytes (to break one on disk)."""
        blobs = self.directory / "storage" / "docker/registry/v2/blobs/sha256"
        return blobs / digest_hex[:2] / digest_hex / "data"


class Storage:
    """The storage host a registry redirects blob reads to (S3/GCS behind a signed URL, here the registry's
    own filesystem storage over HTTP on another loopback address): GET with Range, answers 206. Records
    whether a request carried an Authorization header (a registry's login must not reach it); `refuse`:
    answer 403 with an S3-style error body, as an expired signed URL gets."""

    def __init__(self, root: Path, host: str = "127.0.0.2") -> None:
        self.root = root
        self.port = free_port()
        self.base = f"http://{host}:{self.port}"
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str | None]] = []
        """(path, its Authorization header or None) of every request."""
        self.refuse = False
        self.bytes_served = 0
        self._server = _Served(host, self.port, self._answer)

    def stop(self) -> None:
        self._server.stop()

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        path = urlsplit(h.path).path
        with self._lock:
            self.requests.append((path, h.headers.get("Authorization")))
        file = (self.root / path.lstrip("/")).resolve()
        if self.refuse or not file.is_relative_to(self.root.resolve()) or not file.is_file():
            body = b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"
            h.send_response(403 if self.refuse else 404)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body if h.command == "GET" else b"")
            return
        data = file.read_bytes()
        start, end = 0, len(data)
        ranged = re.fullmatch(r"bytes=([0-9]+)-([0-9]*)", h.headers.get("Range", ""))
        if ranged:
            start, end = int(ranged.group(1)), min(len(data), int(ranged.group(2) or len(data) - 1) + 1)
        h.send_response(206 if ranged else 200)
        if ranged:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.send_header("Content-Length", str(end - start))
        h.end_headers()
        if h.command == "GET":
            h.wfile.write(data[start:end])
            with self._lock:
                self.bytes_served += end - start


TAR_WEIGHT = "application/vnd.cncf.model.weight.v1.tar"
TAR_GZIP_WEIGHT = "application/vnd.cncf.model.weight.v1.tar+gzip"


def tar_layer(files: dict[str, bytes], compress: bool = False, extra: list[tarfile.TarInfo] = ()) -> bytes:
    """A tar layer as modctl and oras write one (Python's tarfile, pax format): `files` at their paths,
    gzipped when `compress`; `extra` entries (links, hostile paths) after them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(bytes(info.size)) if info.size else None)
    return gzip.compress(buf.getvalue()) if compress else buf.getvalue()


def docker_config(directory: Path, registry: str, user: str, password: str) -> Path:
    """A docker config whose `auths` hold `user:password` for `registry`, as `docker login` writes it."""
    path = directory / "docker-config.json"
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    return path
