"""Fixtures for the daemon tests: a real origin (HubServer), a real tracker (`tracker serve` as a
subprocess, so a test can kill and restart it), and real agents (in-process `Daemon`s or
`agent serve` subprocesses), all on 127.0.0.1. Everything started here is stopped here, by PID.

One family per component, each with a factory a module calls with its own values:
- origin: `make_hub(root, **options)` (a test hub on models already written, e.g. by `write_models`),
  `make_origin(repo_id, ...)` (one model on a hub of its own; `gated=`, `tokens=`, rates: HubServer's
  options) and `origin` (its defaults); `model_origin` where a test wants one inside a `with`;
- tracker: `TrackerProcess` and `tracker`;
- agents: `make_agent` (in-process), `AgentProcess`, `agent_cli` (the `agent` command);
- checks: `fetch_and_wait` / `fetch_until_done`, `assert_snapshot_verifies`, `same_files` / `has_files`.
"""

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.daemon.node import Daemon
from agent.daemon.serve_settings import build_serve_settings
from agent.http.agent_httpx import http_client
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from tests.support.procs import free_port, loop_until, stop_process

REPO = "acme/tiny"
MODEL_BYTES = 3 * 2**20
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


def write_models(
    root: Path, repo_ids: Sequence[str], *, total_bytes: int, shards: int, seed: int
) -> dict[str, dict[str, bytes]]:
    """One test model per repo id under `root`, seeded `seed`, `seed + 1`, ... in order:
    {repo id: {repo path: bytes}}."""
    return {
        repo_id: write_model(root, repo_id, total_bytes=total_bytes, shards=shards, seed=seed + i)
        for i, repo_id in enumerate(repo_ids)
    }


def repo_files(root: Path, repo_id: str) -> dict[str, bytes]:
    """Every file under `root/repo_id`, as a test hub serving `root` has them: {repo path: bytes}."""
    base = root / repo_id
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in base.rglob("*") if p.is_file()}


@contextlib.contextmanager
def model_origin(
    root: Path, repo_id: str, *, total_bytes: int, shards: int, seed: int, **hub: Any
) -> Iterator[Origin]:
    """A test model written under `root`, served by a real test hub (`hub`: HubServer options)."""
    files = write_model(root, repo_id, total_bytes=total_bytes, shards=shards, seed=seed)
    with HubServer(root, **hub) as server:
        yield Origin.of(server, repo_id, files)


@pytest.fixture
def make_hub() -> Iterator[Callable[..., HubServer]]:
    """`make_hub(root, **options)`: a real test hub serving the repos under `root`; `options` are
    HubServer's (tokens, grants, gated, private, tree_page_size, rates, ...). Stopped at teardown."""
    with contextlib.ExitStack() as stack:

        def make(root: Path, **options: Any) -> HubServer:
            return stack.enter_context(HubServer(root, **options))

        yield make


@pytest.fixture
def make_origin(tmp_path: Path, make_hub: Callable[..., HubServer]) -> Callable[..., Origin]:
    """`make_origin(repo_id, total_bytes=, shards=, seed=, root=, **options)`: one test model written
    under `tmp_path / root` and served by its own test hub (`options`: HubServer's, e.g. `tokens`,
    `gated`, `rate_total`). The defaults are `origin`'s."""

    def make(
        repo_id: str = REPO,
        *,
        total_bytes: int = MODEL_BYTES,
        shards: int = 3,
        seed: int = 7,
        root: str = "hub",
        **options: Any,
    ) -> Origin:
        files = write_model(tmp_path / root, repo_id, total_bytes=total_bytes, shards=shards, seed=seed)
        return Origin.of(make_hub(tmp_path / root, **options), repo_id, files)

    return make


@pytest.fixture
def origin(make_origin: Callable[..., Origin]) -> Origin:
    """REPO, MODEL_BYTES in 3 shards, on a test hub of its own."""
    return make_origin()


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


@pytest.fixture
def tracker(tmp_path: Path) -> Iterator[TrackerProcess]:
    t = TrackerProcess(tmp_path)
    t.start()
    try:
        yield t
    finally:
        t.stop()


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


