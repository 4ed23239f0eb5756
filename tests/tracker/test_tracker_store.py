"""The same suite against both stores (SQLite and Redis), through the real HTTP app."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tests.support.procs import loop_until
from tests.support.trackerkit import (
    AUTH,
    PUBLISHER,
    SETTINGS,
    SIGNATURE,
    compact_ports,
    flush_redis,
    infohash,
    make_info,
    peer_id,
    run_server,
)
from tracker.settings import TrackerSettings
from wirekit.bencode import bdecode


def test_announce_hands_out_others_seeders_first(store_settings: TrackerSettings) -> None:
    with run_server(store_settings) as t:
        ih = infohash(1)
        first = t.announce(ih, peer_id(1), 7001, left=100, event="started")
        assert first[b"peers"] == b"" and first[b"incomplete"] == 1 and first[b"complete"] == 0
        assert first[b"interval"] == store_settings.interval
        assert first[b"min interval"] == store_settings.min_interval
        for n in range(2, 6):
            t.announce(ih, peer_id(n), 7000 + n, left=100)
        t.announce(ih, peer_id(9), 7009, left=0)
        reply = t.announce(ih, peer_id(1), 7001, left=100, numwant=2)
        ports = compact_ports(reply[b"peers"])
        assert len(ports) == 2
        assert ports[0] == 7009, "the seeder comes first for a leecher"
        assert 7001 not in ports, "a peer is never handed itself"
        assert (reply[b"complete"], reply[b"incomplete"]) == (1, 5)
        everyone = t.announce(ih, peer_id(1), 7001, left=100, numwant=500)
        assert sorted(compact_ports(everyone[b"peers"])) == [7002, 7003, 7004, 7005, 7009]
        seeder_view = t.announce(ih, peer_id(9), 7009, left=0)
        assert sorted(compact_ports(seeder_view[b"peers"])) == [7001, 7002, 7003, 7004, 7005]


def test_dictionary_form_ipv6_and_ip_param(store_settings: TrackerSettings) -> None:
    with run_server(replace(store_settings, trust_announce_ip=True)) as t:
        ih = infohash(2)
        t.announce(ih, peer_id(1), 6001, left=0, ip="10.1.2.3")
        t.announce(ih, peer_id(2), 6002, left=0, ip="fd00::7")
        t.announce(ih, peer_id(3), 6003, left=0, ip="not-an-ip")  # ignored: source address used
        reply = t.announce(ih, peer_id(4), 6004, left=5)
        v4 = reply[b"peers"]
        assert sorted(compact_ports(v4)) == [6001, 6003]
        assert {v4[i : i + 4] for i in range(0, len(v4), 6)} == {bytes([10, 1, 2, 3]), bytes([127, 0, 0, 1])}
        assert reply[b"peers6"] == bytes.fromhex("fd000000000000000000000000000007") + (6002).to_bytes(
            2, "big"
        )
        full = t.announce(ih, peer_id(4), 6004, left=5, compact=0)
        peers = {p[b"port"]: p for p in full[b"peers"]}
        assert peers[6001][b"ip"] == b"10.1.2.3" and peers[6001][b"peer id"] == peer_id(1)
        assert peers[6002][b"ip"] == b"fd00::7"
        no_id = t.announce(ih, peer_id(4), 6004, left=5, compact=0, no_peer_id=1)
        assert all(b"peer id" not in p for p in no_id[b"peers"])


def test_events_scrape_and_numwant_cap(store_settings: TrackerSettings) -> None:
    settings = replace(store_settings, max_numwant=3)
    with run_server(settings) as t:
        ih, unknown = infohash(3), infohash(4)
        for n in range(1, 7):
            t.announce(ih, peer_id(n), 5000 + n, left=10, event="started")
        assert len(compact_ports(t.announce(ih, peer_id(1), 5001, numwant=10**12)[b"peers"])) == 3
        assert t.announce(ih, peer_id(1), 5001, numwant=0)[b"peers"] == b""
        t.announce(ih, peer_id(2), 5002, left=0, event="completed")
        t.announce(ih, peer_id(3), 5003, left=10, event="stopped")
        files = t.scrape(ih, unknown)[b"files"]
        assert files[ih] == {b"complete": 1, b"downloaded": 1, b"incomplete": 4}
        assert files[unknown] == {b"complete": 0, b"downloaded": 0, b"incomplete": 0}
        stopped_view = t.announce(ih, peer_id(1), 5001, numwant=50)
        assert 5003 not in compact_ports(stopped_view[b"peers"])


def test_peers_expire_after_missed_announces(store_settings: TrackerSettings) -> None:
    settings = replace(store_settings, interval=1, min_interval=0, peer_ttl_factor=1.0)
    with run_server(settings) as t:
        ih = infohash(5)
        t.announce(ih, peer_id(1), 4001, left=0)
        assert compact_ports(t.announce(ih, peer_id(2), 4002)[b"peers"]) == [4001]
        # Peer 2 keeps announcing; peer 1 went silent and must drop out within a few TTLs.
        loop_until(
            lambda: t.announce(ih, peer_id(2), 4002)[b"peers"] == b"",
            timeout=15,
            interval=0.3,
            what="silent peer to expire",
        )
        assert t.scrape(ih)[b"files"][ih][b"complete"] == 0


def test_metainfo_publish_is_validated_idempotent_and_conflicts(store_settings: TrackerSettings) -> None:
    with run_server(store_settings) as t:
        blob_id, info = make_info(b"x" * 40_000)
        url = f"/v1/blobs/{blob_id}/metainfo"
        assert t.http.get(url).status_code == 404
        created = t.http.put(url, content=info, headers=AUTH)
        assert created.status_code == 201, created.text
        import hashlib

        assert created.json() == {"infohash": hashlib.sha1(info).hexdigest()}
        assert t.http.put(url, content=info, headers=AUTH).status_code == 200
        got = t.http.get(url)
        assert got.content == info and got.headers["content-type"] == "application/x-bittorrent"
        _, other = make_info(b"y" * 40_000, name=blob_id)
        conflict = t.http.put(url, content=other, headers=AUTH)
        assert conflict.status_code == 409 and blob_id in conflict.json()["detail"]
        assert t.http.get(url).content == info
        state = t.http.get(f"/v1/blobs/{blob_id}").json()
        assert state == {
            "blob_id": blob_id,
            "infohash": hashlib.sha1(info).hexdigest(),
            "seeders": 0,
            "leechers": 0,
            "lease": None,
            "holders": [],
        }


def test_leases_one_holder_idempotent_release_and_expiry(store_settings: TrackerSettings) -> None:
    with run_server(store_settings) as t:
        blob_id = "ab" * 32
        url = f"/v1/leases/{blob_id}"
        first = t.http.post(url, json={"node_id": "node-a", "ttl": 30}, headers=AUTH).json()
        assert first["granted"] and first["holder"] == "node-a" and 0 < first["expires_in"] <= 30
        again = t.http.post(url, json={"node_id": "node-a", "ttl": 30}, headers=AUTH).json()
        assert again["granted"] and again["holders"] == ["node-a"]
        other = t.http.post(url, json={"node_id": "node-b", "ttl": 30}, headers=AUTH).json()
        assert not other["granted"] and other["holder"] == "node-a"
        assert t.http.get(f"/v1/blobs/{blob_id}").json()["lease"]["holder"] == "node-a"
        beat = t.http.post(f"{url}/heartbeat", json={"node_id": "node-a", "ttl": 30}, headers=AUTH)
        assert beat.status_code == 200 and beat.json()["granted"]
        assert t.http.post(f"{url}/heartbeat", json={"node_id": "node-b"}, headers=AUTH).status_code == 409
        assert t.http.delete(url, params={"node_id": "node-a"}, headers=AUTH).json() == {"released": True}
        assert t.http.post(f"{url}/heartbeat", json={"node_id": "node-a"}, headers=AUTH).status_code == 404
        short = t.http.post(url, json={"node_id": "node-b", "ttl": 0.5}, headers=AUTH).json()
        assert short["granted"]
        # node-b dies (no heartbeat): its lease lapses and node-c gets it.
        loop_until(
            lambda: t.http.post(url, json={"node_id": "node-c", "ttl": 30}, headers=AUTH).json()["granted"],
            timeout=15,
            interval=0.2,
            what="expired lease to be granted again",
        )
        assert t.http.get(f"/v1/blobs/{blob_id}").json()["holders"] == ["node-c"]


@pytest.mark.parametrize("step", [600.0, -600.0])
def test_a_wall_clock_step_moves_no_lease_and_no_peer(
    store_settings: TrackerSettings, step: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracker host's clock is stepped by 10 minutes mid-lease (NTP, a resumed VM). On wall time a
    step forward expired every lease at once (a second origin download per blob), a step back kept
    dead ones 10 minutes, and with Redis a peer a replica with a slow clock stored was expired for the
    others. Leases and peers are timed by a clock no step moves (monotonic; Redis's own TIME)."""
    real, offset = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + offset[0])
    with run_server(store_settings) as t:
        blob_id, ih = "ef" * 32, infohash(9)
        url = f"/v1/leases/{blob_id}"
        assert t.http.post(url, json={"node_id": "node-a", "ttl": 3}, headers=AUTH).json()["granted"]
        t.announce(ih, peer_id(1), 4101, left=0)
        offset[0] = step
        assert not t.http.post(url, json={"node_id": "node-b", "ttl": 30}, headers=AUTH).json()["granted"]
        t.announce(ih, peer_id(2), 4102, left=0)
        loop_until(  # node-a's lease lapses after its 3 s, not 10 minutes later
            lambda: t.http.post(url, json={"node_id": "node-c", "ttl": 30}, headers=AUTH).json()["granted"],
            timeout=15,
            interval=0.3,
            what="the lease to lapse after its TTL",
        )
        offset[0] = 0.0  # stepped back (or: the other replica's clock)
        assert t.scrape(ih)[b"files"][ih][b"complete"] == 2


