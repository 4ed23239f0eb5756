"""Three agents in their own network namespaces fetch one model cold, at once (opt-in).

    sudo .venv/bin/pytest -m multinode

Real processes in a real shaped topology (bench/netns.py): origin 10 MB/s, node links
50 MB/s each way, a 16 MiB model. Each node's fetch must exit 0 (verified), its snapshot
must hold the origin's exact bytes, and the origin must send each byte about once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.netns import Cluster, cleanup_stale, have_netns_support, measure_rate
from bench.stack import BIN, Stack, sha256_file
from tests.support.procs import loop_until, require

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(180)]

REPO = "multinode/tiny"
MiB = 2**20


def _require_netns() -> None:
    """Root, iproute2 and curl (./dev installs both; CI runs as root): fail in CI, skip elsewhere."""
    reason = have_netns_support()
    if reason is None and shutil.which("curl") is None:
        reason = "needs `curl` (Debian package curl)"
    if reason:
        require("the multi-node harness", reason)


@pytest.fixture
def stack(tmp_path: Path):
    _require_netns()
    import subprocess

    hub = tmp_path / "hub"
    subprocess.run(
        [str(BIN / "agent"), "make-test-model", str(hub), REPO, "--size", "16MiB", "--shards", "4"],
        check=True,
        timeout=120,
        capture_output=True,
    )
    with Cluster(nodes=3, node_rate=50e6, origin_rate=10e6) as cluster:
        s = Stack(cluster, tmp_path, hub)
        s.start_origin()
        s.start_tracker(tmp_path / "tracker.db")
        s.start_agents(cluster.nodes)
        yield s
    # Cluster.__exit__ stopped every process by PID and deleted every namespace.
    assert not any(ns.startswith(cluster.prefix) for ns in _netns_list())


def _netns_list() -> list[str]:
    import subprocess

    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_three_nodes_cold_fetch_at_once(stack: Stack) -> None:
    model = stack.describe_model(REPO)
    assert model.size >= 16 * MiB
    nodes = stack.c.nodes
    e0 = stack.egress()
    r0 = sum(stack.c.received(n) for n in nodes)

    res = stack.run_fetches(nodes, lambda n: stack.fetch_agent_argv(n, model), timeout=90, tag="mn")

    assert res.failures == {}, res.failures
    assert sorted(res.times) == sorted(nodes)
    origin_dir = stack.hub_root / REPO
    for node in nodes:
        snapshot = Path(res.snapshots[node])
        assert snapshot.is_relative_to(stack.node_dir(node) / "cache"), snapshot
        for f in model.files:
            got = snapshot / f.path
            assert got.is_file(), f"{node}: {f.path} missing"
            assert sha256_file(got) == sha256_file(origin_dir / f.path), f"{node}: {f.path} differs"
    egress = stack.egress() - e0
    logs = {n: stack.log(f"mn-{n}").read_text().splitlines() for n in nodes}
    from_origin = [f"{n}:{line}" for n, lines in logs.items() for line in lines if "origin" in line]
    twice = stack.origin_overlaps(model)
    times = f"origin sent {egress / model.size:.2f} x the model"
    assert egress <= 1.1 * model.size, (times, twice, from_origin)
    # What the nodes' links took in: each node the model once, and few blocks sent to it twice.
    taken = sum(stack.c.received(n) for n in nodes) - r0
    assert len(nodes) * model.size <= taken <= 1.25 * len(nodes) * model.size, taken / model.size


def test_three_nodes_cold_known_use_the_origin_as_web_seed(stack: Stack) -> None:
    """Metainfo known, no seeders: the lease holders web-seed from the origin, which is on a private
    address here, as an in-cluster `agent serve-hub` is. libtorrent's SSRF guard refused that signed
    URL (query string, private IP), so every holder waited out a stall and fell back to its origin
    engine; loopback tests cannot see it (libtorrent lets loopback through)."""
    model = stack.describe_model(REPO)
    nodes = stack.c.nodes
    first = stack.run_fetches(nodes[:1], lambda n: stack.fetch_agent_argv(n, model), timeout=90, tag="first")
    assert first.failures == {}, first.failures
    stack.stop_agents()  # "stopped" announces: the tracker keeps the metainfo and counts no seeders
    stack.wipe(nodes)
    stack.log_prefix = "known-"
    stack.start_agents(nodes)
    e0 = stack.egress()

    res = stack.run_fetches(nodes, lambda n: stack.fetch_agent_argv(n, model), timeout=90, tag="fetch")

    assert res.failures == {}, res.failures
    # 16 MiB at 10 MB/s from the origin: ~1.7 s; the old stall fallback took minutes.
    assert max(res.times.values()) < 30, res.times
    egress = stack.egress() - e0
    assert egress <= 1.1 * model.size, f"origin sent {egress / model.size:.2f} x the model"
    for node in nodes:
        log = stack.log(f"agent-{node}").read_text()
        assert "web seed" not in log, f"{node}: {log[-600:]}"


def test_shaping_matches_configuration(tmp_path: Path) -> None:
    _require_netns()
    with Cluster(nodes=2, node_rate=40e6, origin_rate=10e6) as c:
        for member in c.members + ["br"]:
            routes = c.run(member, ["ip", "route", "show", "default"]).stdout
            assert routes.strip() == "", f"{member} has a default route: {routes}"
        origin_to_node = measure_rate(c, "origin", "n0", 2.0, tmp_path)
        node_to_node = measure_rate(c, "n0", "n1", 2.0, tmp_path, port=5202)
    # TCP/IP headers take ~4 % of a 1500-byte MTU; the rest is the shaper's accuracy.
    assert 0.8 * 10e6 <= origin_to_node <= 1.05 * 10e6, origin_to_node
    assert 0.8 * 40e6 <= node_to_node <= 1.05 * 40e6, node_to_node


def test_every_member_knows_every_other_members_address_without_asking() -> None:
    """The kernel keeps one ARP table for all namespaces, capped at 1,024 learned entries: 32 nodes, the
    origin and the tracker need 1,122, and past the cap connects went unanswered (dmesg: "neighbor table
    overflow!"). Each namespace holds a permanent entry for every other member, and it is that member's
    real MAC address, so no member ever learns an entry."""
    _require_netns()
    with Cluster(nodes=2, node_rate=10e6, origin_rate=10e6) as c:
        macs = {}
        for member in c.members:
            link = c.run(member, ["ip", "-o", "link", "show", "eth0"]).stdout
            macs[member] = link.split("link/ether ")[1].split()[0]
        for member in c.members:
            table = c.run(member, ["ip", "neigh", "show", "dev", "eth0"]).stdout.splitlines()
            entries = {line.split()[0]: line.split() for line in table}
            others = [m for m in c.members if m != member]
            assert set(entries) == {c.ip(m) for m in others}, table
            for m in others:
                assert entries[c.ip(m)][2] == macs[m] and entries[c.ip(m)][-1] == "PERMANENT", table
        assert all(v == 0 for counts in c.net_counters().values() for v in counts.values())


def test_teardown_on_exception_kills_processes_and_deletes_namespaces() -> None:
    _require_netns()
    with pytest.raises(RuntimeError, match="boom"):
        with Cluster(nodes=1, node_rate=10e6, origin_rate=10e6) as c:
            proc = c.spawn("n0", ["sleep", "600"])
            assert proc.poll() is None
            raise RuntimeError("boom")
    assert proc.poll() is not None
    assert not any(ns.startswith(c.prefix) for ns in _netns_list())


def test_cleanup_stale_removes_a_crashed_runs_leftovers() -> None:
    _require_netns()
    c = Cluster(nodes=1, node_rate=10e6, origin_rate=10e6).__enter__()  # a run that "crashed"
    try:
        proc = c.spawn("n0", ["sleep", "600"])
        removed = cleanup_stale(c.prefix)
        assert sorted(removed) == sorted(c.ns(m) for m in [*c.members, "br"])
        loop_until(lambda: proc.poll() is not None, 15, what="the stale process to die")
        assert not any(ns.startswith(c.prefix) for ns in _netns_list())
    finally:
        c.close()
