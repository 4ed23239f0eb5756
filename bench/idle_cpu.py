"""What an idle tracker and idle agents cost: the share of a core each uses while nothing is asked of
it, before its first fetch and after it (seeding what it fetched). A DaemonSet pays this on every
GPU node, all day, beside the inference pods.

What it does, per run and per checkout: serves a small test model (a test hub in this process), starts
a tracker (`tracker serve`) and --agents `agent serve` on loopback (bench.launchers, as
bench.relay_cpu does), waits --settle seconds, samples each process's CPU over --seconds; then has
every agent fetch the model, waits, samples again. With `--checkout DIR` (an older
commit from `git worktree add DIR REV`) the same runs with that checkout's processes, interleaved
with this tree's (the machine is shared and noisy), and both are printed side by side.

Usage:
  .venv/bin/python -m bench.idle_cpu
  .venv/bin/python -m bench.idle_cpu --checkout /tmp/before --runs 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.launchers import AgentProcess, TrackerProcess, model_origin
from bench.relay_cpu import HERE, fetch
from bench.tracker_load import cpu_seconds

REPO = "bench/idle"


def run(checkout: Path, origin: str, agents: int, settle: float, seconds: float) -> list[tuple[str, float]]:
    """(row, percent of a core) of each process in one run of `checkout`: "tracker before-fetch",
    "agent before-fetch" (once per agent), then the same after the agents fetched the model."""
    os.environ["PYTHONPATH"] = str(checkout)  # the entry points import that tree
    with tempfile.TemporaryDirectory(prefix="ws-idle-") as d:
        tmp = Path(d)
        tracker = TrackerProcess(tmp)
        tracker.start()
        nodes = [AgentProcess(tmp, f"idle-{i}", origin, tracker) for i in range(agents)]
        try:
            for node in nodes:
                node.start()
            pids = [("tracker", tracker.proc)] + [("agent", node.proc) for node in nodes]
            procs = [(kind, proc.pid) for kind, proc in pids if proc is not None]

            def sample(state: str) -> list[tuple[str, float]]:
                time.sleep(settle)
                t0 = [cpu_seconds(pid) for _, pid in procs]
                time.sleep(seconds)
                return [
                    (f"{kind} {state}", (cpu_seconds(pid) - c) / seconds * 100)
                    for (kind, pid), c in zip(procs, t0, strict=True)
                ]

            before = sample("before-fetch")
            for node in nodes:
                fetch(node, REPO)
            return before + sample("after-fetch")
        finally:
            for node in nodes:
                node.stop()
            tracker.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=3, help="agents per run (default 3)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each checkout (default 2)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of each sample (default 30)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds before each sample (default 5)")
    ap.add_argument("--checkout", type=Path, default=None, help="also measure this checkout, interleaved")
    args = ap.parse_args(argv)
    checkouts = {"this tree": HERE}
    if args.checkout is not None:
        checkouts[str(args.checkout)] = args.checkout.resolve()
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    with tempfile.TemporaryDirectory(prefix="ws-idle-origin-") as d:
        with model_origin(Path(d), REPO, total_bytes=16 << 20, shards=2, seed=5) as origin:
            for _ in range(args.runs):
                for name, path in checkouts.items():
                    for row, value in run(path, origin.hub.url, args.agents, args.settle, args.seconds):
                        seen[name].setdefault(row, []).append(value)
    print(f"% of one core, median over {args.runs} runs x {args.agents} agents, {args.seconds:.0f}-s samples")
    print("| process | " + " | ".join(checkouts) + " |")
    print("|---|" + "---|" * len(checkouts))
    for row in seen["this tree"]:
        cells = " | ".join(f"{statistics.median(seen[name][row]):.2f}" for name in checkouts)
        print(f"| {row} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