def test_a_holder_reclaims_a_lapsed_lease_unless_another_took_it(store_settings: TrackerSettings) -> None:
    with run_server(store_settings) as t:
        url = f"/v1/leases/{'5a' * 32}"
        assert t.http.post(url, json={"node_id": "node-a", "ttl": 0.5}, headers=AUTH).json()["granted"]
        beat = {"node_id": "node-a", "ttl": 30, "reclaim": True}
        loop_until(lambda: not t.http.get(f"/v1/blobs/{'5a' * 32}").json()["holders"], timeout=10)
        assert t.http.post(f"{url}/heartbeat", json={"node_id": "node-a"}, headers=AUTH).status_code == 404
        assert t.http.post(f"{url}/heartbeat", json=beat, headers=AUTH).json()["holders"] == ["node-a"]
        assert not t.http.post(url, json={"node_id": "node-b", "ttl": 30}, headers=AUTH).json()["granted"]
        t.http.delete(url, params={"node_id": "node-a"}, headers=AUTH)
        assert t.http.post(url, json={"node_id": "node-b", "ttl": 30}, headers=AUTH).json()["granted"]
        lost = t.http.post(f"{url}/heartbeat", json=beat, headers=AUTH)
        assert lost.status_code == 409, "node-b holds it now"


@pytest.mark.redis
def test_after_redis_lost_its_data_leases_go_back_to_their_holders_first(redis_url: str) -> None:
    """Redis restarted empty under a running tracker: for `lease_amnesty` seconds a node asking for a
    lease is refused, so the holder still downloading reclaims it (else: 2 x S of origin egress)."""
    import redis

    flush_redis(redis_url)
    with run_server(replace(SETTINGS, redis_url=redis_url, lease_amnesty=3.0)) as t:
        url = f"/v1/leases/{'6b' * 32}"
        assert t.http.post(url, json={"node_id": "holder", "ttl": 30}, headers=AUTH).json()["granted"]
        assert t.http.get("/readyz").json()["epoch"]
        with redis.Redis.from_url(redis_url) as r:
            r.flushall()  # what a restart without persistence leaves
        waiter = t.http.post(url, json={"node_id": "waiter", "ttl": 30}, headers=AUTH).json()
        assert not waiter["granted"] and waiter["holder"] is None
        assert 0 < waiter["retry_in"] <= 3.0, "when the amnesty ends: ask again then"
        beat = t.http.post(f"{url}/heartbeat", json={"node_id": "holder", "reclaim": True}, headers=AUTH)
        assert beat.status_code == 200 and beat.json()["holders"] == ["holder"]
        other = f"/v1/leases/{'7c' * 32}"
        loop_until(  # after the amnesty, leases are granted as before
            lambda: t.http.post(other, json={"node_id": "waiter", "ttl": 30}, headers=AUTH).json()["granted"],
            timeout=15,
            interval=0.5,
        )


