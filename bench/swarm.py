"""Swarm benchmark: N shaped nodes fetch one model; naive vs aria2c swarm vs weightswarm.

    sudo .venv/bin/python -m bench.swarm                      # 8 nodes, 1 GiB / 4 shards (the issue)
    sudo .venv/bin/python -m bench.swarm --nodes 4 --size 256MiB   # a quick run

Needs root (network namespaces, tc, a tmpfs mount), iproute2, curl and aria2c.

Topology (bench/netns.py): one namespace per node, one for the origin (`agent serve-hub`)
and one for the tracker (`tracker serve`), joined by a bridge; every node link is shaped
to --node-rate each way, the origin's upload to --origin-rate. Model and caches live on a
tmpfs mounted for the run (unmounted at the end), so disks are not what we measure.

Scenarios:
  cold        no cache anywhere, the tracker knows nothing (fresh tracker DB)
  cold-known  caches wiped, the tracker keeps its DB (metainfo known, no seeders)
  warm        node n0 keeps its cache (and agent state); the other N-1 nodes fetch
Systems (in one run):
  naive       every node runs standalone `agent fetch` from the origin at once
  aria2c      every node runs aria2c (BitTorrent) on one .torrent per blob, built from the
              same piece hashes, origin as web seed (url-list), our tracker as announce;
              it keeps seeding until every node is done. aria2c always has the .torrent,
              so for it (and for naive) cold-known is the same as cold: run once, shown once.
  weightswarm one `agent serve` per node, `agent fetch --agent` on every node at once
  weightswarm_open  the same with `agent serve --no-peer-gate`: what authenticating peers costs
              (agent.swarm.gate), side by side in throughput and CPU
  weightswarm_norelay  the same with `agent serve --relay-fanout 0`: no relay of a blob while it
              arrives (agent.relay.directory), so other nodes start once its lease holder has it whole
  weightswarm_parts  the same with `agent serve --origin-holders 8`: a large blob pulled from the
              origin in up to 8 parts, by as many nodes as measuring says pay (agent.relay.directory
              "Parts", agent.relay.admission); with --origin-rate-per-client, what parts gain
              against a CDN's per-client cap, and without, what they cost on an origin capped in total
  weightswarm_mmap  the same with `agent serve --disk-io mmap`: libtorrent's memory maps in place of
              its pread/pwrite disk I/O (the agent's default)
  weightswarm_super  the same with `agent serve --super-seed`: a node seeds complete blobs in
              libtorrent's super-seeding mode (SwarmSettings.super_seed)
  weightswarm_bt  the same with `agent serve --no-relay-seeds`: a blob some node has whole comes
              by BitTorrent alone, not as a chain of relays first (agent.relay.directory "Warm starts")
  aria2c_bt   aria2c whose warm round has no web seed: every byte from its peers, as weightswarm_bt
              takes them (aria2c's warm round takes about 0.4 × S from the origin, whose upload no
              peer then pays); its cold round only fills n0 and is not shown

Printed per scenario and system: completion time median and max ÷ the lower bound
max(S/U_origin, S/D_node, R·S/(U_origin + ΣU_node)) with R receiving nodes (warm: R=N-1,
the seeding node's upload counts in ΣU; the origin is not needed), origin egress ÷ S (the
origin's own counter), the peak RSS and peak RssAnon of one process (sampled every 0.5 s: each
`agent serve` for weightswarm, each `agent fetch` for naive, each aria2c; RSS includes the page
cache of files a process mmaps, which libtorrent's mmap disk I/O does for every blob it serves
(weightswarm_mmap), so the memory target is judged on RssAnon, the memory the process owns) and
the mean CPU use of the machine (≥ 85 % → "CPU-bound": the figure then measures this machine's
cores, not the protocol), and how much of it was steal (the hypervisor running other guests on
these cores: at times half of both, which makes runs spread; compare within one run), and the
CPU-seconds the system's processes used, over every node, per GiB delivered to the receivers (each
`agent serve`: its libtorrent session, relay and the rest; each aria2c; each naive `agent fetch`),
and (BT) the part of it the BitTorrent client used: an agent's libtorrent threads, told from the
daemon's own by their names (agent.daemon.threadnames), or all of aria2c.
With --perf (root, linux-perf), each round also prints where its CPU went, per thread group and
what the samples were doing (bench.profile), and keeps the recording with the logs.
Targets (max ÷ bound): cold ≤ 1.15×, cold-known ≤ 1.10×, warm ≤ 1.40×, each below aria2c; origin
egress ≤ 1.05 × S; CPU per GiB at or below aria2c's; agent anon ≤ 150 MiB.
Results: a table on stdout, bench/out/swarm-<time>.{json,png} and every process's log in
bench/out/swarm-<time>-logs/.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from agent.hub.testmodel import parse_size
from bench import profile
from bench.netns import Cluster, Proc, cleanup_stale, have_netns_support
from bench.stack import ARIA2C_PRIVATE, BIN, BT_PORT, FetchResult, Model, Stack, blob_info, resolve_url
from wirekit.bencode import bencode

SYSTEMS = (
    "naive", "aria2c", "weightswarm", "weightswarm_open", "weightswarm_norelay", "weightswarm_parts",
    "weightswarm_mmap", "weightswarm_super", "weightswarm_bt", "aria2c_bt",
)
DEFAULT_SYSTEMS = SYSTEMS[:-5]
"""`weightswarm_parts`, `weightswarm_mmap`, `weightswarm_super` and `weightswarm_bt` differ from
`weightswarm` in one setting, `aria2c_bt` from `aria2c`: asked for by name."""
SCENARIOS = ("cold", "cold-known", "warm")
OUT = Path(__file__).resolve().parent / "out"


class NetSnapshot(NamedTuple):
    """What the members' network stacks had counted at one moment (bench.netns `net_counters`), the
    bytes and packets the origin's link had sent (`Cluster.sent`), and the bytes all links had received."""

    counters: dict[str, dict[str, int]]
    origin_sent: tuple[int, int]
    received: int


