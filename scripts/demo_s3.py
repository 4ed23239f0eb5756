"""The object-storage side of the demo (`./dev demo --origin s3`, scripts/demo.py): a local S3 server
with the model in a bucket, and a byte counter in front of it.

- the store: moto's S3 server (`moto_server`, a process the demo starts and stops by PID) with
  authentication off: it checks no signature and serves the presigned URLs the agents read ranges with;
- `upload_model`: the bucket and one object per model file under the prefix (boto3, path-style);
- `CountingRelay`: a TCP relay on 127.0.0.1 in front of the store, counting every byte the store sends
  (its egress on the wire: objects, listings, headers); the agents reach the store through it;
- `store_env`: the `AWS_*` variables that point the agents (obstore) at the relay, with any ambient
  `AWS_*` setting dropped, so the demo's daemons see only the demo's store.

No imports from scripts/demo.py (run as a script, it is `__main__`): it gives its own process runner.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from pathlib import Path

BUCKET = "demo-models"
PREFIX = "models/tiny-llama"
REGION = "us-east-1"
KEY = ("demo", "demo-secret")
"""Any keys: the store checks none (moto without INITIAL_NO_AUTH_ACTION_COUNT)."""
MOTO_SERVER = Path(sys.executable).parent / "moto_server"


def moto_argv(port: int) -> list[str]:
    return [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def bucket_url() -> str:
    return f"s3://{BUCKET}/{PREFIX}"


def store_env(env: dict[str, str], endpoint: str) -> dict[str, str]:
    """`env` without its `AWS_*`, plus what points obstore at `endpoint` (plain http, path-style)."""
    out = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    out |= {
        "AWS_ENDPOINT": endpoint,
        "AWS_ACCESS_KEY_ID": KEY[0],
        "AWS_SECRET_ACCESS_KEY": KEY[1],
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }
    return out


def upload_model(endpoint: str, model_dir: Path) -> int:
    """Create the bucket; every file under `model_dir` to s3://BUCKET/PREFIX/<relative path>: the count."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=5, read_timeout=60, retries={"max_attempts": 3}, s3={"addressing_style": "path"}
    )
    s3 = boto3.Session(KEY[0], KEY[1], region_name=REGION).client("s3", endpoint_url=endpoint, config=config)
    s3.create_bucket(Bucket=BUCKET)
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    for path in files:
        s3.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(model_dir).as_posix()}")
    return len(files)


class CountingRelay:
    """TCP relay 127.0.0.1:`port` -> 127.0.0.1:`upstream`; `egress()`: the bytes upstream sent through it.
    Threads of this process (daemon threads); `close` stops it and drops its connections."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._egress = 0
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="store-relay", daemon=True).start()

    def egress(self) -> int:
        with self._lock:
            return self._egress

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            ends = [2]  # pumps still running; the last one closes both sockets
            for src, dst, count in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, count, ends), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool, ends: list[int]) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if count:
                    with self._lock:
                        self._egress += len(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # EOF: pass it on, the other direction may go on
        except OSError:  # a reset on either side ends both directions
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        with self._lock:
            ends[0] -= 1
            if ends[0]:
                return
            self._open -= {src, dst}
        src.close()
        dst.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            live = list(self._open)
        for s in live:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
