"""Launchers shared by the benchmarks and the tests (tests.support.cluster re-exports them, and adds the
pytest fixtures): a test model on a real test hub (`model_origin`), a real tracker (`TrackerProcess`:
`tracker serve` as a subprocess, so a caller can kill and restart it), real agents (`AgentProcess`:
`agent serve`), all on 127.0.0.1 and stopped by their PID; `admin_request` on an agent's admin channel
and `assert_snapshot_verifies` to check what it fetched. Kept out of tests/ so that the benchmarks do
not import the tests (an import-linter contract)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from agent.http.agent_httpx import http_client
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from bench.procs import free_port, loop_until, stop_process

TOKEN = "tracker-secret-token-1234"
PASSKEY = "tracker-announce-passkey-5678"
INTEROP_PASSKEY = "tracker-interop-passkey-3456"
PUBLISHER_TOKEN = "tracker-publisher-token-9012"
BIN = Path(sys.executable).parent


@dataclasses.dataclass
class Origin:
    hub: HubServer
    repo_id: str
    size: int
    """Bytes of all files of the model."""
    files: dict[str, bytes]

    @classmethod
    def of(cls, hub: HubServer, repo_id: str, files: dict[str, bytes]) -> Origin:
        """The model `repo_id` on `hub`, its files {repo path: bytes}."""
        return cls(hub, repo_id, sum(len(b) for b in files.values()), files)


def write_model(root: Path, repo_id: str, *, total_bytes: int, shards: int, seed: int) -> dict[str, bytes]:
    """A test model written under `root` (`make_model`): {repo path: bytes} of what it wrote."""
    paths = make_model(root, repo_id, total_bytes=total_bytes, shards=shards, seed=seed)
    return {p.relative_to(root / repo_id).as_posix(): p.read_bytes() for p in paths}


@contextlib.contextmanager
def model_origin(
    root: Path, repo_id: str, *, total_bytes: int, shards: int, seed: int, **hub: Any
) -> Iterator[Origin]:
    """A test model written under `root`, served by a real test hub (`hub`: HubServer options)."""
    files = write_model(root, repo_id, total_bytes=total_bytes, shards=shards, seed=seed)
    with HubServer(root, **hub) as server:
        yield Origin.of(server, repo_id, files)


class TrackerProcess:
    def __init__(
        self, tmp: Path, redis_url: str | None = None, interval: int = 10, extra: Sequence[str] = ()
    ) -> None:
        """`interval`: the announce interval; a peer is listed for 2.5 times that after its last announce.
        `extra`: more `tracker serve` options."""
        self.port = free_port()
        self.extra = list(extra)
        self.interval = interval
        self.db = tmp / "tracker.db"
        self.store = ["--redis", redis_url] if redis_url else ["--db", str(self.db)]
        self.token_file = tmp / "tracker.token"
        self.token_file.write_text(TOKEN + "\n")
        self.passkey_file = tmp / "tracker.passkey"
        self.passkey_file.write_text(PASSKEY + "\n")
        self.interop_passkey_file = tmp / "tracker.interop-passkey"
        self.interop_passkey_file.write_text(INTEROP_PASSKEY + "\n")
        self.publisher_token_file = tmp / "tracker.publisher-token"
        self.publisher_token_file.write_text(PUBLISHER_TOKEN + "\n")
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "tracker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            str(BIN / "tracker"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.store,
            "--token-file",
            str(self.token_file),
            "--announce-passkey-file",
            str(self.passkey_file),
            "--interop-passkey-file",
            str(self.interop_passkey_file),
            "--publisher-token-file",
            str(self.publisher_token_file),
            "--interval",
            str(self.interval),
            "--log-level",
            "WARNING",
            *self.extra,
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        loop_until(self.ready, timeout=30, what="tracker ready")

    def ready(self) -> bool:
        return _ready(self.proc, self.url, self.log, "tracker", tail=2000)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a lost node would: no shutdown handler runs."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    @property
    def auth(self) -> dict[str, str]:
        """Headers with the agent-role token: /v1 reads need a token."""
        return {"Authorization": f"Bearer {TOKEN}"}

    @property
    def announce_url(self) -> str:
        """What libtorrent, aria2c or a .torrent file announce to: the passkey in the path."""
        return f"{self.url}/announce/{PASSKEY}"

    @property
    def interop_announce_url(self) -> str:
        """What a stock client outside the cluster announces to (agent.swarm.gate)."""
        return f"{self.url}/announce/{INTEROP_PASSKEY}"

    def blob(self, blob_id: str) -> dict[str, object]:
        resp = httpx.get(f"{self.url}/v1/blobs/{blob_id}", headers=self.auth, timeout=5)
        resp.raise_for_status()
        data: dict[str, object] = resp.json()
        return data


def _ready(proc: subprocess.Popen[bytes] | None, url: str, log: Path, what: str, tail: int) -> bool:
    """Whether `url`/readyz answers 200; fails at once, with the end of `log`, if the process exited."""
    assert proc is not None
    if proc.poll() is not None:
        raise AssertionError(f"{what} exited: {log.read_text()[-tail:]}")
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@functools.cache
def publisher_keys() -> tuple[Path, Path]:
    """(publisher.key, publisher.pub): the publisher's Ed25519 pair for the session, as `agent keygen`
    writes it. Agents with a tracker get both (as they get the publisher token): they sign what they
    publish and verify what others published. Removed at exit."""
    from agent.core.signing import generate_keypair

    path = Path(tempfile.mkdtemp(prefix="ws-keys-"))
    private, public = generate_keypair()
    (path / "publisher.key").write_bytes(private)
    (path / "publisher.key").chmod(0o600)
    (path / "publisher.pub").write_bytes(public)
    atexit.register(shutil.rmtree, path, True)
    return path / "publisher.key", path / "publisher.pub"


def admin_request(url: str, method: str, path: str, timeout: float = 30.0, **kw: Any) -> httpx.Response:
    """One request on an agent's admin channel (`Daemon.admin_url`, `AgentProcess.url`, a unix socket)."""
    with http_client(url, timeout) as client:
        return client.request(method, path, **kw)


