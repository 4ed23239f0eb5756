"""Origin calls of a cluster's cold start, against the Hub's rate limits (counted, not timed).

    .venv/bin/python -m bench.origin_calls                        # N = 1, 8, 32
    .venv/bin/python -m bench.origin_calls --nodes 1,4 --variants current,no-blobs,hub-2024
    git archive 1699fa5 agent | tar -x -C /tmp/before           # the client before one-call planning
    .venv/bin/python -m bench.origin_calls --checkout /tmp/before # its agents too, same hub

The Hub limits each client per 5-minute fixed window (LIMITS below, with its source): an "api" budget
(`/api/...`) and a "resolvers" one (`/resolve/` and `/api/resolve-cache/`), per IP address without a
token, per user with one. A cluster that shares one token shares one budget; nodes behind one NAT address
share one. The CDN's signed LFS URLs are not counted.

What it does, per N: the test hub (agent.hub.server, its default behaviour: the Hub of 2026) in this
process, a fresh `tracker serve` and N `agent serve` on loopback (bench.launchers' TrackerProcess and
AgentProcess: stopped by PID at the end, whatever happens), empty caches; every agent is asked for the model
at once (`POST /v1/fetch`) and followed to its end (bounded); each snapshot is checked byte for byte. The
hub's request log gives the counts per bucket and its egress counter the body bytes (÷ S, the model's size).

Then, for 1,000 nodes, per tier: the cluster's api calls and resolves extrapolated linearly from the
measured N = 1 and largest N (per node and per cluster, from the run), and whether a cold start of one
model fits in one window; where not, how many windows it spans (the last nodes wait for the resets). With
distinct node addresses, anonymous, one address carries at most one node's api calls and at most the
cluster's resolves (all agents here are on 127.0.0.1, so the log cannot split them finer: an upper bound).

Variants (`--variants`, each a run per N): `current` (this tree, the hub as in 2026); `no-blobs` (a hub
whose revision answer lists no file metadata, `siblings` left out by agent.hub.faults: each node lists the
tree too, the API calls of a client that plans with two); `hub-2024` (`HubServer(answers="2024")`: small
files answered at their resolve URL, no resolve-cache hop); `checkout, hub-2024` (with `--checkout DIR`:
the agents of another checkout, e.g. the commit before one-call planning, against the 2024 hub, as that
client did not follow a small file's 307: compare with `hub-2024`).
"""

from __future__ import annotations

import argparse
import collections
import compileall
import concurrent.futures
import dataclasses
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from bench.launchers import AgentProcess, Origin, TrackerProcess, admin_request, assert_snapshot_verifies
from bench.stack import clean_env, compile_bytecode

REPO = "bench/calls"
MiB = 2**20
WINDOW_S = 300
LIMITS_SOURCE = "https://huggingface.co/docs/hub/rate-limits (table 'in September 25', read 2026)"


@dataclasses.dataclass(frozen=True)
class Tier:
    name: str
    api: int
    resolvers: int
    shared: bool
    """One budget for the whole cluster (a token, a NAT address), or one per node address."""


LIMITS = (
    Tier("anonymous, one IP per node", 500, 3_000, shared=False),
    Tier("anonymous, behind one NAT IP", 500, 3_000, shared=True),
    Tier("free user, one token", 1_000, 5_000, shared=True),
    Tier("PRO user, one token", 2_500, 12_000, shared=True),
    Tier("Team org member, one token", 3_000, 20_000, shared=True),
    Tier("Enterprise org member, one token", 6_000, 50_000, shared=True),
    Tier("Enterprise Plus org member, one token", 10_000, 100_000, shared=True),
)
"""Requests per 5-minute window (LIMITS_SOURCE). An organization's limits apply to each member, not to the
organization: a cluster's one token is one member's budget."""


# -- counting --------------------------------------------------------------------------------------


def bucket_of(record: Any) -> str:
    """The rate-limit bucket of a hub `RequestRecord` (the hub sets it: agent.hub.records `bucket_for`)."""
    return str(record.bucket)


def bucket_counts(records: Iterable[Any]) -> dict[str, int]:
    """Requests per bucket ("api", "resolvers", "cdn" always present)."""
    counts = collections.Counter({"api": 0, "resolvers": 0, "cdn": 0})
    counts.update(bucket_of(r) for r in records)
    return dict(counts)


