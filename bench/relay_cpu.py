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
the same moment; and right before each transfer the bench writes and deletes a file twice the shard's
size (`prime`), so that every receiver writes into pages freed a moment before; `--no-prime` leaves the
machine's memory as the runs before left it.

`--bittorrent`: both agents run with `--no-relay-seeds`, so the shard goes by BitTorrent (libtorrent on
both sides) instead: the same figures for that path, with the part of each agent's CPU that its
libtorrent threads used (told from the daemon's by their names, agent.daemon.threadnames). Between the
agents' runs one aria2c seeds the same shard to another through the same tracker (the seed verifies its
copy first and is measured from when the receiver starts; the receiver is measured whole, from its
start to its exit): one sender and one receiver compared, which bench.swarm's eight nodes on two
cores blur.

Usage:
  .venv/bin/python -m bench.relay_cpu
  .venv/bin/python -m bench.relay_cpu --size 1024 --runs 3 --checkout /tmp/before
  .venv/bin/python -m bench.relay_cpu --bittorrent --size 512 --runs 5 --checkout /tmp/before
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import psutil

from agent.http.client import AgentClient
from agent.hub.testmodel import make_model
from bench.launchers import AgentProcess, TrackerProcess, model_origin
from bench.procs import free_port, stop_process
from bench.stack import ARIA2C_PRIVATE, blob_info, grown, native_threads
from wirekit.bencode import bencode

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


class Run(NamedTuple):
    """CPU-seconds of one transfer: whole processes, and (BitTorrent) the part in the client's threads."""

    wall: float
    seed: float
    receiver: float
    floor: float
    seed_bt: float = float("nan")
    receiver_bt: float = float("nan")


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
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


def prime(directory: Path, size_mib: int) -> None:
    """Write and delete a file twice the shard's size right before a transfer. This VM hands freed
    memory back to its host a few seconds after it is freed, and a page the host must fault in again
    makes the first write into it several times dearer (`bench.page_cost`). Without this, what a
    receiver pays for its page cache depends on how much the run before it freed, and how long ago:
    the agents' runs, which first fill a seed from the hub and wait for its announce, paid about 2.5
    times aria2c's for the same writes. Primed, both write into pages freed a moment before, as on a
    machine that keeps its memory."""
    floor(directory, 2 * size_mib)


def one_run(checkout: Path, size_mib: int, bittorrent: bool, primed: bool = True) -> Run:
    """One fetch by agents of `checkout`, over the relay or (`bittorrent`) by BitTorrent."""
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
                assert a.proc is not None and b.proc is not None
                pa, pb = a.proc.pid, b.proc.pid
                if primed:
                    prime(tmp, size_mib)
                bt0 = native_threads(pa), native_threads(pb)
                seed0, recv0, t0 = cpu(pa), cpu(pb), time.monotonic()
                fetch(b, o.repo_id)
                wall, seed, recv = time.monotonic() - t0, cpu(pa) - seed0, cpu(pb) - recv0
                seed_bt, recv_bt = grown(bt0[0], native_threads(pa)), grown(bt0[1], native_threads(pb))
                if ("relayed from" in b.log.read_text()) == bittorrent:
                    path = "BitTorrent" if bittorrent else "the relay"
                    raise SystemExit(f"b did not take the shard over {path}: nothing measured")
                bt = (seed_bt, recv_bt) if bittorrent else ()
                return Run(wall, seed, recv, floor(tmp, size_mib), *bt)
        finally:
            for agent in (a, b):
                if agent is not None:
                    agent.stop()
            tracker.stop()


def aria2c_argv(directory: Path, torrent: Path, *options: str) -> list[str]:
    return [
        "aria2c",
        f"--dir={directory}",
        f"--listen-port={free_port()}",
        *ARIA2C_PRIVATE,
        *options,
        str(torrent),
    ]