@dataclass
class Row:
    system: str
    scenario: str
    receivers: int
    times: dict[str, float]
    failures: dict[str, str]
    bound: float
    egress: int
    size: int
    peak_rss: int
    cpu_busy: float
    peak_anon: int = 0
    cpu_steal: float = 0.0
    system_cpu: float = 0.0
    """CPU-seconds the system's processes used over every node (FetchResult.system_cpu)."""
    native_cpu: float = 0.0
    """The part of it in native threads (FetchResult.native_cpu): an agent's libtorrent session."""
    net: dict[str, int] = field(default_factory=dict)
    """What the members' network stacks counted during the run, summed (bench.netns `net_counters`)."""

    def per_gib(self, cpu: float) -> float:
        """`cpu` CPU-seconds per GiB delivered to the receivers."""
        return cpu / (self.receivers * self.size / 2**30) if self.receivers else float("nan")

    @property
    def cpu_per_gib(self) -> float:
        """The system's CPU-seconds per GiB delivered to the receivers (sending and receiving both)."""
        return self.per_gib(self.system_cpu)

    @property
    def bittorrent_cpu_per_gib(self) -> float:
        """CPU-seconds per GiB delivered of the system's BitTorrent client: an agent's libtorrent session
        (its threads: not the daemon's relay, verifying or HTTP), all of aria2c; none for naive."""
        if self.system.startswith("weightswarm"):
            return self.per_gib(self.native_cpu)
        return self.cpu_per_gib if self.system.startswith("aria2c") else float("nan")

    @property
    def median(self) -> float:
        return statistics.median(self.times.values()) if self.times else float("nan")

    @property
    def worst(self) -> float:
        return max(self.times.values()) if self.times and not self.failures else float("nan")


