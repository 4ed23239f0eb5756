"""Faults during a cluster's cold fetch: 8 namespace nodes, a tracker, the origin; every node checked.

    sudo .venv/bin/python -m bench.chaos [--nodes 8] [--size 256MiB] [--shards 4] [--runs 1]
                                         [--scenarios agents-killed,holder-killed,...]

Each scenario starts from empty caches and a fresh tracker database, runs `agent fetch` (through each
node's agent) on every node at once, and injects its fault while the bytes flow:

    none             no fault: the same run's baseline
    agents-killed    two agents SIGKILLed at random moments, each started again 5 s later
    holder-killed    the node holding the largest blob's origin lease SIGKILLed (back 5 s later)
    tracker-restart  the tracker SIGKILLed and started again 3 s later (same SQLite file)
    redis-restart    the tracker on Redis; redis-server SIGKILLed, started again empty 2 s later
    tracker-replicas two tracker replicas on one Redis behind a balancer (nftables, as kube-proxy
                     does for a Service); one SIGKILLed, its endpoint removed 2 s later
    origin-429       the origin answers 429 with Retry-After for 30 s, then bursts of 503s
    netem            2 % loss and 50 ms added latency on every link, from the start
    disk-full        one node's cache is a tmpfs smaller than the model: it must fail clearly alone
    corrupt-peer     one node fetches first; then the last, running stock libtorrent with the tracker's
                     credentials instead of an agent, seeds the model with a byte flipped in every
                     16 KiB block (bench/chaos_peer.py) while the other six fetch
    clock-jump       the tracker's and one agent's wall clock stepped +10 min, then -20 min (an
                     LD_PRELOAD, bench/clockjump.c; their monotonic clocks run on, as in a real step)
    all              agents-killed + tracker-restart + origin-429 + netem at once

A node's `agent fetch` that fails (its agent was killed under it) is run again, as an init
container's restart would, at most 10 times: each retry is an "error surfaced". Afterwards every
complete node's snapshot is compared byte for byte with the origin's files, no snapshot entry
may resolve to a partial (`.incomplete`) blob, origin egress must stay within the scenario's
bound (`EGRESS_BOUND`), and after a tracker, replica or Redis restart the tracker must list every
seeder it listed before within one announce interval (`REBUILD_BOUND`). The table: completed /
total, completion ÷ the lower bound, origin egress ÷ S, agent restarts, errors surfaced, and whether
the checks held.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.hub.testmodel import parse_size
from bench.netns import Cluster, Proc, cleanup_stale, have_netns_support
from bench.stack import BIN, ORIGIN_PORT, TRACKER_PORT, Model, Stack, sha256_file, wait_for
from bench.swarm import lower_bound, tmpfs

SCENARIOS = (
    "none", "agents-killed", "holder-killed", "tracker-restart", "redis-restart", "tracker-replicas",
    "origin-429", "netem", "disk-full", "corrupt-peer", "clock-jump", "all",
)
REPO = "bench/chaos-model"
ATTEMPTS = 10
"""`agent fetch` runs per node at most (an init container restarting after its agent died)."""
REDIS_PORT = 6379
REPLICA_PORTS = (TRACKER_PORT + 1, TRACKER_PORT + 2)
EGRESS_BOUND = {
    "agents-killed": 1.25, "holder-killed": 1.25, "tracker-restart": 1.1, "redis-restart": 1.1,
    "tracker-replicas": 1.1, "origin-429": 1.1, "clock-jump": 1.1, "all": 1.25,
}
"""Origin egress ÷ S each scenario must stay within (the issue's fault table; others: 1.1)."""
REBUILD_BOUND = 30.0
"""Seconds a restarted tracker (or one whose Redis restarted empty) may take to list every seeder it
listed before: one announce interval (TrackerSettings.interval)."""
CLOCK_STEPS = (600, -600)
"""Seconds the wall clock reads off true time: first 10 min ahead, then 10 min behind."""


@dataclass
class Outcome:
    scenario: str
    run: int
    completed: int = 0
    total: int = 0
    ratio: float = float("nan")
    egress: float = float("nan")
    restarts: int = 0
    errors: int = 0
    checks: list[str] = field(default_factory=list)
    """What did not hold (empty: everything did)."""
    notes: list[str] = field(default_factory=list)


class Chaos:
    def __init__(self, args: argparse.Namespace, stack: Stack, model: Model, control: Path) -> None:
        self.a = args
        self.s = stack
        self.model = model
        self.control = control
        self.nodes = stack.c.nodes
        self._seq = 0
        self.restarts = 0
        self.events: list[str] = []
        self._t0 = 0.0
        self.redis: Proc | None = None
        self.peer: Proc | None = None
        """The corrupt peer (bench/chaos_peer.py)."""
        self.replicas: list[Proc] = []
        self.clock_file = stack.workdir / "clockjump"
        self.clockjump: Path | None = None
        """The built bench/clockjump.c (the clock-jump scenario)."""
        self.rebuild_s: float | None = None
        """Seconds the swarm state took to come back after the tracker or Redis lost it (None: not lost)."""

    # -- faults -----------------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self._t0:5.1f}s {text}")

    def _when_egress(self, fraction: float, timeout: float = 120) -> bool:
        """Wait until the origin has sent `fraction` of the model since the fetch started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.s.egress() - self.e0 >= fraction * self.model.size:
                    return True
            except RuntimeError:
                pass
            time.sleep(0.2)
        return False

    def kill_agent(self, node: str, back_after: float = 5.0) -> None:
        proc = self.s.agents.get(node)
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self._note(f"SIGKILL agent {node}")
        time.sleep(back_after)
        self.s.start_agents([node], self.serve_args)
        self.restarts += 1
        self._note(f"agent {node} started again")

    def agents_killed(self) -> None:
        victims = random.sample(self.nodes, 2)
        moments = sorted(random.uniform(0.1, 0.6) for _ in victims)
        threads = []
        for node, at in zip(victims, moments, strict=True):
            if not self._when_egress(at):
                return
            t = threading.Thread(target=self.kill_agent, args=(node,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(60)

    def holder_killed(self) -> None:
        blob = max(self.model.files, key=lambda f: f.size).blob_id
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = self.s.curl("tracker", f"{self.s.tracker_url}/v1/blobs/{blob}", tracker_auth=True)
            holders = (json.loads(body).get("holders") or []) if body else []
            if holders and self._when_egress(0.0):
                node = str(holders[0].get("node_id") if isinstance(holders[0], dict) else holders[0])
                node = node.split(":")[0]
                self._when_egress(0.2)
                self.kill_agent(node)
                return
            time.sleep(0.2)
        self._note("no lease holder seen")

    def _seeders(self) -> dict[str, int]:
        """Each of the model's blobs -> the seeders the tracker lists now (-1: no answer)."""
        counts = {}
        for f in self.model.files:
            body = self.s.curl("tracker", f"{self.s.tracker_url}/v1/blobs/{f.blob_id}", tracker_auth=True)
            counts[f.blob_id] = int(json.loads(body).get("seeders") or 0) if body else -1
        return counts

    def _await_rebuilt(self, before: dict[str, int]) -> None:
        """Time, from now, until the tracker lists again at least the seeders it listed before it lost
        the swarm state (nodes only gain blobs meanwhile)."""
        start = time.monotonic()
        while time.monotonic() - start < 3 * REBUILD_BOUND:
            if all(n >= before[b] for b, n in self._seeders().items()):
                self.rebuild_s = time.monotonic() - start
                self._note(f"{sum(before.values())} seeder entries listed again after {self.rebuild_s:.1f} s")
                return
            time.sleep(0.5)
        self.rebuild_s = float("inf")

    def tracker_restart(self) -> None:
        if not self._when_egress(0.25):
            return
        tracker = self.s.tracker
        assert tracker is not None
        before = self._seeders()
        os.kill(tracker.pid, signal.SIGKILL)
        tracker.wait(10)
        self._note("SIGKILL tracker")
        time.sleep(3)
        self.s.start_tracker(self.db)
        self._note("tracker started again")
        self._await_rebuilt(before)

    def _command(self, **cmd: object) -> None:
        self._seq += 1
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"seq": self._seq, **cmd}))
        tmp.replace(self.control)

    def origin_429(self) -> None:
        if not self._when_egress(0.05):
            return
        self._command(rate_limit_for=30, retry_after=5)
        self._note("origin: 429 + Retry-After 5 for 30 s")
        time.sleep(31)
        for _ in range(3):
            self._command(errors=30)
            self._note("origin: 30 x 503")
            time.sleep(3)

    def netem(self) -> None:
        for member in self.s.c.members:
            self.s.c.run(member, ["tc", "qdisc", "add", "dev", "eth0", "parent", "1:10", "handle", "10:",
                                  "netem", "loss", "2%", "delay", "50ms"])
        self._note("netem: 2% loss, 50 ms on every link")

    def _start_redis(self) -> None:
        argv = ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.s.workdir), "--protected-mode", "yes"]
        self.redis = self.s.c.spawn("tracker", argv, self.s.env, self.s.log("redis"))
        ping = ["redis-cli", "-p", str(REDIS_PORT), "ping"]
        wait_for(lambda: self.s.c.run("tracker", ping, 5).stdout.strip() == "PONG", 30, "redis-server")

    def redis_restart(self) -> None:
        if not self._when_egress(0.25) or self.redis is None:
            return
        before = self._seeders()
        os.kill(self.redis.pid, signal.SIGKILL)
        self.redis.wait(10)
        self._note("SIGKILL redis-server")
        time.sleep(2)
        self._start_redis()
        self._note("redis-server started again, empty (no persistence)")
        self._await_rebuilt(before)

    def _balance(self, ports: tuple[int, ...]) -> None:
        """The tracker address's port goes round-robin to `ports` (DNAT keeps the client's address, which
        the tracker hands out as the peer's, as a Service's kube-proxy rules do)."""
        mapping = ", ".join(f"{i} : {port}" for i, port in enumerate(ports))
        rule = f"tcp dport {TRACKER_PORT} redirect to :numgen inc mod {len(ports)} map {{ {mapping} }}"
        rules = self.s.workdir / "balance.nft"
        rules.write_text(
            "flush ruleset\ntable ip ws {\n"
            f"  chain pre {{ type nat hook prerouting priority -100; {rule}; }}\n"
            f"  chain out {{ type nat hook output priority -100; {rule}; }}\n}}\n"
        )
        res = self.s.c.run("tracker", ["nft", "-f", str(rules)])
        if res.returncode != 0:
            raise RuntimeError(f"nft: {res.stderr.strip()}")

    def replica_killed(self) -> None:
        if not self._when_egress(0.25):
            return
        before = self._seeders()
        os.kill(self.replicas[0].pid, signal.SIGKILL)
        self.replicas[0].wait(10)
        self._note(f"SIGKILL tracker replica :{REPLICA_PORTS[0]}")
        time.sleep(2)
        self._balance(REPLICA_PORTS[1:])
        self._note("its endpoint removed from the balancer (readiness failed)")
        self._await_rebuilt(before)

    def clock_jump(self) -> None:
        for step, at in zip(CLOCK_STEPS, (0.25, 0.6), strict=True):
            if not self._when_egress(at):
                return
            self.clock_file.write_text(f"{step}\n")
            self._note(f"wall clock of the tracker and {self.nodes[0]} now {step:+d} s off")

    def _clock_env(self) -> dict[str, str]:
        if self.clockjump is None:
            self.clockjump = self.s.workdir / "libclockjump.so"
            source = Path(__file__).with_name("clockjump.c")
            subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(self.clockjump), str(source), "-ldl"],
                           check=True, timeout=120)
        self.clock_file.write_text("0\n")
        return {**self.s.env, "LD_PRELOAD": str(self.clockjump), "CLOCKJUMP_FILE": str(self.clock_file)}

    def _start_tracker(self, scenario: str) -> None:
        s = self.s
        if scenario in ("redis-restart", "tracker-replicas"):
            self._start_redis()
            store = ["--redis", f"redis://127.0.0.1:{REDIS_PORT}/0"]
            if scenario == "redis-restart":
                s.tracker = s.spawn_tracker(store)
                return
            self.replicas = [s.spawn_tracker(store, port=port, host="0.0.0.0") for port in REPLICA_PORTS]
            self._balance(REPLICA_PORTS)
        elif scenario == "clock-jump":
            env = self._clock_env()
            s.node_env[self.nodes[0]] = env
            s.tracker = s.spawn_tracker(["--db", str(self.db)], env=env)
        else:
            s.start_tracker(self.db)

    def _stop_tracker(self) -> None:
        s = self.s
        s.stop_tracker()
        for proc in self.replicas:
            s.c.stop(proc)
        if self.replicas:
            s.c.run("tracker", ["nft", "flush", "ruleset"])
        self.replicas = []
        if self.redis is not None:
            s.c.stop(self.redis)
            self.redis = None
        s.node_env.clear()

    def _corrupt_peer(self, bad: str) -> None:
        """One node fetches the model first (an honest seed); then `bad`, which runs no agent, seeds it
        through stock libtorrent with a byte flipped in every 16 KiB block (bench/chaos_peer.py)."""
        s = self.s
        honest = self.nodes[-2]
        proc = s.c.spawn(honest, s.fetch_agent_argv(honest, self.model), s.env, s.log(f"prefetch-{honest}"))
        if proc.wait(self.a.timeout) != 0:
            raise RuntimeError(f"{honest}: the fetch before the corrupt peer failed: {proc.output()[-400:]}")
        blobs = s.workdir / "corrupt-blobs.json"
        blobs.write_text(json.dumps([{"path": f.path, "blob_id": f.blob_id} for f in self.model.files]))
        argv = [sys.executable, "-m", "bench.chaos_peer", str(blobs), "--hub", str(s.hub_root), "--repo",
                self.model.repo_id, "--tracker", s.tracker_url, "--token-file", str(s.token_file),
                "--passkey-file", str(s.passkey_file), "--listen", f"{s.c.ip(bad)}:6881",
                "--dir", str(s.node_dir(bad) / "corrupt")]
        self.peer = peer = s.c.spawn(bad, argv, s.env, s.log(f"corrupt-peer-{bad}"))
        wait_for(lambda: "seeding corrupt pieces" in peer.output(), 60, "the corrupt peer")
        self._note(f"{honest} seeds the model; {bad} (stock libtorrent) seeds it, a byte flipped per 16 KiB")

    def _check_banned(self, bad: str, out: Outcome) -> None:
        logs = [self.s.log(f"agent-{n}").read_text(errors="replace") for n in self.nodes if n != bad]
        bans = sum(text.count(f"banned peer {self.s.c.ip(bad)}:") for text in logs)
        fails = sum(text.count("failed its hash check") for text in logs)
        out.notes.append(f"{bad} banned {bans} times; {fails} pieces failed their hash check")
        if not bans:
            out.checks.append(f"no node banned the corrupt peer {bad}")

    def _snapshot(self, node: str) -> Path:
        folder = "models--" + self.model.repo_id.replace("/", "--")
        return self.s.node_dir(node) / "cache" / folder / "snapshots" / self.model.commit

    # -- one scenario -----------------------------------------------------------------------------

    def run(self, scenario: str, run: int) -> Outcome:
        s = self.s
        out = Outcome(scenario, run, total=len(self.nodes))
        self.events, self.restarts, self.rebuild_s = [], 0, None
        self.serve_args: tuple[str, ...] = ()
        s.wipe(self.nodes)
        s.log_prefix = f"{scenario}-{run}-"
        self.db = s.workdir / f"tracker-{scenario}-{run}.db"
        small = self.nodes[-1] if scenario == "disk-full" else None
        mounts = []
        if small is not None:
            mounts.append(tmpfs(s.node_dir(small) / "cache", self.model.size // 2))
            mounts[0].__enter__()
        faults: list[Callable[[], None]] = {
            "none": [],
            "agents-killed": [self.agents_killed],
            "holder-killed": [self.holder_killed],
            "tracker-restart": [self.tracker_restart],
            "origin-429": [self.origin_429],
            "netem": [self.netem],
            "disk-full": [],
            "redis-restart": [self.redis_restart],
            "tracker-replicas": [self.replica_killed],
            "corrupt-peer": [],
            "clock-jump": [self.clock_jump],
            "all": [self.netem, self.agents_killed, self.tracker_restart, self.origin_429],
        }[scenario]
        bad = self.nodes[-1] if scenario == "corrupt-peer" else None
        try:
            self._start_tracker(scenario)
            s.start_agents([n for n in self.nodes if n != bad], self.serve_args)
            self._t0 = time.monotonic()
            if bad is not None:
                self._corrupt_peer(bad)
            self.e0 = s.egress()
            self._t0 = time.monotonic()
            fetching = [n for n in self.nodes if n != bad]
            out.total = len(fetching)
            procs = {n: s.c.spawn(n, self._fetch_loop(n), s.env, s.log(f"fetch-{n}")) for n in fetching}
            injectors = [threading.Thread(target=f, daemon=True) for f in faults]
            for t in injectors:
                t.start()
            times: dict[str, float] = {}
            deadline = self._t0 + self.a.timeout
            while len(times) < len(procs) and time.monotonic() < deadline:
                for n, p in procs.items():
                    if n not in times and p.poll() is not None:
                        times[n] = time.monotonic() - self._t0
                time.sleep(0.1)
            for t in injectors:
                t.join(max(0.0, deadline - time.monotonic()))
            egress = s.egress() - self.e0
            ok = {n for n, p in procs.items() if p.poll() == 0}
            for p in procs.values():
                s.c.stop(p)
            out.completed = len(ok)
            out.egress = egress / self.model.size
            out.restarts = self.restarts
            out.errors = sum(p.output().count("ATTEMPT FAILED") for p in procs.values())
            if ok:
                bound = lower_bound(self.model.size, len(self.nodes), len(self.nodes), self.a.node_rate,
                                    self.a.origin_rate, warm=False)
                out.ratio = max(times[n] for n in ok) / bound
            out.checks = self._verify(ok, small, bad)
            limit = EGRESS_BOUND.get(scenario, 1.1)
            if out.egress > limit:
                out.checks.append(f"origin egress {out.egress:.2f} S over {limit} S")
            if self.rebuild_s is not None and self.rebuild_s > REBUILD_BOUND:
                out.checks.append(f"swarm state not rebuilt within {REBUILD_BOUND:.0f} s")
            if bad is not None:
                self._check_banned(bad, out)
            if small is not None:
                said = [ln.strip() for ln in procs[small].output().splitlines()]
                clear = [ln for ln in said if "disk" in ln.lower() or "space" in ln.lower()]
                if not clear:
                    out.checks.append(f"{small}: no clear disk error in its output")
                else:
                    out.notes.append(f"{small}: {clear[-1][:160]}")
            out.notes.extend(self.events)
        finally:
            s.stop_agents()
            if self.peer is not None:
                s.c.stop(self.peer)
                self.peer = None
            self._stop_tracker()
            for m in mounts:
                m.__exit__(None, None, None)
            if scenario in ("netem", "all"):
                for member in s.c.members:
                    s.c.run(member, ["tc", "qdisc", "del", "dev", "eth0", "parent", "1:10", "handle", "10:"])
        return out

    def _fetch_loop(self, node: str) -> list[str]:
        admin = self.s.node_dir(node) / "state" / "admin.sock"
        fetch = f"{BIN / 'agent'} fetch {self.model.repo_id} --agent unix://{admin}"
        script = (
            f"for i in $(seq 1 {ATTEMPTS}); do {fetch} && exit 0; "
            'echo "ATTEMPT FAILED (exit $?)"; sleep 2; done; exit 1'
        )
        return ["bash", "-c", script]

    def _verify(self, ok: set[str], small: str | None, bad: str | None) -> list[str]:
        """Byte for byte against the origin's files; no snapshot entry resolving to a partial blob. The
        corrupt peer (`bad`) is the attacker: its own bytes are known wrong."""
        problems = []
        want = {f.path: sha256_file(self.s.hub_root / self.model.repo_id / f.path) for f in self.model.files}
        for node in self.nodes:
            if node == bad:
                continue
            snap = self._snapshot(node)
            entries = [p for p in snap.rglob("*") if p.is_symlink() or p.is_file()] if snap.is_dir() else []
            for p in entries:
                if os.path.realpath(p).endswith(".incomplete") or not p.exists():
                    problems.append(f"{node}: {p.name} visible but not complete")
            if node not in ok:
                if node != small:
                    problems.append(f"{node}: did not complete")
                continue
            for path, digest in want.items():
                f = snap / path
                if not f.exists() or sha256_file(f) != digest:
                    problems.append(f"{node}: {path} differs from the origin")
        return problems


def print_table(outcomes: list[Outcome]) -> None:
    print()
    print(f"{'scenario':<16} {'run':>3} {'done':>5} {'max÷bound':>9} {'egress÷S':>8} {'restarts':>8} "
          f"{'errors':>6}  checks")
    for o in outcomes:
        checks = "ok" if not o.checks else "; ".join(o.checks[:3])
        print(f"{o.scenario:<16} {o.run:>3} {o.completed:>2}/{o.total:<2} {o.ratio:>9.2f} {o.egress:>8.2f} "
              f"{o.restarts:>8} {o.errors:>6}  {checks}")
        for note in o.notes:
            print(f"{'':<20}{note}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size", default="256MiB")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--node-rate", type=float, default=120e6, help="bytes/s each way per node link")
    p.add_argument("--origin-rate", type=float, default=30e6, help="origin upload, bytes/s")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--runs", type=int, default=1, help="repeat the whole set (the issue asks for 3 clean)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per scenario")
    p.add_argument("--seed", type=int, default=None, help="random moments and victims")
    p.add_argument("--out", type=Path, default=Path("bench/out"))
    p.add_argument("--agent-log-level", default="INFO")
    args = p.parse_args(argv)
    scenarios = [x for x in args.scenarios.split(",") if x]
    for bad in set(scenarios) - set(SCENARIOS):
        p.error(f"unknown scenario: {bad}")
    reason = have_netns_support()
    if reason:
        print(f"error: the chaos run {reason}", file=sys.stderr)
        return 2
    random.seed(args.seed)
    cleanup_stale("ws-")
    size = parse_size(args.size)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="ws-chaos-") as tmp:
        room = size * (args.nodes + 3) + 512 * 2**20
        with tmpfs(Path(tmp) / "fs", room) as fs:
            hub = fs / "hub"
            subprocess.run([str(BIN / "agent"), "make-test-model", str(hub), REPO, "--size", args.size,
                            "--shards", str(args.shards)], check=True, timeout=600, stdout=subprocess.DEVNULL)
            control = fs / "origin-faults.json"
            control.write_text("{}")
            with Cluster(nodes=args.nodes, node_rate=args.node_rate, origin_rate=args.origin_rate) as c:
                logdir = args.out / f"chaos-{stamp}-logs"
                stack = Stack(c, fs, hub, logdir)
                stack.env["WEIGHTSWARM_LOG_LEVEL"] = args.agent_log_level
                argv = [sys.executable, "-m", "bench.chaos_origin", str(hub), "--host", c.ip("origin"),
                        "--port", str(ORIGIN_PORT), "--control", str(control)]
                stack.origin = c.spawn("origin", argv, stack.env, stack.log("origin"))
                stats = f"{stack.origin_url}/_weightswarm/stats"
                wait_for(lambda: stack.curl("origin", stats, 2), 60, "the origin (bench.chaos_origin)")
                model = stack.describe_model(REPO)
                print(f"logs: {logdir}; model {model.size / 2**20:.0f} MiB in {len(model.files)} files; "
                      f"{args.nodes} nodes", flush=True)
                chaos = Chaos(args, stack, model, control)
                for run in range(1, args.runs + 1):
                    for scenario in scenarios:
                        o = chaos.run(scenario, run)
                        outcomes.append(o)
                        state = "ok" if not o.checks else "FAILED: " + "; ".join(o.checks[:3])
                        print(f"  {scenario} #{run}: {o.completed}/{o.total}, {o.ratio:.2f} x bound, "
                              f"egress {o.egress:.2f} S, {o.restarts} restarts, {o.errors} errors: {state}",
                              flush=True)
    print_table(outcomes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"chaos-{stamp}.json").write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    return 0 if all(not o.checks for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
