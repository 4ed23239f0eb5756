"""N nodes cold from a source the agents read themselves (a bucket, a registry), shared by bench.bucket and
bench.registry: the test model, the source's link counted, and the cold round through `agent serve`.

The round: a tracker and one `agent serve SOURCE-OPTIONS` per node (bench.stack), then `agent fetch URL
--repo-id … --agent unix://…` on every node at once. Recorded as bench.swarm records a row (bound
max(S/U_origin, S/D_node, N·S/(U_origin + ΣU_node))), with the source's egress counted on its link (the
veth's tx bytes less 66 B a packet: independent of the agent), the agents' CPU, the bytes each job says
it took from the source, and the tracker's lease takeovers.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.netns import Cluster
from bench.stack import BIN, Model, ModelFile, Stack
from bench.swarm import Bench, Row

HEADER = 66
"""Bytes of headers a packet on the veth (Ethernet, IPv4, TCP with timestamps), as bench.swarm counts."""


def human_to_bytes(text: str) -> int:
    """`agent.core.progress.human_bytes` back to bytes ("512.0 MiB", "1,024.0 MiB", "0 B")."""
    number, unit = text.replace(",", "").split()
    return int(float(number) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[unit])


def tree_bytes(path: Path) -> int:
    """Bytes of every file under `path`, symlinks followed (a snapshot's entries link to its blobs)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def write_model(path: Path, repo: str, size: str, shards: int) -> Model:
    """`agent make-test-model` under `path`: its files (no commit, no blob ids: the source names them)."""
    subprocess.run(
        [str(BIN / "agent"), "make-test-model", str(path), repo, "--size", size, "--shards", str(shards)],
        check=True,
        timeout=600,
        stdout=subprocess.DEVNULL,
    )
    root = path / repo
    files = tuple(
        ModelFile(p.relative_to(root).as_posix(), p.stat().st_size, "")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    )
    return Model(repo, "", files)


def payload_sent(c: Cluster) -> int:
    """Payload bytes the origin member's link has sent (headers taken off)."""
    sent, packets = c.sent("origin")
    return sent - HEADER * packets


def process_cpu(pid: int) -> float:
    """User + system CPU-seconds of `pid` with its reaped children (0 once gone)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system + t.children_user + t.children_system)


@dataclass
class ColdRound:
    """One system's cold round (bench.swarm's row) and what the source and the agents said of it."""

    row: Row
    agents_cpu: float = float("nan")
    """CPU-seconds of every `agent serve` in the round (nan for a system without agents)."""
    source_cpu: float = float("nan")
    """CPU-seconds of the source's server in the round."""
    reported: dict[str, int] = field(default_factory=dict)
    """Bytes each node's job says it took from the source (bytes_from_origin)."""
    takeovers: int = -1
    """Leases the tracker handed from a holder whose reported bytes stood still (-1: unknown)."""


def run_cold(
    args: argparse.Namespace,
    stack: Stack,
    model: Model,
    system: str,
    argv: Callable[[str], list[str]],
    source_cpu: Callable[[], float],
    serve: Sequence[str] | None = None,
) -> ColdRound:
    """Every node runs `argv(node)` at once from cold caches. `serve`: the source options of one `agent
    serve` per node (with a tracker) that `argv` asks; None: `argv` is a client of its own."""
    s, c = stack, stack.c
    s.wipe(c.nodes)
    s.log_prefix = f"{system}-"
    bench = Bench(args, s, model, [], [])
    agents: dict[int, float] = {}
    try:
        if serve is not None:
            s.start_tracker(s.workdir / f"tracker-{system}.db")
            s.start_agents(c.nodes, serve)
            agents = {p.pid: process_cpu(p.pid) for p in s.agents.values()}
        server0, net0, sent0 = source_cpu(), bench.network(), payload_sent(c)
        if serve is not None:
            res = s.run_fetches(c.nodes, argv, args.timeout, "fetch", rss_pids=s.agent_pids)
        else:
            clients = lambda: [p.pid for p in c.procs if p.argv[:1] == argv(c.nodes[0])[:1]]  # noqa: E731
            res = s.run_fetches(c.nodes, argv, args.timeout, "fetch", rss_pids=clients)
        bench.record(system, "cold", c.nodes, res, payload_sent(c) - sent0, net0)
        out = ColdRound(bench.rows[-1], source_cpu=source_cpu() - server0)
        if serve is not None:
            out.agents_cpu = sum(process_cpu(pid) - cpu0 for pid, cpu0 in agents.items())
            out.reported = _origin_bytes(s, c.nodes)
            out.takeovers = _takeovers(s)
    finally:
        s.stop_agents()
        s.stop_tracker()
    return out


def _takeovers(s: Stack) -> int:
    """The tracker's count of leases taken over from a stalled holder (its /metrics)."""
    text = s.curl("tracker", f"{s.tracker_url}/metrics", tracker_auth=True) or ""
    found = re.findall(r"^tracker_lease_takeovers_total (\S+)$", text, re.MULTILINE)
    return int(float(found[0])) if found else -1


def _origin_bytes(s: Stack, nodes: Sequence[str]) -> dict[str, int]:
    """Bytes each node's job says it took from the origin (the CLI's last message)."""
    got = {}
    for node in nodes:
        text = s.log(f"fetch-{node}").read_text(errors="replace")
        found = re.findall(r"from peers, ([\d.,]+ [KMGT]?i?B) from the origin", text)
        if found:
            got[node] = human_to_bytes(found[-1])
    return got
