"""Progress lines say where a file came from and show a rate only over an interval that can carry one."""

from __future__ import annotations

import io
import time

from agent.core.progress import Progress
from agent.http.client import mirror_progress


def _lines(progress: Progress) -> list[str]:
    stream = progress.stream
    assert isinstance(stream, io.StringIO)
    return stream.getvalue().splitlines()


def test_a_file_that_arrives_in_one_step_shows_no_rate():
    p = Progress(stream=io.StringIO())
    p.set_total(40 * 2**30)
    fp = p.start_file("model.safetensors", 40 * 2**30)
    fp.advance(40 * 2**30)  # microseconds after it started: any "rate" would read as TiB/s
    fp.finish("peers")
    p.close()
    done = next(line for line in _lines(p) if line.startswith("  done"))
    assert done == "  done model.safetensors (from peers, 40.0 GiB)"
    assert not any("/s" in line for line in _lines(p)), _lines(p)


def test_a_slow_file_shows_its_real_rate_and_source():
    p = Progress(stream=io.StringIO())
    fp = p.start_file("a.bin", 1000)
    fp.started -= 2.0  # two seconds ago, without sleeping
    fp.advance(1000)
    fp.finish("origin")
    done = next(line for line in _lines(p) if line.startswith("  done"))
    assert done in ("  done a.bin (from origin, 500 B/s)", "  done a.bin (from origin, 499 B/s)"), done


def test_mirrored_job_progress_says_cached_and_from_peers():
    """`agent fetch --agent` draws the daemon's job: files it finds complete show where they came from."""
    p = Progress(stream=io.StringIO())
    status = {
        "phase": "Ready",
        "files": [
            {"path": "big.safetensors", "size": 5 * 2**30, "done": 5 * 2**30, "source": "peers"},
            {"path": "README.md", "size": 10, "done": 10, "source": "cache"},
        ],
    }
    bars: dict = {}
    finished: set[str] = set()
    started = time.monotonic()
    mirror_progress(status, bars, finished, p)
    assert time.monotonic() - started < 0.5  # so a rate here would be computed over ~0 s
    lines = _lines(p)
    assert "  done big.safetensors (from peers, 5.0 GiB)" in lines, lines
    assert not any("README.md" in line for line in lines)  # cached files are not drawn as downloads