def test_max_lease_holders(store_settings: TrackerSettings) -> None:
    with run_server(replace(store_settings, max_lease_holders=2)) as t:
        url = f"/v1/leases/{'cd' * 20}"
        results = [
            t.http.post(url, json={"node_id": f"n{i}", "ttl": 30}, headers=AUTH).json() for i in range(3)
        ]
        assert [r["granted"] for r in results] == [True, True, False]
        assert sorted(results[2]["holders"]) == ["n0", "n1"]


def test_manifests_resolve_and_models_health(store_settings: TrackerSettings) -> None:
    with run_server(store_settings) as t:
        blob_id, info = make_info(b"w" * 20_000)
        ih = t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).json()["infohash"]
        commit1, commit2 = "1" * 40, "2" * 40
        files = [
            {"path": "model.safetensors", "size": 20_000, "blob_id": blob_id, "infohash": ih},
            {"path": "sub/config.json", "size": 12, "blob_id": "e" * 40, "infohash": None},
        ]
        r = t.http.put(
            f"/v1/manifests/org/model/{commit1}",
            json={"revision": "main", "files": files, "signature": SIGNATURE},
            headers=PUBLISHER,
        )
        assert r.status_code == 201, r.text
        assert t.http.get("/v1/resolve/org/model/main").json() == {"commit": commit1}
        got = t.http.get(f"/v1/manifests/org/model/{commit1}").json()
        assert got["files"] == files and got["repo_id"] == "org/model" and got["signature"] == SIGNATURE
        t.http.put(
            f"/v1/manifests/org/model/{commit2}",
            json={"revision": "main", "files": files[:1], "signature": SIGNATURE},
            headers=PUBLISHER,
        ).raise_for_status()
        assert t.http.get("/v1/resolve/org/model/main").json() == {"commit": commit2}, "latest publish wins"
        assert t.http.get("/v1/resolve/org/model/dev").status_code == 404
        assert t.http.get(f"/v1/manifests/org/other/{commit1}").status_code == 404
        t.announce(bytes.fromhex(ih), peer_id(1), 3001, left=0)
        t.announce(bytes.fromhex(ih), peer_id(2), 3002, left=0)
        t.announce(bytes.fromhex(ih), peer_id(3), 3003, left=9)
        (model,) = t.http.get("/v1/models").json()["models"]
        assert model["repo_id"] == "org/model" and model["revisions"] == {"main": commit2}
        by_commit = {c["commit"]: c for c in model["commits"]}
        assert by_commit[commit2]["complete_copies"] == 2
        assert by_commit[commit2]["files"][0]["leechers"] == 1
        assert by_commit[commit1]["complete_copies"] == 0, "a file nobody seeds means no complete copy"


