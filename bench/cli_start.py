"""How long N `agent fetch --agent` started at once take when the agent has the model already:
the CLI's own cost (interpreter, imports, the request, the job's status), which a cold start in
`bench.swarm` pays on every node before the first byte is asked for.

What it does: writes a small test model (`agent make-test-model`), serves it (`agent serve-hub`),
starts one `agent serve` on loopback (no tracker) and has it fetch the model; then, --runs times,
starts --clients `python -m agent fetch REPO --agent unix://ADMIN_SOCKET --quiet` at once and
times until the last one exits (each must exit 0). With `--checkout DIR` (e.g. an older commit from
`git worktree add DIR REV`) it also runs the CLI of that checkout against the same agent,
interleaved with this tree's, and prints both and their ratio.

Usage:
  .venv/bin/python -m bench.cli_start
  .venv/bin/python -m bench.cli_start --checkout /tmp/before --clients 8 --runs 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.origin_fetch import AGENT, HERE, REPO, make_model, start_hub, stop


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"agent serve did not open {path}")
        time.sleep(0.1)


def fetch_all(checkout: Path, admin: Path, clients: int) -> float:
    """Seconds until `clients` fetches started at once from `checkout` have all exited 0."""
    argv = [*AGENT, "fetch", REPO, "--agent", f"unix://{admin}", "--quiet"]
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(argv, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(clients)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    elapsed = time.perf_counter() - t0
    for p, err in zip(procs, errors, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"agent fetch from {checkout} failed ({p.returncode}): {err[-1000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8, help="fetches started at once (default 8)")
    ap.add_argument("--runs", type=int, default=7, help="runs of each checkout (default 7)")
    ap.add_argument("--checkout", type=Path, default=None, help="also time the CLI of this checkout")
    args = ap.parse_args(argv)
    checkouts = {"this tree": HERE}
    if args.checkout is not None:
        checkouts[str(args.checkout)] = args.checkout.resolve()
    with tempfile.TemporaryDirectory(prefix="ws-cli-start-") as tmp:
        work = Path(tmp)
        make_model(work / "origin", "1MiB", 1)
        hub, url = start_hub(work / "origin", None)
        serve = [
            *AGENT, "serve", "--cache-dir", str(work / "hub"), "--state-dir", str(work / "state"),
            "--origin", url, "--bt-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
        ]
        quiet = subprocess.DEVNULL
        agent = subprocess.Popen(serve, cwd=HERE, stdout=quiet, stderr=quiet, text=True)
        try:
            admin = work / "state" / "admin.sock"
            wait_for(admin, agent)
            fetch_all(HERE, admin, 1)  # the model into the agent's cache: every timed fetch finds it there
            times: dict[str, list[float]] = {name: [] for name in checkouts}
            for _ in range(args.runs):
                for name, path in checkouts.items():
                    times[name].append(fetch_all(path, admin, args.clients))
        finally:
            stop(agent)
            stop(hub)
    print(f"{args.clients} x `agent fetch --agent` at once, the model cached; seconds, {args.runs} runs")
    print("| CLI | median s | min s | max s |\n|---|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} | {min(ts):.2f} | {max(ts):.2f} |")
    if args.checkout is not None:
        (this, other) = (statistics.median(ts) for ts in times.values())
        print(f"this tree / {args.checkout}: {this / other:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
