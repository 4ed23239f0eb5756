"""Bad input gets a clear refusal and the tracker keeps serving (checked after every case)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import quote_from_bytes

import pytest

from tests.support.trackerkit import (
    AUTH,
    SETTINGS,
    Tracker,
    infohash,
    make_info,
    peer_id,
    run_server,
)
from wirekit.bencode import bdecode, bencode

IH = quote_from_bytes(infohash(1))
PID = quote_from_bytes(peer_id(1))


@pytest.fixture(scope="module")
def tracker() -> Iterator[Tracker]:
    with run_server(replace(SETTINGS, max_body_bytes=64 * 1024)) as t:
        yield t


def still_serving(t: Tracker) -> None:
    assert t.http.get("/healthz").json() == {"status": "ok"}
    assert b"interval" in t.anon.get(f"{t.announce_url}?info_hash={IH}&peer_id={PID}&port=1&left=0").content


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", b"missing info_hash"),
        (f"peer_id={PID}&port=1", b"missing info_hash"),
        (f"info_hash=%01%02&peer_id={PID}&port=1", b"info_hash must be 20 bytes, got 2"),
        (f"info_hash={IH}{IH}&peer_id={PID}&port=1", b"info_hash must be 20 bytes, got 40"),
        (f"info_hash={IH}&port=1", b"missing peer_id"),
        (f"info_hash={IH}&peer_id=abc&port=1", b"peer_id must be 20 bytes, got 3"),
        (f"info_hash={IH}&peer_id={PID}", b"missing port"),
        (f"info_hash={IH}&peer_id={PID}&port=0", b"port out of range"),
        (f"info_hash={IH}&peer_id={PID}&port=70000", b"port out of range"),
        (f"info_hash={IH}&peer_id={PID}&port=http", b"port must be an integer"),
        (f"info_hash={IH}&peer_id={PID}&port=1&left=-5", b"left out of range"),
        (f"info_hash={IH}&peer_id={PID}&port=1&numwant=abc", b"numwant must be an integer"),
        (f"info_hash={IH}&peer_id={PID}&port=1&numwant=" + "9" * 40, b"numwant out of range"),
        (f"info_hash={IH}&peer_id={PID}&port=1&event=exploded", b"event must be"),
        ("info_hash=%zz%&&&==&peer_id=%ff%fe", b"info_hash must be 20 bytes"),
    ],
)
def test_bad_announce_gets_failure_reason(tracker: Tracker, query: str, reason: bytes) -> None:
    response = tracker.anon.get(f"{tracker.announce_url}?{query}")
    assert response.status_code == 200, "BitTorrent clients expect 200 with a failure reason"
    body = bdecode(response.content)
    assert reason in body[b"failure reason"]
    still_serving(tracker)


def test_an_announce_url_past_the_listeners_target_limit_is_414(tracker: Tracker) -> None:
    # 40,000 bytes: past the listener's 20 KiB target (room for a 256-hash scrape), refused before the
    # parser keeps it (servekit.limits), as nginx answers 414 past `large_client_header_buffers`.
    response = tracker.anon.get(f"{tracker.announce_url}?a=" + "x" * 40_000)
    assert response.status_code == 414
    still_serving(tracker)


def test_non_utf8_bytes_everywhere(tracker: Tracker) -> None:
    raw_pid = quote_from_bytes(bytes(range(236, 256)))
    reply = bdecode(
        tracker.anon.get(
            f"{tracker.announce_url}?info_hash={IH}&peer_id={raw_pid}&port=9&left=3&ip=%ff%fe"
        ).content
    )
    assert b"failure reason" not in reply
    path = tracker.http.get("/v1/blobs/%ff%fe")
    assert path.status_code == 400
    still_serving(tracker)


def test_huge_numwant_is_capped(tracker: Tracker) -> None:
    ih = infohash(77)
    for n in range(1, 4):
        tracker.announce(ih, peer_id(n), 100 + n, left=0)
    reply = tracker.announce(ih, peer_id(50), 150, numwant=10**15)
    assert len(reply[b"peers"]) == 3 * 6


def test_scrape_limits_and_unknown_hashes(tracker: Tracker) -> None:
    scrape = tracker.scrape_url
    assert b"needs at least one info_hash" in bdecode(tracker.anon.get(scrape).content)[b"failure reason"]
    bad = bdecode(tracker.anon.get(f"{scrape}?info_hash=%01").content)
    assert b"20 bytes" in bad[b"failure reason"]
    many = "&".join(f"info_hash={quote_from_bytes(infohash(i))}" for i in range(300))
    assert b"at most 256" in bdecode(tracker.anon.get(f"{scrape}?{many}").content)[b"failure reason"]
    zeros = tracker.scrape(infohash(1000))
    assert zeros[b"files"][infohash(1000)] == {b"complete": 0, b"downloaded": 0, b"incomplete": 0}
    assert tracker.anon.post(tracker.announce_url, content=b"x").status_code == 405
    still_serving(tracker)


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda b, i: b"not bencode", "not valid canonical bencode"),
        (lambda b, i: b"d4:name1:a6:lengthi1ee", "not valid canonical bencode"),  # unsorted keys
        (lambda b, i: bencode([1, 2]), "must be a bencoded dictionary"),
        (lambda b, i: i.replace(b"i16384e", b"i016384e"), "not valid canonical bencode"),
        (lambda b, i: bencode({**bdecode(i), b"name": b"other"}), "'name' must equal the blob id"),
        (lambda b, i: bencode({**bdecode(i), b"piece length": 20000}), "power of two"),
        (lambda b, i: bencode({**bdecode(i), b"piece length": 8192}), "power of two"),
        (lambda b, i: bencode({**bdecode(i), b"pieces": bdecode(i)[b"pieces"][:-20]}), "'pieces' must be"),
        (lambda b, i: bencode({**bdecode(i), b"length": -1}), "'length' must be a positive integer"),
        (lambda b, i: bencode({**bdecode(i), b"files": []}), "multi-file"),
    ],
)
def test_bad_metainfo_is_refused(tracker: Tracker, mutate, detail: str) -> None:
    blob_id, info = make_info(b"m" * 50_000)
    body = mutate(blob_id, info)
    response = tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=body, headers=AUTH)
    assert response.status_code == 400, response.text
    assert detail in response.json()["detail"]
    assert tracker.http.get(f"/v1/blobs/{blob_id}/metainfo").status_code == 404, "nothing stored"
    still_serving(tracker)


def test_metainfo_hash_mismatch_and_bad_blob_id(tracker: Tracker) -> None:
    blob_id, info = make_info(b"h" * 20_000)
    wrong = hashlib.sha1(b"other").hexdigest()
    r = tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=info, headers={**AUTH, "X-Infohash": wrong})
    assert r.status_code == 400 and "infohash mismatch" in r.json()["detail"]
    right = hashlib.sha1(info).hexdigest()
    ok = tracker.http.put(
        f"/v1/blobs/{blob_id}/metainfo", params={"infohash": right}, content=info, headers=AUTH
    )
    assert ok.status_code == 201
    r = tracker.http.put("/v1/blobs/NOT-HEX/metainfo", content=info, headers=AUTH)
    assert r.status_code == 400 and "blob id must be" in r.json()["detail"]


def test_oversized_bodies_get_413(tracker: Tracker) -> None:
    blob_id = "a" * 64
    big = b"x" * (64 * 1024 + 1)
    assert tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=big, headers=AUTH).status_code == 413

    def chunks():  # no Content-Length: chunked transfer must be bounded too
        for _ in range(20):
            yield b"y" * 8192

    assert (
        tracker.http.put(f"/v1/blobs/{blob_id}/metainfo", content=chunks(), headers=AUTH).status_code == 413
    )
    still_serving(tracker)


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("../etc/passwd", "'..' segment"),
        ("a/../../b", "'..' segment"),
        ("/abs/path", "must be relative"),
        ("C:/windows", "must be relative"),
        ("a\\b", "backslash"),
        ("a//b", "empty"),
        ("a/./b", "'.'"),
        ("nul\x00byte", "NUL"),
        ("", "non-empty"),
    ],
)
def test_unsafe_manifest_paths_are_refused(tracker: Tracker, path: str, detail: str) -> None:
    files = [{"path": path, "size": 1, "blob_id": "b" * 64, "infohash": None}]
    r = tracker.http.put(f"/v1/manifests/org/m/{'4' * 40}", json={"files": files}, headers=AUTH)
    assert r.status_code == 400, r.text
    assert detail in r.json()["detail"]
    assert tracker.http.get(f"/v1/manifests/org/m/{'4' * 40}").status_code == 404
    still_serving(tracker)


@pytest.mark.parametrize(
    ("url", "body", "status"),
    [
        (f"/v1/manifests/org/m/{'5' * 39}", {"files": []}, 400),  # short commit
        (f"/v1/manifests/org/m/{'G' * 40}", {"files": []}, 400),
        (f"/v1/manifests/o..x/m/{'5' * 40}", {"files": []}, 400),
        (
            f"/v1/manifests/org/m/{'5' * 40}",
            {"files": [{"path": "a", "size": -1, "blob_id": "b" * 64, "infohash": None}]},
            400,
        ),
        (
            f"/v1/manifests/org/m/{'5' * 40}",
            {"files": [{"path": "a", "size": 1, "blob_id": "xyz", "infohash": None}]},
            400,
        ),
        (
            f"/v1/manifests/org/m/{'5' * 40}",
            {"files": [{"path": "a", "size": True, "blob_id": "b" * 64, "infohash": None}]},
            422,
        ),
        (f"/v1/manifests/org/m/{'5' * 40}", {"files": "nope"}, 422),
        (f"/v1/manifests/org/m/{'5' * 40}", {"revision": "../x", "files": []}, 400),
        (f"/v1/leases/{'c' * 64}", {"node_id": "bad id with spaces"}, 422),
        (f"/v1/leases/{'c' * 64}", {"node_id": "n", "ttl": -1}, 422),
    ],
)
def test_bad_json_requests(tracker: Tracker, url: str, body: object, status: int) -> None:
    method = tracker.http.put if "/manifests/" in url else tracker.http.post
    r = method(url, json=body, headers=AUTH)
    assert r.status_code == status, r.text
    still_serving(tracker)


def test_invalid_json_body(tracker: Tracker) -> None:
    r = tracker.http.put(
        f"/v1/manifests/org/m/{'6' * 40}",
        content=b"{not json",
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 422
    still_serving(tracker)
