"""Auth: tokens and their roles, the announce passkey, `ip=`, secrets kept out of logs, and the
`tracker serve` command line. Each attack a test names is refused; the legitimate path works."""

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
from tests.support.trackerkit import (
    AUTH,
    PASSKEY,
    PUBLISHER,
    PUBLISHER_TOKEN,
    SETTINGS,
    SIGNATURE,
    TOKEN,
    compact_ports,
    infohash,
    make_info,
    peer_id,
    run_server,
)
from tracker.settings import TrackerSettings
from wirekit.bencode import bdecode

READ = "read-token-abcdefgh"
READER = {"Authorization": f"Bearer {READ}"}
ROOT = Path(__file__).resolve().parents[2]
COMMIT = "7" * 40
REFUSED = {b"failure reason": b"unknown or missing passkey"}


def _query(ih: bytes, pid: bytes, port: int, left: int = 0) -> str:
    return f"info_hash={quote_from_bytes(ih)}&peer_id={quote_from_bytes(pid)}&port={port}&left={left}"


# -- tokens and roles ----------------------------------------------------------------------


def test_reads_need_a_token() -> None:
    blob_id, info = make_info(b"r" * 20_000)
    with run_server(replace(SETTINGS, read_token=READ)) as t:
        assert t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info).status_code == 201
        t.anon.put(
            f"/v1/manifests/o/m/{COMMIT}",
            json={"revision": "main", "files": [], "signature": SIGNATURE},
            headers=PUBLISHER,
        ).raise_for_status()
        reads = [
            "/v1/models",
            f"/v1/manifests/o/m/{COMMIT}",
            "/v1/resolve/o/m/main",
            f"/v1/blobs/{blob_id}/metainfo",
            f"/v1/blobs/{blob_id}",
            f"/v1/blobs/{blob_id}/wait?timeout=0",
        ]
        for url in reads:
            for headers in ({}, {"Authorization": "Bearer wrong-token-xyz"}, {"Authorization": TOKEN}):
                r = t.anon.get(url, headers=headers)
                assert r.status_code == 401, (url, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
                assert COMMIT not in r.text and b"pieces" not in r.content, "nothing of the registry leaks"
            for who in (AUTH, PUBLISHER, READER):
                assert t.anon.get(url, headers=who).status_code == 200, (url, who)
        for open_url in ("/healthz", "/readyz", "/metrics"):
            assert t.anon.get(open_url).status_code == 200, open_url


def test_writes_need_the_agent_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    blob_id, info = make_info(b"t" * 20_000)
    with run_server(replace(SETTINGS, read_token=READ)) as t:
        writes = [
            ("PUT", f"/v1/blobs/{blob_id}/metainfo", {"content": info}),
            ("POST", f"/v1/leases/{blob_id}", {"json": {"node_id": "n"}}),
            ("POST", f"/v1/leases/{blob_id}/heartbeat", {"json": {"node_id": "n"}}),
            ("DELETE", f"/v1/leases/{blob_id}?node_id=n", {}),
            ("PUT", f"/v1/manifests/o/m/{COMMIT}", {"json": {"files": []}}),
        ]
        for method, url, kwargs in writes:
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token-xyz"},
                {"Authorization": TOKEN},
                {"Authorization": f"Basic {TOKEN}"},
            ):
                r = t.anon.request(method, url, headers=headers, **kwargs)
                assert r.status_code == 401, (method, url, headers)
                assert r.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in r.text and "wrong-token" not in r.text
            r = t.anon.request(method, url, headers=READER, **kwargs)
            assert r.status_code == 403 and "the token given has the reader role" in r.text, (method, url)
        assert t.http.get(f"/v1/blobs/{blob_id}/metainfo").status_code == 404, "refused writes stored nothing"
        assert t.http.get(f"/v1/manifests/o/m/{COMMIT}").status_code == 404
        assert t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info).status_code == 201
        metrics = t.anon.get("/metrics").text
        assert 'tracker_auth_refusals_total{reason="token"} 20.0' in metrics
        assert 'tracker_auth_refusals_total{reason="role"} 5.0' in metrics
    assert TOKEN not in caplog.text and READ not in caplog.text and TOKEN not in metrics
    assert (
        TOKEN not in repr(SETTINGS)
        and PUBLISHER_TOKEN not in repr(SETTINGS)
        and PASSKEY not in repr(SETTINGS)
    )