def _file(
    path: str = "model.safetensors", size: int = 5, blob: str = "d", infohash: str | None = None
) -> dict:
    return {"path": path, "size": size, "blob_id": blob * 64, "infohash": infohash}


def test_a_commits_manifest_never_changes(store_settings: TrackerSettings) -> None:
    """repo@commit is written once: the same files again are a no-op (200), other files 409, for the
    agent role and the publisher role alike, and a refused write changes nothing."""
    hub, local, commit = "acme/hub", "me/local", "a" * 40
    files = [_file(), _file("config.json", 7, "c")]
    variants = {
        "another size": [_file(size=6), files[1]],
        "another blob": [_file(blob="e"), files[1]],
        "another path": [_file("other.safetensors"), files[1]],
        "a file more": [*files, _file("extra.bin", 1, "f")],
        "a file less": files[:1],
    }
    with run_server(store_settings) as t:
        assert t.http.put(f"/v1/manifests/{hub}/{commit}", json={"files": files}).status_code == 201
        again = t.http.put(f"/v1/manifests/{hub}/{commit}", json={"files": list(reversed(files))})
        assert again.status_code == 200, "the same files (in any order) are a no-op"
        # A node that seeds the blobs now knows their infohashes: still the same files, nothing changes.
        seeded = [_file(infohash="9" * 40), files[1]]
        assert t.http.put(f"/v1/manifests/{hub}/{commit}", json={"files": seeded}).status_code == 200
        for what, other in variants.items():
            r = t.http.put(f"/v1/manifests/{hub}/{commit}", json={"files": other})
            assert r.status_code == 409, (what, r.text)
            assert f"{hub}@{commit} already has a manifest with other files" in r.json()["detail"]
        assert t.http.get(f"/v1/manifests/{hub}/{commit}").json()["files"] == files

        signed = {"revision": "main", "files": files, "signature": SIGNATURE}
        url = f"/v1/manifests/{local}/{commit}"
        assert t.anon.put(url, json=signed, headers=PUBLISHER).status_code == 201
        assert t.anon.put(url, json=signed, headers=PUBLISHER).status_code == 200
        for what, other in variants.items():
            r = t.anon.put(
                f"/v1/manifests/{local}/{commit}",
                json={"revision": "evil", "files": other, "signature": SIGNATURE},
                headers=PUBLISHER,
            )
            assert r.status_code == 409, (what, r.text)
        assert t.http.get(f"/v1/manifests/{local}/{commit}").json()["files"] == files
        assert t.http.get(f"/v1/resolve/{local}/evil").status_code == 404, "a refused write moves no ref"

        # The publisher's conflicting write on a hub model's commit does not close the repo to agents.
        fewer = {"files": files[:1], "signature": SIGNATURE}
        r = t.anon.put(f"/v1/manifests/{hub}/{commit}", json=fewer, headers=PUBLISHER)
        assert r.status_code == 409
        assert t.http.put(f"/v1/manifests/{hub}/{'b' * 40}", json={"files": files}).status_code == 201
        assert t.http.get(f"/v1/manifests/{hub}/{commit}").json()["published"] is False


