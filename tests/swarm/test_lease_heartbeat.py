"""README "Tracker" leases: a holder's download that outlives the lease TTL keeps the lease (heartbeats
every ttl/3), so a second node asking meanwhile does not get it and takes the blob from the holder.

A real tracker process, two real daemons, an origin capped so the one shard takes several TTLs.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import (
    Origin,
    assert_snapshot_verifies,
    model_origin,
)
from tests.support.procs import loop_until

REPO = "acme/slow"
SHARD_BYTES = 2 * 2**20
ORIGIN_RATE = 200_000  # bytes/s: the shard alone takes ~10 s
LEASE_TTL = 3.0  # the CLI's floor; the download lasts more than three of them
SHORT_LEASE = {"lease_ttl": LEASE_TTL, "wait_poll_seconds": 1.0}
"""With a 1 s long-poll a waiting node would notice a lapsed lease within a second."""


@pytest.fixture
def slow_origin(tmp_path: Path) -> Iterator[Origin]:
    with model_origin(
        tmp_path / "hub", REPO, total_bytes=SHARD_BYTES, shards=1, seed=11, rate_total=ORIGIN_RATE
    ) as o:
        yield o


@pytest.mark.timeout(120)
def test_a_download_longer_than_the_lease_ttl_keeps_the_lease(slow_origin, tracker, make_agent):
    shard = next(p for p in slow_origin.files if p.endswith(".safetensors"))
    blob = hashlib.sha256(slow_origin.files[shard]).hexdigest()

    def holder() -> str | None:
        lease = tracker.blob(blob).get("lease")
        return str(lease["holder"]) if isinstance(lease, dict) else None

    a = make_agent("a", slow_origin, tracker, daemon=SHORT_LEASE)
    job_a = a.request_model(REPO, "main")
    loop_until(lambda: holder() == a.node_id, timeout=30, what="node a holds the shard's origin lease")
    taken = time.monotonic()
    b = make_agent("b", slow_origin, tracker, daemon=SHORT_LEASE)
    job_b = b.request_model(REPO, "main")

    samples: list[tuple[float, str | None]] = []
    while not job_a.wait(0.2):  # sampling cadence; the wait ends as soon as a is done
        samples.append((time.monotonic() - taken, holder()))
        assert time.monotonic() - taken < 90, "node a's download did not finish"
    assert job_a.status().phase == "Ready", job_a.status()
    assert job_b.wait(60), job_b.status()

    assert {h for _t, h in samples} <= {a.node_id, None}, f"the lease changed hands: {samples}"
    held = [t for t, h in samples if h == a.node_id]
    lapsed = [t for t, h in samples if h is None]
    # Held without a gap for several TTLs (released only at the end): renewed, not granted once.
    assert held and held[-1] >= 3 * LEASE_TTL, samples
    assert not lapsed or lapsed[0] > held[-1], f"the lease lapsed mid-download: {samples}"

    status_b = job_b.status().to_json()
    assert status_b["phase"] == "Ready", status_b
    assert next(f["source"] for f in status_b["files"] if f["path"] == shard) == "peers", status_b
    assert_snapshot_verifies(status_b["snapshot"], slow_origin)
    # The origin sent the shard once (to a), not to b as well.
    assert slow_origin.hub.egress_bytes < slow_origin.size + SHARD_BYTES // 2