def test_publisher_may_not_take_leases_or_put_metainfo() -> None:
    blob_id, info = make_info(b"p" * 20_000)
    with run_server(SETTINGS) as t:
        for method, url, kwargs in [
            ("POST", f"/v1/leases/{blob_id}", {"json": {"node_id": "n"}}),
            ("POST", f"/v1/leases/{blob_id}/heartbeat", {"json": {"node_id": "n"}}),
            ("DELETE", f"/v1/leases/{blob_id}?node_id=n", {}),
            ("PUT", f"/v1/blobs/{blob_id}/metainfo", {"content": info}),
        ]:
            r = t.anon.request(method, url, headers=PUBLISHER, **kwargs)
            assert r.status_code == 403, (method, url, r.text)
            assert r.json()["detail"] == (
                "this needs the agent role (--token-file); the token given has the publisher role"
            )
        state = t.http.get(f"/v1/blobs/{blob_id}").json()
        assert state["holders"] == [] and state["infohash"] is None, "nothing was taken or stored"


def test_a_published_repo_is_closed_to_agent_writes(store_settings: TrackerSettings) -> None:
    pub_commit, shadow_commit, other_commit = "a" * 40, "b" * 40, "c" * 40
    blob = {"path": "model.safetensors", "size": 5, "blob_id": "d" * 64, "infohash": None}
    evil = {"path": "model.safetensors", "size": 5, "blob_id": "e" * 64, "infohash": None}
    with run_server(store_settings) as t:
        # An agent may register a hub model's manifest before anyone publishes the repo...
        t.http.put(f"/v1/manifests/acme/priv/{other_commit}", json={"revision": "v0", "files": [blob]})
        r = t.anon.put(
            f"/v1/manifests/acme/priv/{pub_commit}",
            json={"revision": "main", "files": [blob], "signature": SIGNATURE},
            headers=PUBLISHER,
        )
        assert r.status_code == 201 and r.json()["published"] is True, r.text
        # ...but once the publisher has, no agent-role write touches the repo: not the published
        # commit, not a new commit, not a ref (refs are only set through a manifest).
        for commit, body in [
            (pub_commit, {"revision": "main", "files": [evil]}),
            (shadow_commit, {"revision": "main", "files": [evil]}),
            (shadow_commit, {"files": [evil]}),
        ]:
            r = t.http.put(f"/v1/manifests/acme/priv/{commit}", json=body)
            assert r.status_code == 403, r.text
            assert "acme/priv is a published model" in r.json()["detail"]
            assert "--publisher-token-file" in r.json()["detail"]
        assert t.http.get("/v1/resolve/acme/priv/main").json() == {"commit": pub_commit}
        got = t.http.get(f"/v1/manifests/acme/priv/{pub_commit}").json()
        assert got["files"] == [blob] and got["published"] is True and got["signature"] == SIGNATURE
        assert t.http.get(f"/v1/manifests/acme/priv/{shadow_commit}").status_code == 404
        assert t.http.get(f"/v1/manifests/acme/priv/{other_commit}").json()["published"] is False
        (model,) = t.http.get("/v1/models").json()["models"]
        assert model["repo_id"] == "acme/priv" and model["published"] is True
        assert {c["commit"]: c["published"] for c in model["commits"]} == {
            other_commit: False,
            pub_commit: True,
        }
        # The publisher itself may publish a new version; other repos stay open to agents.
        r = t.anon.put(
            f"/v1/manifests/acme/priv/{shadow_commit}",
            json={"revision": "main", "files": [blob], "signature": SIGNATURE},
            headers=PUBLISHER,
        )
        assert r.status_code == 201
        assert t.http.get("/v1/resolve/acme/priv/main").json() == {"commit": shadow_commit}
        assert (
            t.http.put(f"/v1/manifests/hub/model/{other_commit}", json={"files": [blob]}).status_code == 201
        )
        assert t.http.get(f"/v1/manifests/hub/model/{other_commit}").json()["published"] is False


# -- announce: passkey and address ---------------------------------------------------------