def test_agent_writes_never_move_refs(store_settings: TrackerSettings) -> None:
    """Only the publisher points a revision at a commit; an agent's `revision` is ignored."""
    old, new = "1" * 40, "2" * 40
    files, newer = [_file()], [_file(blob="e")]
    with run_server(store_settings) as t:
        r = t.http.put(f"/v1/manifests/acme/hub/{old}", json={"revision": "main", "files": files})
        assert r.status_code == 201 and r.json()["revision"] is None, r.text
        assert t.http.get(f"/v1/manifests/acme/hub/{old}").json()["signature"] is None
        assert t.http.get("/v1/resolve/acme/hub/main").status_code == 404
        (model,) = t.http.get("/v1/models").json()["models"]
        assert model["revisions"] == {} and [c["commit"] for c in model["commits"]] == [old]

        publish = {"revision": "main", "files": files, "signature": SIGNATURE}
        r = t.anon.put(f"/v1/manifests/me/local/{old}", json=publish, headers=PUBLISHER)
        assert r.status_code == 201 and r.json()["revision"] == "main"
        assert t.http.get("/v1/resolve/me/local/main").json() == {"commit": old}
        newer_publish = {"revision": "main", "files": newer, "signature": SIGNATURE}
        t.anon.put(f"/v1/manifests/me/local/{new}", json=newer_publish, headers=PUBLISHER).raise_for_status()
        assert t.http.get("/v1/resolve/me/local/main").json() == {"commit": new}
        # Rolling back: publishing the old files again (the same commit) moves the ref back.
        rollback = t.anon.put(f"/v1/manifests/me/local/{old}", json=publish, headers=PUBLISHER)
        assert rollback.status_code == 200
        assert t.http.get("/v1/resolve/me/local/main").json() == {"commit": old}
        # The publisher may (re)sign a commit an agent registered with the same files: it is then
        # published, and its ref moves.
        resign = {"revision": "v1", "files": files, "signature": SIGNATURE}
        assert t.anon.put(f"/v1/manifests/acme/hub/{old}", json=resign, headers=PUBLISHER).status_code == 200
        got = t.http.get(f"/v1/manifests/acme/hub/{old}").json()
        assert got["published"] is True and got["signature"] == SIGNATURE
        assert t.http.get("/v1/resolve/acme/hub/v1").json() == {"commit": old}