def describe(records: Iterable[Any], limit: int = 40) -> str:
    """The requests grouped by (bucket, method, path, status), for an assertion message."""
    groups = collections.Counter((bucket_of(r), r.method, r.path, r.status) for r in records)
    lines = [f"  {n:3d} x {b:9s} {m:4s} {p} -> {s}" for (b, m, p, s), n in sorted(groups.items())]
    more = [f"  ... {len(lines) - limit} more"] if len(lines) > limit else []
    return "\n".join(lines[:limit] + more)


# -- one run ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    answers: str = "2026"
    omit_siblings: bool = False
    checkout: Path | None = None

    def agent_argv(self) -> list[str] | None:
        """The start of `agent ...` for this variant's agents (None: this tree's console script)."""
        if self.checkout is None:
            return None
        code = (
            f"import runpy, sys; sys.path.insert(0, {str(self.checkout)!r}); "
            "runpy.run_module('agent', run_name='__main__')"
        )
        return [sys.executable, "-c", code]


VARIANTS = {
    "current": Variant("current"),
    "no-blobs": Variant("no-blobs", omit_siblings=True),
    "hub-2024": Variant("hub-2024", answers="2024"),
}


@dataclasses.dataclass
class Run:
    nodes: int
    variant: str
    counts: dict[str, int]
    egress: int
    size: int
    seconds: float

    def per_node(self, bucket: str) -> float:
        return self.counts[bucket] / self.nodes


def _follow(agent: Any, job: dict[str, Any], deadline: float) -> dict[str, Any]:
    status = job
    while status["phase"] not in ("Ready", "Failed"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{agent.cache_dir.parent.name}: not done in time: {status.get('phase')}")
        wait = max(1, min(5, int(left)))
        path = f"/v1/jobs/{status['job_id']}"
        status = admin_request(agent.url, "GET", path, params={"wait": wait}, timeout=wait + 10).json()
    return status


def run_cluster(root: Path, work: Path, nodes: int, variant: Variant, timeout: float) -> Run:
    base = root / REPO
    files = {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
    size = sum(map(len, files.values()))
    with ExitStack() as stack:
        hub = stack.enter_context(HubServer(root, answers=variant.answers))  # type: ignore[arg-type]
        hub.warm()
        if variant.omit_siblings:
            hub.faults.model_info_omit.add("siblings")
        origin = Origin(hub, REPO, size, files)
        work.mkdir(parents=True)
        tracker = TrackerProcess(work)
        stack.callback(tracker.stop)
        tracker.start()
        agents = [AgentProcess(work, f"n{i:02d}", hub.url, tracker) for i in range(nodes)]
        start = variant.agent_argv()
        for agent in agents:
            stack.callback(agent.stop)
            if start is not None:
                agent.argv[:1] = start
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, nodes)) as pool:
            list(pool.map(lambda a: a.start(), agents))
        hub.reset_counters()  # whatever the agents did before the fetch would count too: none is expected
        started = time.monotonic()
        deadline = started + timeout
        with concurrent.futures.ThreadPoolExecutor(max_workers=nodes) as pool:
            body = {"repo_id": REPO}
            jobs = list(
                pool.map(lambda a: admin_request(a.url, "POST", "/v1/fetch", json=body).json(), agents)
            )
            done = list(pool.map(lambda aj: _follow(aj[0], aj[1], deadline), zip(agents, jobs, strict=True)))
        seconds = time.monotonic() - started
        failed = [st for st in done if st["phase"] != "Ready"]
        if failed:
            raise RuntimeError(f"{len(failed)} of {nodes} fetches failed: {failed[0].get('error')}")
        for st in done:
            assert_snapshot_verifies(st["snapshot"], origin)
        return Run(nodes, variant.name, bucket_counts(hub.requests), hub.egress_bytes, size, seconds)


# -- the arithmetic --------------------------------------------------------------------------------


def extrapolate(runs: Sequence[Run], bucket: str, nodes: int) -> float:
    """The cluster's requests in `bucket` at `nodes`, on the line through the smallest and largest N run
    (one run: proportional)."""
    lo, hi = min(runs, key=lambda r: r.nodes), max(runs, key=lambda r: r.nodes)
    if hi.nodes == lo.nodes:
        return hi.counts[bucket] / hi.nodes * nodes
    slope = (hi.counts[bucket] - lo.counts[bucket]) / (hi.nodes - lo.nodes)
    return lo.counts[bucket] + slope * (nodes - lo.nodes)


def verdict(load: float, quota: int) -> str:
    if load <= quota:
        return f"fits ({load:,.0f} of {quota:,})"
    windows = math.ceil(load / quota)
    wait = (windows - 1) * WINDOW_S / 60
    return f"{windows} windows ({load:,.0f} / {quota:,}): the last nodes wait up to {wait:.0f} min"


