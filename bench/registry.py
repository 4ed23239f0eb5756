"""A model in an OCI registry, N nodes cold: weightswarm beside every node pulling the artifact itself.

    sudo .venv/bin/python -m bench.registry                  # 512 MiB / 4 shards, registry 30 MB/s, 8 nodes
    sudo .venv/bin/python -m bench.registry --size 256MiB --nodes 4   # a quicker look

Needs root (network namespaces, tc, a tmpfs mount), iproute2, curl, Debian's docker-registry and skopeo.
Topology as bench/swarm.py's (bench/netns.py): one namespace per node, one for the registry and one for
the tracker, around a bridge; node links shaped to --node-rate each way, the registry's upload to
--origin-rate (30 MB/s by default: bench.swarm's Hub origin). The registry is Debian's `docker-registry`
(distribution v2) in the origin namespace, anonymous, filesystem storage on a tmpfs mounted for the run
(with the model and every cache). The model (`agent make-test-model`) is pushed, inside the origin
namespace, as a CNCF ModelPack artifact of raw layers, one per file (bench.oci_push).

Systems, one after the other in the same run, each from cold caches on every node at once:
  weightswarm  a tracker and one `agent serve --registry oci://REGISTRY/models` per node, then
               `agent fetch oci://REGISTRY/models/m:v1 --repo-id … --agent unix://…` on every node
  skopeo       every node pulls the artifact itself: `skopeo copy docker://REGISTRY/models/m:v1
               oci:DIR` (what a node without weightswarm does: `oras pull` reads the same blobs)
Printed per system: first, median and last completion ÷ bench.swarm's bound max(S/U_origin, S/D_node,
N·S/(U_origin + ΣU_node)), the registry's egress ÷ S counted on its link (the veth's tx bytes less 66 B
a packet), the registry's CPU, the agents' (weightswarm) and the bytes the jobs say they took from it.
Targets (issue 64): weightswarm ≤ 1.2 × the bound at ≤ 1.05 × S from the registry.
Results: a table on stdout, bench/out/registry-<time>.json, every process's log in
bench/out/registry-<time>-logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from agent.hub.testmodel import parse_size
from bench import oci_push
from bench.cold_source import ColdRound, process_cpu, run_cold, tree_bytes, write_model
from bench.netns import Cluster, Proc, cleanup_stale, have_netns_support
from bench.stack import BIN, ORIGIN_PORT, Model, Stack, wait_for
from bench.swarm import tmpfs

OUT = Path(__file__).resolve().parent / "out"
REGISTRY_BIN = "/usr/bin/docker-registry"
REPO = "bench/registry-model"
NAME = "models/m"
TAG = "v1"


class RegistryBench:
    def __init__(self, args: argparse.Namespace, stack: Stack, fs: Path, model: Model) -> None:
        self.a = args
        self.s = stack
        self.c = stack.c
        self.fs = fs
        self.model = model
        self.registry: Proc | None = None
        self.rounds: list[ColdRound] = []
        self.digest = ""

    @property
    def host(self) -> str:
        """The registry: it listens where the stack's origin would."""
        return f"{self.c.ip('origin')}:{ORIGIN_PORT}"

    @property
    def ref(self) -> str:
        return f"{self.host}/{NAME}:{TAG}"

    def start_registry(self, model_dir: Path) -> None:
        config = {
            "version": 0.1,
            "log": {"level": "error", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.fs / "registry")}},
            "http": {"addr": self.host, "secret": os.urandom(16).hex()},
        }
        path = self.fs / "registry.yml"
        path.write_text(json.dumps(config))  # YAML reads JSON
        argv = [REGISTRY_BIN, "serve", str(path)]
        # distribution reads REGISTRY_<SECTION>_<KEY> as configuration: REGISTRY_AUTH_FILE (the agents'
        # and skopeo's login file) would be its `auth` section.
        env = {k: v for k, v in self.s.env.items() if not k.startswith("REGISTRY_")}
        registry = self.registry = self.c.spawn("origin", argv, env, self.s.log("registry"))

        def up() -> bool:
            if registry.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {registry.output()[-600:]}")
            return self.s.curl("origin", f"http://{self.host}/v2/", 2) is not None

        wait_for(up, 60, "docker-registry")
        t0 = time.monotonic()
        push = [sys.executable, oci_push.__file__, f"http://{self.host}", NAME, TAG, str(model_dir)]
        res = self.c.run("origin", push, timeout=600)
        said = res.stdout.split()
        if res.returncode != 0 or len(said) != 3 or int(said[2]) != self.model.size:
            raise RuntimeError(f"push to the registry failed: {res.stdout[-300:]} {res.stderr[-600:]}")
        self.digest = said[0]
        took = time.monotonic() - t0
        mib = int(said[2]) / 2**20
        print(f"pushed {said[1]} layers, {mib:.0f} MiB in {took:.1f}s: {self.digest}", flush=True)

    def registry_cpu(self) -> float:
        return process_cpu(self.registry.pid) if self.registry else float("nan")

    def weightswarm(self) -> None:
        print(f"weightswarm: {len(self.c.nodes)} nodes cold from the registry", flush=True)

        def argv(node: str) -> list[str]:
            admin = self.s.node_dir(node) / "state" / "admin.sock"
            return [str(BIN / "agent"), "fetch", f"oci://{self.ref}", "--repo-id", REPO,
                    "--agent", f"unix://{admin}"]

        serve = ["--registry", f"oci://{self.host}/models", "--oci-plain-http", self.host]
        self.rounds.append(
            run_cold(self.a, self.s, self.model, "weightswarm", argv, self.registry_cpu, serve)
        )

    def skopeo(self) -> None:
        print(f"skopeo: {len(self.c.nodes)} nodes each pull the artifact", flush=True)

        def argv(node: str) -> list[str]:
            dest = self.s.node_dir(node) / "oci"
            return ["skopeo", "copy", "--quiet", "--src-tls-verify=false", "--src-no-creds",
                    f"docker://{self.ref}", f"oci:{dest}"]

        self.rounds.append(run_cold(self.a, self.s, self.model, "skopeo", argv, self.registry_cpu))
        blobs = {n: tree_bytes(self.s.node_dir(n) / "oci" / "blobs") for n in self.c.nodes}
        short = [n for n, got in blobs.items() if got < self.model.size]
        if short and not self.rounds[-1].row.failures:
            raise RuntimeError(f"skopeo wrote less than the model on {', '.join(short)}")

    def print_table(self) -> None:
        a, size = self.a, self.model.size
        print()
        print(
            f"{len(self.c.nodes)} nodes cold from an OCI registry (docker-registry, upload "
            f"{a.origin_rate / 1e6:g} MB/s; node links {a.node_rate / 1e6:g} MB/s), S={size / 2**20:.0f} MiB "
            f"in {len(self.model.files)} layers, {os.cpu_count()} CPUs"
        )
        if self.rounds:
            bound = self.rounds[0].row.bound
            print(f"bound max(S/U_origin, S/D_node, N·S/(U_origin+ΣU_node)) = {bound:.1f} s")
        head = (
            f"{'system':<13}{'first s':>8}{'median s':>9}{'last s':>8}{'first/bnd':>10}{'median/bnd':>11}"
            f"{'last/bnd':>9}{'registry egress/S':>18}{'jobs/S':>7}{'failed':>7}{'CPU':>5}{'steal':>6}"
            f"{'agents CPU-s':>13}{'registry CPU-s':>15}"
        )
        print(head)
        print("-" * len(head))
        for r in self.rounds:
            row = r.row
            times = sorted(row.times.values())
            first = times[0] if times else float("nan")
            jobs = f"{sum(r.reported.values()) / size:.3f}" if r.reported else "-"
            agents = f"{r.agents_cpu:.1f}" if r.agents_cpu == r.agents_cpu else "-"
            print(
                f"{row.system:<13}{first:>8.1f}{row.median:>9.1f}{row.worst:>8.1f}{first / row.bound:>10.2f}"
                f"{row.median / row.bound:>11.2f}{row.worst / row.bound:>9.2f}{row.egress / size:>18.3f}"
                f"{jobs:>7}{len(row.failures):>7}{row.cpu_busy * 100:>4.0f}%{row.cpu_steal * 100:>5.0f}%"
                f"{agents:>13}{r.source_cpu:>15.1f}"
            )
        for r in self.rounds:
            if r.row.system == "weightswarm":
                met = r.row.worst / r.row.bound <= 1.2 and r.row.egress / size <= 1.05
                print(f"target (issue 64): last/bnd <= 1.20, registry egress/S <= 1.05: "
                      f"{'met' if met else 'NOT met'}")
        for r in self.rounds:
            if r.reported:
                readers = ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in sorted(r.reported.items()) if b)
                print(f"{r.row.system}: nodes that read the registry: {readers}; "
                      f"lease takeovers {r.takeovers}")
            for node, why in sorted(r.row.failures.items()):
                print(f"  {r.row.system} {node} FAILED: {why}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.registry",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size", default="512MiB", help="model size (e.g. 256MiB, 1GiB)")
    p.add_argument("--shards", type=int, default=4, help="safetensors shards (one layer each)")
    p.add_argument("--node-rate", type=float, default=120e6, help="bytes/s each way per node link")
    p.add_argument("--origin-rate", type=float, default=30e6, help="the registry's upload, bytes/s")
    p.add_argument("--systems", default="weightswarm,skopeo", help="weightswarm, skopeo, or both")
    p.add_argument("--timeout", type=float, default=600, help="seconds per fetch before it counts as failed")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--agent-log-level", default="WARNING", help="log level of every agent")
    p.add_argument(
        "--cleanup-stale", action="store_true", help="first delete namespaces of crashed runs (ws-*)"
    )
    args = p.parse_args(argv)
    # bench.swarm.Bench reads these.
    args.origin_rate_per_connection = args.origin_rate_per_client = None
    systems = [x for x in args.systems.split(",") if x]
    if set(systems) - {"weightswarm", "skopeo"} or not systems:
        p.error(f"--systems: weightswarm, skopeo or both, not {args.systems!r}")
    reason = have_netns_support()
    if reason:
        print(f"error: the registry benchmark {reason}", file=sys.stderr)
        return 2
    for tool in ("curl", REGISTRY_BIN, "skopeo"):
        if shutil.which(tool) is None:
            print(f"error: the registry benchmark needs `{tool}` (apt-get install -y docker-registry skopeo)",
                  file=sys.stderr)
            return 2
    if args.cleanup_stale:
        cleanup_stale("ws-")
    size = parse_size(args.size)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="ws-registry-") as tmp:
        # The model, the registry's copy, every node's cache (or OCI layout).
        room = size * (args.nodes + 3) + 512 * 2**20
        with tmpfs(Path(tmp) / "fs", room) as fs:
            model = write_model(fs / "hub", REPO, args.size, args.shards)
            with Cluster(nodes=args.nodes, node_rate=args.node_rate, origin_rate=args.origin_rate) as c:
                logdir = args.out / f"registry-{stamp}-logs"
                stack = Stack(c, fs, fs / "hub", logdir)
                # The host's own logins stay out: the registry is anonymous.
                (fs / "auth.json").write_text('{"auths": {}}')
                stack.env["REGISTRY_AUTH_FILE"] = str(fs / "auth.json")
                stack.env["WEIGHTSWARM_LOG_LEVEL"] = args.agent_log_level
                print(
                    f"logs: {logdir}\nmodel {REPO}: {len(model.files)} files, {model.size / 2**20:.0f} MiB; "
                    f"cluster {c.prefix}: {args.nodes} nodes",
                    flush=True,
                )
                rb = RegistryBench(args, stack, fs, model)
                rb.start_registry(fs / "hub" / REPO)
                for system in systems:
                    getattr(rb, system)()
                rb.print_table()
                (args.out / f"registry-{stamp}.json").write_text(
                    json.dumps(
                        {
                            "args": {k: v for k, v in vars(args).items() if k != "out"},
                            "manifest": rb.digest,
                            "rounds": [asdict(r) for r in rb.rounds],
                        },
                        indent=1,
                        default=str,
                    )
                )
                print(f"saved {args.out / f'registry-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