def test_publisher_manifests_carry_a_signature_agent_ones_none(store_settings: TrackerSettings) -> None:
    url = f"/v1/manifests/me/local/{'3' * 40}"
    files = [_file()]
    with run_server(store_settings) as t:
        for body in (
            {"revision": "main", "files": files},
            {"revision": "main", "files": files, "signature": None},
            {"revision": "main", "files": files, "signature": "bm90IGEgc2lnbmF0dXJl"},
            {"revision": "main", "files": files, "signature": SIGNATURE[:-4] + "!!=="},
        ):
            r = t.anon.put(url, json=body, headers=PUBLISHER)
            assert r.status_code == 400, (body, r.text)
            assert "signature" in r.json()["detail"]
        unsigned = t.anon.put(url, json={"files": files}, headers=PUBLISHER)
        assert "--publisher-signing-key-file" in unsigned.text
        r = t.anon.put(url, json={"files": files, "signature": 5}, headers=PUBLISHER)
        assert r.status_code == 422
        r = t.http.put(url, json={"files": files, "signature": SIGNATURE})
        assert r.status_code == 400 and "agent-role manifest has no signature" in r.json()["detail"]
        assert t.http.get(url).status_code == 404, "nothing was stored"
        assert t.http.get("/v1/resolve/me/local/main").status_code == 404
        assert t.http.get("/v1/models").json()["models"] == [], "the repo was not marked published either"


def test_wait_returns_when_a_seeder_appears(store_settings: TrackerSettings) -> None:
    with run_server(store_settings) as t:
        blob_id, info = make_info(b"v" * 20_000)
        quick = t.http.get(f"/v1/blobs/{blob_id}/wait", params={"timeout": 0.3}).json()
        assert quick["infohash"] is None and quick["seeders"] == 0
        ih = t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).json()["infohash"]
        import threading

        seeded = threading.Timer(0.5, lambda: t.announce(bytes.fromhex(ih), peer_id(1), 2001, left=0))
        seeded.start()
        try:
            state = t.http.get(f"/v1/blobs/{blob_id}/wait", params={"timeout": 20}).json()
        finally:
            seeded.join()
        assert state["infohash"] == ih and state["seeders"] == 1


@pytest.mark.redis
def test_two_replicas_share_one_redis(redis_url: str) -> None:
    flush_redis(redis_url)
    settings = replace(SETTINGS, redis_url=redis_url)
    with run_server(settings) as a, run_server(settings) as b:
        ih = infohash(7)
        a.announce(ih, peer_id(1), 8001, left=0)
        assert compact_ports(b.announce(ih, peer_id(2), 8002)[b"peers"]) == [8001]
        assert b.scrape(ih)[b"files"][ih][b"complete"] == 1
        url = f"/v1/leases/{'ef' * 32}"
        assert a.http.post(url, json={"node_id": "node-a"}, headers=AUTH).json()["granted"]
        denied = b.http.post(url, json={"node_id": "node-b"}, headers=AUTH).json()
        assert not denied["granted"] and denied["holder"] == "node-a"
        blob_id, info = make_info(b"z" * 30_000)
        a.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).raise_for_status()
        assert b.http.get(f"/v1/blobs/{blob_id}/metainfo").content == info
        published = {"revision": "main", "files": [], "signature": SIGNATURE}
        assert (
            a.http.put(f"/v1/manifests/o/p/{'8' * 40}", json=published, headers=PUBLISHER).status_code == 201
        )
        shadow = b.http.put(f"/v1/manifests/o/p/{'9' * 40}", json={"files": []}, headers=AUTH)
        assert shadow.status_code == 403, "the other replica knows the repo is published"
        other = {"revision": "main", "files": [_file()], "signature": SIGNATURE}
        conflict = b.http.put(f"/v1/manifests/o/p/{'8' * 40}", json=other, headers=PUBLISHER)
        assert conflict.status_code == 409, "the other replica knows the commit's files"


