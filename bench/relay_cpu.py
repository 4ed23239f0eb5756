"""CPU a relay stream costs: one seed, one receiver, one blob over the relay on loopback (no shaping).

A warm start on two cores is bound by what the receivers cost (bench.swarm's warm rows are CPU-bound),
so this measures the relay's receive and send paths alone: a real tracker, two real `agent serve`
processes, a test hub. Agent a fetches the model from the hub and offers its shard over the relay;
agent b fetches it (a warm start: the shard comes over the relay) and the CPU seconds (user + system)
both processes spent during b's fetch are read from /proc. With `--checkout DIR` (e.g. `git worktree
add DIR REV`) the agents of that checkout run too, interleaved with this tree's.

The floor, measured right after each fetch in the same directory: what this process spends to write
the same bytes into a new file with plain 1-MiB writes and to sha256 them once, the least a receiver
can do (it also takes them off a socket). On this VM writing fresh page-cache pages costs ten times as
much when memory has just churned as on a quiet machine, so the receiver is read against the floor of
the same moment.

`--bittorrent`: both agents run with `--no-relay-seeds`, so the shard goes by BitTorrent (libtorrent on
both sides) instead: the same figures for that path.

Usage:
  .venv/bin/python -m bench.relay_cpu
  .venv/bin/python -m bench.relay_cpu --size 1024 --runs 3 --checkout /tmp/before
  .venv/bin/python -m bench.relay_cpu --bittorrent --size 512 --runs 5 --checkout /tmp/before
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from agent.http.client import AgentClient
from tests.support.cluster import AgentProcess, TrackerProcess, model_origin

HERE = Path(__file__).resolve().parent.parent


def fetch(agent: AgentProcess, repo: str, timeout: float = 300) -> None:
    client = AgentClient(agent.url)
    job = client.start_fetch(repo, "main", [], [])["job_id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phase = client.job(job, wait=1.0)["phase"]  # answers as soon as the job ends
        if phase == "Ready":
            return
        if phase == "Failed":
            raise SystemExit(f"the fetch on {agent.argv[-1]} failed; see its log")
    raise SystemExit(f"the fetch on {agent.argv[-1]} did not finish in {timeout}s")


def cpu(agent: AgentProcess) -> float:
    assert agent.proc is not None
    t = psutil.Process(agent.proc.pid).cpu_times()
    return float(t.user + t.system)


def floor(directory: Path, size_mib: int) -> float:
    """CPU seconds this process spends writing `size_mib` MiB into a new file and hashing them once."""
    block = os.urandom(1 << 20)
    path = directory / "floor"
    before = resource.getrusage(resource.RUSAGE_SELF)
    digest = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(size_mib):
            os.pwrite(fd, block, i << 20)
            digest.update(block)
    finally:
        os.close(fd)
    after = resource.getrusage(resource.RUSAGE_SELF)
    path.unlink()
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def one_run(checkout: Path, size_mib: int, bittorrent: bool) -> tuple[float, float, float, float]:
    """(wall s, seed CPU s, receiver CPU s, floor CPU s) of one fetch by agents of `checkout`, over the
    relay or (`bittorrent`) by BitTorrent."""
    extra = ("--no-relay-seeds",) if bittorrent else ()
    os.environ["PYTHONPATH"] = str(checkout)  # the agents' `agent` entry point imports that tree
    with tempfile.TemporaryDirectory(prefix="ws-relay-cpu-") as d:
        tmp = Path(d)
        tracker = TrackerProcess(tmp)
        tracker.start()
        a = b = None
        try:
            with model_origin(tmp / "hub", "bench/relay", total_bytes=size_mib << 20, shards=1, seed=3) as o:
                a = AgentProcess(tmp, "a", o.hub.url, tracker, *extra)
                a.start()
                fetch(a, o.repo_id)
                b = AgentProcess(tmp, "b", o.hub.url, tracker, *extra)
                b.start()
                time.sleep(12)  # a's offer announced (at the tracker's interval), b settled
                seed0, recv0, t0 = cpu(a), cpu(b), time.monotonic()
                fetch(b, o.repo_id)
                wall, seed, recv = time.monotonic() - t0, cpu(a) - seed0, cpu(b) - recv0
                if ("relayed from" in b.log.read_text()) == bittorrent:
                    path = "BitTorrent" if bittorrent else "the relay"
                    raise SystemExit(f"b did not take the shard over {path}: nothing measured")
                return wall, seed, recv, floor(tmp, size_mib)
        finally:
            for agent in (a, b):
                if agent is not None:
                    agent.stop()
            tracker.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=512, help="the shard, MiB (default 512)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each checkout (default 3)")
    ap.add_argument("--checkout", type=Path, default=None, help="also measure the agents of this checkout")
    ap.add_argument("--bittorrent", action="store_true", help="the shard by BitTorrent, not the relay")
    args = ap.parse_args(argv)
    checkouts = {"this tree": HERE}
    if args.checkout is not None:
        checkouts[str(args.checkout)] = args.checkout.resolve()
    runs: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in checkouts}
    for _ in range(args.runs):
        for name, path in checkouts.items():
            runs[name].append(one_run(path, args.size, args.bittorrent))
    gib = args.size / 1024
    path = "by BitTorrent" if args.bittorrent else "over the relay"
    print(f"one {args.size} MiB shard {path}, loopback; medians of {args.runs} runs")
    print(
        "| agents | wall s | seed CPU s | receiver CPU s | receiver CPU s per GiB | floor CPU s "
        "| receiver ÷ floor |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, rows in runs.items():
        wall, seed, recv, least = (statistics.median(col) for col in zip(*rows, strict=True))
        ratio = statistics.median(r[2] / r[3] for r in rows)
        print(
            f"| {name} | {wall:.2f} | {seed:.2f} | {recv:.2f} | {recv / gib:.1f} | {least:.2f} "
            f"| {ratio:.1f} |"
        )
    if args.bittorrent:
        print("target: at or below aria2c's CPU per GiB (bench.swarm prints both in one run)")
    else:
        print("targets: seed <= 0.2 CPU-s per GiB, receiver <= 1.0 CPU-s per GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
