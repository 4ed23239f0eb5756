"""The weightswarm stack inside a `bench.netns.Cluster`: origin, tracker, agents, fetchers.

Shared by the swarm benchmark (`bench/swarm.py`) and the opt-in multi-node test. Every
process is started with `Cluster.spawn` (so teardown stops it by PID) and every wait is
bounded. The controller lives in the host namespace, which has no route into the cluster,
so it talks to the servers with `curl` run inside a member namespace (`Cluster.run`).
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeVar
from urllib.parse import quote

import psutil

from agent.core.metainfo import PieceHasher, info_dict, piece_length_for
from agent.hub.cdn import cdn_path
from bench.netns import Cluster, Proc
from bench.profile import Recording, Threads, process_name
from bench.tracker_load import cpu_seconds

_K = TypeVar("_K")

BIN = Path(sys.executable).parent
ORIGIN_PORT = 8080
TRACKER_PORT = 7480
BT_PORT = 6881
API_PORT = 7470
"""Each agent's network listener, on its node's address as the chart binds it to the pod's: probes, and
the relay (agent.relay.directory) other nodes stream an arriving blob from."""


def compile_bytecode(packages: Iterable[str] = ("agent", "tracker", "clikit", "servekit", "wirekit")) -> None:
    """Byte-compile the packages the spawned processes import, where they will import them from (so an
    A/B checkout on PYTHONPATH too), as the image's `pip install` does. A checkout run with
    PYTHONDONTWRITEBYTECODE=1 (as this machine's shell sets it) otherwise compiles every module again in
    every process it starts: 16 `agent fetch` CLIs started at once took 2.5-2.7 s to end, 2.2 s
    compiled (`bench.cli_start --clients 16`), and a cold start pays that on every node."""
    for name in packages:
        spec = importlib.util.find_spec(name)
        for where in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(where, quiet=1)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for spawned commands: ours minus any ambient HF/weightswarm setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIGHTSWARM_", "HF_", "HUGGING_FACE_"))}
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env.update(extra or {})
    return env


def _secret_file(path: Path, secret: str) -> Path:
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    blob_id: str


@dataclass(frozen=True)
class Model:
    repo_id: str
    commit: str
    files: tuple[ModelFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class FetchResult:
    """Per-node completion times (seconds from the common start) and what went wrong."""

    times: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)
    peak_rss: int = 0
    """Peak resident bytes of one process (and its children), file-backed pages included."""
    peak_anon: int = 0
    """Peak anonymous resident bytes (RssAnon: heap, buffers, stacks) of one process: the memory it
    owns. libtorrent 2.x mmaps the blobs it serves, so RSS also counts page-cache pages of those
    files, which the kernel drops under pressure: the memory target is judged on this."""
    cpu_busy: float = 0.0
    """The machine's mean CPU use, steal included (as psutil's `cpu_percent` counts it)."""
    cpu_steal: float = 0.0
    """The part of it the hypervisor gave to other guests (steal): on this shared machine up to half of
    both cores at times (`bench.cpu_sample` beside `bench.swarm --nodes 32`), which no run controls."""
    system_cpu: float = 0.0
    """CPU-seconds (user + system) the measured processes (`rss_pids`, with their children) used during
    the run, summed over every node: what the system under test cost, sending and receiving."""
    native_cpu: float = 0.0
    """The part of `system_cpu` spent in the measured processes' native threads: those still named like
    their process, the main thread aside. In an agent (whose Python threads carry their own names,
    agent.daemon.threadnames) that is its libtorrent session: network, disk I/O and hashing threads."""
    profile: Recording | None = None
    """`perf record` of the run, with `Stack.perf`."""


class Stack:
    """Origin + tracker + per-node agents in a cluster; node dirs under `workdir/nodes/<node>`."""

    def __init__(self, cluster: Cluster, workdir: Path, hub_root: Path, logdir: Path | None = None) -> None:
        self.c = cluster
        self.workdir = workdir
        self.logdir = logdir or workdir / "logs"
        self.log_prefix = ""
        """Prefixed to log names (e.g. "weightswarm-cold-"), so a later phase keeps earlier logs."""
        self.perf = False
        """Record each `run_fetches` with perf (bench.profile), next to its logs."""
        self.hub_root = hub_root
        compile_bytecode()
        self.env = clean_env()
        self.token_file = _secret_file(workdir / "tracker.token", secrets.token_hex(16))
        """The tracker's agent-role token: every agent's --tracker-token-file."""
        self.passkey_file = _secret_file(workdir / "tracker.passkey", secrets.token_hex(16))
        """The tracker's announce passkey: every agent's --tracker-passkey-file."""
        self._auth_header = _secret_file(
            workdir / "tracker.auth-header", f"Authorization: Bearer {self.token_file.read_text().strip()}"
        )
        """The agent token as a curl header file (`-H @file`): reads need it, and argv is public."""
        self.origin: Proc | None = None
        self.tracker: Proc | None = None
        self.agents: dict[str, Proc] = {}
        self.node_env: dict[str, dict[str, str]] = {}
        """Extra environment for one node's agent (e.g. the chaos run's clock step)."""
        self.logdir.mkdir(parents=True, exist_ok=True)

    # -- helpers -------------------------------------------------------------------------
    @property
    def origin_url(self) -> str:
        return f"http://{self.c.ip('origin')}:{ORIGIN_PORT}"

    @property
    def tracker_url(self) -> str:
        return f"http://{self.c.ip('tracker')}:{TRACKER_PORT}"

    @property
    def announce_url(self) -> str:
        """The tracker's announce URL, passkey included (for .torrent files; never print it)."""
        return f"{self.tracker_url}/announce/{self.passkey_file.read_text().strip()}"

    def node_dir(self, node: str) -> Path:
        return self.workdir / "nodes" / node

    def log(self, name: str) -> Path:
        return self.logdir / f"{self.log_prefix}{name}.log"

    def curl(self, member: str, url: str, timeout: float = 10.0, tracker_auth: bool = False) -> str | None:
        """GET `url` from inside `member`'s namespace; None on any failure. `tracker_auth`: send the
        agent token (the tracker's /v1 reads need one)."""
        auth = ["-H", f"@{self._auth_header}"] if tracker_auth else []
        res = self.c.run(member, ["curl", "-sf", *auth, "--max-time", str(timeout), url], timeout=timeout + 5)
        return res.stdout if res.returncode == 0 else None

    # -- origin --------------------------------------------------------------------------
    def start_origin(self, extra: Sequence[str] = ()) -> None:
        argv = [
            str(BIN / "agent"),
            "serve-hub",
            str(self.hub_root),
            "--host",
            self.c.ip("origin"),
            "--port",
            str(ORIGIN_PORT),
            "--access-log",
            *extra,
        ]
        self.origin = self.c.spawn("origin", argv, self.env, self.log("origin"))
        wait_for(
            lambda: self._alive(self.origin, "origin") and self.curl("origin", self._stats_url(), 2),
            60,
            "the origin (agent serve-hub)",
        )

    def _stats_url(self) -> str:
        return f"{self.origin_url}/_weightswarm/stats"

    def egress(self) -> int:
        """Body bytes the origin has sent so far."""
        body = self.curl("origin", self._stats_url())
        if body is None:
            raise RuntimeError("origin stats unavailable")
        return int(json.loads(body)["egress_bytes"])

    def origin_overlaps(self, model: Model) -> list[str]:
        """The origin's access log (origin.log) for each file of `model` whose bytes it served more
        than once: the requests, by client, that explain an origin egress above 1 x S."""
        by_path: dict[str, list[str]] = {}
        served: dict[str, int] = {}
        sizes = {f.path: f.size for f in model.files}
        names = {f"/_cdn/{f.blob_id}": f.path for f in model.files}
        names.update({f"/{model.repo_id}/resolve/{model.commit}/{f.path}": f.path for f in model.files})
        cached = f"/api/resolve-cache/models/{model.repo_id}/{model.commit}"
        names.update({f"{cached}/{f.path}": f.path for f in model.files})
        lfs = [f for f in model.files if len(f.blob_id) == 64]  # the CDN names a blob by its Xet hash
        names.update({cdn_path(model.repo_id, f.blob_id): f.path for f in lfs})
        for line in self.log("origin").read_text().splitlines():
            fields = line.split()
            if len(fields) < 7 or fields[3] != "GET" or fields[4] not in names:
                continue
            path, rng, status = names[fields[4]], fields[5], fields[6]
            by_path.setdefault(path, []).append(f"{fields[2]} {rng} {status}")
            if status in ("200", "206"):
                first, _, last = rng.removeprefix("bytes=").partition("-") if rng != "-" else ("0", "", "")
                end = min(int(last) + 1, sizes[path]) if last else sizes[path]
                served[path] = served.get(path, 0) + end - int(first or 0)
        twice = sorted(p for p in served if served[p] > sizes[p])
        return [f"{p}: {served[p]} of {sizes[p]} B: {by_path[p]}" for p in twice]

    def describe_model(self, repo_id: str) -> Model:
        """Commit and files (size, blob id) as the origin reports them."""
        rev = self.curl("origin", f"{self.origin_url}/api/models/{repo_id}/revision/main")
        tree = self.curl("origin", f"{self.origin_url}/api/models/{repo_id}/tree/main?recursive=true")
        if rev is None or tree is None:
            raise RuntimeError(f"origin does not describe {repo_id}")
        files = []
        for entry in json.loads(tree):
            if entry.get("type") != "file":
                continue
            lfs = entry.get("lfs") or {}
            files.append(ModelFile(entry["path"], int(entry["size"]), lfs.get("oid") or entry["oid"]))
        return Model(repo_id, json.loads(rev)["sha"], tuple(sorted(files, key=lambda f: f.path)))

    # -- tracker -------------------------------------------------------------------------
    def start_tracker(self, db: Path) -> None:
        self.tracker = self.spawn_tracker(["--db", str(db)])

    def spawn_tracker(
        self,
        store: Sequence[str],
        port: int = TRACKER_PORT,
        host: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """A `tracker serve` in the tracker namespace on `store` (`--db PATH` or `--redis URL`), ready."""
        argv = [
            str(BIN / "tracker"),
            "serve",
            "--host",
            host or self.c.ip("tracker"),
            "--port",
            str(port),
            *store,
            "--token-file",
            str(self.token_file),
            "--announce-passkey-file",
            str(self.passkey_file),
        ]
        log = self.log("tracker" if port == TRACKER_PORT else f"tracker-{port}")
        proc = self.c.spawn("tracker", argv, env or self.env, log)
        url = f"http://{self.c.ip('tracker')}:{port}/healthz"
        wait_for(lambda: self._alive(proc, "tracker") and self.curl("tracker", url, 2), 60, "the tracker")
        return proc

    def stop_tracker(self) -> None:
        if self.tracker is not None:
            self.c.stop(self.tracker)
            self.tracker = None

    def blob_seeders(self, blob_id: str) -> int:
        body = self.curl("tracker", f"{self.tracker_url}/v1/blobs/{blob_id}", tracker_auth=True)
        return int(json.loads(body).get("seeders") or 0) if body else 0

    # -- agents --------------------------------------------------------------------------
    def start_agents(self, nodes: Iterable[str], extra: Sequence[str] = ()) -> None:
        nodes = list(nodes)
        for node in nodes:
            d = self.node_dir(node)
            argv = [
                str(BIN / "agent"),
                "serve",
                "--cache-dir",
                str(d / "cache"),
                "--state-dir",
                str(d / "state"),
                "--tracker",
                self.tracker_url,
                "--tracker-token-file",
                str(self.token_file),
                "--tracker-passkey-file",
                str(self.passkey_file),
                "--origin",
                self.origin_url,
                "--bt-listen",
                f"{self.c.ip(node)}:{BT_PORT}",
                "--api-listen",
                f"{self.c.ip(node)}:{API_PORT}",
                "--node-name",
                node,
                *extra,
            ]
            env = {**self.env, **self.node_env.get(node, {})}
            self.agents[node] = self.c.spawn(node, argv, env, self.log(f"agent-{node}"))
        for node in nodes:
            wait_for(
                lambda n=node: (
                    self._alive(self.agents[n], f"agent {n}")  # type: ignore[misc]
                    and self.curl(n, f"http://{self.c.ip(n)}:{API_PORT}/readyz", 2)
                ),
                60,
                f"agent {node} ready",
            )

    def stop_agents(self) -> None:
        for proc in self.agents.values():
            self.c.stop(proc)
        self.agents.clear()

    def wipe(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            shutil.rmtree(self.node_dir(node), ignore_errors=True)

    def _alive(self, proc: Proc | None, what: str) -> bool:
        if proc is None or proc.poll() is not None:
            tail = proc.output()[-600:] if proc else ""
            raise RuntimeError(f"{what} exited: {tail}")
        return True

    # -- fetching ------------------------------------------------------------------------
    def fetch_agent_argv(self, node: str, model: Model) -> list[str]:
        admin = self.node_dir(node) / "state" / "admin.sock"  # the agent's default admin socket
        return [str(BIN / "agent"), "fetch", model.repo_id, "--agent", f"unix://{admin}"]

    def fetch_naive_argv(self, node: str, model: Model) -> list[str]:
        d = self.node_dir(node)
        return [
            str(BIN / "agent"),
            "fetch",
            model.repo_id,
            "--origin",
            self.origin_url,
            "--cache-dir",
            str(d / "cache"),
            "--state-dir",
            str(d / "state"),
        ]

    def run_fetches(
        self,
        nodes: Sequence[str],
        argv_for: Callable[[str], list[str]],
        timeout: float,
        tag: str,
        done: Callable[[str, Proc], bool] | None = None,
        rss_pids: Callable[[], Sequence[int]] = lambda: [],
    ) -> FetchResult:
        """Start one fetch per node at once; record each node's completion time (bounded).

        `done(node, proc)` decides completion for clients that keep running (aria2c seeding);
        by default a node is done when its process exits 0. Samples RSS of `rss_pids()` and CPU.
        """
        res = FetchResult()
        for node in nodes:
            self.node_dir(node).mkdir(parents=True, exist_ok=True)
        # Processes that run before the fetches (agents) count from here; ones started for them from 0.
        start = _sample(rss_pids())
        cpu_at_start, native_at_start = start.cpu, start.native
        cpu_seen: dict[int, float] = {}
        native_seen: dict[tuple[int, int], float] = {}
        if self.perf:
            daemons = {pid: process_name(pid) for pid in rss_pids()}
            res.profile = Recording(self.logdir / f"{self.log_prefix}{tag}.perf.data", Threads(daemons))
            res.profile.start()
            time.sleep(1)  # perf's start: a second before the first fetch
        psutil.cpu_times_percent(None)
        t0 = time.monotonic()
        procs = {n: self.c.spawn(n, argv_for(n), self.env, self.log(f"{tag}-{n}")) for n in nodes}
        if res.profile is not None:
            res.profile.threads.clients = {p.pid for p in procs.values()}
        cpu: list[float] = []
        steal: list[float] = []
        pending = set(nodes)
        deadline = t0 + timeout
        last_sample = 0.0
        while pending and time.monotonic() < deadline:
            for n in sorted(pending):
                p = procs[n]
                rc = p.poll()
                if done is not None and rc is None:
                    if done(n, p):
                        res.times[n] = time.monotonic() - t0
                        pending.discard(n)
                    continue
                if rc is None:
                    continue
                pending.discard(n)
                if rc == 0:
                    res.times[n] = time.monotonic() - t0
                    lines = p.output().strip().splitlines()
                    res.snapshots[n] = lines[-1] if lines else ""
                else:
                    res.failures[n] = f"exit {rc}: {p.output().strip()[-300:]}"
            now = time.monotonic()
            if now - last_sample >= 0.5:
                last_sample = now
                use = psutil.cpu_times_percent(None)
                cpu.append(100.0 - use.idle - use.iowait)
                steal.append(use.steal)
                sample = _sample(rss_pids())
                for rss, anon in sample.memory:
                    res.peak_rss, res.peak_anon = max(res.peak_rss, rss), max(res.peak_anon, anon)
                cpu_seen.update(sample.cpu)
                native_seen.update(sample.native)
            time.sleep(0.05)
        for n in pending:
            res.failures[n] = f"not complete after {timeout:.0f}s"
        last = _sample(rss_pids())  # before the seeding clients stop
        if res.profile is not None:
            res.profile.stop()
        cpu_seen.update(last.cpu)
        native_seen.update(last.native)
        res.system_cpu = grown(cpu_at_start, cpu_seen)
        res.native_cpu = grown(native_at_start, native_seen)
        for p in procs.values():
            self.c.stop(p)
        res.cpu_busy = sum(cpu) / len(cpu) / 100 if cpu else 0.0
        res.cpu_steal = sum(steal) / len(steal) / 100 if steal else 0.0
        return res

    def agent_pids(self) -> list[int]:
        return [p.pid for p in self.agents.values() if p.poll() is None]


class _Sample(NamedTuple):
    """One look at the measured processes, each with its children."""

    memory: list[tuple[int, int]]
    """(RSS, RssAnon) bytes of each process ((0, 0) for one gone)."""
    cpu: dict[int, float]
    """User + system CPU-seconds of each process alive now (gone ones are left out: a process's last
    sample stands for it)."""
    native: dict[tuple[int, int], float]
    """User + system CPU-seconds of each native thread ((pid, tid): `FetchResult.native_cpu`) of each
    process alive now; a thread's last sample stands for it once it is gone."""


def _sample(pids: Sequence[int]) -> _Sample:
    """Memory and CPU of each of `pids` with its children, from one scan of the process table for all of
    them. psutil's `children()` scans the whole table per call: sampling 32 agents twice a second that
    way kept this process at 0.5 CPU-s per 2 s (a quarter of a core the agents under test did not get;
    `bench.cpu_sample` beside `bench.swarm --nodes 32`, warm)."""
    kids: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        kids.setdefault(proc.info["ppid"], []).append(proc.pid)
    sample = _Sample([], {}, {})
    for pid in pids:
        tree = [pid]
        for member in tree:  # grows as it goes: the whole subtree
            tree += kids.get(member, [])
        rss = anon = 0
        cpu: float | None = 0.0
        for member in tree:
            try:
                proc = psutil.Process(member)
                rss += int(proc.memory_info().rss)
                times = proc.cpu_times()
            except psutil.Error:
                if member == pid:
                    cpu = None
                continue
            anon += _rss_anon(member)
            if cpu is not None:
                cpu += times.user + times.system
        sample.memory.append((rss, anon))
        if cpu is not None:
            sample.cpu[pid] = cpu
            sample.native.update(native_threads(pid))
    return sample


def grown(before: dict[_K, float], after: dict[_K, float]) -> float:
    """CPU-seconds used between two samples, per process or thread; one started in between counts
    from zero."""
    return sum(used - before.get(key, 0.0) for key, used in after.items())


ARIA2C_PRIVATE = (
    "--enable-dht=false",
    "--enable-dht6=false",
    "--bt-enable-lpd=false",
    "--enable-peer-exchange=true",
    "--file-allocation=none",
    "--console-log-level=warn",
    "--summary-interval=0",
)
"""aria2c's options for a swarm of the bench's own: peers from its tracker alone, files written as
they come, quiet."""


def blob_info(path: Path, name: str) -> dict[str, object]:
    """The info dict weightswarm publishes for the blob in `path` (its piece hashes), named `name`."""
    size = path.stat().st_size
    hasher = PieceHasher(piece_length_for(size))
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            hasher.update(chunk)
    return info_dict(name, size, hasher.piece_length, hasher.digest())


def native_threads(pid: int) -> dict[tuple[int, int], float]:
    """CPU-seconds of each thread of `pid` named like the process, its main thread aside."""
    threads: dict[tuple[int, int], float] = {}
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read()
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    except OSError:
        return threads
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read() == name:
                    threads[(pid, tid)] = cpu_seconds(pid, tid)
        except OSError:
            continue  # gone since the listing
    return threads


def _rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def resolve_url(origin_url: str, model: Model, f: ModelFile) -> str:
    return f"{origin_url}/{model.repo_id}/resolve/{model.commit}/{quote(f.path)}"
