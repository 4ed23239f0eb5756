"""Scaling curve: bench.swarm at N = 4, 8, 16, 32 nodes, cold and warm, weightswarm beside aria2c.

    sudo .venv/bin/python -m bench.scaling                  # N = 4, 8, 16, 32 (~30 min)
    sudo .venv/bin/python -m bench.scaling --nodes 4,8      # a quicker look

Each N is one `bench.swarm` run (its own cluster, tracker and origin) with the same model and links.
The links are scaled down from bench.swarm's defaults (120 / 30 MB/s) by 30, keeping their 4 : 1
ratio: node links 4 MB/s each way, origin 1 MB/s. At N = 32 the nodes then move at most 128 MB/s
together, which two cores can carry with 32 agents on them; at the default rates the CPU, not the
protocol, would set the curve (bench.swarm's 8-node warm run is CPU-bound already). The model is
48 MiB in 2 shards of 24 MiB, so the relay (blobs of 16 MiB and more) is in play as it is for real
shards. Printed: max and median completion ÷ the lower bound per N, scenario and system, origin egress
÷ S, the agents' peak anonymous memory and CPU use, and the growth of max ÷ bound from the smallest N
to the largest. Saved: docs/swarm-scaling.png (unless --plot says elsewhere) and a JSON of every
row under bench/out/scaling-<time>/ (with each run's own table, plot and logs); bench.fleet_model
reads that JSON to project the curve to 1,000 and 10,000 nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench import swarm

DOCS = Path(__file__).resolve().parent.parent / "docs"
SYSTEMS = ("weightswarm", "aria2c")
SCENARIOS = ("cold", "warm")


def run(n: int, args: argparse.Namespace, out: Path) -> list[dict]:
    """One bench.swarm run at N nodes; its rows (from the JSON it saves) with N added."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        "--nodes", str(n), "--size", args.size, "--shards", str(args.shards),
        "--node-rate", str(args.node_rate), "--origin-rate", str(args.origin_rate),
        "--systems", ",".join(SYSTEMS), "--scenarios", ",".join(SCENARIOS),
        "--timeout", str(args.timeout), "--out", str(out),
    ]  # fmt: skip
    if swarm.main(argv) != 0:
        raise RuntimeError(f"bench.swarm failed at N = {n}")
    (saved,) = out.glob("swarm-*.json")
    rows = json.loads(saved.read_text())["rows"]
    return [{**row, "n": n} for row in rows]


def ratio(row: dict, key: str) -> float:
    """max or median completion ÷ bound, as bench.swarm's table computes them (NaN: a node failed)."""
    r = swarm.Row(**{k: v for k, v in row.items() if k != "n"})
    return (r.worst if key == "max" else r.median) / r.bound


def series(rows: list[dict], scenario: str, system: str) -> list[dict]:
    line = [r for r in rows if r["scenario"] == scenario and r["system"] == system]
    return sorted(line, key=lambda r: r["n"])


def print_table(rows: list[dict]) -> None:
    print()
    head = f"{'N':>4}  {'scenario':<9}{'system':<13}{'max/bnd':>8}{'med/bnd':>8}{'egress/S':>9}{'anon':>9}"
    head += f"{'CPU':>6}{'steal':>6}"
    print(head)
    print("-" * len(head))
    for row in sorted(rows, key=lambda r: (SCENARIOS.index(r["scenario"]), r["system"], r["n"])):
        anon = f"{row['peak_anon'] / 2**20:.0f} MiB" if row["peak_anon"] else "-"
        print(
            f"{row['n']:>4}  {row['scenario']:<9}{row['system']:<13}{ratio(row, 'max'):>8.2f}"
            f"{ratio(row, 'median'):>8.2f}{row['egress'] / row['size']:>9.2f}{anon:>9}"
            f"{row['cpu_busy'] * 100:>5.0f}%{row.get('cpu_steal', 0.0) * 100:>5.0f}%"
        )
    print()
    for scen in SCENARIOS:
        for system in SYSTEMS:
            line = series(rows, scen, system)
            if len(line) >= 2:
                first, last = ratio(line[0], "max"), ratio(line[-1], "max")
                print(
                    f"{scen} {system}: max/bnd {first:.2f} at N={line[0]['n']} -> {last:.2f} at "
                    f"N={line[-1]['n']}: {100 * (last / first - 1):+.0f} % (target: weightswarm <= +10 %)"
                )


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"weightswarm": "tab:green", "aria2c": "tab:orange"}
    for scen, marker in zip(SCENARIOS, ("o", "s"), strict=True):
        for system in SYSTEMS:
            line = series(rows, scen, system)
            xs, ys = [r["n"] for r in line], [ratio(r, "max") for r in line]
            ls = "-" if scen == "cold" else "--"
            ax.plot(xs, ys, marker=marker, color=styles[system], ls=ls, label=f"{system}, {scen}")
    ax.set_xscale("log", base=2)
    ns = sorted({r["n"] for r in rows})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("nodes (N)")
    ax.set_ylabel("slowest node's completion ÷ lower bound")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title(
        f"node links {args.node_rate / 1e6:g} MB/s, origin {args.origin_rate / 1e6:g} MB/s, "
        f"{args.size} in {args.shards} shards"
    )
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="4,8,16,32", help="comma-separated node counts")
    p.add_argument("--size", default="48MiB")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--node-rate", type=float, default=4e6, help="bytes/s each way per node link")
    p.add_argument("--origin-rate", type=float, default=1e6, help="origin upload, bytes/s")
    p.add_argument("--timeout", type=float, default=600, help="seconds per scenario (then: failed)")
    p.add_argument("--out", type=Path, default=swarm.OUT)
    p.add_argument("--plot", type=Path, default=DOCS / "swarm-scaling.png")
    args = p.parse_args(argv)
    out = args.out / f"scaling-{time.strftime('%Y%m%d-%H%M%S')}"
    rows: list[dict] = []
    for n in (int(x) for x in args.nodes.split(",")):
        rows += run(n, args, out / f"n{n}")
    print_table(rows)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "plot")}
    (out / "scaling.json").write_text(json.dumps({"args": settings, "rows": rows}, indent=1, default=str))
    plot(rows, args)
    print(f"saved {args.plot} and {out / 'scaling.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
