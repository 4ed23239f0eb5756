"""A model in an S3 bucket: one node (`agent fetch s3://...` vs s5cmd), then N nodes cold through the swarm.

    sudo .venv/bin/python -m bench.bucket                 # 512 MiB / 8 shards, origin 10 MB/s, 8 nodes
    sudo .venv/bin/python -m bench.bucket --size 256MiB --nodes 4  # a quicker look

Needs root (network namespaces, tc, a tmpfs mount), iproute2, curl, moto[server,s3], boto3 and s5cmd
(all in the dev venv). Topology as bench/swarm.py's (bench/netns.py): one namespace per node, one for
the store and one for the tracker, around a bridge; node links shaped to --node-rate each way, the
store's upload to --origin-rate. The store is moto's standalone S3 server (`moto_server`, authentication
off: it serves any presigned URL) in the origin namespace; the model (`agent make-test-model`) is
uploaded to s3://models/<prefix>/ with boto3, path-style. Model, moto's spill files and every cache
live on a tmpfs mounted for the run.

Part 1, one node from the bucket, into a fresh directory each time:
  agent    `agent fetch s3://models/m --repo-id ... --agent off` (standalone: parallel 4 MiB ranges on
           presigned URLs, sha256 of every byte)
  s5cmd    `s5cmd --endpoint-url URL cp 's3://models/m/*' DIR/` (defaults: 50 MiB parts, 5 per file)
first inside the origin namespace to its own address (loopback, unshaped: what moto itself serves, on
this machine's two cores shared with the client), then from node n0 over the shaped links. Printed:
seconds, MB/s, ÷ the bound max(S/U_origin, S/D_node) (shaped only), the client's CPU-seconds (user +
system), moto's, and what the store's link carried ÷ S. moto answers a ranged GET by reading the whole
object and slicing it, so each of the agent's 4 MiB ranges costs it a whole object: here it served the
agent 11 MB/s from 128-MiB objects (4 shards), 24-72 MB/s from 64-MiB ones (8, the default) and
169 MB/s from 32-MiB ones (16). Keep --origin-rate well below the agent's unshaped MB/s (a warning says
when it is not), so the link, not moto, is the limit.

Part 2, N nodes cold: a tracker and one `agent serve --bucket s3://models/m` per node (bench.cold_source),
then `agent fetch s3://... --agent unix://...` on every node at once. One node takes the commit's index
lease and reads the store (agent.fetch.bucket); the others wait for its manifest and take the bytes
from peers. Printed: first, median and last completion ÷ bench.swarm's bound max(S/U_origin, S/D_node,
N·S/(U_origin + ΣU_node)), the store's egress ÷ S counted on its link (the veth's tx bytes less 66 B a
packet: independent of the agent) and as the agents' jobs report it (bytes_from_origin summed), CPU,
which nodes read the store, and how many leases the tracker handed over from a holder whose reported
bytes stood still (its tracker_lease_takeovers_total: a waiter that took the index lease reads too).
Results: tables on stdout, bench/out/bucket-<time>.json, every process's log in bench/out/bucket-<time>-logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from agent.hub.testmodel import parse_size
from bench.cold_source import ColdRound, payload_sent, run_cold, tree_bytes, write_model
from bench.netns import Cluster, Proc, cleanup_stale, have_netns_support
from bench.stack import BIN, ORIGIN_PORT, Model, Stack, wait_for
from bench.swarm import tmpfs

OUT = Path(__file__).resolve().parent / "out"
BUCKET = "models"
REPO = "bench/bucket-model"
KEY = "bench"
"""Access key id and secret: moto runs without authentication, so any will do (none is a secret)."""

_UPLOAD = r"""
import sys
from pathlib import Path
import boto3
from botocore.config import Config
endpoint, root, bucket, prefix, key = sys.argv[1:6]
config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}, read_timeout=120)
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=key,
                  region_name="us-east-1", config=config)
s3.create_bucket(Bucket=bucket)
n = 0
for f in sorted(Path(root).rglob("*")):
    if f.is_file():
        s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(root).as_posix()}")
        n += 1
listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
print(n, len(listed.get("Contents", [])), sum(o["Size"] for o in listed.get("Contents", [])))
"""


@dataclass
class OneRun:
    """One client's fetch of the whole model on one node."""

    link: str
    client: str
    seconds: float
    cpu: float
    """The client's CPU-seconds, user + system (its rusage once reaped)."""
    moto_cpu: float
    wire: float
    """Payload bytes the store's link sent ÷ S (nan on loopback: no link counts it)."""
    error: str = ""


