"""How the tracker lets a cluster recover: an info dict reported wrong is quarantined so a
verified one can replace it, and a lease holder whose reported bytes stop moving can be taken over.

Both stores (SQLite and Redis), through the real HTTP app.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import replace

from tests.support.trackerkit import (
    AUTH,
    PUBLISHER,
    SETTINGS,
    make_info,
    run_server,
)
from tracker.settings import TrackerSettings

TRUE_BYTES = bytes(range(256)) * 160  # 40 KiB: three 16 KiB pieces
POISON_BYTES = bytes(reversed(range(256))) * 160


def _poisoned() -> tuple[str, bytes, bytes]:
    """(blob id of TRUE_BYTES, its right info dict, an info dict of other bytes of the same size under
    that blob id: what a poisoner publishes)."""
    blob_id, good = make_info(TRUE_BYTES)
    _, bad = make_info(POISON_BYTES, name=blob_id)
    return blob_id, good, bad


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def test_a_report_quarantines_the_reported_dict_and_a_verified_one_replaces_it(
    store_settings: TrackerSettings,
) -> None:
    blob_id, good, bad = _poisoned()
    url = f"/v1/blobs/{blob_id}/metainfo"
    with run_server(store_settings) as t:
        assert t.http.put(url, content=bad, headers=AUTH).status_code == 201
        assert t.http.put(url, content=good, headers=AUTH).status_code == 409, "first publish wins"

        report = {"infohash": _sha1(bad), "reason": "sha256 mismatch", "node_id": "node-h"}
        assert t.anon.post(f"{url}/report", json=report).status_code == 401
        assert t.http.post(f"{url}/report", json=report, headers=PUBLISHER).status_code == 403
        stale = t.http.post(f"{url}/report", json={**report, "infohash": _sha1(good)}, headers=AUTH)
        assert stale.json() == {"quarantined": False, "infohash": _sha1(good), "current": _sha1(bad)}
        assert t.http.get(url).content == bad, "a report naming another dict removes nothing"

        done = t.http.post(f"{url}/report", json=report, headers=AUTH)
        assert done.json() == {"quarantined": True, "infohash": _sha1(bad), "current": None}
        assert t.http.get(url).status_code == 404
        assert t.http.get(f"/v1/blobs/{blob_id}").json()["infohash"] is None
        again = t.http.put(url, content=bad, headers=AUTH)
        assert again.status_code == 409 and "quarantined" in again.json()["detail"]

        assert t.http.put(url, content=good, headers=AUTH).status_code == 201
        assert t.http.get(url).content == good
        # The poisoner's dict stays refused while the hold lasts, also once the blob has none again.
        assert t.http.post(f"{url}/report", json={**report, "infohash": _sha1(good)}, headers=AUTH).json()[
            "quarantined"
        ]
        assert t.http.put(url, content=bad, headers=AUTH).status_code == 409
        assert t.http.put(url, content=good, headers=AUTH).status_code == 409, "held too, once reported"
        records = t.http.get(f"{url}/quarantine").json()["quarantined"]
        assert [(r["infohash"], r["reason"], r["reporter"], r["address"]) for r in records] == [
            (_sha1(bad), "sha256 mismatch", "node-h", "127.0.0.1"),
            (_sha1(good), "sha256 mismatch", "node-h", "127.0.0.1"),
        ]
        assert t.anon.get(f"{url}/quarantine").status_code == 401
        assert "tracker_metainfo_quarantined_total 2.0" in t.http.get("/metrics").text


def test_the_quarantine_hold_ends(store_settings: TrackerSettings) -> None:
    blob_id, _good, bad = _poisoned()
    url = f"/v1/blobs/{blob_id}/metainfo"
    with run_server(replace(store_settings, quarantine_hold=1.0)) as t:
        t.http.put(url, content=bad, headers=AUTH).raise_for_status()
        report = {"infohash": _sha1(bad), "reason": "wrong"}
        assert t.http.post(f"{url}/report", json=report, headers=AUTH).json()["quarantined"]
        assert t.http.put(url, content=bad, headers=AUTH).status_code == 409
        time.sleep(1.2)
        assert t.http.put(url, content=bad, headers=AUTH).status_code == 201


def test_a_holder_whose_bytes_stop_moving_can_be_taken_over(store_settings: TrackerSettings) -> None:
    url = f"/v1/leases/{'ab' * 32}"
    with run_server(store_settings) as t:

        def ask(node: str, stale_after: float | None = 1.0) -> dict:
            body = {"node_id": node, "ttl": 60, "stale_after": stale_after}
            return dict(t.http.post(url, json=body, headers=AUTH).json())

        def beat(node: str, progress: int | None) -> int:
            body = {"node_id": node, "ttl": 60, "progress": progress}
            return t.http.post(f"{url}/heartbeat", json=body, headers=AUTH).status_code

        first = ask("holder")
        assert first["granted"] and first["leases"][0]["progress"] == 0
        denied = ask("waiter")
        assert not denied["granted"] and denied["leases"][0]["idle"] < 1.0, "a fresh grant is not idle"
        for done in (100, 200, 300):  # bytes keep arriving: the holder keeps its lease
            time.sleep(0.6)
            assert beat("holder", done) == 200
            assert not ask("waiter")["granted"]
        # Heartbeats go on, the bytes do not: after stale_after the lease may be taken over.
        time.sleep(0.6)
        assert beat("holder", 300) == 200
        assert not ask("waiter")["granted"], "idle for 0.6 s only"
        time.sleep(0.6)
        assert beat("holder", 300) == 200
        still = ask("waiter", stale_after=None)
        assert not still["granted"], "without stale_after nobody takes a live lease"
        assert still["leases"][0]["progress"] == 300 and still["leases"][0]["idle"] >= 1.0
        taken = ask("waiter")
        assert taken["granted"] and taken["holders"] == ["waiter"]
        assert beat("holder", 300) == 409, "the stalled holder learns it lost the lease"
        # A heartbeat without `progress` (an older agent) counts as progress.
        time.sleep(1.1)
        assert beat("waiter", None) == 200
        assert not ask("third")["granted"]
        state = t.http.get(f"/v1/blobs/{'ab' * 32}").json()["lease"]
        assert state["holder"] == "waiter" and state["idle"] < 1.0
        assert "tracker_lease_takeovers_total 1.0" in t.http.get("/metrics").text


def test_a_grant_counts_the_seeders_after_it(store_settings: TrackerSettings) -> None:
    """A grant says how many seeders the blob has, counted after granting: the new holder learns of a
    seeder that announced since it last looked without waiting for its own announce
    (agent.fetch.sources.policy `_seeder_appeared`). A refusal says nothing of seeders (the asker waits;
    it does not pull)."""
    blob_id, info = make_info(TRUE_BYTES)
    ih = hashlib.sha1(info).digest()
    with run_server(store_settings) as t:

        def ask(node: str) -> dict:
            return dict(t.http.post(f"/v1/leases/{blob_id}", json={"node_id": node, "ttl": 60}).json())

        first = ask("a")
        assert first["granted"] and first["seeders"] == 0, "no metainfo yet: nobody can seed it"
        assert "seeders" not in ask("b")
        t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info).raise_for_status()
        assert ask("a")["seeders"] == 0, "metainfo, no seeder"
        t.announce(ih, b"-WS0100-" + bytes(12), 7001, left=0, event="completed")
        t.announce(ih, b"-WS0100-" + bytes(11) + b"\x01", 7002, left=5)  # a leecher is not a seeder
        assert ask("a")["seeders"] == 1


def test_a_holder_that_asks_again_starts_its_stall_clock_over(store_settings: TrackerSettings) -> None:
    """A restarted agent asks for its lease again: from then on it is a fresh holder, not one idle for
    as long as its process was dead (the chaos run's all-at-once scenario: a waiter took over a holder
    that had restarted 7 s before, and both pulled the blob from the origin)."""
    url = f"/v1/leases/{'ef' * 32}"
    with run_server(store_settings) as t:

        def ask(node: str) -> dict:
            body = {"node_id": node, "ttl": 60, "stale_after": 1.0}
            return dict(t.http.post(url, json=body, headers=AUTH).json())

        beat = {"node_id": "holder", "ttl": 60, "progress": 500}
        assert ask("holder")["granted"]
        assert t.http.post(f"{url}/heartbeat", json=beat, headers=AUTH).status_code == 200
        time.sleep(1.2)  # the holder's process dies: no bytes, no heartbeat
        again = ask("holder")  # ... and its agent, restarted, asks again
        assert again["granted"] and again["leases"][0]["progress"] == 0 and again["leases"][0]["idle"] < 1.0
        assert not ask("waiter")["granted"], "a holder that just started over is not stalled"
        time.sleep(1.2)  # it makes no progress this time either: now it may be taken over
        assert ask("waiter")["granted"]


def test_a_sqlite_file_from_before_lease_progress_is_upgraded(tmp_path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as old:
        old.execute(
            "CREATE TABLE leases (blob_id TEXT NOT NULL, node_id TEXT NOT NULL, expires REAL NOT NULL, "
            "PRIMARY KEY (blob_id, node_id))"
        )
        old.execute("INSERT INTO leases VALUES (?, ?, ?)", ("cd" * 32, "old-holder", time.time() + 60))
    old.close()
    with run_server(replace(SETTINGS, db_path=db)) as t:
        url = f"/v1/leases/{'cd' * 32}"
        # Its lease was timed by the wall clock (leases are monotonic now): dropped, not misread as a
        # lease for decades. The lease is free: the old holder's next heartbeat reclaims it.
        assert t.http.get(f"/v1/blobs/{'cd' * 32}").json()["holders"] == []
        lost = t.http.post(f"{url}/heartbeat", json={"node_id": "old-holder", "progress": 5}, headers=AUTH)
        assert lost.status_code == 404
        body = {"node_id": "old-holder", "progress": 5, "reclaim": True}
        beat = t.http.post(f"{url}/heartbeat", json=body, headers=AUTH)
        assert beat.status_code == 200 and beat.json()["leases"][0]["progress"] == 5
        denied = t.http.post(url, json={"node_id": "n", "stale_after": 60}, headers=AUTH).json()
        assert not denied["granted"] and denied["holders"] == ["old-holder"]