def test_announce_and_scrape_need_the_passkey() -> None:
    with run_server(SETTINGS) as t:
        ih, intruder = infohash(2), _query(infohash(2), peer_id(66), 6666)
        for url in (
            f"/announce?{intruder}",
            f"/announce/wrong-passkey-1234?{intruder}",
            f"/announce?{intruder}&passkey=wrong-passkey-1234",
            f"/announce/{PASSKEY[:-1]}?{intruder}",
            f"/scrape?info_hash={quote_from_bytes(ih)}",
            f"/scrape/wrong-passkey-1234?info_hash={quote_from_bytes(ih)}",
        ):
            r = t.anon.get(url)
            assert r.status_code == 200 and bdecode(r.content) == REFUSED, url
        # The intruder was not stored: the swarm is empty to a legitimate peer and to scrape.
        legit = t.announce(ih, peer_id(1), 7001, left=10)
        assert legit[b"peers"] == b"" and (legit[b"complete"], legit[b"incomplete"]) == (0, 1)
        assert t.scrape(ih)[b"files"][ih] == {b"complete": 0, b"downloaded": 0, b"incomplete": 1}
        # The legitimate forms: /announce/<passkey> (what agents use), ?passkey=, /scrape/<passkey>.
        assert b"interval" in bdecode(
            t.anon.get(f"/announce/{PASSKEY}?{_query(ih, peer_id(2), 7002)}").content
        )
        assert b"interval" in bdecode(
            t.anon.get(f"/announce?{_query(ih, peer_id(3), 7003)}&passkey={PASSKEY}").content
        )
        assert sorted(compact_ports(t.announce(ih, peer_id(1), 7001, left=10)[b"peers"])) == [7002, 7003]
        metrics = t.anon.get("/metrics").text
        assert 'tracker_auth_refusals_total{reason="passkey"} 6.0' in metrics


@pytest.mark.parametrize("trusted", [False, True])
def test_announce_ip_is_ignored_unless_trusted(store_settings: TrackerSettings, trusted: bool) -> None:
    with run_server(replace(store_settings, trust_announce_ip=trusted)) as t:
        ih = infohash(3)
        t.announce(ih, peer_id(1), 6001, left=0, ip="10.9.8.7")  # from 127.0.0.1
        reply = t.announce(ih, peer_id(2), 6002, left=5, compact=0)
        (peer,) = reply[b"peers"]
        assert peer[b"port"] == 6001
        assert peer[b"ip"] == (b"10.9.8.7" if trusted else b"127.0.0.1")


def test_insecure_no_token_opens_everything() -> None:
    from tracker.errors import ConfigError

    with pytest.raises(ConfigError, match="--token-file"):
        TrackerSettings(announce_passkey=PASSKEY)
    with pytest.raises(ConfigError, match="--announce-passkey-file"):
        TrackerSettings(token=TOKEN)
    with run_server(TrackerSettings(insecure_no_token=True)) as t:
        r = t.anon.post(f"/v1/leases/{'d' * 64}", json={"node_id": "n"})
        assert r.status_code == 200 and r.json()["granted"]
        assert t.anon.get("/v1/models").status_code == 200
        assert t.anon.put(f"/v1/manifests/o/m/{COMMIT}", json={"files": []}).json()["published"] is False
        assert b"interval" in bdecode(t.anon.get(f"/announce?{_query(infohash(4), peer_id(1), 9)}").content)


def test_the_api_served_alone_checks_the_passkey_too() -> None:
    from starlette.testclient import TestClient

    from tracker.api import create_api
    from tracker.metrics import Metrics
    from tracker.stores import open_store

    api = create_api(SETTINGS, open_store(SETTINGS), Metrics())
    query = _query(infohash(5), peer_id(1), 9)
    with TestClient(api, client=("127.0.0.1", 50000)) as client:
        for url in (f"/announce?{query}", f"/announce/wrong-passkey-1234?{query}", f"/scrape?{query}"):
            assert bdecode(client.get(url).content) == REFUSED, url
        assert b"interval" in bdecode(client.get(f"/announce/{PASSKEY}?{query}").content)
        assert b"files" in bdecode(client.get(f"/scrape/{PASSKEY}?{query}").content)


