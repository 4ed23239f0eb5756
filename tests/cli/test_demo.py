"""`./dev demo` (= `scripts/demo.py`), run as the README describes, at a small size (slow, opt-in locally).

The README's claims: three daemons fetch one model at once; a report per agent and the origin
egress ÷ model size (≈ 1.0); every agent's cache read the way vLLM does; exit 0 and "OK" only if
all of that verified; every process it started stopped; the temp work dir removed. `./dev demo`
only bootstraps the venv before running this script, so the test runs the script itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


def _find(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.M)
    assert match is not None, f"no line matching {pattern!r} in:\n{text[-2000:]}"
    return match.group(1)


def _stop_leftovers(marker: str) -> list[str]:
    """Processes whose command line names `marker`, stopped by PID; what they were."""
    found = [p for p in psutil.process_iter(["cmdline"]) if any(marker in a for a in p.info["cmdline"] or [])]
    described = [f"{p.pid}: {' '.join(p.info['cmdline'])[:200]}" for p in found]
    for p in found:
        p.terminate()
    psutil.wait_procs(found, timeout=10)
    return described


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_fetches_on_three_agents_mostly_peer_to_peer_verifies_and_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its temp work dir, and every path its processes get
    try:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--size", "16MiB", "--timeout", "120"],
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        leftovers = _stop_leftovers(str(tmp_path))
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert out.rstrip().endswith("demo: OK"), out[-2000:]
    assert leftovers == [], f"processes the demo did not stop: {leftovers}"
    work = Path(_find(r"^demo: work files in (\S+) \(removed at the end\)", out))
    assert work.is_relative_to(tmp_path) and not work.exists(), f"{work} left behind"

    rows = re.findall(r"^(agent-\d)\s+([\d.]+)\s+(\d+) MiB\s+(\d+) MiB$", out, re.M)
    assert [r[0] for r in rows] == ["agent-1", "agent-2", "agent-3"], out
    for _name, _seconds, from_origin, from_peers in rows:
        # Each agent got the whole model once (the report rounds to whole MiB).
        assert abs(int(from_origin) + int(from_peers) - 16) <= 1, rows
    assert abs(sum(int(r[2]) for r in rows) - 16) <= 1, rows  # the origin's bytes reached one agent each
    ratio = float(_find(r"^origin egress: .* = ([\d.]+) x model size", out))
    assert ratio <= 1.1, out
    for name in ("agent-1", "agent-2", "agent-3"):
        assert f"verified ({name})" in out, out
