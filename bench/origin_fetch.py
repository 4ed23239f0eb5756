"""One node from the origin: `agent fetch` vs huggingface_hub vs aria2c (vs curl uncapped).

What it does:
  1. writes a test model (default 2 GiB in 4 safetensors shards) with `agent make-test-model`;
  2. starts the test hub with `agent serve-hub` in a separate process (so it does not share
     this process's GIL), (a) capped per connection (default 40 MB/s, as a CDN does) and
     (b) uncapped on loopback, and (c) capped as (a) and allowing one stream per file and client address
     (`--streams-per-file 1`: a second concurrent range of a file gets a 403, as the Hub's download host
     was reported to answer in 2026);
  3. into a fresh cache each time, times:
     - `agent fetch` (subprocess, default settings: 8 connections per file, 4 files at once);
     - `huggingface_hub.snapshot_download` (subprocess, default settings: plain HTTP, 8 files at
       once, one connection each; hf_transfer is not installed and HF_HUB_ENABLE_HF_TRANSFER is
       cleared; HF_HUB_DISABLE_XET=1, since the test hub's Xet headers lead to no Xet CAS);
     - (a, b) `aria2c -x 16 -s 16`, all files from one input file (resolve URLs; aria2c follows the
       302 to the CDN URL), default -j 5 files at once;
     - (b only) `curl -s -L -o`, the files one after another (sequentially), one connection each;
  4. runs the tools interleaved (run 1 of each, then run 2 of each, ...) so a busy neighbour
     hurts all alike, and prints the median wall seconds per tool over --runs, every run's
     time, and the ratios agent/aria2c, agent/hf, agent/curl.

`--agent-checkout DIR` times `python -m agent` from another checkout (e.g. an older commit
unpacked with `git archive`) against the same origin: a before/after of the fetch engine.

Targets (issue 2): (a) agent <= aria2c and >= 3x faster than huggingface_hub; (b) within 1.2x of curl;
(issue 63) (c) agent no slower than huggingface_hub.

Usage:
  .venv/bin/python bench/origin_fetch.py                      # 2 GiB, both scenarios
  .venv/bin/python bench/origin_fetch.py --size 512MiB --runs 3
  .venv/bin/python bench/origin_fetch.py --size 256MiB --shards 8 --runs 1 --scenarios c
  .venv/bin/python bench/origin_fetch.py --workdir /tmp/wsb  # keep the generated model between runs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-m", "agent"]
REPO = "bench/model"


def start_hub(
    root: Path, rate_per_connection: str | None, streams: int = 0
) -> tuple[subprocess.Popen[str], str]:
    cmd = [*AGENT, "serve-hub", str(root), "--port", "0", "--streams-per-file", str(streams)]
    if rate_per_connection:
        cmd += ["--rate-per-connection", rate_per_connection]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=HERE)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"serve-hub did not start: {url!r}")
    # The hub hashes files behind its socket; the first listing waits for that, so warm it here.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            tree = f"{url}/api/models/{REPO}/tree/main?recursive=true"
            with urllib.request.urlopen(tree, timeout=600) as r:
                json.load(r)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("serve-hub never answered")


def make_model(origin: Path, size: str, shards: int) -> None:
    """The test model REPO under `origin` (`agent make-test-model`), unless it is there already."""
    if not (origin / REPO).exists():
        subprocess.run(
            [*AGENT, "make-test-model", str(origin), REPO, "--size", size, "--shards", str(shards)],
            check=True,
            cwd=HERE,
            stdout=subprocess.DEVNULL,
        )


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def files_of(url: str) -> list[tuple[str, int]]:
    with urllib.request.urlopen(f"{url}/api/models/{REPO}/tree/main?recursive=true") as r:
        return [(e["path"], e["size"]) for e in json.load(r) if e["type"] == "file"]


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = HERE) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=cwd)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({res.returncode}): {res.stderr[-2000:]}")
    return elapsed


AGENT_CWD = HERE
"""Checkout whose `agent` package `python -m agent fetch` runs (--agent-checkout)."""


def run_agent(work: Path, url: str) -> float:
    return timed(
        [
            *AGENT,
            "fetch",
            REPO,
            "--origin",
            url,
            "--cache-dir",
            str(work / "hub"),
            "--state-dir",
            str(work / "state"),
            "--quiet",
        ],
        cwd=AGENT_CWD,
    )


def run_hf(work: Path, url: str) -> float:
    env = dict(os.environ, HF_ENDPOINT=url, HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1")
    env["HF_HUB_DISABLE_XET"] = "1"
    env.pop("HF_HUB_ENABLE_HF_TRANSFER", None)
    code = (
        "import sys; from huggingface_hub import snapshot_download; "
        "snapshot_download(sys.argv[1], cache_dir=sys.argv[2])"
    )
    return timed([sys.executable, "-c", code, REPO, str(work / "hf")], env=env)


def run_aria2(work: Path, url: str, files: list[tuple[str, int]]) -> float:
    out = work / "aria2"
    out.mkdir(parents=True)
    listing = work / "aria2.txt"
    listing.write_text("".join(f"{url}/{REPO}/resolve/main/{p}\n  out={p}\n" for p, _ in files))
    return timed(
        [
            "aria2c",
            "-x",
            "16",
            "-s",
            "16",
            "-i",
            str(listing),
            "-d",
            str(out),
            "--console-log-level=warn",
            "--summary-interval=0",
            "--allow-overwrite=true",
            "--auto-file-renaming=false",
        ]
    )


def run_curl(work: Path, url: str, files: list[tuple[str, int]]) -> float:
    out = work / "curl"
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    for p, _ in files:
        dest = out / p
        dest.parent.mkdir(parents=True, exist_ok=True)
        src = f"{url}/{REPO}/resolve/main/{p}"
        subprocess.run(["curl", "-s", "-f", "-L", "-o", str(dest), src], check=True)
    return time.perf_counter() - t0


def once(fn, scratch: Path, *args: object) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall seconds, CPU seconds user+system of the tool's processes) of one run in a fresh dir."""
    work = Path(tempfile.mkdtemp(dir=scratch))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        wall = float(fn(work, *args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="2GiB", help="model tensor bytes (default 2GiB)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rate-per-connection", default="40MB", help="cap for scenario (a)")
    ap.add_argument("--runs", type=int, default=3, help="runs per tool; the median is reported")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--skip-hf", action="store_true", help="skip huggingface_hub (slow when capped)")
    ap.add_argument("--agent-checkout", type=Path, default=None, help="run `agent` from this checkout")
    ap.add_argument("--scenarios", default="abc", help="which of the scenarios a, b, c to run (default abc)")
    args = ap.parse_args()
    global AGENT_CWD
    if args.agent_checkout is not None:
        AGENT_CWD = args.agent_checkout.resolve()
    if shutil.which("aria2c") is None or shutil.which("curl") is None:
        raise SystemExit("needs aria2c and curl (Debian packages aria2, curl)")

    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="ws-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    origin = scratch / "origin"
    make_model(origin, args.size, args.shards)
    rows = []
    for label, cap, streams in (
        (f"(a) capped {args.rate_per_connection}/s per connection", args.rate_per_connection, 0),
        ("(b) uncapped loopback", None, 0),
        ("(c) as (a), one stream per file", args.rate_per_connection, 1),
    ):
        if label[1] not in args.scenarios:
            continue
        proc, url = start_hub(origin, cap, streams)
        try:
            files = files_of(url)
            total = sum(s for _, s in files)
            tools: dict[str, tuple[object, ...]] = {"agent": (run_agent, url)}
            if not streams:  # aria2c -x 16 is what such a host refuses
                tools["aria2c"] = (run_aria2, url, files)
            if not args.skip_hf:
                tools["hf"] = (run_hf, url)
            if cap is None:
                tools["curl"] = (run_curl, url, files)
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
            for _ in range(args.runs):
                for name, (fn, *fargs) in tools.items():
                    times[name].append(once(fn, scratch, *fargs))
            row: dict[str, object] = {"scenario": label, "bytes": total}
            for name, ts in times.items():
                row[name] = statistics.median(w for w, _ in ts)
                cpu = statistics.median(c for _, c in ts)
                # On a shared machine wall time follows the neighbours; CPU seconds are steadier.
                print(
                    f"{label}: {name} wall {' '.join(f'{w:.2f}' for w, _ in ts)} s; "
                    f"median CPU {cpu:.2f} s (user+sys)",
                    file=sys.stderr,
                )
            rows.append(row)
        finally:
            stop(proc)

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nmodel: {args.size} in {args.shards} shards; {os.cpu_count()} CPUs; "
        f"median of {args.runs} run(s); load average at the end {load}"
    )
    print(
        f"{'scenario':<42} {'agent s':>8} {'aria2c s':>9} {'hf s':>8} {'curl s':>8} "
        f"{'agent MB/s':>10} {'ag/aria2':>9} {'ag/hf':>7} {'ag/curl':>8}"
    )

    def cell(r: dict[str, object], k: str, width: int) -> str:
        return f"{float(r[k]):>{width}.2f}" if k in r else f"{'-':>{width}}"  # type: ignore[arg-type]

    def ratio(r: dict[str, object], k: str, width: int) -> str:
        ag = float(r["agent"])  # type: ignore[arg-type]
        return f"{ag / float(r[k]):>{width}.2f}" if k in r else f"{'-':>{width}}"  # type: ignore[arg-type]

    for r in rows:
        ag = float(r["agent"])  # type: ignore[arg-type]
        mbps = int(r["bytes"]) / ag / 1e6  # type: ignore[call-overload]
        print(
            f"{r['scenario']:<42} {cell(r, 'agent', 8)} {cell(r, 'aria2c', 9)} {cell(r, 'hf', 8)} "
            f"{cell(r, 'curl', 8)} {mbps:>10.0f} {ratio(r, 'aria2c', 9)} {ratio(r, 'hf', 7)} "
            f"{ratio(r, 'curl', 8)}"
        )
    print("ratios are agent time / other time: < 1 means agent is faster")
    if args.workdir is None:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
