"""Announces and scrapes answered in the listener's protocol (the SQLite store's peers live in the
process) give the same bytes as the ASGI front, which the Redis store still uses; the hand-written
compact encoding and the one-call percent-decoding agree with the general ones."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from urllib.parse import quote_from_bytes, unquote_to_bytes

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.trackerkit import PASSKEY, SETTINGS, Tracker, infohash, peer_id, run_server
from tracker import announce as bt
from tracker.metrics import Metrics
from tracker.store import AnnounceResult
from wirekit.bencode import bdecode, bencode


@pytest.fixture(scope="module")
def tracker() -> Iterator[Tracker]:
    with run_server(SETTINGS) as t:
        assert t.app.quick_routes() is not None  # the SQLite store: announces answered in the protocol
        yield t


def both(t: Tracker, path: str) -> tuple[httpx.Response, httpx.Response]:
    """`path` through the listener (quick) and through the ASGI front, on one store."""

    async def through_asgi() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=t.app), base_url="http://a") as asgi:
            return await asgi.get(path)

    return t.anon.get(path), asyncio.run(through_asgi())


def query(n: int, blob: int = 1, **extra: object) -> str:
    q = f"info_hash={quote_from_bytes(infohash(blob))}&peer_id={quote_from_bytes(peer_id(n))}&port={6000 + n}"
    return q + "".join(f"&{k}={v}" for k, v in extra.items())


@pytest.mark.parametrize(
    "path",
    [
        f"/announce/{PASSKEY}?port=1",
        f"/announce/wrong?{query(1)}",
        f"/announce/{PASSKEY}?port=0&{query(1)}",
        f"/announce/{PASSKEY}?{query(1)}&event=bogus",
        f"/announce/{PASSKEY}?info_hash=%41%4&peer_id=x&port=1",
        f"/scrape/{PASSKEY}",
        f"/scrape/{PASSKEY}?info_hash=short",
        f"/scrape/wrong?info_hash={quote_from_bytes(infohash(9))}",
    ],
)
def test_refusals_are_the_same_bytes_either_way(tracker: Tracker, path: str):
    quick, asgi = both(tracker, path)
    assert quick.status_code == asgi.status_code == 200
    assert quick.content == asgi.content and b"failure reason" in quick.content
    assert quick.headers["content-type"] == asgi.headers["content-type"] == "text/plain"


def test_announces_either_way_share_one_swarm_and_one_answer_shape(tracker: Tracker):
    blob = 42
    seen = []
    for n in range(1, 7):
        quick, asgi = both(tracker, f"/announce/{PASSKEY}?{query(n, blob, left=0 if n % 2 else 100)}")
        seen.append((bdecode(quick.content), bdecode(asgi.content)))
    last_quick, last_asgi = seen[-1]
    assert last_quick.keys() == last_asgi.keys()
    assert last_quick[b"complete"] == last_asgi[b"complete"] == 3
    assert last_quick[b"incomplete"] == last_asgi[b"incomplete"] == 3
    scrape_quick, scrape_asgi = both(
        tracker, f"/scrape/{PASSKEY}?info_hash={quote_from_bytes(infohash(blob))}"
    )
    assert scrape_quick.content == scrape_asgi.content
    assert bdecode(scrape_quick.content)[b"files"][infohash(blob)][b"complete"] == 3


def test_head_and_a_post_on_the_listener(tracker: Tracker):
    head = tracker.anon.head(f"{tracker.announce_url}?{query(1)}")
    assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
    post = tracker.anon.post(f"{tracker.announce_url}?{query(1)}", content=b"x")
    assert post.status_code == 405


@pytest.mark.parametrize("addresses", [[], ["10.0.0.1"], ["10.0.0.1", "10.0.0.2", "fd00::1"], ["fd00::7"]])
def test_the_compact_answer_is_the_bencoding_of_its_dict(addresses: list[str]):
    peers = [(peer_id(i), ipaddress.ip_address(a).packed, 1000 + i * 257) for i, a in enumerate(addresses)]
    req = bt.AnnounceRequest(
        infohash(1), peers[0] if peers else (peer_id(99), b"\0" * 4, 1), 0, "", 50, True, False
    )
    body = bt.announce_response(req, AnnounceResult(len(peers), 2, peers), SETTINGS)
    v4 = b"".join(ip + port.to_bytes(2, "big") for _, ip, port in peers if len(ip) == 4)
    v6 = b"".join(ip + port.to_bytes(2, "big") for _, ip, port in peers if len(ip) == 16)
    expected = {
        b"interval": SETTINGS.interval,
        b"min interval": SETTINGS.min_interval,
        b"complete": len(peers),
        b"incomplete": 2,
        b"peers": v4,
        **({b"peers6": v6} if v6 else {}),
    }
    assert body == bencode(expected)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"plain",
        b"%41%42",
        b"%41%4",
        b"%4g%41",
        b"% 1%41",
        b"%  %ab",
        b"%%%",
        b"a%41b",
        b"%e9%",
        b"\xff%41",
        b"%20" * 20,
        b"%FF%fe",
    ],
)
def test_one_call_percent_decoding_agrees_with_the_standard_library(raw: bytes):
    assert bt._unquote(raw) == unquote_to_bytes(raw)


def test_escaped_keys_and_numbers_read_as_the_general_decoding_reads_them():
    def q(raw: bytes) -> bytes:
        return quote_from_bytes(raw, safe="").encode()

    raw = (
        b"info%5Fhash="
        + q(infohash(3))
        + b"&info_hash="
        + q(infohash(4))
        + b"&peer_id="
        + q(peer_id(3))
        + b"&port=%36%30%30%31&left=&numwant=%2D3&compact=%30"
    )
    req = bt.parse_announce(bt.first_values(raw), "10.0.0.1", SETTINGS)
    assert req.infohash == infohash(3)  # a key's first value, however the key was spelled
    assert req.peer == (peer_id(3), b"\x0a\x00\x00\x01", 6001)
    assert req.left is None and req.numwant == 0 and req.compact is False


@pytest.mark.parametrize("value", [b"1_0", b"+5", b"%2B5", b"%201", b"1e3", b"\xd9\xa1"])
def test_a_number_int_would_take_but_a_client_never_sends_is_refused(value: bytes):
    raw = (
        b"info_hash="
        + quote_from_bytes(infohash(1)).encode()
        + b"&peer_id="
        + quote_from_bytes(peer_id(1)).encode()
        + b"&port="
        + value
    )
    with pytest.raises(bt.AnnounceError, match="port must be an integer"):
        bt.parse_announce(bt.first_values(raw), "10.0.0.1", SETTINGS)


def test_the_decoded_values_kept_stay_bounded_whatever_clients_send(monkeypatch: pytest.MonkeyPatch):
    """Every info_hash and peer_id a client makes up is decoded once and kept: flooding the tracker
    with new ones must not grow it without bound."""
    monkeypatch.setattr(bt, "_DECODED", {})
    for n in range(bt._DECODED_MAX + 100):
        value = n.to_bytes(20, "big")
        assert bt._unquote(quote_from_bytes(value, safe="").encode()) == value
        assert len(bt._DECODED) <= bt._DECODED_MAX
    assert bt._unquote(quote_from_bytes(value, safe="").encode()) == value  # kept: the same answer again
    long = b"%41" * 10_000
    assert bt._unquote(long) == b"A" * 10_000 and long not in bt._DECODED  # a long one is never kept


def test_per_request_numbers_read_as_prometheus_counters_and_a_histogram():
    metrics = Metrics()
    metrics.announces["started"].inc()
    for seconds in (0.0004, 0.0005, 0.003, 60.0):
        metrics.latency["announce"].observe(seconds)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    started = [s for s in families["tracker_announces"].samples if s.labels == {"event": "started"}]
    assert started[0].value == 1.0
    buckets = {
        s.labels["le"]: s.value
        for s in families["tracker_request_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["route"] == "announce"
    }
    # Cumulative, a bound counting values at or below it, as prometheus_client's own Histogram.
    assert (buckets["0.0005"], buckets["0.001"], buckets["0.005"], buckets["30.0"], buckets["+Inf"]) == (
        2,
        2,
        3,
        3,
        4,
    )
