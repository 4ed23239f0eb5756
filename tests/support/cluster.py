"""Fixtures for the daemon tests: a real origin (HubServer), a real tracker (`tracker serve` as a
subprocess, so a test can kill and restart it), and real agents (in-process `Daemon`s or
`agent serve` subprocesses), all on 127.0.0.1. Everything started here is stopped here, by PID.
The launchers the benchmarks use too are bench.launchers', re-exported here.

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
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.daemon.node import Daemon
from agent.daemon.serve_settings import build_serve_settings
from agent.hub.server import HubServer
from bench.launchers import BIN as BIN
from bench.launchers import INTEROP_PASSKEY as INTEROP_PASSKEY
from bench.launchers import PASSKEY as PASSKEY
from bench.launchers import PUBLISHER_TOKEN as PUBLISHER_TOKEN
from bench.launchers import TOKEN as TOKEN
from bench.launchers import AgentProcess as AgentProcess
from bench.launchers import Origin as Origin
from bench.launchers import TrackerProcess as TrackerProcess
from bench.launchers import admin_request as admin_request
from bench.launchers import assert_snapshot_verifies as assert_snapshot_verifies
from bench.launchers import model_origin as model_origin
from bench.launchers import publisher_keys as publisher_keys
from bench.launchers import write_model as write_model
from tests.support.procs import loop_until

REPO = "acme/tiny"
MODEL_BYTES = 3 * 2**20


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


@pytest.fixture
def tracker(tmp_path: Path) -> Iterator[TrackerProcess]:
    t = TrackerProcess(tmp_path)
    t.start()
    try:
        yield t
    finally:
        t.stop()


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
