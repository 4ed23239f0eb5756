"""Fleet model: tracker load, Redis memory and completion time for 1,000 and 10,000 nodes.

    .venv/bin/python -m bench.fleet_model --scaling bench/out/scaling-<time>/scaling.json

A calculation on paper, calibrated on what this machine measures:
- Redis memory per (node, torrent): measured here. A private redis-server (the Debian binary, on a
  free loopback port, no persistence) takes `--sample-nodes` agents announcing every torrent of the
  model through the tracker's own RedisStore; INFO's used_memory before and after, divided by the
  announces, is the cost of one live peer entry with everything the store keeps beside it.
- Announces per second: every node announces each torrent once per tracker interval (30 s by
  default); a node also announces the relay key of each blob it streams for others or seeds whole
  (agent.relay.directory: blobs of 16 MiB and more), counted here for every blob: the steady state of a
  model's shards, an upper bound for its small files. Each relay key is a peer entry in Redis too.
  Replicas needed: that rate ÷ one replica's measured rate (`--replica-rate`, from
  bench/tracker_load.py: 4,190 announces/s is the lowest figure docs/benchmarks.md reports).
- Completion: the lower bound max(S/U_origin, S/D_node, N·S/(U_origin + N·U_node)) times the ratio
  to the bound that bench.scaling measured, extrapolated in log2(N) by a least-squares line
  through its points (weightswarm's slowest node, cold and warm). The check printed first: the line
  fitted without the largest N, against what that N measured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

from bench.redis_server import RedisServer
from bench.scaling import ratio, series
from bench.swarm import lower_bound
from tracker.settings import TrackerSettings
from tracker.stores import open_store

GB = 1e9
DEFAULT_INTERVAL = next(f.default for f in dataclasses.fields(TrackerSettings) if f.name == "interval")


def redis_bytes_per_entry(nodes: int, torrents: int) -> float:
    """used_memory added per (node, torrent) announce, through the tracker's RedisStore."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("error: needs redis-server (./dev installs the Debian package)")
    with tempfile.TemporaryDirectory(prefix="ws-fleet-") as workdir:
        server = RedisServer(binary, Path(workdir))
        with server, redis.Redis(host="127.0.0.1", port=server.port) as client:
            # The store only (no HTTP): no token to check. A long interval: nothing expires mid-sample.
            settings = TrackerSettings(redis_url=server.url, interval=3600, insecure_no_token=True)

            async def announce_all() -> None:
                store = open_store(settings)
                try:
                    for node in range(nodes):
                        peer_id = b"-WS0001-" + node.to_bytes(12, "big")
                        addr = bytes([10, 1, node >> 8, node & 0xFF])
                        for t in range(torrents):
                            infohash = t.to_bytes(20, "big")
                            await store.announce(infohash, (peer_id, addr, 6881), True, "started", 0)
                finally:
                    await store.close()

            before = int(client.info("memory")["used_memory"])
            asyncio.run(announce_all())
            after = int(client.info("memory")["used_memory"])
    return (after - before) / (nodes * torrents)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = a + b·x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--scaling", type=Path, help="scaling.json from bench.scaling (for completion times)")
    p.add_argument("--fleet", default="1000,10000", help="node counts to project")
    p.add_argument("--model-size", type=float, default=140 * GB, help="bytes")
    p.add_argument("--shard-size", type=float, default=5 * GB, help="bytes per safetensors shard")
    p.add_argument("--small-files", type=int, default=8, help="config, tokenizer, index...: one torrent each")
    p.add_argument("--interval", type=int, default=DEFAULT_INTERVAL, help="tracker interval, s")
    p.add_argument("--replica-rate", type=float, default=4190, help="announces/s one tracker replica serves")
    p.add_argument("--origin-rate", type=float, default=1 * GB, help="bytes/s the origin gives the cluster")
    p.add_argument("--node-rate", type=float, default=100e9 / 8, help="bytes/s per node link, each way")
    p.add_argument("--sample-nodes", type=int, default=300, help="agents announcing into the sample Redis")
    args = p.parse_args(argv)

    shards = math.ceil(args.model_size / args.shard_size)
    torrents = shards + args.small_files
    per_entry = redis_bytes_per_entry(args.sample_nodes, torrents)
    print(
        f"model {args.model_size / GB:.0f} GB: {shards} shards of <= {args.shard_size / GB:.1f} GB + "
        f"{args.small_files} small files = {torrents} torrents per node; tracker interval {args.interval} s"
    )
    print(
        f"Redis: {per_entry:.0f} bytes per (node, torrent), measured with {args.sample_nodes} agents x "
        f"{torrents} torrents through RedisStore"
    )

    curves: dict[str, tuple[float, float]] = {}
    if args.scaling:
        rows = json.loads(args.scaling.read_text())["rows"]
        print()
        for scen in ("cold", "warm"):
            pts = [(math.log2(r["n"]), ratio(r, "max")) for r in series(rows, scen, "weightswarm")]
            pts = [(x, y) for x, y in pts if not math.isnan(y)]
            if len(pts) < 2:
                continue
            curves[scen] = fit(pts)
            if len(pts) >= 3:
                a, b = fit(pts[:-1])
                x, y = pts[-1]
                print(
                    f"check, {scen}: the line through N = {', '.join(str(round(2**q)) for q, _ in pts[:-1])} "
                    f"predicts {a + b * x:.2f} x bound at N = {round(2**x)}; measured {y:.2f}"
                )
            a, b = curves[scen]
            print(f"{scen}: max/bound = {a:.2f} + {b:.3f} * log2(N)  ({b:+.2f} x bound per doubling of N)")

    print()
    head = (
        f"{'nodes':>7}{'announces/s':>13}{'replicas':>9}{'Redis':>10}{'cold bound s':>13}"
        f"{'cold s':>8}{'warm bound s':>13}{'warm s':>8}"
    )
    print(head)
    print("-" * len(head))
    for n in (int(x) for x in args.fleet.split(",")):
        rate = n * torrents * 2 / args.interval  # x2: a relay key per blob (an upper bound)
        replicas = math.ceil(rate / args.replica_rate)
        memory = n * torrents * 2 * per_entry  # x2 as well: the relay keys are peer entries too
        cold = lower_bound(args.model_size, n, n, args.node_rate, args.origin_rate, warm=False)
        warm = lower_bound(args.model_size, n - 1, n, args.node_rate, args.origin_rate, warm=True)
        projected = {}
        for scen, bound in (("cold", cold), ("warm", warm)):
            a, b = curves.get(scen, (math.nan, 0.0))
            projected[scen] = bound * (a + b * math.log2(n))
        print(
            f"{n:>7}{rate:>13,.0f}{replicas:>9}{memory / 2**20:>6.0f} MiB{cold:>13.0f}"
            f"{projected['cold']:>8.0f}{warm:>13.0f}{projected['warm']:>8.0f}"
        )
    print(
        f"\nbound: origin {args.origin_rate / GB:g} GB/s, node links {args.node_rate * 8 / 1e9:g} Gb/s; "
        "cold/warm: the bound x the fitted ratio (needs --scaling); replicas at "
        f"{args.replica_rate:,.0f} announces/s each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