def lower_bound(
    size: int, receivers: int, nodes: int, node_rate: float, origin_rate: float, warm: bool
) -> float:
    """max(S/U_origin, S/D_node, R·S/(U_origin + ΣU_node)); warm: the origin is not needed."""
    terms = [size / node_rate, receivers * size / (origin_rate + nodes * node_rate)]
    if not warm:
        terms.append(size / origin_rate)
    return max(terms)


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
        check=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def build_torrents(stack: Stack, model: Model, dest: Path, web_seed: bool = True) -> list[Path]:
    """One .torrent per blob: the info dict weightswarm would publish, origin as web seed (`web_seed`)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in model.files:
        info = blob_info(stack.hub_root / model.repo_id / f.path, f.blob_id)
        meta = {b"announce": stack.announce_url.encode(), b"info": info}
        if web_seed:
            meta[b"url-list"] = resolve_url(stack.origin_url, model, f).encode()
        path = dest / f"{f.blob_id}.torrent"
        path.write_bytes(bencode(meta))
        out.append(path)
    return out


class Bench:
    def __init__(
        self,
        args: argparse.Namespace,
        stack: Stack,
        model: Model,
        torrents: list[Path],
        peer_torrents: list[Path],
    ) -> None:
        self.a = args
        self.stack = stack
        self.model = model
        self.torrents = torrents
        self.peer_torrents = peer_torrents
        """The same torrents without the web seed (the same info hashes): `aria2c_bt`'s warm round."""
        self.nodes = stack.c.nodes
        self.rows: list[Row] = []
        self.errors: list[str] = []

    def record(
        self,
        system: str,
        scenario: str,
        receivers: list[str],
        res: FetchResult,
        egress: int,
        net0: NetSnapshot,
    ) -> None:
        now = self.network()
        was = net0.counters
        each = {m: {k: v - was.get(m, {}).get(k, 0) for k, v in c.items()} for m, c in now.counters.items()}
        net = {k: sum(c[k] for c in each.values()) for k in next(iter(each.values()))}
        worst = max(each, key=lambda m: each[m]["listen_drops"])
        warm = scenario == "warm"
        bound = lower_bound(
            self.model.size, len(receivers), len(self.nodes), self.a.node_rate, self.a.origin_rate, warm
        )
        row = Row(
            system,
            scenario,
            len(receivers),
            res.times,
            res.failures,
            bound,
            egress,
            self.model.size,
            res.peak_rss,
            res.cpu_busy,
            res.peak_anon,
            res.cpu_steal,
            res.system_cpu,
            res.native_cpu,
            net,
        )
        self.rows.append(row)
        status = (
            "ok" if not res.failures else f"{len(res.failures)} FAILED: {next(iter(res.failures.values()))}"
        )
        print(
            f"  {system:<12}{scenario:<11} max {row.worst:7.1f}s  bound {bound:6.1f}s  "
            f"egress {egress / self.model.size:5.2f}xS  {status}",
            flush=True,
        )
        most = each[worst]["listen_drops"]
        where = f" (listen drops most on {worst}: {most})" if most else ""
        # What the origin's link carried, against its app's count (`egress`): bytes an origin wrote into a
        # connection that was then cut (a hedged range) count there but may never have been sent. Less
        # a header a packet (Ethernet, IPv4, TCP with timestamps: 66 bytes), that is the payload sent.
        sent = now.origin_sent[0] - net0.origin_sent[0]
        payload = sent - 66 * (now.origin_sent[1] - net0.origin_sent[1])
        wire = f", origin link {sent / self.model.size:.3f}xS (payload {payload / self.model.size:.3f}xS)"
        # Every link's bytes in, over what the receivers were to get: past 1, less requests and
        # headers (under 1 %), are blocks that came twice.
        taken = (now.received - net0.received) / (self.model.size * len(receivers))
        wire += f", taken {taken:.3f}xS a receiver"
        counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in net.items())
        print("    network: " + counts + wire + where)
        if res.profile is not None:
            print("\n".join(res.profile.report(self.model.size * len(receivers) / 2**30)), flush=True)

    def network(self) -> NetSnapshot:
        c = self.stack.c
        return NetSnapshot(c.net_counters(), c.sent("origin"), sum(c.received(m) for m in c.members))

    # -- naive -----------------------------------------------------------------------------
    def naive(self) -> None:
        s = self.stack
        for scenario, receivers in (("cold", self.nodes), ("warm", self.nodes[1:])):
            if scenario not in self.a.scenarios:
                continue  # naive has no cold-known: without a tracker it is cold
            s.wipe(self.nodes)
            s.log_prefix = f"naive-{scenario}-"
            e0 = s.egress()
            net0 = self.network()
            fetch_pids = lambda: [p.pid for p in s.c.procs if p.argv[1:2] == ["fetch"]]  # noqa: E731
            res = s.run_fetches(
                receivers,
                lambda n: s.fetch_naive_argv(n, self.model),
                self.a.timeout,
                "fetch",
                rss_pids=fetch_pids,
            )
            self.record("naive", scenario, receivers, res, s.egress() - e0, net0)
        s.wipe(self.nodes)

    # -- aria2c ----------------------------------------------------------------------------
    def _aria2_argv(self, node: str, check: bool, torrents: list[Path]) -> list[str]:
        d = self.stack.node_dir(node)
        marks = d / "done"
        marks.mkdir(parents=True, exist_ok=True)
        hook = d / "hook.sh"
        hook.write_text(f'#!/bin/sh\ntouch "{marks}/$1"\n')
        hook.chmod(0o755)
        return [
            "aria2c",
            f"--dir={d / 'aria2'}",
            *ARIA2C_PRIVATE,
            f"--listen-port={BT_PORT}",
            "--seed-time=100000",
            "--seed-ratio=0.0",
            f"--on-bt-download-complete={hook}",
            f"--check-integrity={'true' if check else 'false'}",
            "--bt-seed-unverified=false",
            f"--max-concurrent-downloads={len(torrents)}",
            "--bt-max-peers=0",
            *map(str, torrents),
        ]

    def _aria2_done(self, node: str, _proc: Proc) -> bool:
        marks = self.stack.node_dir(node) / "done"
        return marks.is_dir() and sum(1 for _ in marks.iterdir()) >= len(self.torrents)

    def aria2c_bt(self) -> None:
        self.aria2c("aria2c_bt")

    def aria2c(self, name: str = "aria2c") -> None:
        s = self.stack
        s.wipe(self.nodes)
        for scenario in ("cold", "warm"):
            if scenario != "cold" and scenario not in self.a.scenarios:
                continue  # cold always runs: warm needs n0's copy from it
            torrents = self.peer_torrents if name == "aria2c_bt" and scenario == "warm" else self.torrents
            s.log_prefix = f"{name}-{scenario}-"
            s.start_tracker(s.workdir / f"aria2c-{scenario}.db")
            seeders: list[Proc] = []
            receivers = self.nodes
            try:
                if scenario == "warm":
                    # n0 keeps the files of the cold run, re-verifies them (aria2c has no resume
                    # data we trust) and seeds; the clock starts once it is seeding. The receivers'
                    # copies go first, as weightswarm's go before its agents start, so that both warm
                    # rounds begin as long after that memory was freed: on this VM that decides how much
                    # of it is cheap to write again (bench.page_cost).
                    receivers = self.nodes[1:]
                    s.wipe(receivers)
                    shutil.rmtree(s.node_dir("n0") / "done", ignore_errors=True)
                    seeders.append(
                        s.c.spawn("n0", self._aria2_argv("n0", True, torrents), s.env, s.log("seed-n0"))
                    )
                    deadline = time.monotonic() + self.a.timeout
                    while not self._aria2_done("n0", seeders[0]):
                        if time.monotonic() > deadline or seeders[0].poll() is not None:
                            raise RuntimeError(
                                f"aria2c seeder on n0 did not start: {seeders[0].output()[-300:]}"
                            )
                        time.sleep(0.1)
                e0 = s.egress()
                net0 = self.network()
                aria_pids = lambda: [p.pid for p in s.c.procs if p.argv[:1] == ["aria2c"]]  # noqa: E731
                res = s.run_fetches(
                    receivers,
                    functools.partial(self._aria2_argv, check=False, torrents=torrents),
                    self.a.timeout,
                    "fetch",
                    done=self._aria2_done,
                    rss_pids=aria_pids,
                )
                if name == "aria2c" or scenario == "warm":
                    self.record(name, scenario, receivers, res, s.egress() - e0, net0)
            finally:
                for p in seeders:
                    s.c.stop(p)
                s.stop_tracker()
        s.wipe(self.nodes)

    # -- weightswarm -----------------------------------------------------------------------
    def weightswarm_open(self) -> None:
        self.weightswarm("weightswarm_open", ("--no-peer-gate",))

    def weightswarm_norelay(self) -> None:
        self.weightswarm("weightswarm_norelay", ("--relay-fanout", "0"))

    def weightswarm_parts(self) -> None:
        self.weightswarm("weightswarm_parts", ("--origin-holders", "8"))

    def weightswarm_mmap(self) -> None:
        self.weightswarm("weightswarm_mmap", ("--disk-io", "mmap"))

    def weightswarm_bt(self) -> None:
        self.weightswarm("weightswarm_bt", ("--no-relay-seeds",))

    def weightswarm_super(self) -> None:
        self.weightswarm("weightswarm_super", ("--super-seed",))

    def weightswarm(self, name: str = "weightswarm", serve_args: tuple[str, ...] = ()) -> None:
        s = self.stack
        s.wipe(self.nodes)
        db = s.workdir / "weightswarm-tracker.db"
        db.unlink(missing_ok=True)
        # cold first (warm needs n0's copy from it), cold-known last (wiping every cache).
        for scenario in ("cold", "warm", "cold-known"):
            if scenario != "cold" and scenario not in self.a.scenarios:
                continue
            receivers = self.nodes[1:] if scenario == "warm" else self.nodes
            if scenario == "cold-known":
                s.wipe(self.nodes)
            elif scenario == "warm":
                s.wipe(receivers)
            # The tracker restarts with its DB: metainfo survives, live peers are announced anew.
            s.log_prefix = f"{name}-{scenario}-"
            s.start_tracker(db)
            try:
                s.start_agents(self.nodes, serve_args)
                if scenario == "warm":
                    blobs = [f.blob_id for f in self.model.files]
                    deadline = time.monotonic() + 120
                    while not all(s.blob_seeders(b) >= 1 for b in blobs):
                        if time.monotonic() > deadline:
                            raise RuntimeError("n0 did not announce its blobs as a seeder within 120s")
                        time.sleep(0.5)
                e0 = s.egress()
                net0 = self.network()
                res = s.run_fetches(
                    receivers,
                    lambda n: s.fetch_agent_argv(n, self.model),
                    self.a.timeout,
                    "fetch",
                    rss_pids=s.agent_pids,
                )
                self.record(name, scenario, receivers, res, s.egress() - e0, net0)
                if res.failures and scenario == "cold":
                    raise RuntimeError("cold did not complete; warm needs n0's copy from it")
            finally:
                s.stop_agents()
                s.stop_tracker()
        s.wipe(self.nodes)