def assert_snapshot_verifies(snapshot: str, origin: Origin) -> None:
    """Every file of the model is in the snapshot with the origin's exact bytes, as a relative symlink."""
    snap = Path(snapshot)
    for rel, data in origin.files.items():
        link = snap / rel
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), rel
        got = link.read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), f"{rel} differs"
    assert sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir()) == sorted(origin.files)


class AgentProcess:
    """`agent serve` as a subprocess (for SIGKILL tests)."""

    def __init__(self, tmp: Path, name: str, origin_url: str, tracker: TrackerProcess, *extra: str) -> None:
        self.api_port = free_port()
        self.bt_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        """The network listener: probes, metrics, the HF-compatible endpoint."""
        self.cache_dir = tmp / name / "hub"
        self.state_dir = tmp / name / "state"
        self.url = f"unix://{self.state_dir / 'admin.sock'}"
        """The admin channel, its default socket (`--agent` of the CLI; `admin_request` for HTTP calls)."""
        self.log = tmp / f"{name}.log"
        self.argv = [
            str(BIN / "agent"),
            "--log-level",
            "INFO",
            "serve",
            "--cache-dir",
            str(self.cache_dir),
            "--state-dir",
            str(self.state_dir),
            "--tracker",
            tracker.url,
            "--tracker-token-file",
            str(tracker.token_file),
            "--tracker-passkey-file",
            str(tracker.passkey_file),
            "--publisher-token-file",
            str(tracker.publisher_token_file),
            "--publisher-signing-key-file",
            str(publisher_keys()[0]),
            "--publisher-public-key-file",
            str(publisher_keys()[1]),
            "--origin",
            origin_url,
            "--bt-listen",
            f"127.0.0.1:{self.bt_port}",
            "--api-listen",
            f"127.0.0.1:{self.api_port}",
            "--node-name",
            name,
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, open_files: int | None = None) -> None:
        """`open_files`: the agent's limit on open files (soft and hard), as a container's nofile."""

        def limit() -> None:
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit)
        loop_until(self.ready, timeout=30, what="agent ready")

    def ready(self) -> bool:
        return _ready(self.proc, self.api_url, self.log, "agent", tail=3000)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=20)
        self.proc = None