def test_sqlite_store_keeps_manifests_and_leases_across_restarts(tmp_path) -> None:
    settings = replace(SETTINGS, db_path=tmp_path / "t.db")
    blob_id, info = make_info(b"q" * 17_000)
    with run_server(settings) as t:
        t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).raise_for_status()
        t.http.put(
            f"/v1/manifests/o/m/{'3' * 40}",
            json={"revision": "v1", "files": [], "signature": SIGNATURE},
            headers=PUBLISHER,
        ).raise_for_status()
        assert t.http.post(f"/v1/leases/{blob_id}", json={"node_id": "n1"}, headers=AUTH).json()["granted"]
        t.http.put(
            f"/v1/manifests/o/pub/{'a' * 40}", json={"files": [], "signature": SIGNATURE}, headers=PUBLISHER
        ).raise_for_status()
    with run_server(settings) as t:
        assert t.http.get(f"/v1/blobs/{blob_id}/metainfo").content == info
        assert t.http.get("/v1/resolve/o/m/v1").json() == {"commit": "3" * 40}
        assert t.http.get(f"/v1/manifests/o/pub/{'a' * 40}").json()["published"] is True
        refused = t.http.put(f"/v1/manifests/o/pub/{'b' * 40}", json={"files": []}, headers=AUTH)
        assert refused.status_code == 403, "a restart does not reopen a published repo"
        assert not t.http.post(f"/v1/leases/{blob_id}", json={"node_id": "n2"}, headers=AUTH).json()[
            "granted"
        ]
        assert bdecode(t.http.get(f"/v1/blobs/{blob_id}/metainfo").content)[b"name"] == blob_id.encode()


def test_sqlite_leases_do_not_outlive_their_boot(tmp_path) -> None:
    """Lease times are monotonic, which counts from boot: a file opened in another boot (or on another
    host, or written by a tracker that timed leases by wall clock) loses its leases, nothing else."""
    import sqlite3

    settings = replace(SETTINGS, db_path=tmp_path / "t.db")
    blob_id, info = make_info(b"r" * 17_000)
    with run_server(settings) as t:
        t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).raise_for_status()
        assert t.http.post(f"/v1/leases/{blob_id}", json={"node_id": "n1"}, headers=AUTH).json()["granted"]
    with sqlite3.connect(settings.db_path) as db:
        db.execute("UPDATE lease_clock SET boot_id = 'another-boot'")
    with run_server(settings) as t:
        assert t.http.post(f"/v1/leases/{blob_id}", json={"node_id": "n2"}, headers=AUTH).json()["granted"]
        assert t.http.get(f"/v1/blobs/{blob_id}/metainfo").content == info


@pytest.mark.parametrize("event", ["started", "completed", "stopped", "update"])
def test_metrics_count_announces_by_event(event: str, tmp_path) -> None:
    with run_server(SETTINGS) as t:
        extra = {} if event == "update" else {"event": event}
        t.announce(infohash(9), peer_id(1), 1234, left=0, **extra)
        t.announce(infohash(9), b"short", 1234)  # refused: counted as error
        text = t.http.get("/metrics").text
        assert f'tracker_announces_total{{event="{event}"}} 1.0' in text
        assert 'tracker_announces_total{event="error"} 1.0' in text
        assert 'tracker_request_seconds_count{route="announce"}' in text
        expected_peers = 0 if event == "stopped" else 1
        assert f"tracker_peers {expected_peers}.0" in text


