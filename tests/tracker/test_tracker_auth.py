"""Auth (write token, read token, announce passkey) and the `tracker serve` command line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote_from_bytes

import httpx
import pytest

from tests.support.procs import free_port, kill_process, loop_until
from tests.tracker.test_tracker_fixtures import AUTH, TOKEN, infohash, make_info, peer_id, run_server
from tracker.bencode import bdecode
from tracker.settings import TrackerSettings

READ = "read-token-abcdefgh"
PASSKEY = "passkey-0123456789"
ROOT = Path(__file__).resolve().parents[2]


def test_writes_need_the_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    blob_id, info = make_info(b"t" * 20_000)
    with run_server(TrackerSettings(token=TOKEN)) as t:
        writes = [
            ("PUT", f"/v1/blobs/{blob_id}/metainfo", {"content": info}),
            ("POST", f"/v1/leases/{blob_id}", {"json": {"node_id": "n"}}),
            ("POST", f"/v1/leases/{blob_id}/heartbeat", {"json": {"node_id": "n"}}),
            ("DELETE", f"/v1/leases/{blob_id}?node_id=n", {}),
            ("PUT", f"/v1/manifests/o/m/{'7' * 40}", {"json": {"files": []}}),
        ]
        for method, url, kwargs in writes:
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token-xyz"},
                {"Authorization": TOKEN},
                {"Authorization": f"Basic {TOKEN}"},
            ):
                r = t.http.request(method, url, headers=headers, **kwargs)
                assert r.status_code == 401, (method, url, headers)
                assert r.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in r.text and "wrong-token" not in r.text
        assert t.http.get(f"/v1/blobs/{blob_id}/metainfo").status_code == 404, "refused writes stored nothing"
        assert t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).status_code == 201
        assert t.http.get(f"/v1/blobs/{blob_id}").status_code == 200, "reads open without --read-token-file"
        metrics = t.http.get("/metrics").text
    assert TOKEN not in caplog.text and TOKEN not in metrics
    assert TOKEN not in repr(TrackerSettings(token=TOKEN))


def test_read_token_guards_registry_reads() -> None:
    with run_server(TrackerSettings(token=TOKEN, read_token=READ)) as t:
        for url in ("/v1/models", f"/v1/blobs/{'a' * 64}", "/v1/resolve/o/m/main"):
            r = t.http.get(url)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert t.http.get(url, headers={"Authorization": f"Bearer {READ}"}).status_code in (200, 404)
            assert t.http.get(url, headers=AUTH).status_code in (200, 404), "the write token reads too"
        assert t.http.get("/healthz").status_code == 200
        assert t.announce(infohash(1), peer_id(1), 10, left=0)[b"interval"] == 30, "announce stays open"


def test_announce_passkey_in_path_or_query() -> None:
    with run_server(TrackerSettings(token=TOKEN, announce_passkey=PASSKEY)) as t:
        query = (
            f"info_hash={quote_from_bytes(infohash(2))}&peer_id={quote_from_bytes(peer_id(1))}&port=9&left=0"
        )
        for url in (f"/announce?{query}", f"/announce/wrong-passkey?{query}", f"/scrape?{query}"):
            body = bdecode(t.http.get(url).content)
            assert body == {b"failure reason": b"unknown or missing passkey"}
        assert b"interval" in bdecode(t.http.get(f"/announce/{PASSKEY}?{query}").content)
        assert b"interval" in bdecode(t.http.get(f"/announce?{query}&passkey={PASSKEY}").content)
        assert b"files" in bdecode(t.http.get(f"/scrape/{PASSKEY}?{query}").content)


def test_no_token_means_no_start_unless_insecure() -> None:
    from tracker.errors import ConfigError

    with pytest.raises(ConfigError, match="--token-file"):
        TrackerSettings()
    with run_server(TrackerSettings(insecure_no_token=True)) as t:
        r = t.http.post(f"/v1/leases/{'d' * 64}", json={"node_id": "n"})
        assert r.status_code == 200 and r.json()["granted"]


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracker", "serve", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token-file", "/nonexistent/token"], "cannot read --token-file /nonexistent/token"),
        ([], "no write token"),
        (["--insecure-no-token", "--redis", "http://x"], "--redis must be a redis://"),
        (["--insecure-no-token", "--redis", "redis://127.0.0.1:1/0"], "cannot reach Redis"),
        (["--insecure-no-token", "--redis", "redis://127.0.0.1:1/0", "--db", "x.db"], "choose one store"),
    ],
)
def test_startup_errors_are_one_line(args: list[str], message: str) -> None:
    proc = _serve("--port", str(free_port()), *args)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        kill_process(proc)
    assert proc.returncode != 0
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_serve_reads_options_from_environment(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    proc = _serve(
        env={
            "WEIGHTSWARM_PORT": str(port),
            "WEIGHTSWARM_TOKEN_FILE": str(token),
            "WEIGHTSWARM_DB": str(tmp_path / "t.db"),
            "WEIGHTSWARM_INTERVAL": "45",
            "WEIGHTSWARM_LOG_LEVEL": "INFO",
        }
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        loop_until(ready, timeout=60, what="tracker serve subprocess")
        base = f"http://127.0.0.1:{port}"
        query = f"info_hash={quote_from_bytes(infohash(3))}&peer_id={quote_from_bytes(peer_id(1))}&port=9"
        assert bdecode(httpx.get(f"{base}/announce/secretish?{query}").content)[b"interval"] == 45
        r = httpx.post(f"{base}/v1/leases/{'e' * 64}", json={"node_id": "n"}, headers=AUTH)
        assert r.status_code == 200
        assert httpx.post(f"{base}/v1/leases/{'e' * 64}", json={"node_id": "n"}).status_code == 401
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert (tmp_path / "t.db").exists()
    assert "/v1/leases" in err, "API requests are logged"
    assert TOKEN not in err and "secretish" not in err and "announce" not in err


def test_settings_validation() -> None:
    from tracker.errors import ConfigError

    base = TrackerSettings(token=TOKEN)
    for bad in ({"interval": 0}, {"max_lease_holders": 0}, {"min_interval": 100}):
        with pytest.raises(ConfigError):
            replace(base, **bad)