# -- the command line, and what reaches its log --------------------------------------------


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracker", "serve", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _secret(tmp_path: Path, name: str, value: str) -> str:
    path = tmp_path / name
    path.write_text(value + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token-file", "/nonexistent/token"], "cannot read --token-file /nonexistent/token"),
        ([], "no write token"),
        (["--token-file", "{token}"], "no announce passkey: pass --announce-passkey-file FILE"),
        (
            ["--token-file", "{token}", "--announce-passkey-file", "{token}"],
            "--token-file and --announce-passkey-file hold the same secret",
        ),
        (
            ["--token-file", "{token}", "--publisher-token-file", "{token}", "--insecure-no-token"],
            "--token-file and --publisher-token-file hold the same secret",
        ),
        (
            ["--token-file", "{token}", "--announce-passkey-file", "{slashed}"],
            "only letters, digits and - . _ ~",
        ),
        (["--insecure-no-token", "--redis", "http://x"], "--redis must be a redis://"),
        (["--insecure-no-token", "--redis", "redis://127.0.0.1:1/0"], "cannot reach Redis"),
        (["--insecure-no-token", "--redis", "redis://127.0.0.1:1/0", "--db", "x.db"], "choose one store"),
    ],
)
def test_startup_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    files = {
        "token": _secret(tmp_path, "token", TOKEN),
        "slashed": _secret(tmp_path, "slashed", "pass/key-123"),
    }
    proc = _serve("--port", str(free_port()), *(a.format(**files) for a in args))
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        kill_process(proc)
    assert proc.returncode != 0
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert TOKEN not in err


def test_serve_from_environment_keeps_secrets_out_of_its_log(tmp_path: Path) -> None:
    """`tracker serve` at DEBUG, options from WEIGHTSWARM_*: legitimate and refused requests with
    every secret, and none of them in the output."""
    port = free_port()
    proc = _serve(
        env={
            "WEIGHTSWARM_PORT": str(port),
            "WEIGHTSWARM_TOKEN_FILE": _secret(tmp_path, "token", TOKEN),
            "WEIGHTSWARM_PUBLISHER_TOKEN_FILE": _secret(tmp_path, "publisher", PUBLISHER_TOKEN),
            "WEIGHTSWARM_READ_TOKEN_FILE": _secret(tmp_path, "read", READ),
            "WEIGHTSWARM_ANNOUNCE_PASSKEY_FILE": _secret(tmp_path, "passkey", PASSKEY),
            "WEIGHTSWARM_DB": str(tmp_path / "t.db"),
            "WEIGHTSWARM_INTERVAL": "45",
            "WEIGHTSWARM_LOG_LEVEL": "DEBUG",
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
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            query = _query(infohash(3), peer_id(1), 9)
            assert bdecode(http.get(f"/announce/{PASSKEY}?{query}").content)[b"interval"] == 45
            assert bdecode(http.get(f"/announce?{query}&passkey={PASSKEY}").content)[b"interval"] == 45
            assert bdecode(http.get(f"/scrape/{PASSKEY}?{query}").content)[b"files"]
            assert bdecode(http.get(f"/announce/not-{PASSKEY}?{query}").content) == REFUSED
            assert http.get(f"/announce/{PASSKEY}/extra?{query}").status_code == 404  # reaches the API
            assert http.get(f"/scrape/{PASSKEY}/").status_code in (307, 404)
            r = http.post(f"/v1/leases/{'e' * 64}", json={"node_id": "n"}, headers=AUTH)
            assert r.status_code == 200
            assert http.post(f"/v1/leases/{'e' * 64}", json={"node_id": "n"}).status_code == 401
            assert (
                http.post(f"/v1/leases/{'e' * 64}", json={"node_id": "n"}, headers=PUBLISHER).status_code
                == 403
            )
            assert http.get("/v1/models", headers=READER).status_code == 200
            bad = {"Authorization": f"Bearer {TOKEN}x"}
            assert http.get("/v1/models", headers=bad).status_code == 401
            manifest = {"revision": "main", "files": [], "signature": SIGNATURE}
            assert (
                http.put(f"/v1/manifests/o/m/{COMMIT}", json=manifest, headers=PUBLISHER).status_code == 201
            )
            agent_write = {"revision": "main", "files": []}
            assert http.put(f"/v1/manifests/o/m/{COMMIT}", json=agent_write, headers=AUTH).status_code == 403
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    log = out + err
    assert (tmp_path / "t.db").exists()
    assert "/v1/leases" in log and "/v1/manifests/o/m" in log, "API requests are logged"
    assert "/announce/*** 404" in log and "/announce/*** refused (passkey) from 127.0.0.1" in log
    for secret in (TOKEN, PUBLISHER_TOKEN, READ, PASSKEY):
        assert secret not in log, f"a secret reached the log: {secret[:6]}..."


def test_settings_validation() -> None:
    from tracker.errors import ConfigError

    for bad in ({"interval": 0}, {"max_lease_holders": 0}, {"min_interval": 100}, {"read_token": PASSKEY}):
        with pytest.raises(ConfigError):
            replace(SETTINGS, **bad)
