"""What writing a GiB into memory it has not touched lately costs this machine: the floor under every
receiver's copy into its cache, and what makes the warm rows of `bench.swarm` move from run to run.

It writes --gib files of 1 GiB each (plain 1-MiB writes of the same random block) into --dir, a tmpfs
by default, keeping each until the end, and prints the CPU seconds (user + system) and wall seconds of
each GiB; then it deletes them, waits --rest seconds and writes them again, so that the second round
shows how much of what was just freed stays cheap. On a machine whose memory is its own every row reads
about the same; on a VM whose host backs guest memory lazily and takes back what the guest frees
(free page reporting), a GiB past what the host keeps for it costs many times as much.

Usage:
  .venv/bin/python -m bench.page_cost
  .venv/bin/python -m bench.page_cost --gib 8 --rest 3 --dir /dev/shm
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

GiB = 1 << 30
_BLOCK = 1 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_gib(path: Path, block: bytes) -> tuple[float, float]:
    """(CPU s, wall s) of writing one GiB of `block`s into a new file at `path`."""
    c0, t0 = cpu(), time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for i in range(GiB // _BLOCK):
            os.pwrite(fd, block, i * _BLOCK)
    finally:
        os.close(fd)
    return cpu() - c0, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="where to write (default /dev/shm)")
    ap.add_argument("--gib", type=int, default=10, help="GiB per round (default 10)")
    ap.add_argument("--rest", type=float, default=5.0, help="seconds between the rounds (default 5)")
    args = ap.parse_args(argv)
    free = os.statvfs(args.dir).f_bavail * os.statvfs(args.dir).f_frsize
    if free < (args.gib + 1) * GiB:
        raise SystemExit(f"{args.dir} has {free / GiB:.1f} GiB free; --gib {args.gib} needs {args.gib + 1}")
    block = os.urandom(_BLOCK)
    rounds: list[list[tuple[float, float]]] = []
    with tempfile.TemporaryDirectory(prefix="ws-page-cost-", dir=args.dir) as d:
        for r in range(2):
            if r:
                time.sleep(args.rest)
            paths = [Path(d) / f"{r}-{k}" for k in range(args.gib)]
            try:
                rounds.append([write_gib(p, block) for p in paths])
            finally:
                for p in paths:
                    p.unlink(missing_ok=True)
    print(f"1 GiB files into {args.dir}, each kept until its round ends; {args.rest:g} s between the rounds")
    print("| GiB | first round CPU s | wall s | second round CPU s | wall s |")
    print("|---|---|---|---|---|")
    for k, ((c1, w1), (c2, w2)) in enumerate(zip(*rounds, strict=True), start=1):
        print(f"| {k} | {c1:.2f} | {w1:.2f} | {c2:.2f} | {w2:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
