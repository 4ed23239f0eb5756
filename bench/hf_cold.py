"""huggingface_hub through the agent's HF endpoint on a cold model, at the client's default timeouts.

huggingface_hub reads each response with a 10 s read timeout (HF_HUB_DOWNLOAD_TIMEOUT). The agent's
HF-compatible endpoint (`agent serve --api-listen`) fetches a cold file from the origin hub and
streams its bytes to the client while they arrive, so a file that takes far longer than 10 s from
a slow origin must still arrive in one piece, without the client timing out and resuming. This
measures that on two runs that used to fail or flake, each against a hub with a total cap:
  A  512 MiB model in 2 safetensors shards, origin capped at 20 MB/s in total (~27 s);
  B  256 MiB model in 1 shard, origin capped at 3 MiB/s in total (~85 s).
Target: through the agent, no retry/timeout message on the client's stderr, and
seconds <= 1.1 x (model bytes / origin rate).

What it does, per run:
  1. writes the test model with `agent make-test-model`;
  2. starts `agent serve-hub --rate-total RATE` in a separate process (start_hub of
     bench/origin_fetch.py, which also waits until the hub has hashed the files);
  3. runs `huggingface_hub.snapshot_download` in a fresh subprocess straight against the hub
     (HF_ENDPOINT=<hub>): the baseline;
  4. then starts a standalone agent (`agent serve`, no tracker) with an empty cache and state
     directory, waits for /readyz, and runs the same client with HF_ENDPOINT=<agent's API
     address>; the two clients run one after the other, never together, as the cap is shared.
The client runs with every HF_* / HUGGINGFACE_* variable of this environment removed (so no
HF_HUB_DOWNLOAD_TIMEOUT or HF_HUB_ETAG_TIMEOUT), plus HF_ENDPOINT, HF_HOME (a scratch dir),
HF_HUB_DISABLE_TELEMETRY and HF_HUB_DISABLE_PROGRESS_BARS (so stderr holds only its log lines).

Columns:
  run          A or B (above);
  client path  `direct origin` (HF_ENDPOINT = the hub) or `through agent` (HF_ENDPOINT = the agent);
  MiB          bytes of all the model's files (shards, index, config), in MiB;
  origin rate  the hub's total cap;
  seconds      wall time of the snapshot_download call, timed inside the client process
               (its Python start and import are left out; the JSON has the process's wall too);
  s/ideal      seconds / (bytes / rate): 1.0 is the cap's pace, the target is <= 1.1;
  retries      lines of the client's stderr that contain "Trying to resume download",
               "timed out", "Error while downloading", "Retrying in" or "thrown while requesting"
               (huggingface_hub's retry and timeout warnings); they are printed below the table;
  verified     yes when the client exited 0 and every file of the snapshot matches the model
               directory byte for byte (sha256).
The rows also go to bench/out/hf_cold-<timestamp>.json, with the matching stderr lines, the
client process's wall seconds and, through the agent, the bytes the agent fetched from the origin
(its /metrics; a line below the table says when they differ from the model's bytes). With
--workdir, each client's stderr and the agent's log stay in <workdir>/run-<run>/attempt-*/.

Usage:
  .venv/bin/python -m bench.hf_cold                      # both runs, ~4-5 min
  .venv/bin/python -m bench.hf_cold --runs B
  .venv/bin/python -m bench.hf_cold --workdir /tmp/wsc   # keep models and logs afterwards
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.hub.testmodel import parse_size
from bench.origin_fetch import AGENT, HERE, REPO, files_of, make_model, start_hub, stop

OUT = HERE / "bench" / "out"
RETRY_MARKERS = (
    "Trying to resume download",
    "timed out",
    "Error while downloading",
    "Retrying in",
    "thrown while requesting",
)
CLIENT = """\
import json, sys, time
from huggingface_hub import snapshot_download
t0 = time.perf_counter()
path = snapshot_download(sys.argv[1], cache_dir=sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t0, "path": path}))
"""


@dataclass(frozen=True)
class Run:
    name: str
    size: str
    shards: int
    rate: str


RUNS = {
    "A": Run("A", size="512MiB", shards=2, rate="20MB"),
    "B": Run("B", size="256MiB", shards=1, rate="3MiB"),
}


@dataclass
class Row:
    run: str
    path: str
    bytes: int
    rate: str
    ideal_s: float
    seconds: float | None
    process_s: float
    returncode: int
    retry_lines: list[str]
    verified: bool
    origin_bytes: int | None = None  # through agent: what the agent fetched from the origin

    @property
    def ratio(self) -> float | None:
        return None if self.seconds is None else self.seconds / self.ideal_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_capped_hub(root: Path, rate_total: str) -> tuple[subprocess.Popen[str], str]:
    """start_hub with a total cap: serve-hub reads --rate-total from WEIGHTSWARM_RATE_TOTAL."""
    os.environ["WEIGHTSWARM_RATE_TOTAL"] = rate_total
    try:
        return start_hub(root, None)
    finally:
        del os.environ["WEIGHTSWARM_RATE_TOTAL"]


def start_agent(work: Path, origin_url: str) -> tuple[subprocess.Popen[str], str]:
    """A standalone `agent serve` with an empty cache; returns it and its API URL once /readyz is 200."""
    port = free_port()
    log = (work / "agent.log").open("w")
    cmd = [
        *AGENT,
        "serve",
        "--cache-dir",
        str(work / "hub"),
        "--state-dir",
        str(work / "state"),
        "--origin",
        origin_url,
        "--api-listen",
        f"127.0.0.1:{port}",
        "--bt-listen",
        "127.0.0.1:0",
        "--node-name",
        "bench",
        "--kube",
        "off",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=HERE)
    log.close()  # the child holds its own copy
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.2)
    stop(proc)
    tail = (work / "agent.log").read_text()[-2000:]
    raise SystemExit(f"agent serve not ready after 60 s (exit {proc.returncode}):\n{tail}")


def origin_bytes(agent_url: str) -> int | None:
    """Bytes the agent fetched from the origin, from its /metrics (None if it does not say)."""
    try:
        with urllib.request.urlopen(f"{agent_url}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith('weightswarm_agent_fetched_bytes_total{source="origin"}'):
            return int(float(line.split()[-1]))
    return None


def client_env(endpoint: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(home),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    return env


def sha256_tree(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under root (following the snapshot's symlinks)."""
    digests = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digests[path.relative_to(root).as_posix()] = h.hexdigest()
    return digests