def print_table(rows: list[Row], args: argparse.Namespace, size: int) -> None:
    print()
    print(
        f"nodes={args.nodes}  S={size / 2**20:.0f} MiB  node links {args.node_rate / 1e6:.0f} MB/s each way  "
        f"origin {args.origin_rate / 1e6:.0f} MB/s  (tc HTB; TCP goodput is ~0.96 of the rate)"
    )
    if args.origin_rate_per_connection:
        print(f"origin connections capped at {args.origin_rate_per_connection / 1e6:.0f} MB/s each")
    if args.origin_rate_per_client:
        print(f"origin clients (addresses) capped at {args.origin_rate_per_client / 1e6:.0f} MB/s each")
    head = (
        f"{'scenario':<11}{'system':<12}{'nodes':>6}{'median s':>9}{'max s':>8}{'bound s':>8}"
        f"{'med/bnd':>8}{'max/bnd':>8}{'egress/S':>9}{'peak RSS':>10}{'anon':>9}{'CPU':>6}{'steal':>6}"
        f"{'CPU-s/GiB':>10}{'BT':>6}  notes"
    )
    print(head)
    print("-" * len(head))
    for scen in SCENARIOS:
        for r in (r for r in rows if r.scenario == scen):
            notes = []
            if r.failures:
                notes.append(f"{len(r.failures)} failed")
            if r.cpu_busy >= 0.85:
                notes.append("CPU-bound")
            rss = f"{r.peak_rss / 2**20:.0f} MiB" if r.peak_rss else "-"
            anon = f"{r.peak_anon / 2**20:.0f} MiB" if r.peak_anon else "-"
            print(
                f"{r.scenario:<11}{r.system:<12}{r.receivers:>6}{r.median:>9.1f}{r.worst:>8.1f}{r.bound:>8.1f}"
                f"{r.median / r.bound:>8.2f}{r.worst / r.bound:>8.2f}{r.egress / r.size:>9.2f}"
                f"{rss:>10}{anon:>9}{r.cpu_busy * 100:>5.0f}%{r.cpu_steal * 100:>5.0f}%{r.cpu_per_gib:>10.2f}"
                f"{r.bittorrent_cpu_per_gib:>6.2f}  {', '.join(notes)}"
            )
    print(
        "targets: max/bnd cold <= 1.15, cold-known <= 1.10, warm <= 1.40, each below aria2c;\n"
        "  egress/S <= 1.05;\n"
        "  CPU-s/GiB (the system's processes on every node, per GiB delivered) at or below aria2c's;\n"
        "  BT: the part of it in the BitTorrent client (an agent's libtorrent threads; aria2c whole), at or\n"
        "  below aria2c's;\n"
        "  agent memory <= 150 MiB, judged on anon (RssAnon: what the process owns; RSS adds the page cache\n"
        "  of the blobs libtorrent mmaps to seed them with --disk-io mmap, reclaimable, shared)"
    )


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "naive": "tab:blue",
        "aria2c": "tab:orange",
        "aria2c_bt": "tab:red",
        "weightswarm": "tab:green",
        "weightswarm_open": "tab:olive",
        "weightswarm_norelay": "tab:gray",
        "weightswarm_parts": "tab:purple",
        "weightswarm_mmap": "tab:brown",
        "weightswarm_super": "tab:pink",
        "weightswarm_bt": "tab:cyan",
    }
    # Own y scale per scenario: warm and cold differ by an order of magnitude.
    fig, axes = plt.subplots(1, len(SCENARIOS), figsize=(5 * len(SCENARIOS), 4.5))
    for ax, scen in zip(axes, SCENARIOS, strict=True):
        sub = [r for r in rows if r.scenario == scen]
        for x, r in enumerate(sub):
            ys = sorted(r.times.values())
            ax.scatter([x] * len(ys), ys, s=25, alpha=0.7, color=colors.get(r.system))
            if r.failures:
                ax.annotate(f"{len(r.failures)} failed", (x, 0), ha="center")
        if sub:
            ax.axhline(sub[0].bound, ls="--", c="grey", label="lower bound")
            ax.legend(loc="upper right")
        ax.set_xticks(range(len(sub)), [r.system for r in sub])
        ax.set_xlim(-0.5, max(len(sub), 1) - 0.5)
        ax.set_title(scen)
        ax.set_ylabel("per-node completion time (s)")
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.swarm",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size", default="1GiB", help="model size (e.g. 1GiB, 256MiB)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--node-rate", type=float, default=120e6, help="bytes/s each way per node link")
    p.add_argument("--origin-rate", type=float, default=30e6, help="origin upload, bytes/s")
    p.add_argument(
        "--origin-rate-per-connection",
        type=float,
        default=None,
        help="also cap each origin connection at this many bytes/s, as a CDN does (the bound ignores it)",
    )
    p.add_argument(
        "--origin-rate-per-client",
        type=float,
        default=None,
        help="also cap each client address at this many bytes/s, as a CDN does (the bound ignores it)",
    )
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument(
        "--timeout", type=float, default=900, help="seconds per scenario before it counts as failed"
    )
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--agent-log-level", default="WARNING", help="log level of every `agent serve`")
    p.add_argument("--perf", action="store_true", help="where each round's CPU went (bench.profile)")
    p.add_argument(
        "--cleanup-stale", action="store_true", help="first delete namespaces of crashed runs (ws-*)"
    )
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    for bad in set(args.systems) - set(SYSTEMS) | set(args.scenarios) - set(SCENARIOS):
        p.error(f"unknown system or scenario: {bad}")
    reason = have_netns_support() or (profile.missing() if args.perf else None)
    if reason:
        print(f"error: the swarm benchmark {reason}", file=sys.stderr)
        return 2
    for tool in ("curl", "aria2c"):
        if shutil.which(tool) is None:
            print(f"error: the swarm benchmark needs `{tool}` (./dev installs it)", file=sys.stderr)
            return 2
    if args.cleanup_stale:
        cleanup_stale("ws-")
    size = parse_size(args.size)
    repo = "bench/swarm-model"
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp:
        room = size * (args.nodes + 3) + 512 * 2**20
        with tmpfs(Path(tmp) / "fs", room) as fs:
            hub = fs / "hub"
            subprocess.run(
                [
                    str(BIN / "agent"),
                    "make-test-model",
                    str(hub),
                    repo,
                    "--size",
                    args.size,
                    "--shards",
                    str(args.shards),
                ],
                check=True,
                timeout=600,
                stdout=subprocess.DEVNULL,
            )
            with Cluster(nodes=args.nodes, node_rate=args.node_rate, origin_rate=args.origin_rate) as c:
                logdir = args.out / f"swarm-{stamp}-logs"
                stack = Stack(c, fs, hub, logdir)
                stack.env["WEIGHTSWARM_LOG_LEVEL"] = args.agent_log_level
                stack.perf = args.perf
                print(f"logs: {logdir}", flush=True)
                per_conn, per_client = args.origin_rate_per_connection, args.origin_rate_per_client
                caps = ["--rate-per-connection", str(int(per_conn))] if per_conn else []
                caps += ["--rate-per-client", str(int(per_client))] if per_client else []
                stack.start_origin(caps)
                model = stack.describe_model(repo)
                aria = any(system.startswith("aria2c") for system in args.systems)
                torrents = build_torrents(stack, model, fs / "torrents") if aria else []
                peers_only = build_torrents(stack, model, fs / "peer-torrents", False) if aria else []
                print(
                    f"model {repo}@{model.commit[:10]}: {len(model.files)} files, "
                    f"{model.size / 2**20:.0f} MiB; cluster {c.prefix}: {args.nodes} nodes",
                    flush=True,
                )
                bench = Bench(args, stack, model, torrents, peers_only)
                for system in args.systems:
                    try:
                        getattr(bench, system)()
                    except (RuntimeError, TimeoutError) as exc:
                        # One system failing must not cost the others' figures: note it, go on.
                        print(f"  {system}: FAILED: {exc}", flush=True)
                        bench.errors.append(f"{system}: {exc}")
                        stack.stop_agents()
                        stack.stop_tracker()
                print_table(bench.rows, args, model.size)
                (args.out / f"swarm-{stamp}.json").write_text(
                    json.dumps(
                        {
                            "args": {k: v for k, v in vars(args).items() if k != "out"},
                            "rows": [asdict(r) for r in bench.rows],
                        },
                        indent=1,
                        default=str,
                    )
                )
                plot(bench.rows, args.out / f"swarm-{stamp}.png")
                for err in bench.errors:
                    print(f"error: {err}")
                print(f"saved {args.out / f'swarm-{stamp}.png'} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
