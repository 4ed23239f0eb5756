"""Which nodes hold what: the stores' live seeder addresses per torrent, and `/v1/models?holders=true`
(agent role only, as `/v1/peers`: where the agents are is theirs to know). Both stores."""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import replace

from tests.support.procs import loop_until
from tests.support.trackerkit import (
    AUTH,
    PUBLISHER,
    SIGNATURE,
    infohash,
    make_info,
    peer_id,
    run_server,
)
from tracker.settings import TrackerSettings
from tracker.store import Store
from tracker.stores import open_store

READ = "read-token-holders-abcdefgh"
READER = {"Authorization": f"Bearer {READ}"}
LOOPBACK = ipaddress.ip_address("127.0.0.1").packed
COMMIT = "4" * 40


def test_seeder_addresses_are_the_live_seeders_per_torrent(store_settings: TrackerSettings) -> None:
    # A one-second peer TTL, so that a peer that stops announcing drops out within the test.
    settings = replace(store_settings, interval=1, min_interval=0, peer_ttl_factor=1.0)
    one, two, unknown = infohash(21), infohash(22), infohash(23)
    v6 = ipaddress.ip_address("fd00::9").packed
    ten = ipaddress.ip_address("10.0.0.2").packed

    async def scenario() -> None:
        store = open_store(settings)
        try:
            await store.announce(one, (peer_id(1), ten, 7001), True, "started", 0)
            await store.announce(one, (peer_id(2), v6, 7002), True, "started", 0)
            await store.announce(one, (peer_id(3), LOOPBACK, 7003), False, "started", 0)  # a leecher
            await store.announce(two, (peer_id(1), ten, 7001), False, "started", 0)
            await store.announce(two, (peer_id(4), LOOPBACK, 7004), True, "started", 0)
            got = await store.seeder_addresses([one, two, unknown])
            assert got == {one: [(ten, 7001), (v6, 7002)], two: [(LOOPBACK, 7004)], unknown: []}

            # A leecher that completes joins; a seeder that stops leaves; one that turns leecher leaves.
            await store.announce(one, (peer_id(3), LOOPBACK, 7003), True, "completed", 0)
            await store.announce(one, (peer_id(2), v6, 7002), True, "stopped", 0)
            await store.announce(two, (peer_id(4), LOOPBACK, 7004), False, "", 0)
            got = await store.seeder_addresses([one, two])
            assert got == {one: [(ten, 7001), (LOOPBACK, 7003)], two: []}

            # Expiry, as scrape counts it: peer 1 goes silent, peer 3 keeps announcing.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while True:
                await store.announce(one, (peer_id(3), LOOPBACK, 7003), True, "", 0)
                got = await store.seeder_addresses([one])
                await agrees_with_scrape(store, one, got[one])
                if got[one] == [(LOOPBACK, 7003)]:
                    break
                assert loop.time() < deadline, f"silent seeder never expired: {got}"
                await asyncio.sleep(0.2)

            # With no announce in between (so nothing sweeps the swarm, and its keys stay alive for
            # the later peer), the earlier peer must drop out at its own expiry, the later one after.
            three = infohash(24)
            await store.announce(three, (peer_id(5), ten, 7005), True, "started", 0)
            await asyncio.sleep(0.5)
            await store.announce(three, (peer_id(6), ten, 7006), True, "started", 0)
            seen = []
            deadline = loop.time() + 10
            while not seen or seen[-1]:
                got = await store.seeder_addresses([three])
                await agrees_with_scrape(store, three, got[three])
                if not seen or seen[-1] != got[three]:
                    seen.append(got[three])
                assert loop.time() < deadline, f"silent seeders never expired: {seen}"
                await asyncio.sleep(0.05)
            assert seen == [[(ten, 7005), (ten, 7006)], [(ten, 7006)], []], seen
        finally:
            await store.close()

    asyncio.run(scenario())


