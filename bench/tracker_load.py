"""Announce load: `tracker serve` (default SQLite store) vs opentracker, same wrk load, same run.

    .venv/bin/python bench/tracker_load.py [--duration 10] [--blobs 2000] [--peers 4000]
        [--threads 1] [--connections 32] [--checkout DIR]

Starts both trackers on loopback ports, drives each with
`wrk -t<threads> -c<connections> -d<duration>s --latency -s bench/announce.lua`, where the script
spreads compact announces over --blobs infohashes and --peers peer ids (percent-encoded raw bytes;
ours at /announce/<passkey>, as agents announce, opentracker at /announce), and
prints announces/s, p50/p99 latency, the share of a core the tracker and wrk each used meanwhile (the one
near 100 % is what sets the rate: opentracker closes every connection, so against it wrk spends its
time reconnecting), the ratio, and how many nodes x blobs one replica carries at the announce interval
(every node re-announces every blob once per interval).
`--checkout DIR`: also run the tracker of another tree (a before/after in one run), with this
tree's Python environment.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listening on port {port} after {timeout}s")


def check_announce(port: int, path: str, hashes: Path) -> None:
    """One announce by hand: a refused one is HTTP 200 too, and wrk would time refusals."""
    first = hashes.read_text().split()[0]
    query = "info_hash=" + "".join(f"%{first[i : i + 2]}" for i in range(0, 40, 2))
    query += "&peer_id=" + "%02" * 20 + "&port=1&left=0"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?{query}", timeout=10) as resp:
        body = resp.read()
    if b"failure reason" in body:
        raise SystemExit(f"the tracker refused the benchmark's announce: {body[:200]!r}")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (of its thread `tid`) so far."""
    where = f"/proc/{pid}" if tid is None else f"/proc/{pid}/task/{tid}"
    fields = Path(f"{where}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(
    port: int, load: argparse.Namespace, hashes: Path, server: int, path: str = "/announce"
) -> dict[str, float]:
    """wrk's figures, and the share of one core the server (pid `server`) and wrk each used meanwhile."""
    check_announce(port, path, hashes)
    # The path (with the passkey) goes to announce.lua by environment, not on wrk's command line.
    env = {**os.environ, "WS_HASHES": str(hashes), "WS_PEERS": str(load.peers), "WS_ANNOUNCE_PATH": path}
    duration = load.duration
    cmd = [
        "wrk",
        f"-t{load.threads}",
        f"-c{load.connections}",
        f"-d{duration}s",
        "--latency",
        "-s",
        str(HERE / "announce.lua"),
        f"http://127.0.0.1:{port}/announce",
    ]
    server0, wrk0, started = cpu_seconds(server), _children_cpu(), time.monotonic()
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=duration + 30, check=True
    ).stdout
    wall = time.monotonic() - started
    match = re.search(r"WSRESULT (.*)", out)
    if not match:
        raise SystemExit(f"wrk printed no result:\n{out}")
    result: dict[str, float] = {k: int(v) for k, v in (kv.split("=") for kv in match.group(1).split())}
    result["server_cpu"] = (cpu_seconds(server) - server0) / wall
    result["wrk_cpu"] = (_children_cpu() - wrk0) / wall
    return result


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_ours(
    tree: Path, work: Path, passkey: str, args: argparse.Namespace, hashes: Path
) -> dict[str, float]:
    """`tracker serve` of `tree` (SQLite, the passkey, warnings only) under the wrk load."""
    port = free_port()
    ours = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracker",
            "serve",
            "--port",
            str(port),
            "--db",
            str(work / f"{port}.db"),
            "--token-file",
            str(work / "token"),
            "--announce-passkey-file",
            str(work / "passkey"),
            "--log-level",
            "WARNING",
            "--interval",
            str(args.interval),
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    try:
        wait_port(port, ours)
        return run_wrk(port, args, hashes, ours.pid, f"/announce/{passkey}")
    finally:
        stop(ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds of load per tracker")
    ap.add_argument("--blobs", type=int, default=2000, help="distinct infohashes")
    ap.add_argument("--peers", type=int, default=4000, help="distinct peer ids")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads")
    ap.add_argument("--connections", type=int, default=32, help="wrk connections")
    ap.add_argument("--checkout", type=Path, help="another tree whose tracker runs too (before/after)")
    ap.add_argument("--interval", type=int, default=30, help="announce interval for the capacity line")
    args = ap.parse_args()
    for tool in ("wrk", "opentracker"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: ./dev installs it (Debian package {tool})")

    with tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp:
        work = Path(tmp)
        hashes = work / "whitelist"
        hashes.write_text("".join(secrets.token_hex(20) + "\n" for _ in range(args.blobs)))
        token = work / "token"
        token.write_text(secrets.token_hex(16))
        passkey = secrets.token_hex(16)
        (work / "passkey").write_text(passkey)
        os.chmod(tmp, 0o755)  # opentracker chroots into it and drops to 'nobody'
        hashes.chmod(0o644)
        results = {}

        trees = {"tracker serve (sqlite)": ROOT}
        if args.checkout:
            trees[f"tracker serve ({args.checkout.name})"] = args.checkout.resolve()
        for name, tree in trees.items():
            results[name] = run_ours(tree, work, passkey, args, hashes)

        port = free_port()
        ot = subprocess.Popen(
            [
                "opentracker",
                "-i",
                "127.0.0.1",
                "-p",
                str(port),
                "-P",
                str(port),
                "-d",
                tmp,
                "-w",
                "whitelist",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(port, ot)
            results["opentracker"] = run_wrk(port, args, hashes, ot.pid)
        finally:
            stop(ot)

    print(
        f"\nwrk -t{args.threads} -c{args.connections} -d{args.duration}s, {args.blobs} infohashes x "
        f"{args.peers} peer ids, loopback, "
        f"{os.cpu_count()} CPUs (wrk shares them)\n"
    )
    print(
        f"{'tracker':<30} {'announces/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} {'timeouts':>8} "
        f"{'server CPU':>11} {'wrk CPU':>8} {'CPU µs/announce':>16}"
    )
    rps = {}
    for name, r in results.items():
        rps[name] = r["requests"] / (r["duration_us"] / 1e6)
        print(
            f"{name:<30} {rps[name]:>12,.0f} {r['p50_us'] / 1000:>8.2f} {r['p99_us'] / 1000:>8.2f} "
            f"{r['status_errors']:>8.0f} {r['timeouts']:>8.0f} {r['server_cpu']:>10.0%} {r['wrk_cpu']:>8.0%} "
            f"{r['server_cpu'] / rps[name] * 1e6:>16.0f}"
        )
    if results["opentracker"]["socket_errors"]:
        print(
            "(opentracker closes the connection after every reply; wrk counts those as read errors "
            "and reconnects)"
        )
    print("(CPU: the share of one core each used during the load; whichever is near 100 % sets the rate)")
    ours_rps = rps["tracker serve (sqlite)"]
    print()
    for name in trees:
        print(f"ratio {name} / opentracker: {rps[name] / rps['opentracker']:.2f} (target >= 1)")
    print(
        f"one replica at interval {args.interval}s carries ~{ours_rps * args.interval:,.0f} node x blob "
        f"announce slots (e.g. {ours_rps * args.interval / 100:,.0f} nodes x 100 blobs)"
    )


if __name__ == "__main__":
    main()