def run_client(run: Run, path: str, endpoint: str, work: Path, total: int, expected: dict[str, str]) -> Row:
    """One snapshot_download into a fresh cache under work, timed, checked, its stderr scanned."""
    work.mkdir(parents=True)
    ideal = total / parse_size(run.rate)
    cmd = [sys.executable, "-c", CLIENT, REPO, str(work / "hf-cache")]
    t0 = time.perf_counter()
    try:
        res = subprocess.run(
            cmd,
            env=client_env(endpoint, work / "hf-home"),
            capture_output=True,
            text=True,
            timeout=5 * ideal + 120,
        )
        returncode, stdout, stderr = res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed it
        returncode = -9
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        stderr += f"\n[hf_cold] client killed after {5 * ideal + 120:.0f} s"
    process_s = time.perf_counter() - t0
    (work / "client.stderr").write_text(stderr)

    seconds, verified = None, False
    if returncode == 0:
        result = json.loads(stdout.strip().splitlines()[-1])
        seconds = float(result["seconds"])
        verified = sha256_tree(Path(result["path"])) == expected
    else:
        print(f"[hf_cold] {run.name} {path}: client exited {returncode}:\n{stderr[-2000:]}", file=sys.stderr)
    retry_lines = [line for line in stderr.splitlines() if any(m in line for m in RETRY_MARKERS)]
    return Row(run.name, path, total, run.rate, ideal, seconds, process_s, returncode, retry_lines, verified)


def do_run(run: Run, scratch: Path) -> list[Row]:
    base = scratch / f"run-{run.name}"
    origin = base / "origin"
    make_model(origin, run.size, run.shards)
    expected = sha256_tree(origin / REPO)
    rows = []
    hub, hub_url = start_capped_hub(origin, run.rate)
    try:
        total = sum(size for _, size in files_of(hub_url))
        attempt = tempfile.mkdtemp(prefix="attempt-", dir=base)  # fresh caches on every invocation
        rows.append(run_client(run, "direct origin", hub_url, Path(attempt) / "direct", total, expected))
        agent_work = Path(attempt) / "agent"
        agent_work.mkdir()
        agent, agent_url = start_agent(agent_work, hub_url)
        try:
            row = run_client(run, "through agent", agent_url, agent_work / "client", total, expected)
            row.origin_bytes = origin_bytes(agent_url)
            rows.append(row)
        finally:
            stop(agent)
    finally:
        stop(hub)
    return rows


def print_table(rows: list[Row]) -> None:
    print(
        f"{'run':<4} {'client path':<14} {'MiB':>6} {'origin rate':>11} {'seconds':>8} "
        f"{'s/ideal':>8} {'retries':>8} {'verified':>9}"
    )
    for r in rows:
        seconds = "failed" if r.seconds is None else f"{r.seconds:.1f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        print(
            f"{r.run:<4} {r.path:<14} {r.bytes / 2**20:>6.1f} {r.rate + '/s':>11} {seconds:>8} "
            f"{ratio:>8} {len(r.retry_lines):>8} {'yes' if r.verified else 'no':>9}"
        )
    for r in rows:
        for line in r.retry_lines:
            print(f"  {r.run} {r.path}: {line}")
        if r.origin_bytes is not None and r.origin_bytes != r.bytes:
            print(
                f"  {r.run} {r.path}: the agent fetched {r.origin_bytes} bytes from the origin, not {r.bytes}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs (default A,B)")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    names = [n.strip().upper() for n in args.runs.split(",") if n.strip()]
    if unknown := [n for n in names if n not in RUNS]:
        raise SystemExit(f"unknown run(s) {unknown}; known: {', '.join(RUNS)}")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="ws-hfcold-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        rows = [row for name in names for row in do_run(RUNS[name], scratch)]
    finally:
        if args.workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    print()
    print_table(rows)
    out = OUT / f"hf_cold-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "started": stamp,
                "cpus": os.cpu_count(),
                "loadavg": os.getloadavg(),
                "rows": [{**asdict(r), "ratio": r.ratio} for r in rows],
            },
            indent=2,
        )
    )
    print(f"\nJSON: {out.relative_to(HERE)}")


if __name__ == "__main__":
    main()
