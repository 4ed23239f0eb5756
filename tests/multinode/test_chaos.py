"""The chaos run's short version (opt-in everywhere: `sudo .venv/bin/pytest -m chaos`).

`bench/chaos.py` on 4 namespace nodes and a 48 MiB model, one fault per test: the script itself checks
every node's snapshot byte for byte against the origin, that no partial file is visible and that origin
egress stays within the scenario's bound; here every node must also complete. About 1 min per scenario;
the full run (8 nodes, every scenario, 3 times) is in the README.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multinode.test_multinode import _require_netns

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]

SCENARIOS = ("agents-killed", "holder-killed", "tracker-restart", "redis-restart", "tracker-replicas",
             "corrupt-peer", "clock-jump")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_cold_fetch_through_the_fault(scenario: str, tmp_path: Path) -> None:
    _require_netns()
    argv = [sys.executable, "-m", "bench.chaos", "--nodes", "4", "--size", "48MiB", "--shards", "3",
            "--scenarios", scenario, "--seed", "3", "--out", str(tmp_path), "--timeout", "240"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=800)
    (result,) = json.loads(next(tmp_path.glob("chaos-*.json")).read_text())
    assert run.returncode == 0 and not result["checks"], (result["checks"], run.stdout[-3000:])
    assert result["completed"] == result["total"], result