async def agrees_with_scrape(store: Store, ih: bytes, before: list[tuple[bytes, int]]) -> None:
    """Scrape counts the seeders `seeder_addresses` lists. A peer may expire between two calls, so the
    count must lie between the listing taken before the scrape and the one taken after it."""
    complete = (await store.scrape([ih]))[ih].complete
    after = (await store.seeder_addresses([ih]))[ih]
    assert set(after) <= set(before), (before, after)
    assert len(after) <= complete <= len(before), f"scrape counts {complete}, listed {before} then {after}"


def _register(t, blob_ids: list[str], infohashes: list[str | None]) -> None:
    files = [
        {"path": f"model-{i}.safetensors", "size": 20_000, "blob_id": b, "infohash": ih}
        for i, (b, ih) in enumerate(zip(blob_ids, infohashes, strict=True))
    ]
    files.append({"path": "config.json", "size": 12, "blob_id": "e" * 40, "infohash": None})
    r = t.http.put(
        f"/v1/manifests/org/model/{COMMIT}",
        json={"revision": "main", "files": files, "signature": SIGNATURE},
        headers=PUBLISHER,
    )
    assert r.status_code == 201, r.text


def test_models_holders_for_the_agent_role_only(store_settings: TrackerSettings) -> None:
    with run_server(replace(store_settings, read_token=READ)) as t:
        hashes = []
        blobs = []
        for n in (1, 2):
            blob_id, info = make_info(bytes([n]) * 20_000)
            put = t.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers=AUTH)
            blobs.append(blob_id)
            hashes.append(put.json()["infohash"])
        _register(t, blobs, hashes)
        first, second = (bytes.fromhex(h) for h in hashes)
        # Node A (port 9001) and node C (port 10003) seed both files; B only the first; D leeches.
        for ih in (first, second):
            t.announce(ih, peer_id(1), 9001, left=0)
            t.announce(ih, peer_id(3), 10003, left=0)
        t.announce(first, peer_id(2), 9002, left=0)
        t.announce(second, peer_id(4), 9004, left=5)

        plain = t.http.get("/v1/models").json()
        for who in (AUTH, READER, PUBLISHER):
            assert t.anon.get("/v1/models", headers=who).json() == plain, "unchanged without holders"
            assert t.anon.get("/v1/models?holders=false", headers=who).json() == plain
        (commit,) = plain["models"][0]["commits"]
        assert "holders" not in commit and all("holders" not in f for f in commit["files"])
        assert commit["complete_copies"] == 0, "config.json has no infohash: nobody seeds it"

        data = t.http.get("/v1/models", params={"holders": "true"}).json()
        (commit,) = data["models"][0]["commits"]
        assert commit["holders"] == ["127.0.0.1:10003", "127.0.0.1:9001"], "those seeding every file"
        by_path = {f["path"]: f for f in commit["files"]}
        assert by_path["model-0.safetensors"]["holders"] == [
            "127.0.0.1:10003",
            "127.0.0.1:9001",
            "127.0.0.1:9002",
        ]
        assert by_path["model-1.safetensors"]["holders"] == ["127.0.0.1:10003", "127.0.0.1:9001"]
        assert by_path["config.json"]["holders"] == []
        without = {k: v for k, v in commit.items() if k != "holders"}
        without["files"] = [{k: v for k, v in f.items() if k != "holders"} for f in commit["files"]]
        assert without == plain["models"][0]["commits"][0], "holders only add to the plain answer"

        for who, role in ((READER, "reader"), (PUBLISHER, "publisher")):
            refused = t.anon.get("/v1/models?holders=true", headers=who)
            assert refused.status_code == 403, refused.text
            detail = refused.json()["detail"]
            assert "agent role" in detail and role in detail, detail
            assert "127.0.0.1" not in refused.text
        assert t.anon.get("/v1/models?holders=true").status_code == 401

        # A seeder that stops is no holder any more.
        t.announce(first, peer_id(3), 10003, left=0, event="stopped")
        loop_until(
            lambda: t.http.get("/v1/models?holders=true").json()["models"][0]["commits"][0]["holders"]
            == ["127.0.0.1:9001"],
            timeout=5,
            what="stopped seeder dropped from holders",
        )
