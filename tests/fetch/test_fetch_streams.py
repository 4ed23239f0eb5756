"""A download host that refuses a second concurrent stream of one file from one address (the test hub's
`Faults.streams_per_file`, as the Hub's CDN was reported to in 2026; an object store behind the fault
proxy's `streams_per_object`, with S3's or Azure's throttle, a 429 or a reset): its refusals are a limit to
learn, never a failure, standalone, through a daemon and through the node's HF endpoint."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub import constants, snapshot_download

from agent.cli.main import main
from agent.core.errors import EXIT_AUTH
from agent.hub.server import HubServer
from agent.hub.state import StreamRecord
from agent.origin import streams
from tests.support.cluster import AgentProcess, agent_cli
from tests.support.fetchkit import REPO, MiB, fetch_args, model, serve, shards, snapshot_contents
from tests.support.s3kit import FaultProxy, Store

FILES_AT_ONCE, CONNECTIONS = 4, 8
"""`agent fetch`'s defaults (agent.core.settings FetchSettings), which these fetches run with."""


@pytest.fixture(autouse=True)
def fresh_limits(monkeypatch: pytest.MonkeyPatch) -> streams.StreamLimits:
    """The in-process fetches of a test learn from nothing (`streams.LIMITS` is the process's)."""
    limits = streams.StreamLimits()
    monkeypatch.setattr(streams, "LIMITS", limits)
    return limits


def _one_stream_hub(root: Path, answer: str = "403") -> HubServer:
    srv = HubServer(root, rate_per_connection=24.0 * MiB)  # as a CDN: a cap on each stream
    srv.faults.streams_per_file = 1
    srv.faults.streams_answer = answer
    return srv


def assert_learned(records: list[StreamRecord], files: int, asks: int = 1, later_clean: bool = True) -> None:
    """Refused only while the first files learned the limit: never more than each of the first wave's
    files asking its other streams once (`asks` times a stream), and (`later_clean`) some files started
    after the last refusal and saw none."""
    refused = [r for r in records if not r.admitted]
    assert refused, "the hub refused no stream: the test proves nothing"
    assert all(r.streams == 1 for r in records if r.admitted)
    assert len(refused) <= asks * FILES_AT_ONCE * (CONNECTIONS - 1), len(refused)
    last = max(r.at for r in refused)
    first_get = {}
    for r in records:
        first_get.setdefault(r.path, r.at)
    later = [path for path, at in first_get.items() if at > last]
    assert later or not later_clean, "every file started before the limit was learned"
    assert not [r for r in refused if r.path in later]
    assert len(first_get) == files
    # The stream budget the host freed went to more files at once than `files_at_once`.
    assert max(r.files for r in records) > FILES_AT_ONCE, max(r.files for r in records)


@pytest.mark.parametrize("answer", ["403", "429", "reset"])
def test_a_cli_fetch_from_a_host_allowing_one_stream_per_file_succeeds(tmp_path, answer):
    root = tmp_path / "origin"
    files = model(root, total=192 * MiB, shards=8)
    with _one_stream_hub(root, answer) as srv:
        result = agent_cli(*fetch_args(srv.url, tmp_path))
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        assert snapshot_contents(Path(result.stdout.strip().splitlines()[-1])) == files
        # A reset of a pooled connection is asked again at once on a fresh one (`HttpSession.send`).
        assert_learned(srv.cdn_streams, len(shards(files)), asks=2 if answer == "reset" else 1)


def test_a_daemon_and_its_hf_endpoint_fetch_from_a_host_allowing_one_stream_per_file(tmp_path, tracker):
    root = tmp_path / "origin"
    files = model(root, total=192 * MiB, shards=8)
    with _one_stream_hub(root) as srv:
        agent = AgentProcess(tmp_path, "a", srv.url, tracker)
        try:
            agent.start()
            result = agent_cli("fetch", REPO, "--agent", agent.url)
            assert result.returncode == 0, result.stderr[-3000:]
            assert snapshot_contents(Path(result.stdout.strip().splitlines()[-1])) == files
            assert_learned(srv.cdn_streams, len(shards(files)))
            # The daemon keeps the limit: a second model starts at it, nothing refused.
            other = model(root, "org/other", total=48 * MiB, shards=4, seed=1)
            srv.reset_counters()
            got = snapshot_download("org/other", endpoint=agent.api_url, cache_dir=tmp_path / "hf")
            assert snapshot_contents(Path(got)) == other
            assert srv.cdn_streams and all(r.admitted for r in srv.cdn_streams)
        finally:
            agent.stop()
        log = agent.log.read_text()
        assert "Traceback" not in log, log[-3000:]


