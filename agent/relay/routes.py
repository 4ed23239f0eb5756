"""`GET /v1/relay/{blob_id}` on the network listener: an arriving blob's prefix for other agents
(agent.relay.directory has the design). Streams as the HF endpoint does (agent.cache.stream), from a
`Range: bytes=N-` (or `N-M`: one part of a blob pulled in parts) on.

Who: requests with the relay credential (`Authorization: Bearer`, derived from the agents' passkey)
from an address the peer gate admits. Without the credential: 404, as if the route did not exist; with
it from an address the gate does not know yet: 503, and the gate asks the tracker again. What:
blobs arriving now, as far as they are written (each part of a blob pulled in parts), and blobs this
node seeds whole (`swarm.relay_seeds`: a warm start); 410 for one that failed its end-to-end check
here lately, so that a receiver drops what it took from this node. How many: `swarm.relay_fanout`
streams per blob (per part) of one arriving from the origin, one of a blob rooted at a seed (seeded
here, or received from a chain: `Arrival.chain`), and only to a receiver this node is ahead of (or
gets ahead of within `AHEAD_WAIT`); otherwise 503, and the receiver asks another source: first the nodes
a busy one names in `X-Relay-Next`, the nodes it streams to. The last byte goes as soon as it is written:
the receiver checks the whole blob itself (agent.cache.arrivals).
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import Callable

from fastapi import APIRouter, Request, Response

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.layout import is_blob_id
from agent.cache.stream import POLL, arrival_response, parse_range
from agent.relay.directory import NEXT_HEADER

AHEAD_WAIT = 1.0
"""Seconds a request waits for a node that is not ahead of it yet (see the route)."""


def relay_router(
    arrivals: Arrivals,
    credential: str | None,
    admitted: Callable[[str], bool],
    fanout: int,
    stall: float,
    parts: Callable[[int], list[tuple[int, int]]],
    seeded: Callable[[str], Arrival | None] = lambda _blob_id: None,
) -> APIRouter:
    """`admitted(address)`: the peer gate's word on a client address. `parts(size)`: the byte ranges a
    blob of that size is pulled from the origin in (agent.relay.directory `blob_parts`): each is a relay
    tree of its own, with `fanout` streams per node. `seeded(blob_id)`: a blob this node seeds whole, as
    an arrival that is complete (None when it seeds no such blob, or offers none: `swarm.relay_seeds`).

    Long because the route and its two helpers close over the same admission state (the streams each
    blob has, per part), which is this router's alone."""
    router = APIRouter(tags=["relay"], include_in_schema=False)
    streams: dict[tuple[str, int], list[str]] = {}
    """(blob, part) -> the addresses this node streams it to now."""
    lock = threading.Lock()
    expected = f"Bearer {credential}".encode() if credential else None

    @router.get("/v1/relay/{blob_id}")
    async def relay(blob_id: str, request: Request) -> Response:
        given = request.headers.get("authorization", "").encode()
        if expected is None or not hmac.compare_digest(given, expected) or not is_blob_id(blob_id):
            return Response(status_code=404)
        if not admitted(request.client.host if request.client else ""):
            # The credential is right but the gate does not know the address yet (a node that just joined;
            # the gate asks the tracker again now): the receiver retries in a moment.
            return Response(status_code=503, headers={"Retry-After": "1"})
        arrival = arrivals.get(blob_id)
        if arrival is None or arrival.state != "arriving":
            whole = seeded(blob_id)  # a warm start: the stream is the root of a chain
            if whole is None:
                # 410: the blob failed its check here, so what this node relayed of it may be wrong.
                failed = arrivals.failed_recently(blob_id) if arrival is None else arrival.state == "failed"
                return Response(status_code=410 if failed else 404)
            arrival = whole
        wanted = parse_range(request.headers.get("range"), arrival.size)
        if wanted == "unsatisfiable":
            return Response(status_code=416, headers={"Content-Range": f"bytes */{arrival.size}"})
        span = wanted if isinstance(wanted, tuple) else None
        start = span[0] if span else 0
        key = (blob_id, sum(1 for begin, _ in parts(arrival.size) if begin <= start))
        client = request.client.host if request.client else ""
        with lock:
            # A stream rooted at a seed moves at link speed: passed on to one node at a time (a chain), it
            # keeps every uplink's whole rate; a tree would split each parent's among its children.
            served = streams.setdefault(key, [])
            if len(served) >= (1 if arrival.state == "finished" or arrival.chain else fanout):
                # The nodes this one streams to: the receiver asks them next, and so walks down a chain
                # to its end in a request a hop, not in a round of every source and a pause.
                return Response(status_code=503, headers={"Retry-After": "1", NEXT_HEADER: ",".join(served)})
            served.append(client)
        done = False

        def release() -> None:
            nonlocal done
            with lock:
                if done:
                    return
                done = True
                served = streams.get(key, [])
                if client in served:
                    served.remove(client)
                if not served:
                    streams.pop(key, None)

        try:
            # Streaming only from a node that is ahead keeps the relay a tree (two receivers waiting on
            # each other would stall both). One that has just found its own source is ahead a moment
            # later: waited for briefly, so that the nodes of a chain need not ask again one by one.
            waited = time.monotonic()
            while arrival.available(start, checked=True) <= start:
                if arrival.state != "arriving" or time.monotonic() - waited > AHEAD_WAIT:
                    release()
                    return Response(status_code=503, headers={"Retry-After": "1"})
                await asyncio.sleep(POLL)
            return arrival_response(arrival, span, {}, stall, release, checked=True)
        except BaseException:
            release()
            raise

    return router
