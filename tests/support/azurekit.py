"""Azure Blob Storage for tests: Azurite (Microsoft's storage emulator, the npm package `./dev` installs
into `.tools/`) as a real process, blob service only, in memory, on a free loopback port, with one
account whose key is made per run (`AZURITE_ACCOUNTS`), so a wrong key is refused as Azure refuses it
(403 AuthenticationFailed). No `--loose`: Azurite refuses what Azure would refuse.

Setup (create a container, write a blob) signs its requests with Shared Key by hand, as Azure's
"Authorize with Shared Key" page spells it (the string to sign: verb, the standard headers, the
`x-ms-*` headers sorted, then `/account/path` and the query's parameters sorted), not through obstore,
the client under test. Everything started here is stopped here, by PID.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import os
import secrets
import shutil
import signal
import subprocess
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote

from tests.support.procs import free_port, listening, loop_until, require, stop_process

AZURITE = Path(__file__).resolve().parents[2] / ".tools" / "node_modules" / ".bin" / "azurite-blob"
"""Where `./dev tools` installs it (the version pinned there)."""
API_VERSION = "2021-08-06"
"""x-ms-version of the setup requests: one every Azurite release since 3.18 serves."""
_STANDARD = ("Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type", "Date",
             "If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range")
"""The standard headers in Shared Key's string to sign, in its order."""


class AzuriteServer:
    """`azurite-blob` on 127.0.0.1 (`endpoint`), account `account` with key `key`; `workdir` holds its log.
    Containers are the buckets of `az://container/prefix`."""

    scheme = "az"
    secret_env = "AZURE_STORAGE_ACCOUNT_KEY"
    """The variable holding the secret a wrong-credentials test replaces."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log = workdir / "azurite.log"
        self.account = "wsaccount"
        self.key = base64.b64encode(secrets.token_bytes(64)).decode()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        node = shutil.which("node")
        if node is None:
            require("node", "Debian package nodejs (./dev installs it)")
        if not AZURITE.exists():
            require("azurite", "./dev tools installs it into .tools/node_modules")
        argv = [node, str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                "--inMemoryPersistence", "--extentMemoryLimit", "512", "--disableTelemetry"]
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.key}"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=self.workdir,
                                         start_new_session=True)
        try:
            proc = self.proc
            loop_until(lambda: listening(proc, self.port, self.log, "azurite"), 30, what="azurite listening")
        except BaseException:
            self.stop()
            raise


    def stop(self) -> None:
        """SIGTERM to its process group (node alone), then `stop_process`: reaped either way."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            stop_process(self.proc, grace=10)
        self.proc = None

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The `AZURE_*` variables that point obstore (`from_url`: the agent's) at this account here."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": self.account,
            "AZURE_STORAGE_ACCOUNT_KEY": self.key,
            "AZURE_STORAGE_USE_EMULATOR": "true",
            "AZURITE_BLOB_STORAGE_URL": endpoint or self.endpoint,  # plain http: the emulator's
        }

    def wrong_secret(self) -> str:
        """A key of the right shape that is not the account's."""
        return base64.b64encode(secrets.token_bytes(64)).decode()

    def is_object_path(self, path: str) -> bool:
        """Path-style `/account/container/blob`: a blob, not a container (a listing) or the account."""
        parts = path.lstrip("/").split("/", 2)
        return len(parts) == 3 and all(parts)

    def request(self, method: str, path: str, query: dict[str, str], body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One Shared Key request to `/account{path}`: (status, headers, body)."""
        path = f"/{self.account}{quote(path, safe='/~')}"
        sent = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": API_VERSION, **(headers or {})}
        if body:
            sent["Content-Length"] = str(len(body))
        lower = {k.lower(): v for k, v in sent.items()}
        to_sign = [method, *(lower.get(h.lower(), "") for h in _STANDARD)]
        to_sign += [f"{k}:{v}" for k, v in sorted(lower.items()) if k.startswith("x-ms-")]
        to_sign.append(f"/{self.account}{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items())))
        mac = hmac.new(base64.b64decode(self.key), "\n".join(to_sign).encode(), hashlib.sha256).digest()
        sent["Authorization"] = f"SharedKey {self.account}:{base64.b64encode(mac).decode()}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            target = path + ("?" + "&".join(f"{k}={quote(v)}" for k, v in query.items()) if query else "")
            conn.request(method, target, body or None, sent)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def create_bucket(self, container: str) -> None:
        status, _, body = self.request("PUT", f"/{container}", {"restype": "container"})
        assert status in (201, 409), (status, body[:500])  # 409: it exists already

    def delete_bucket(self, container: str) -> None:
        status, _, body = self.request("DELETE", f"/{container}", {"restype": "container"})
        assert status in (202, 404), (status, body[:500])

    def put_object(self, container: str, key: str, data: bytes) -> str:
        """Write one block blob, its key verbatim: its ETag (quoted, as Put Blob answers it)."""
        status, headers, body = self.request(
            "PUT", f"/{container}/{key}", {}, data, {"x-ms-blob-type": "BlockBlob"}
        )
        assert status == 201, (status, body[:500])
        return {k.lower(): v for k, v in headers.items()}["etag"]
