"""bench.fleet_model: the Redis sample is measured through the real store on a real redis-server,
and the projection follows the line fitted through a scaling run's points."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from bench.fleet_model import fit, main, redis_bytes_per_entry
from tests.support.procs import require

pytestmark = pytest.mark.redis


def test_fit_recovers_a_line() -> None:
    a, b = fit([(2.0, 1.3), (3.0, 1.4), (4.0, 1.5), (5.0, 1.6)])
    assert math.isclose(a, 1.1) and math.isclose(b, 0.1)


@pytest.fixture(autouse=True)
def redis_binary() -> None:
    if shutil.which("redis-server") is None:
        require("redis-server", "Debian package redis-server (./dev installs it)")


def test_redis_memory_grows_with_the_entries() -> None:
    per_entry = redis_bytes_per_entry(20, 10)
    # A sorted-set member with its score, the peer's address and key overheads: tens to a few hundred
    # bytes each. Zero or negative would mean the announces stored nothing.
    assert 30 < per_entry < 2000, per_entry


def test_projection_uses_the_scaling_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def row(n: int, scenario: str, worst: float) -> dict[str, object]:
        times = {f"n{i}": worst for i in range(n)}
        return {"n": n, "system": "weightswarm", "scenario": scenario, "receivers": n, "times": times,
                "failures": {}, "bound": 10.0, "egress": 1, "size": 1, "peak_rss": 0, "cpu_busy": 0.5}

    # max / bound = 1.1 + 0.1 * log2(N) for cold (1.3 at N = 4 ... 1.6 at N = 32); warm is flat at 1.2.
    rows = [row(n, "cold", 10 * (1.1 + 0.1 * math.log2(n))) for n in (4, 8, 16, 32)]
    rows += [row(n, "warm", 12.0) for n in (4, 8, 16, 32)]
    scaling = tmp_path / "scaling.json"
    scaling.write_text(json.dumps({"rows": rows}))
    assert main(["--scaling", str(scaling), "--fleet", "1024", "--sample-nodes", "5"]) == 0
    out = capsys.readouterr().out
    assert "predicts 1.60 x bound at N = 32; measured 1.60" in out
    # 140 GB from a 1 GB/s origin: a 140 s bound; x (1.1 + 0.1 * 10) = 294 s cold. 36 torrents x 2 per
    # 30 s interval: 2,458 announces/s at 1,024 nodes.
    (line,) = [x for x in out.splitlines() if x.strip().startswith("1024")]
    assert line.split()[:2] == ["1024", "2,458"] and line.split()[6] == "294", line