def report(runs: Sequence[Run], fleet: int) -> str:
    out = []
    head = "| client | N | api | api/node | resolvers | resolvers/node | cdn | origin bytes ÷ S | s |"
    out += [head, "|---|---|---|---|---|---|---|---|---|"]
    names = list(dict.fromkeys(r.variant for r in runs))
    for r in sorted(runs, key=lambda r: (names.index(r.variant), r.nodes)):
        c = r.counts
        out.append(
            f"| {r.variant} | {r.nodes} | {c['api']} | {r.per_node('api'):.2f}"
            f" | {c['resolvers']} | {r.per_node('resolvers'):.2f} | {c['cdn']} | {r.egress / r.size:.3f}"
            f" | {r.seconds:.1f} |"
        )
    for name in names:
        chosen = [r for r in runs if r.variant == name]
        if not chosen:
            continue
        api, res = extrapolate(chosen, "api", fleet), extrapolate(chosen, "resolvers", fleet)
        biggest = max(chosen, key=lambda r: r.nodes)
        per_node_api = biggest.per_node("api")
        out += [
            "",
            f"{fleet:,} nodes, one model, cold, {name}: "
            f"{api:,.0f} api calls ({per_node_api:.2f} a node), {res:,.0f} resolves for the cluster "
            f"(line through N = {min(r.nodes for r in chosen)} and {biggest.nodes}); limits per "
            f"{WINDOW_S // 60}-minute window from {LIMITS_SOURCE}",
            "| tier | api | resolvers |",
            "|---|---|---|",
        ]
        for tier in LIMITS:
            # One address per node: it carries its own api calls and at most all the cluster's resolves.
            tier_api, tier_res = (api, res) if tier.shared else (per_node_api, res)
            out.append(
                f"| {tier.name} | {verdict(tier_api, tier.api)} | {verdict(tier_res, tier.resolvers)} |"
            )
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------------


@contextmanager
def _terminated_cleanly() -> Iterator[None]:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so every process started is stopped by the `finally`s."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,8,32", help="cluster sizes, comma-separated (default 1,8,32)")
    ap.add_argument("--shards", type=int, default=4, help="LFS shards of the model (default 4)")
    ap.add_argument("--shard-mib", type=int, default=8, help="MiB of each shard (default 8)")
    ap.add_argument("--fleet", type=int, default=1000, help="nodes for the arithmetic (default 1000)")
    ap.add_argument("--variants", default="current", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--checkout", type=Path, default=None, help="also run the agents of this checkout")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one cluster's fetch may take")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the model and logs here")
    args = ap.parse_args(argv)
    sizes = sorted({int(n) for n in args.nodes.split(",")})
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}: one of {', '.join(VARIANTS)}")
    variants = [VARIANTS[v] for v in args.variants.split(",")]
    if args.checkout is not None:
        if not (args.checkout / "agent" / "__main__.py").is_file():
            ap.error(f"{args.checkout} holds no agent package")
        # Against the 2024 hub: the client before one-call planning did not follow a small file's 307.
        variants.append(Variant("checkout, hub-2024", answers="2024", checkout=args.checkout.resolve()))
    os.environ.clear()
    os.environ.update(clean_env())  # no ambient HF_TOKEN or endpoint reaches the agents
    compile_bytecode()  # 32 agents starting at once would each compile every module again otherwise
    if args.checkout is not None:
        compileall.compile_dir(args.checkout, quiet=1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ws-calls-", dir="/tmp"))
    runs: list[Run] = []
    try:
        with _terminated_cleanly():
            root = work / "origin"
            if not (root / REPO).exists():
                make_model(
                    root, REPO, total_bytes=args.shards * args.shard_mib * MiB, shards=args.shards, seed=3
                )
            for variant in variants:
                for n in sizes:
                    where = work / f"{variant.name.replace(', ', '-')}-{n}"
                    try:
                        run = run_cluster(root, where, n, variant, args.timeout)
                    except (RuntimeError, TimeoutError, AssertionError) as exc:  # the other runs still count
                        print(f"{variant.name}, N={n}: FAILED: {exc}"[:2000], flush=True)
                        continue
                    runs.append(run)
                    print(f"{variant.name}, N={n}: {run.counts}, {run.seconds:.1f}s", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.shards} LFS shards of {args.shard_mib} MiB + the small files; cold, loopback\n")
    print(report(runs, args.fleet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
