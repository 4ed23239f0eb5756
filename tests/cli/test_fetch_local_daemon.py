"""README "Fetch a model": with a node daemon answering on the admin socket of the default state dir, a
plain `agent fetch` hands the work to it; `--cache-dir`/`--origin` or `--agent off` keep it standalone,
as does no daemon answering.

The daemon and the CLI share only the environment a user has ($XDG_STATE_HOME), and everything
(origin, daemon, CLI) runs in a private network namespace: its default ports clash with nothing,
and it has no route out, so a fetch that wrongly went standalone to the default endpoint
(huggingface.co) fails instead of passing by luck. Needs root (CI is root; elsewhere it skips).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import BIN, Origin, socket_dir
from tests.support.procs import loop_until, require, require_root, stop_process

ORIGIN_PORT = 18080
DAEMON = "http://127.0.0.1:7470"  # the daemon's default network listener (its probes)
HEAVY_FOR_THE_CLI = {
    "agent.fetch.engine", "agent.origin.bucket", "obstore", "urllib3", "httpx", "fastapi", "libtorrent"
}
"""Modules a fetch handed to the daemon has no use for: each adds to every `agent fetch`'s start-up CPU."""


class Netns:
    """A network namespace with loopback up; what starts in it is stopped by PID, then it is deleted."""

    def __init__(self, tmp: Path) -> None:
        self.name = f"wst-{os.getpid()}-{secrets.token_hex(3)}"
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True, timeout=10)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, timeout=10)

    def argv(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(self.argv(*argv), stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def run(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*argv), capture_output=True, text=True, timeout=120, env=env or dict(os.environ)
        )

    def get(self, url: str, unix_socket: Path | None = None) -> str | None:
        via = ["--unix-socket", str(unix_socket)] if unix_socket else []
        res = self.run("curl", "-sf", "--max-time", "2", *via, url)
        return res.stdout if res.returncode == 0 else None

    def wait_ready(self, name: str, proc: subprocess.Popen[bytes], url: str) -> None:
        def ready() -> bool:
            assert proc.poll() is None, f"{name} exited: {(self.tmp / f'{name}.log').read_text()[-2000:]}"
            return self.get(url) is not None

        loop_until(ready, timeout=60, what=f"{name} answering {url}")

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc, grace=20)
        subprocess.run(["ip", "netns", "del", self.name], check=False, timeout=30)


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[Netns]:
    require_root("a private network namespace (ip netns) for the daemon's fixed port 127.0.0.1:7470")
    for tool, package in (("ip", "iproute2"), ("curl", "curl")):
        if shutil.which(tool) is None:
            require(tool, f"Debian package {package} (./dev installs it)")
    ns = Netns(tmp_path)
    try:
        yield ns
    finally:
        ns.close()


def snapshot_of(res: subprocess.CompletedProcess[str]) -> Path:
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(res.stdout.strip().splitlines()[-1])


def assert_model(snapshot: Path, origin: Origin) -> None:
    for rel, data in origin.files.items():
        assert hashlib.sha256((snapshot / rel).read_bytes()).digest() == hashlib.sha256(data).digest(), rel


@pytest.mark.timeout(240)
def test_agent_fetch_uses_the_local_daemon_when_it_answers_unless_told_otherwise(netns, origin, tmp_path):
    hub = origin.hub.root  # the fixture's files, served again inside the namespace
    origin_url = f"http://127.0.0.1:{ORIGIN_PORT}"
    agent = str(BIN / "agent")
    served = netns.start("origin", agent, "serve-hub", str(hub), "--port", str(ORIGIN_PORT))
    netns.wait_ready("origin", served, f"{origin_url}/api/models/{origin.repo_id}")
    daemon_cache = tmp_path / "daemon" / "hub"
    state_home = socket_dir() / f"state-{tmp_path.name[-20:]}"  # short: a socket path has ≤ 107 bytes
    user = {**os.environ, "XDG_STATE_HOME": str(state_home)}  # the user's environment
    admin_socket = state_home / "weightswarm" / "admin.sock"
    daemon = netns.start(
        "daemon",
        *(agent, "serve", "--cache-dir", str(daemon_cache)),
        *("--origin", origin_url, "--bt-listen", "127.0.0.1:0", "--node-name", "local"),
        env=user,
    )
    netns.wait_ready("daemon", daemon, f"{DAEMON}/readyz")
    assert netns.get(f"{DAEMON}/v1/jobs") is None  # not on the network

    def daemon_jobs() -> int:
        return len(json.loads(netns.get("http://agent/v1/jobs", unix_socket=admin_socket) or "null"))

    # 1. No --agent, no --cache-dir/--origin, no HF_ENDPOINT: the daemon fetches into its own cache.
    # Python reports each module the CLI imports: none of the fetch engine's or the daemon's.
    res = netns.run(agent, "fetch", origin.repo_id, "--quiet", env={**user, "PYTHONPROFILEIMPORTTIME": "1"})
    snap = snapshot_of(res)
    assert snap.is_relative_to(daemon_cache), snap
    assert_model(snap, origin)
    assert daemon_jobs() == 1
    timings = [line for line in res.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[1].strip() for line in timings}
    assert "agent.http.client" in imported
    assert not imported & HEAVY_FOR_THE_CLI, imported & HEAVY_FOR_THE_CLI

    # 2. --cache-dir and --origin: standalone into that cache; the daemon is not asked.
    mine = tmp_path / "mine"
    snap = snapshot_of(
        netns.run(agent, "fetch", origin.repo_id, "--cache-dir", str(mine), "--origin", origin_url, "--quiet")
    )
    assert snap.is_relative_to(mine), snap
    assert_model(snap, origin)

    # 3. --agent off: standalone into the default cache ($HF_HOME/hub), with HF_ENDPOINT as the origin.
    env = {**user, "HF_ENDPOINT": origin_url}
    default_cache = Path(os.environ["HF_HOME"]) / "hub"
    snap = snapshot_of(netns.run(agent, "fetch", origin.repo_id, "--agent", "off", "--quiet", env=env))
    assert snap.is_relative_to(default_cache), snap
    assert daemon_jobs() == 1

    # 4. No daemon answering: standalone as well (here: the default cache again, nothing to download).
    stop_process(daemon, grace=20)
    shutil.rmtree(default_cache)
    snap = snapshot_of(netns.run(agent, "fetch", origin.repo_id, "--quiet", env=env))
    assert snap.is_relative_to(default_cache), snap
    assert_model(snap, origin)
