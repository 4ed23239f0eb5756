"""What an idle tracker and idle agents cost: the share of a core each uses while nothing is asked of
it, before its first fetch and after it (seeding what it fetched). A DaemonSet pays this on every
GPU node, all day, beside the inference pods.

What it does, per run and per checkout: serves a small test model (`agent serve-hub`), starts a
tracker (`tracker serve`, with a token and an announce passkey) and --agents `agent serve` on
loopback, waits --settle seconds, samples each process's CPU over --seconds; then has every agent
fetch the model (`agent fetch --agent`), waits, samples again. With `--checkout DIR` (an older
commit from `git worktree add DIR REV`) the same runs with that checkout's processes, interleaved
with this tree's (the machine is shared and noisy), and both are printed side by side.

Usage:
  .venv/bin/python -m bench.idle_cpu
  .venv/bin/python -m bench.idle_cpu --checkout /tmp/before --runs 2
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from bench.cli_start import wait_for
from bench.origin_fetch import AGENT, HERE, REPO, make_model, start_hub, stop
from bench.tracker_load import free_port

TRACKER = [sys.executable, "-m", "tracker"]


def _secret(path: Path) -> Path:
    path.write_text(secrets.token_hex(16) + "\n")
    path.chmod(0o600)
    return path


def _start_tracker(checkout: Path, work: Path) -> tuple[subprocess.Popen[str], str, Path, Path]:
    token, passkey = _secret(work / "tracker.token"), _secret(work / "tracker.passkey")
    port = free_port()
    argv = [
        *TRACKER, "serve", "--port", str(port), "--db", str(work / "tracker.db"),
        "--token-file", str(token), "--announce-passkey-file", str(passkey),
    ]  # fmt: skip
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen(argv, cwd=checkout, stdout=quiet, stderr=quiet, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=5).close()
            return proc, url, token, passkey
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise SystemExit(f"tracker serve from {checkout} did not answer") from None
            time.sleep(0.2)


def _sample(procs: dict[str, subprocess.Popen[str]], seconds: float) -> dict[str, float]:
    """Percent of one core each process used over `seconds`."""
    ps = {name: psutil.Process(p.pid) for name, p in procs.items()}
    t0 = {name: sum(p.cpu_times()[:2]) for name, p in ps.items()}
    time.sleep(seconds)
    return {name: (sum(p.cpu_times()[:2]) - t0[name]) / seconds * 100 for name, p in ps.items()}


def run(checkout: Path, origin: str, agents: int, settle: float, seconds: float) -> dict[str, float]:
    """`{"<process> idle" | "<process> seeding": percent of a core}` for one run of `checkout`."""
    with tempfile.TemporaryDirectory(prefix="ws-idle-") as tmp:
        work = Path(tmp)
        tracker, url, token, passkey = _start_tracker(checkout, work)
        procs: dict[str, subprocess.Popen[str]] = {"tracker": tracker}
        try:
            for i in range(agents):
                d = work / f"agent-{i}"
                argv = [
                    *AGENT, "serve", "--cache-dir", str(d / "hub"), "--state-dir", str(d / "state"),
                    "--origin", origin, "--tracker", url, "--tracker-token-file", str(token),
                    "--tracker-passkey-file", str(passkey), "--bt-listen", f"127.0.0.1:{free_port()}",
                    "--api-listen", f"127.0.0.1:{free_port()}", "--node-name", f"idle-{i}",
                ]  # fmt: skip
                quiet = subprocess.DEVNULL
                proc = subprocess.Popen(argv, cwd=checkout, stdout=quiet, stderr=quiet, text=True)
                procs[f"agent-{i}"] = proc
            for i in range(agents):
                wait_for(work / f"agent-{i}" / "state" / "admin.sock", procs[f"agent-{i}"])
            time.sleep(settle)
            before = _sample(procs, seconds)
            for i in range(agents):
                admin = work / f"agent-{i}" / "state" / "admin.sock"
                fetch = [*AGENT, "fetch", REPO, "--agent", f"unix://{admin}", "--quiet"]
                subprocess.run(fetch, cwd=checkout, check=True, stdout=subprocess.DEVNULL, timeout=300)
            time.sleep(settle)
            after = _sample(procs, seconds)
        finally:
            for p in procs.values():
                stop(p)
    return {f"{name} before-fetch": v for name, v in before.items()} | {
        f"{name} after-fetch": v for name, v in after.items()
    }


def _kind(key: str) -> str:
    """'agent-2 after-fetch' -> 'agent after-fetch': agents are one row."""
    name, state = key.split(" ")
    return f"{name.split('-')[0]} {state}"


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
    with tempfile.TemporaryDirectory(prefix="ws-idle-origin-") as tmp:
        make_model(Path(tmp) / "origin", "16MiB", 2)
        hub, origin = start_hub(Path(tmp) / "origin", None)
        try:
            for _ in range(args.runs):
                for name, path in checkouts.items():
                    for key, value in run(path, origin, args.agents, args.settle, args.seconds).items():
                        seen[name].setdefault(_kind(key), []).append(value)
        finally:
            stop(hub)
    rows = list(next(iter(seen.values())))
    print(f"% of one core, median over {args.runs} runs x {args.agents} agents, {args.seconds:.0f}-s samples")
    print("| process | " + " | ".join(checkouts) + " |")
    print("|---|" + "---|" * len(checkouts))
    for row in rows:
        cells = " | ".join(f"{statistics.median(seen[name][row]):.2f}" for name in checkouts)
        print(f"| {row} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