@functools.cache
def socket_dir() -> Path:
    """A short directory for the agents' unix sockets (a socket path has at most 107 bytes, and
    pytest's tmp_path can be longer); removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="ws-", dir="/tmp"))
    path.chmod(0o755)  # the sockets' own modes decide who may connect (tests try as another user)
    atexit.register(shutil.rmtree, path, True)
    return path


def agent_settings(tmp: Path, name: str, origin_url: str, tracker: TrackerProcess | None, **swarm: object):
    signing_key, public_key = publisher_keys() if tracker else (None, None)
    settings = build_serve_settings(
        cache_dir=tmp / name / "hub",
        state_dir=tmp / name / "state",
        tracker=tracker.url if tracker else None,
        tracker_token_file=tracker.token_file if tracker else None,
        tracker_passkey_file=tracker.passkey_file if tracker else None,
        publisher_token_file=tracker.publisher_token_file if tracker else None,
        publisher_signing_key_file=signing_key,
        publisher_public_key_file=public_key,
        origin=origin_url,
        token=None,
        bt_listen="127.0.0.1:0",
        api_listen="127.0.0.1:0",
        node_name=name,
        stall_timeout=float(swarm.pop("stall_timeout", 20.0)),
        lease_ttl=9.0,
    )
    daemon = dataclasses.replace(settings.daemon, tracker_probe_interval=0.5, wait_poll_seconds=5.0)
    fetch = dataclasses.replace(settings.fetch, chunk_size=256 * 1024)
    swarm_settings = dataclasses.replace(settings.swarm, **swarm)  # type: ignore[arg-type]
    return dataclasses.replace(settings, daemon=daemon, fetch=fetch, swarm=swarm_settings)


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator:
    started: list[Daemon] = []

    def make(
        name: str,
        origin: Origin | HubServer,
        tracker: TrackerProcess | None,
        daemon: dict[str, Any] | None = None,
        origin_client: dict[str, Any] | None = None,
        fetch: dict[str, Any] | None = None,
        **swarm: object,
    ) -> Daemon:
        """An in-process agent on the origin (an Origin, or the test hub itself) and tracker; `daemon` /
        `origin_client` / `fetch` / `swarm`: settings overrides."""
        hub = origin if isinstance(origin, HubServer) else origin.hub
        settings = agent_settings(tmp_path, name, hub.url, tracker, **swarm)
        if daemon:
            settings = dataclasses.replace(settings, daemon=dataclasses.replace(settings.daemon, **daemon))
        if fetch:
            settings = dataclasses.replace(settings, fetch=dataclasses.replace(settings.fetch, **fetch))
        if origin_client:
            origin_settings = dataclasses.replace(settings.origin, **origin_client)
            settings = dataclasses.replace(settings, origin=origin_settings)
        d = Daemon(settings)
        started.append(d)
        d.start()
        return d

    yield make
    for d in reversed(started):
        d.stop()


def admin_request(url: str, method: str, path: str, timeout: float = 30.0, **kw: Any) -> httpx.Response:
    """One request on an agent's admin channel (`Daemon.admin_url`, `AgentProcess.url`, a unix socket)."""
    with http_client(url, timeout) as client:
        return client.request(method, path, **kw)


def fetch_until_done(
    daemon: Daemon, repo_id: str, token: str | None = None, revision: str = "main", timeout: float = 90.0
) -> dict:
    """Request a model (with the requester's `token`) and wait for its job to end, Ready or Failed:
    its status."""
    job = daemon.request_model(repo_id, revision, token=token)
    assert job.wait(timeout), f"fetch not done after {timeout}s: {job.status()}"
    status: dict = job.status().to_json()
    assert status["phase"] in ("Ready", "Failed"), status
    return status


def fetch_and_wait(daemon: Daemon, repo_id: str, timeout: float = 90.0) -> dict:
    """Request a model and wait for its job, which must end Ready: its status."""
    status = fetch_until_done(daemon, repo_id, timeout=timeout)
    assert status["phase"] == "Ready", status
    return status


def fetch_all_and_verify(daemons: list[Daemon], origin: Origin, timeout: float = 120.0) -> list[dict]:
    """Request the origin's model on every daemon at once; each must end Ready with a verified snapshot."""
    jobs = [d.request_model(origin.repo_id, "main") for d in daemons]
    for job in jobs:
        assert job.wait(timeout), job.status()
    statuses = [j.status().to_json() for j in jobs]
    for st in statuses:
        assert st["phase"] == "Ready", st
        assert_snapshot_verifies(st["snapshot"], origin)
    return statuses


def wait_until_seeded(tracker: TrackerProcess, *daemons: Daemon, timeout: float = 30.0) -> None:
    """Until the tracker lists a seeder for every blob these daemons hold (their first announce is async)."""
    blobs = {b for d in daemons for b in d.held_blobs()}
    assert blobs, "the daemons hold no blobs"
    loop_until(
        lambda: all(int(tracker.blob(b).get("seeders") or 0) >= 1 for b in blobs),
        timeout=timeout,
        what="seeders announced",
    )


def assert_snapshot_verifies(snapshot: str, origin: Origin) -> None:
    """Every file of the model is in the snapshot with the origin's exact bytes, as a relative symlink."""
    snap = Path(snapshot)
    for rel, data in origin.files.items():
        link = snap / rel
        assert link.is_symlink() and not os.path.isabs(os.readlink(link)), rel
        got = link.read_bytes()
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), f"{rel} differs"
    assert sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir()) == sorted(origin.files)


def has_files(snapshot: str | Path, expected: Origin | Mapping[str, bytes]) -> None:
    """Every expected file (the origin's, or {repo path: bytes}) is in the snapshot with its exact bytes."""
    snap = Path(snapshot)
    files = expected.files if isinstance(expected, Origin) else expected
    for rel, data in files.items():
        assert hashlib.sha256((snap / rel).read_bytes()).digest() == hashlib.sha256(data).digest(), rel


def same_files(snapshot: str | Path, expected: Origin | Mapping[str, bytes]) -> None:
    """The snapshot holds the expected files (the origin's, or {repo path: bytes}) with their exact bytes,
    and nothing else."""
    snap = Path(snapshot)
    files = expected.files if isinstance(expected, Origin) else expected
    assert sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if not p.is_dir()) == sorted(files)
    has_files(snap, files)


def file_requests(hub: HubServer) -> list:
    """Requests for file bytes (resolve, resolve-cache or CDN GETs), as opposed to API metadata."""
    return [r for r in hub.requests if r.method == "GET" and r.bucket in ("resolvers", "cdn")]


def agent_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`agent ARGS` as a subprocess, its output captured as text; `env`: variables set on top of this
    process's environment."""
    return subprocess.run(
        [str(BIN / "agent"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


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