@pytest.mark.redis
def test_redis_outage_is_a_failure_reason_not_a_crash(tmp_path) -> None:
    from tests.support.trackerkit import redis_server

    with redis_server(tmp_path) as url:
        server = run_server(replace(SETTINGS, redis_url=url))
        t = server.__enter__()
    try:  # redis-server is stopped now; the tracker keeps answering
        reply = t.announce(infohash(11), peer_id(1), 9001)
        assert reply == {b"failure reason": b"tracker temporarily unavailable, retry later"}
        assert t.http.get("/readyz").status_code == 503
        assert t.http.get("/healthz").status_code == 200
        # The API says "unavailable, retry" (503, which agents wait out), not an unexpected 500.
        blob = "ab" * 32
        for method, path, body in (
            ("GET", f"/v1/blobs/{blob}", None),
            ("GET", f"/v1/blobs/{blob}/wait?timeout=0", None),
            ("POST", f"/v1/leases/{blob}", {"node_id": "n1", "ttl": 30}),
            ("GET", "/v1/models", None),
        ):
            resp = t.http.request(method, path, json=body, headers=AUTH)
            assert resp.status_code == 503, (path, resp.status_code, resp.text)
            assert "Redis unreachable" in resp.json()["detail"]
    finally:
        server.__exit__(None, None, None)


@pytest.mark.redis
def test_connections_pooled_before_a_redis_restart_fail_no_request(tmp_path) -> None:
    """After a Redis restart every connection pooled before it is dead, and each failed the first request
    that drew it (a 503, or an announce's failure reason), at any time later: in the chaos run up to 40 s
    after, and libtorrent's announce back-off then left those seeders unlisted for over a minute."""
    import asyncio

    from tests.support.procs import RedisProcess
    from tracker.store_redis import RedisStore

    server = RedisProcess(tmp_path)
    server.start()
    try:
        store = RedisStore(replace(SETTINGS, redis_url=server.url))
        blob = "ab" * 32

        async def around_a_restart() -> list[object]:
            await asyncio.gather(*(store.get_metainfo(blob) for _ in range(8)))  # eight pooled connections
            server.kill()
            server.start()
            got = await asyncio.gather(*(store.get_metainfo(blob) for _ in range(8)), return_exceptions=True)
            await store.close()
            return got

        assert asyncio.run(around_a_restart()) == [None] * 8
    finally:
        server.stop()


def test_an_interop_announce_needs_the_blobs_metainfo_and_loses_it_with_a_quarantine(
    store_settings: TrackerSettings,
) -> None:
    """The interop passkey announces only infohashes a blob's metainfo has (a relay, rank or place key
    never has one): before the metainfo, a failure and nothing stored; after it, listed; once the dict
    is quarantined, refused again. The agents' passkey is never asked for metainfo."""
    import hashlib
    from urllib.parse import quote_from_bytes

    interop = "test-interop-passkey-4567"
    with run_server(replace(store_settings, interop_passkey=interop)) as t:
        blob_id, info = make_info(b"i" * 40_000)
        ih = hashlib.sha1(info).digest()

        def stock(n: int) -> dict:
            query = f"info_hash={quote_from_bytes(ih)}&peer_id={quote_from_bytes(peer_id(n))}&port={7000 + n}"
            return dict(bdecode(t.anon.get(f"{t.url}/announce/{interop}?{query}&left=0").content))

        refused = stock(1)
        assert refused[b"failure reason"].startswith(b"unregistered torrent"), refused
        assert t.scrape(ih)[b"files"][ih] == {b"complete": 0, b"downloaded": 0, b"incomplete": 0}
        assert b"failure reason" not in t.announce(ih, peer_id(9), 7009, left=0)  # an agent: not asked
        assert t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH).status_code == 201
        assert b"failure reason" not in stock(2)
        assert t.scrape(ih)[b"files"][ih][b"complete"] == 2
        report = {"infohash": ih.hex(), "reason": "test", "node_id": "n1"}
        quarantined = t.http.post(f"/v1/blobs/{blob_id}/metainfo/report", json=report, headers=AUTH)
        assert quarantined.json()["quarantined"] is True, quarantined.text
        assert stock(3)[b"failure reason"].startswith(b"unregistered torrent")
        assert 'tracker_announces_total{event="error"} 2.0' in t.http.get("/metrics").text
