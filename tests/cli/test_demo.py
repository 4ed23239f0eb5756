"""`./dev demo` (= `scripts/demo.py`), run as the README describes, at a small size (slow, opt-in locally).

The README's claims: three daemons fetch one model at once; a report per agent and the origin
egress ÷ model size (≈ 1.0); every agent's cache read the way vLLM does; exit 0 and "OK" only if
all of that verified; every process it started stopped; the temp work dir removed. The same with
`--origin s3` (the model in a bucket on a local S3 server; the store's egress instead of the origin's).
`./dev demo` only bootstraps the venv before running this script, so the test runs the script itself.
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
    """Processes whose command line (its words, each followed by a space) names `marker`, stopped by PID;
    what they were."""
    procs = psutil.process_iter(["cmdline"])
    found = [p for p in procs if marker in "".join(f"{a} " for a in p.info["cmdline"] or [])]
    described = [f"{p.pid}: {' '.join(p.info['cmdline'])[:200]}" for p in found]
    for p in found:
        p.terminate()
    psutil.wait_procs(found, timeout=10)
    return described


def _run_demo(tmp_path: Path, *args: str) -> str:
    """`scripts/demo.py ARGS` at 16 MiB, checked: it ended OK, left nothing running or on disk. Its stdout."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its temp work dir, and every path its processes get
    out = ""
    try:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--size", "16MiB", "--timeout", "120", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
        out = result.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise
    finally:
        leftovers = _stop_leftovers(str(tmp_path))
        # The S3 server's command line names no path: found by its port, when the demo got that far.
        if store := re.search(r"^demo: store http://127\.0\.0\.1:(\d+) ", out, re.M):
            leftovers += _stop_leftovers(f"moto_server -H 127.0.0.1 -p {store.group(1)} ")
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert out.rstrip().endswith("demo: OK"), out[-2000:]
    assert leftovers == [], f"processes the demo did not stop: {leftovers}"
    work = Path(_find(r"^demo: work files in (\S+) \(removed at the end\)", out))
    assert work.is_relative_to(tmp_path) and not work.exists(), f"{work} left behind"
    return out


def _check_report(out: str, source: str, max_egress: float = 1.1) -> None:
    """Every agent got the whole model once, `source` (origin, store) served it about once (its egress at
    most `max_egress` x model size); every agent verified."""
    assert re.search(rf"^agent\s+time s\s+from {source}\s+from peers$", out, re.M), out
    rows = re.findall(r"^(agent-\d)\s+([\d.]+)\s+(\d+) MiB\s+(\d+) MiB$", out, re.M)
    assert [r[0] for r in rows] == ["agent-1", "agent-2", "agent-3"], out
    for _name, _seconds, from_source, from_peers in rows:
        # Each agent got the whole model once (the report rounds to whole MiB).
        assert abs(int(from_source) + int(from_peers) - 16) <= 1, rows
    assert abs(sum(int(r[2]) for r in rows) - 16) <= 1, rows  # the source's bytes reached one agent each
    ratio = float(_find(rf"^{source} egress: .* = ([\d.]+) x model size", out))
    assert ratio <= max_egress, out
    for name in ("agent-1", "agent-2", "agent-3"):
        assert f"verified ({name})" in out, out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_fetches_on_three_agents_mostly_peer_to_peer_verifies_and_cleans_up(tmp_path: Path) -> None:
    out = _run_demo(tmp_path)
    _check_report(out, "origin")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_from_a_bucket_reads_the_store_about_once_verifies_and_cleans_up(tmp_path: Path) -> None:
    """`./dev demo --origin s3`: the model in a bucket on a local S3 server (moto), the same report and
    checks; the server is stopped too."""
    out = _run_demo(tmp_path, "--origin", "s3")
    assert "demo: `agent fetch s3://demo-models/models/tiny-llama --repo-id demo/tiny-llama" in out, out
    # The store's egress may exceed what the agents kept when a ranged read was hedged (demo.store_check).
    _check_report(out, "store", max_egress=1.99)
    readers = re.findall(r"^agent-\d\s+[\d.]+\s+([1-9]\d*) MiB", out, re.M)
    assert len(readers) == 1, out  # one node read the bucket; the others took the bytes from it
    kept = float(_find(r"^store read by agent-\d; the agents kept ([\d.]+) x model size", out))
    assert kept <= 1.1, out
