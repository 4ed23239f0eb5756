"""What a cluster's cold start of one model costs the origin's rate limits (per client and 5-minute window,
an "api" and a "resolvers" budget: huggingface.co/docs/hub/rate-limits), against the test hub at its
default behaviour (the Hub of 2026).

Each node plans the commit from the origin itself: one API call (`revision?blobs=true`), so 4 nodes cost 4.
The files' resolves are one lease holder's per blob, the others' bytes come from peers: the cluster's
resolves are at most what one lone node spends on the same model (measured first, in the same test, with a
standalone `agent fetch` into a fresh cache). `bench.origin_calls` measures the same at N = 1, 8, 32.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.origin_calls import bucket_counts, describe
from tests.support.cluster import BIN, Origin, TrackerProcess, fetch_all_and_verify, model_origin

REPO = "acme/calls"
MiB = 2**20
NODES = 4


@pytest.fixture
def origin4(tmp_path: Path) -> Iterator[Origin]:
    """4 LFS shards and the small files of a real repo (config, tokenizer, index, .gitattributes, README)."""
    with model_origin(tmp_path / "origin", REPO, total_bytes=8 * MiB, shards=4, seed=31) as o:
        yield o


def lone_fetch(origin: Origin, tmp: Path) -> dict[str, int]:
    """The origin's requests, by bucket, for one standalone `agent fetch` into a fresh cache."""
    origin.hub.reset_counters()
    dirs = ["--cache-dir", str(tmp / "hub"), "--state-dir", str(tmp / "state")]
    argv = [str(BIN / "agent"), "fetch", origin.repo_id, "--origin", origin.hub.url, *dirs]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    counts = bucket_counts(origin.hub.requests)
    origin.hub.reset_counters()
    return counts


@pytest.mark.timeout(240)
def test_a_cluster_costs_the_origin_one_api_call_a_node_and_one_nodes_resolves(
    origin4: Origin, tracker: TrackerProcess, make_agent, tmp_path: Path
) -> None:
    lone = lone_fetch(origin4, tmp_path / "lone")
    assert lone["resolvers"] >= len(origin4.files), f"lone node: {lone}"  # every file asked for at least once

    agents = [make_agent(f"n{i}", origin4, tracker) for i in range(NODES)]
    fetch_all_and_verify(agents, origin4)
    requests = origin4.hub.requests
    cluster = bucket_counts(requests)

    seen = f"lone node {lone}; {NODES} nodes {cluster}\n{describe(requests)}"
    # Every agent is on 127.0.0.1: one per node is the count, not one per address.
    assert cluster["api"] == NODES, seen
    assert cluster["resolvers"] <= lone["resolvers"], seen