def aria2c_run(size_mib: int, primed: bool = True, timeout: float = 300) -> Run:
    """One aria2c seeding the shard to another on loopback, announced to the real tracker."""
    with tempfile.TemporaryDirectory(prefix="ws-relay-cpu-") as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        written = make_model(tmp / "hub", "bench/relay", total_bytes=size_mib << 20, shards=1, seed=3)
        (shard,) = (p for p in written if p.suffix == ".safetensors")
        tracker = TrackerProcess(tmp)
        tracker.start()
        stack.callback(tracker.stop)
        torrent = tmp / "shard.torrent"
        torrent.write_bytes(bencode({"announce": tracker.announce_url, "info": blob_info(shard, shard.name)}))
        seeded = tmp / "seeded"
        hook = tmp / "hook.sh"
        hook.write_text(f'#!/bin/sh\ntouch "{seeded}"\n')
        hook.chmod(0o755)
        options = ("--check-integrity=true", "--seed-time=100000", f"--on-bt-download-complete={hook}")
        seed = subprocess.Popen(
            aria2c_argv(shard.parent, torrent, *options), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        stack.callback(stop_process, seed, 10)
        deadline = time.monotonic() + timeout
        while not seeded.exists():
            if seed.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the aria2c seed did not take its copy as complete")
            time.sleep(0.2)
        time.sleep(2)  # its announce answered
        if primed:
            prime(tmp, size_mib)
        seed0, kids0, t0 = cpu(seed.pid), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        done = subprocess.run(
            aria2c_argv(tmp / "received", torrent, "--seed-time=0"),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        wall, seed_cpu = time.monotonic() - t0, cpu(seed.pid) - seed0
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the receiver, waited for
        received = tmp / "received" / shard.name
        if done.returncode != 0 or not received.exists() or received.stat().st_size != shard.stat().st_size:
            raise SystemExit(f"the aria2c receiver failed: {done.stdout[-500:]}")
        recv = (kids.ru_utime - kids0.ru_utime) + (kids.ru_stime - kids0.ru_stime)
        return Run(wall, seed_cpu, recv, floor(tmp, size_mib), seed_cpu, recv)


def print_table(runs: dict[str, list[Run]], size_mib: int, bittorrent: bool) -> None:
    gib = size_mib / 1024
    path = "by BitTorrent" if bittorrent else "over the relay"
    print(f"one {size_mib} MiB shard {path}, loopback; medians of {len(next(iter(runs.values())))} runs")
    bt = " | BitTorrent client CPU s per GiB, seed / receiver" if bittorrent else ""
    print(
        "| system | wall s | seed CPU s | receiver CPU s | receiver CPU s per GiB | floor CPU s "
        f"| receiver ÷ floor{bt} |"
    )
    print("|---" * (8 if bittorrent else 7) + "|")
    for name, rows in runs.items():
        m = Run(*(statistics.median(col) for col in zip(*rows, strict=True)))
        ratio = statistics.median(r.receiver / r.floor for r in rows)
        cells = f" | {m.seed_bt / gib:.2f} / {m.receiver_bt / gib:.2f}" if bittorrent else ""
        print(
            f"| {name} | {m.wall:.2f} | {m.seed:.2f} | {m.receiver:.2f} | {m.receiver / gib:.1f} "
            f"| {m.floor:.2f} | {ratio:.1f}{cells} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=512, help="the shard, MiB (default 512)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each checkout (default 3)")
    ap.add_argument("--checkout", type=Path, default=None, help="also measure the agents of this checkout")
    ap.add_argument("--bittorrent", action="store_true", help="the shard by BitTorrent, not the relay")
    ap.add_argument(
        "--no-prime", action="store_true", help="no write and delete before each transfer (memory as it is)"
    )
    args = ap.parse_args(argv)
    checkouts = {"this tree": HERE}
    if args.checkout is not None:
        checkouts[str(args.checkout)] = args.checkout.resolve()
    measure = {
        name: functools.partial(one_run, path, args.size, args.bittorrent, not args.no_prime)
        for name, path in checkouts.items()
    }
    if args.bittorrent and shutil.which("aria2c"):
        measure["aria2c"] = functools.partial(aria2c_run, args.size, not args.no_prime)
    elif args.bittorrent:
        print("aria2c is not installed (./dev installs it): no aria2c row", file=sys.stderr)
    runs: dict[str, list[Run]] = {name: [] for name in measure}
    for i in range(args.runs):
        # Every other round in reverse: what a run costs here depends on what the one before it freed.
        for name in list(measure)[:: 1 if i % 2 == 0 else -1]:
            runs[name].append(measure[name]())
    print_table(runs, args.size, args.bittorrent)
    if args.bittorrent:
        print("target: the BitTorrent client's CPU per GiB at or below aria2c's, sending and receiving")
    else:
        print("targets: seed <= 0.2 CPU-s per GiB, receiver <= 1.0 CPU-s per GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
