"""An origin that pins a node's disk by seeming to make progress (docs/security.md, attacks): it lists a
large file and sends a little more on every answer, or trickles below any useful rate. A blob's headway
is judged in bytes over time (agent.origin.headway); one that cannot finish gives its reservation back,
and a partial left behind is shown by `agent ls` and freed by `agent rm`, which says how much."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from agent.core.errors import EXIT_INTEGRITY, OriginStalledError
from agent.core.progress import Progress, human_bytes
from agent.core.settings import Settings, default_state_dir
from agent.fetch.engine import FetchEngine, fetch_snapshot, plan_from_origin
from agent.hub.server import HubServer
from agent.origin.chunks import Turn
from agent.origin.headway import MEAGRE, Headway
from agent.origin.kinds import open_origin
from agent.origin.ranges import OriginSource
from tests.support.cluster import BIN
from tests.support.fetchkit import (
    REPO,
    GiB,
    MiB,
    allocated,
    leftovers,
    model,
    repo_dir,
    settings_for,
    shards,
    snapshot_contents,
)


def run_cli(*args: str, timeout: float = 120) -> tuple[int, str, str, int]:
    """`agent ARGS` as a subprocess: (exit code, stdout, stderr, its peak RSS sampled every 20 ms)."""
    import subprocess

    proc = subprocess.Popen([str(BIN / "agent"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    watched = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()  # over its time: the failure below says so
    out, err = proc.communicate(timeout=10)
    return proc.returncode, out.decode(), err.decode(), peak


# -- the rule itself -------------------------------------------------------------------------------


def rule(now: float = 0.0) -> Headway:
    return Headway(min_rate=1000.0, window=10.0, short_answers=3, since=now)


def test_meagre_answers_end_a_blob_within_a_window_and_big_or_old_ones_do_not():
    h = rule()
    assert h.short_answer(1000, 1.0) is None
    assert h.short_answer(MEAGRE, 2.0) is None  # an answer that brought a MiB is headway
    assert h.short_answer(1000, 3.0) is None
    why = h.short_answer(1000, 4.0)
    assert why is not None and "3 answers ended early" in why and "3000 bytes" in why
    old = rule()
    for t in (0.0, 1.0, 12.0):  # the first two are out of the window by the third
        assert old.short_answer(0, t) is None


def test_a_window_below_the_floor_ends_a_blob_and_time_spent_waiting_does_not_count():
    h = rule()
    assert h.judge(9.9, 0) is None  # the window is not over
    assert h.judge(10.0, 10_000) is None  # the floor exactly: a new window from here
    why = h.judge(20.0, 19_000)  # 9,000 bytes in 10 s
    assert why is not None and "brought 9000 bytes in 10 s" in why
    waiting = rule()
    waiting.hold(1.0, idle=True)  # told "later" (429/5xx) for 100 s
    assert waiting.judge(50.0, 0) is None
    waiting.hold(101.0, idle=False)
    assert waiting.judge(105.0, 0) is None  # 5 s of counted time so far
    assert waiting.judge(110.5, 0) is not None


# -- attack 7: a little more on every answer -------------------------------------------------------


def test_an_origin_that_sends_a_little_more_on_every_answer_fails_at_once_and_frees_its_reservation(
    tmp_path: Path,
):
    root = tmp_path / "origin"
    # More real bytes than the engine's window reaches (8 connections x 4 MiB x 2), so that no answer ends
    # at the end of what the origin has: it always has a little more to send.
    shard = shards(model(root, total=96 * MiB, shards=1))[0]
    with HubServer(root) as srv:
        srv.faults.claimed_sizes[shard] = 10 * GiB
        srv.faults.answer_bytes = 1000  # each answer ends 1,000 bytes after its start: never the same byte
        cache, state = tmp_path / "hub", tmp_path / "st"
        started = time.monotonic()
        code, _out, err, peak = run_cli(
            "fetch", REPO, "--origin", srv.url, "--cache-dir", str(cache), "--state-dir", str(state)
        )
        took = time.monotonic() - started
        asked = [r for r in srv.requests if r.method == "GET" and r.bucket == "cdn"]  # the shard's bytes
    assert code == EXIT_INTEGRITY, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"lists {10 * GiB} bytes" in last, err
    assert "cannot send what it lists" in last and "discarded" in last, last
    assert "Traceback" not in err
    # Bounded: the 8th meagre answer within a minute ends it (the 4 connections' answers in flight
    # then), not 10 GiB / 1,000 bytes of answers; before, it went on for as long as the origin liked.
    assert len(asked) <= 16, len(asked)
    assert took < 60, took
    assert leftovers(cache, state) == []
    assert allocated(cache) < 1 * MiB  # not the 10 GiB it reserved
    assert peak < 200 * MiB, peak


# -- a trickle: the rate floor, the reservation given back, ls and rm -------------------------------


def trickle_settings(tmp_path: Path, url: str) -> Settings:
    s = settings_for(tmp_path, url, chunk_size=1 * MiB, connections=2)
    fetch = dataclasses.replace(s.fetch, origin_min_rate=512 * 1024, origin_rate_window=2.0)
    # The default state dir (under the test's own XDG_STATE_HOME): the one `agent ls --cache-dir` reads.
    return dataclasses.replace(s, fetch=fetch, state_dir=default_state_dir(os.environ))


def test_a_trickling_origin_fails_at_the_floor_gives_back_its_reservation_and_resumes(tmp_path: Path):
    root = tmp_path / "origin"
    files = model(root, total=64 * MiB, shards=1)
    shard = shards(files)[0]
    with HubServer(root) as srv:
        srv.faults.slow_rate, srv.faults.slow_times = 40_000.0, 1000  # 40 KB/s a connection, two of them
        settings = trickle_settings(tmp_path, srv.url)
        with pytest.raises(OriginStalledError, match=f"{shard}: the origin brought .* less than the floor"):
            fetch_snapshot(settings, REPO)
        partial = next(settings.cache_dir.rglob("*.incomplete"))
        held = partial.stat().st_blocks * 512
        # It keeps what it wrote (a few hundred KB) and gives back the rest of its 64 MiB reservation.
        assert 0 < partial.stat().st_size < 4 * MiB, partial.stat().st_size
        assert held < 4 * MiB, held

        # `agent ls` shows what holds the space, `agent rm` frees it and says how much.
        code, out, err, _ = run_cli("ls", "--cache-dir", str(settings.cache_dir), "--json")
        assert code == 0, err
        (listed,) = json.loads(out)
        assert [(p["path"], p["size"], p["bytes"]) for p in listed["partials"]] == [
            (shard, len(files[shard]), held)
        ]
        code, out, err, _ = run_cli("ls", "--cache-dir", str(settings.cache_dir))
        assert code == 0 and "(partial)" in out and shard in out, out + err

        # An honest origin resumes it: the bytes it kept are not asked for again.
        srv.faults.reset()
        kept = partial.stat().st_size
        srv.requests.clear()
        honest = dataclasses.replace(settings, fetch=settings_for(tmp_path, srv.url).fetch)
        result = fetch_snapshot(honest, REPO)
        assert snapshot_contents(result.snapshot_path) == files
        assert result.bytes_from_origin <= len(files[shard]) - kept + 2 * MiB


def test_agent_rm_removes_a_partial_and_prints_what_it_freed(tmp_path: Path):
    root = tmp_path / "origin"
    shard = shards(model(root, total=64 * MiB, shards=1))[0]
    with HubServer(root) as srv:
        srv.faults.slow_rate, srv.faults.slow_times = 40_000.0, 1000
        settings = trickle_settings(tmp_path, srv.url)
        with pytest.raises(OriginStalledError):
            fetch_snapshot(settings, REPO, include=[shard])
    held = allocated(repo_dir(settings.cache_dir) / "blobs")
    assert held > 0
    dirs = ["--cache-dir", str(settings.cache_dir), "--state-dir", str(settings.state_dir)]
    code, out, err, _ = run_cli("rm", REPO, *dirs)
    assert code == 0, err
    freed = human_bytes(held)
    assert out.strip() == f"removed {REPO}: 0 revision(s), 0 blob(s), 1 partial download(s), {freed} freed"
    assert leftovers(settings.cache_dir, settings.state_dir) == []


# -- an endless model-info JSON ----------------------------------------------------------------------


class _EndlessJson(BaseHTTPRequestHandler):
    """An origin whose revision answer is 200 MB of JSON (declared, or close-delimited), sent lazily;
    counts the body bytes its socket took."""

    declared = True
    sent = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        total = 200 * 10**6
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if type(self).declared:
            self.send_header("Content-Length", str(total))
        self.end_headers()
        block = b'{"sha": "' + b"a" * (1 << 20)
        try:
            self.wfile.write(block[:9])
            while type(self).sent < total:
                self.wfile.write(block[9:])
                type(self).sent += len(block) - 9
        except OSError:
            pass
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(params=[True, False], ids=["declared", "close-delimited"])
def endless(request: pytest.FixtureRequest) -> Iterator[tuple[str, type[_EndlessJson]]]:
    handler = type("Endless", (_EndlessJson,), {"declared": request.param, "sent": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_huge_model_info_json_is_refused_with_bounded_memory(tmp_path: Path, endless):
    url, handler = endless
    dirs = ["--cache-dir", str(tmp_path / "hub"), "--state-dir", str(tmp_path / "st")]
    code, _out, err, peak = run_cli("fetch", REPO, "--origin", url, *dirs)
    assert code != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "more than the" in last and "allowed" in last, err
    assert peak < 200 * MiB, peak  # the 64 MiB cap, not the 200 MB answer (nor its parse)
    assert handler.sent < 80 * MiB, handler.sent  # the client stopped reading at the cap
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5):
        pass  # the origin is still up: it was the client that stopped


def test_background_work_that_steps_aside_again_and_again_is_no_origin_ending_answers_early(tmp_path: Path):
    """A preheat steps aside whenever a pod's model needs the origin: its open range requests are cut
    (`OriginSource._step_aside`). Those answers end early because we cut them, not the origin: however many
    there are, they never count towards the rule that ends a blob whose origin cuts its answers short."""
    root = tmp_path / "origin"
    files = model(root, total=24 * MiB, shards=1)
    steps = 0
    last = [time.monotonic()]

    def due() -> bool:  # every 50 ms, as often as a busy node's pods might ask
        nonlocal steps
        if time.monotonic() - last[0] < 0.05:
            return False
        last[0] = time.monotonic()
        steps += 1
        return True

    with HubServer(root, rate_per_connection=2 * MiB) as srv:
        settings = settings_for(tmp_path / "node", srv.url)
        assert settings.fetch.origin_short_answers < 12  # the cuts below outnumber the rule's bound
        client = open_origin(settings.origin)
        try:
            plan = plan_from_origin(client, REPO, "main")
            source = OriginSource(client, settings.fetch, turn=Turn(due, lambda: time.sleep(0.01)))
            result = FetchEngine(settings, source, Progress(quiet=True)).run(plan)
        finally:
            client.close()
    assert steps >= 12, steps
    assert snapshot_contents(result.snapshot_path) == files