TARGET_BOUND, TARGET_EGRESS = 1.2, 1.05
"""Issue 66's targets for the cold round: the last node within 1.2 x the bound, 1.05 x S from the store."""


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


class BucketBench:
    def __init__(self, args: argparse.Namespace, stack: Stack, fs: Path, model: Model) -> None:
        self.a = args
        self.s = stack
        self.c = stack.c
        self.fs = fs
        self.model = model
        self.moto: Proc | None = None
        self.runs: list[OneRun] = []
        self.cold_round: ColdRound | None = None
        self.notes: list[str] = []

    # -- the store -------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The store: it listens where the stack's origin would."""
        return self.s.origin_url

    @property
    def url(self) -> str:
        return f"s3://{BUCKET}/{self.a.prefix}"

    def aws_env(self) -> dict[str, str]:
        """What obstore (the agent) and s5cmd read: this store, these keys, plain HTTP."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def start_store(self, model_dir: Path) -> None:
        spill = self.fs / "moto-tmp"  # moto keeps objects over 5 MiB in temporary files: on the tmpfs
        spill.mkdir()
        env = {**self.s.env, "TMPDIR": str(spill)}
        argv = [str(BIN / "moto_server"), "-H", self.c.ip("origin"), "-p", str(ORIGIN_PORT)]
        self.moto = self.c.spawn("origin", argv, env, self.s.log("moto"))
        wait_for(
            lambda: self.moto is not None
            and self.moto.poll() is None
            and self.s.curl("origin", self.endpoint + "/", 2) is not None,
            60,
            "moto_server",
        )
        t0 = time.monotonic()
        up = [sys.executable, "-c", _UPLOAD, self.endpoint, str(model_dir), BUCKET, self.a.prefix, KEY]
        res = self.c.run("origin", up, timeout=600)
        counts = res.stdout.split()
        if res.returncode != 0 or len(counts) != 3 or int(counts[2]) != self.model.size:
            raise RuntimeError(f"upload to moto failed: {res.stdout[-300:]} {res.stderr[-600:]}")
        took = time.monotonic() - t0
        print(f"uploaded {counts[1]} objects, {int(counts[2]) / 2**20:.0f} MiB in {took:.1f}s", flush=True)

    def moto_cpu(self) -> float:
        try:
            t = psutil.Process(self.moto.pid).cpu_times() if self.moto else None
        except psutil.Error:
            return float("nan")
        return t.user + t.system if t else float("nan")

    # -- part 1: one node ------------------------------------------------------------------
    def one(self, member: str, client: str, link: str) -> OneRun:
        dest = self.fs / "one" / f"{client}-{len(self.runs)}"
        dest.mkdir(parents=True)
        if client == "agent":
            argv = [
                str(BIN / "agent"), "fetch", self.url, "--repo-id", REPO, "--agent", "off",
                "--cache-dir", str(dest / "cache"), "--state-dir", str(dest / "state"), "--quiet",
            ]
        else:
            argv = [str(BIN / "s5cmd"), "--endpoint-url", self.endpoint, "cp", f"{self.url}/*"]
            argv.append(f"{dest}/files/")
        shaped = member != "origin"
        sent0 = payload_sent(self.c) if shaped else 0
        moto0 = self.moto_cpu()
        # Nothing else is reaped between the two readings: the children's rusage is this client's alone.
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = self.c.spawn(member, argv, self.s.env, self.s.log(f"one-{len(self.runs)}-{client}-{member}"))
        error = ""
        try:
            rc = proc.wait(timeout=self.a.timeout)
            if rc != 0:
                error = f"exit {rc}: {proc.output().strip()[-300:]}"
        except subprocess.TimeoutExpired:
            error = f"not complete after {self.a.timeout:.0f}s"
        seconds = time.monotonic() - t0
        self.c.stop(proc)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        wire = (payload_sent(self.c) - sent0) / self.model.size if shaped else float("nan")
        got = tree_bytes(dest / ("cache" if client == "agent" else "files"))
        if not error and got < self.model.size:
            error = f"only {got} of {self.model.size} bytes arrived"
        run = OneRun(link, client, seconds, cpu, self.moto_cpu() - moto0, wire, error)
        shutil.rmtree(dest, ignore_errors=True)
        self.runs.append(run)
        print(
            f"  {link:<16}{client:<7}{seconds:7.1f}s  client {cpu:5.1f} CPU-s  moto {run.moto_cpu:5.1f} CPU-s"
            f"  {error or 'ok'}",
            flush=True,
        )
        return run

    def single(self) -> None:
        print("part 1: one node from the bucket", flush=True)
        for client in ("agent", "s5cmd"):
            self.one("origin", client, "unshaped (lo)")
        agent_lo = self.runs[0]
        rate = self.model.size / agent_lo.seconds
        if not agent_lo.error and self.a.origin_rate > 0.8 * rate:
            self.notes.append(
                f"warning: moto served the agent {rate / 1e6:.1f} MB/s unshaped; the origin link's "
                f"{self.a.origin_rate / 1e6:.0f} MB/s may not be the limit: lower --origin-rate"
            )
        for _ in range(self.a.rounds):
            for client in ("agent", "s5cmd"):
                self.one("n0", client, f"origin {self.a.origin_rate / 1e6:g} MB/s")

    # -- part 2: N nodes cold --------------------------------------------------------------
    def cold(self) -> None:
        print(f"part 2: {len(self.c.nodes)} nodes cold from the bucket", flush=True)

        def argv(node: str) -> list[str]:
            admin = self.s.node_dir(node) / "state" / "admin.sock"
            return [str(BIN / "agent"), "fetch", self.url, "--repo-id", REPO, "--agent", f"unix://{admin}"]

        self.cold_round = run_cold(self.a, self.s, self.model, "weightswarm", argv, self.moto_cpu,
                                   ["--bucket", self.url])

    # -- output ----------------------------------------------------------------------------
    def _print_single(self, bound1: float) -> None:
        a, size = self.a, self.model.size
        shards = sum(1 for f in self.model.files if f.path.endswith(".safetensors"))
        print()
        print(
            f"one node from the bucket: S={size / 2**20:.0f} MiB ({shards} shards + "
            f"{len(self.model.files) - shards} small files), moto_server {_version('moto')}, "
            f"{os.cpu_count()} CPUs; shaped: origin {a.origin_rate / 1e6:g} MB/s, "
            f"node {a.node_rate / 1e6:g} MB/s (TCP goodput ~0.96 of the rate)"
        )
        head = (
            f"{'link':<17}{'client':<8}{'seconds':>8}{'MB/s':>7}{'÷ bound':>8}{'client CPU-s':>13}"
            f"{'moto CPU-s':>11}{'link ÷ S':>9}  notes"
        )
        print(head)
        print("-" * len(head))
        for r in self.runs:
            shaped = r.link != "unshaped (lo)"
            ratio = f"{r.seconds / bound1:.2f}" if shaped else "-"
            wire = f"{r.wire:.3f}" if shaped else "-"
            print(
                f"{r.link:<17}{r.client:<8}{r.seconds:>8.1f}{size / r.seconds / 1e6:>7.1f}{ratio:>8}"
                f"{r.cpu:>13.1f}{r.moto_cpu:>11.1f}{wire:>9}  {r.error[:80]}"
            )
        print(f"{'bound':<17}{'S/U':<8}{bound1:>8.1f}{size / bound1 / 1e6:>7.1f}{1:>8.2f}")
        shaped = {r.client: r.seconds for r in self.runs if r.link != "unshaped (lo)" and not r.error}
        if "agent" in shaped and "s5cmd" in shaped:
            print(f"target (issue 66): agent no slower than s5cmd on the shaped link: "
                  f"{shaped['agent'] / shaped['s5cmd']:.2f} x, {_met(shaped['agent'] <= shaped['s5cmd'])}")
        for r in self.runs:
            if r.link == "unshaped (lo)" and not r.error:
                rate = size / r.seconds / 1e6
                print(f"moto unshaped, {r.client}: {rate:.1f} MB/s with {r.moto_cpu:.1f} CPU-s")

    def print_tables(self) -> None:
        bound1 = max(self.model.size / self.a.origin_rate, self.model.size / self.a.node_rate)
        if self.runs:
            self._print_single(bound1)
        cold = self.cold_round
        if cold is not None:
            row = cold.row
            times = sorted(row.times.values())
            first = times[0] if times else float("nan")
            reported = sum(cold.reported.values())
            readers = ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in sorted(cold.reported.items()) if b)
            print()
            print(
                f"{row.receivers} nodes cold from the bucket: bound max(S/U_origin, S/D_node, "
                f"N·S/(U_origin+ΣU_node)) = {row.bound:.1f} s"
            )
            head = (
                f"{'first s':>8}{'median s':>9}{'max s':>8}{'bound s':>8}{'first/bnd':>10}{'max/bnd':>8}"
                f"{'store egress/S':>15}{'jobs origin/S':>14}{'failed':>7}{'CPU':>5}{'steal':>6}"
                f"{'agents CPU-s':>13}{'moto CPU-s':>11}{'anon':>9}"
            )
            print(head)
            print("-" * len(head))
            anon = f"{row.peak_anon / 2**20:.0f} MiB" if row.peak_anon else "-"
            print(
                f"{first:>8.1f}{row.median:>9.1f}{row.worst:>8.1f}{row.bound:>8.1f}{first / row.bound:>10.2f}"
                f"{row.worst / row.bound:>8.2f}{row.egress / row.size:>15.3f}{reported / row.size:>14.3f}"
                f"{len(row.failures):>7}{row.cpu_busy * 100:>4.0f}%{row.cpu_steal * 100:>5.0f}%"
                f"{cold.agents_cpu:>13.1f}{cold.source_cpu:>11.1f}{anon:>9}"
            )
            print(f"target (issue 66): max/bnd <= {TARGET_BOUND:.2f}, store egress/S <= {TARGET_EGRESS:.2f}: "
                  f"{_met(row.worst / row.bound <= TARGET_BOUND and row.egress / row.size <= TARGET_EGRESS)}")
            print(f"nodes that read the store (their jobs' bytes_from_origin): {readers or 'none reported'}")
            print(f"leases the tracker handed over from a holder whose bytes stood still: {cold.takeovers}")
            for node, why in sorted(row.failures.items()):
                print(f"  {node} FAILED: {why}")
        for note in self.notes:
            print(note)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.bucket",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size", default="512MiB", help="model size (e.g. 512MiB, 1GiB)")
    p.add_argument("--shards", type=int, default=8, help="safetensors shards (see moto's cost above)")
    p.add_argument("--node-rate", type=float, default=120e6, help="bytes/s each way per node link")
    p.add_argument("--origin-rate", type=float, default=10e6, help="the store's upload, bytes/s")
    p.add_argument("--rounds", type=int, default=1, help="shaped runs of each client in part 1 (0: none)")
    p.add_argument("--parts", default="single,cold", help="single (part 1), cold (part 2), or both")
    p.add_argument("--prefix", default="m", help="the model's prefix in the bucket")
    p.add_argument("--timeout", type=float, default=600, help="seconds per fetch before it counts as failed")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--agent-log-level", default="WARNING", help="log level of every agent")
    p.add_argument(
        "--cleanup-stale", action="store_true", help="first delete namespaces of crashed runs (ws-*)"
    )
    args = p.parse_args(argv)
    # bench.swarm.Bench reads these.
    args.origin_rate_per_connection = args.origin_rate_per_client = None
    parts = {x for x in args.parts.split(",") if x}
    if parts - {"single", "cold"} or not parts:
        p.error(f"--parts: single, cold or both, not {args.parts!r}")
    reason = have_netns_support()
    if reason:
        print(f"error: the bucket benchmark {reason}", file=sys.stderr)
        return 2
    for tool in ("curl", str(BIN / "moto_server"), str(BIN / "s5cmd")):
        if shutil.which(tool) is None:
            print(f"error: the bucket benchmark needs `{tool}` (./dev installs it)", file=sys.stderr)
            return 2
    if args.cleanup_stale:
        cleanup_stale("ws-")
    size = parse_size(args.size)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="ws-bucket-") as tmp:
        # The model, moto's copy (and its multipart parts), part 1's one copy, every node's cache.
        room = size * (args.nodes + 5) + 512 * 2**20
        with tmpfs(Path(tmp) / "fs", room) as fs:
            model = write_model(fs / "hub", REPO, args.size, args.shards)
            with Cluster(nodes=args.nodes, node_rate=args.node_rate, origin_rate=args.origin_rate) as c:
                logdir = args.out / f"bucket-{stamp}-logs"
                stack = Stack(c, fs, fs / "hub", logdir)
                bb = BucketBench(args, stack, fs, model)
                stack.env = {k: v for k, v in stack.env.items() if not k.startswith("AWS_")} | bb.aws_env()
                stack.env["WEIGHTSWARM_LOG_LEVEL"] = args.agent_log_level
                print(
                    f"logs: {logdir}\nmodel {REPO}: {len(model.files)} files, {model.size / 2**20:.0f} MiB; "
                    f"cluster {c.prefix}: {args.nodes} nodes",
                    flush=True,
                )
                bb.start_store(fs / "hub" / REPO)
                if "single" in parts:
                    bb.single()
                if "cold" in parts:
                    bb.cold()
                bb.print_tables()
                (args.out / f"bucket-{stamp}.json").write_text(
                    json.dumps(
                        {
                            "args": {k: v for k, v in vars(args).items() if k != "out"},
                            "single": [asdict(r) for r in bb.runs],
                            "cold": asdict(bb.cold_round) if bb.cold_round else None,
                        },
                        indent=1,
                        default=str,
                    )
                )
                print(f"saved {args.out / f'bucket-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