def one_stream_store(store: Store, bucket: str, proxy: FaultProxy, answer: str = "503") -> dict[str, bytes]:
    """Eight 16-MiB objects under `bucket`/m (each a large file: under 16 MiB a file goes on the lane of
    small ones, `FileEntry.small`; no larger, as Azurite keeps every blob of a session in 512 MiB of
    memory), behind `proxy` allowing one GET of an object at once: {path: bytes}."""
    rng = random.Random(63)
    files = {f"pytorch_model-{i:05d}-of-00008.bin": rng.randbytes(16 * MiB) for i in range(1, 9)}
    for path, data in files.items():
        store.put_object(bucket, f"m/{path}", data)
    proxy.streams_per_object, proxy.streams_answer = 1, answer
    proxy.rate = 24.0 * MiB  # each answer held open a while, as a CDN's cap on a stream does
    return files


@pytest.mark.parametrize("answer", ["503", "429", "reset"])
def test_a_cli_fetch_from_a_store_allowing_one_stream_per_object_succeeds(
    tmp_path, answer, store, store_bucket, store_proxy, store_env
):
    """`agent fetch s3://…` (az://) when the store refuses a second GET of an object at once: 503 is S3's
    SlowDown or Azure's ServerBusy, each store's "reduce your request rate"."""
    files = one_stream_store(store, store_bucket, store_proxy, answer)
    result = agent_cli("fetch", f"{store.scheme}://{store_bucket}/m", "--repo-id", REPO,
                       "--cache-dir", str(tmp_path / "hub"), "--state-dir", str(tmp_path / "st"),
                       "--agent", "off", env=store_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert snapshot_contents(Path(result.stdout.strip().splitlines()[-1])) == files
    # Not `later_clean` (as in the daemon below): on a loaded machine a first-wave object's slow range can be
    # hedged, a second stream refused after later objects started; the refusals stay within the bound.
    assert_learned(store_proxy.streams, len(files), asks=2 if answer == "reset" else 1, later_clean=False)


def test_a_daemon_reads_a_store_allowing_one_stream_per_object(
    origin, tracker, make_agent, s3_server, s3_bucket, s3_proxy, monkeypatch
):
    """The daemon's bucket reader (agent.fetch.bucket) spends the freed stream budget on more objects too
    (the same code for every store: S3's here)."""
    for name, value in s3_server.env(endpoint=s3_proxy.endpoint).items():
        monkeypatch.setenv(name, value)
    files = one_stream_store(s3_server, s3_bucket, s3_proxy)
    url = f"s3://{s3_bucket}/m"
    daemon = make_agent("a", origin, tracker, daemon={"buckets": (url,)})
    job = daemon.request_model(REPO, "main", source=url)
    assert job.wait(120), job.status()
    status = job.status().to_json()
    assert status["phase"] == "Ready", status
    assert snapshot_contents(Path(status["snapshot"])) == files
    # Not `later_clean`: in a daemon a first-wave object's stream is at times refused again about a second
    # in (4 at once, as if hedged), after later objects started; the count stays within the bound.
    assert_learned(s3_proxy.streams, len(files), later_clean=False)


def test_huggingface_hub_itself_is_served_by_that_host(tmp_path, monkeypatch):
    """The double is sane: one stream per file, as huggingface_hub asks, is never refused. (Over plain HTTP:
    the test hub has no Xet CAS behind its Xet headers.)"""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    root = tmp_path / "origin"
    files = model(root, total=32 * MiB, shards=4)
    with _one_stream_hub(root) as srv:
        got = snapshot_download(REPO, endpoint=srv.url, cache_dir=tmp_path / "hf")
        assert snapshot_contents(Path(got)) == files
        assert srv.cdn_streams and all(r.admitted for r in srv.cdn_streams)


def test_a_single_stream_refused_by_the_origin_itself_is_still_exit_4(tmp_path):
    root = tmp_path / "origin"
    model(root, "acme/gated", total=8 * MiB, shards=2)
    for srv in serve(root, tokens=["hf_granted_token_0123456789a"], gated=["acme/gated"]):
        srv.faults.streams_per_file = 1
        args = ["fetch", "acme/gated", "--origin", srv.url, "--cache-dir", str(tmp_path / "hub"),
                "--state-dir", str(tmp_path / "st")]
        result = CliRunner(env={"HF_TOKEN": None, "HF_HOME": str(tmp_path / "nohome")}).invoke(main, args)
        assert result.exit_code == EXIT_AUTH, result.output
        assert "access refused" in result.output
        assert "Traceback" not in result.output


def test_a_host_limit_is_probed_upward_slowly_and_backs_off_when_refused_again():
    now = [0.0]
    limits = streams.StreamLimits(clock=lambda: now[0])
    assert limits.limit("cdn", 8) == 8  # nothing learned: what the settings say
    assert limits.refused("cdn", 1, via="hub") == 1
    assert limits.per_file("hub", 8) == 1
    now[0] += streams.PROBE_AFTER - 1
    assert limits.limit("cdn", 8) == 1
    now[0] += 1
    assert limits.limit("cdn", 8) == 2  # one probe up
    limits.refused("cdn", 1)
    now[0] += streams.PROBE_AFTER
    assert limits.limit("cdn", 8) == 1  # the refused probe doubled the wait
    now[0] += streams.PROBE_AFTER
    assert limits.limit("cdn", 8) == 2
    now[0] += streams.MEMORY
    assert limits.limit("cdn", 8) == 8  # forgotten


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
