"""`GET /v1/relay/{blob_id}` on the network listener: an arriving blob's prefix for other agents
(agent.swarm.relay has the design). Streams as the HF endpoint does (agent.http.stream), from a
`Range: bytes=N-` (or `N-M`: one part of a blob pulled in parts) on.

Who: requests with the relay credential (`Authorization: Bearer`, derived from the agents' passkey)
from an address the peer gate admits. Without the credential: 404, as if the route did not exist; with
it from an address the gate does not know yet: 503, and the gate asks the tracker again. What:
blobs arriving now, as far as they are written (each part of a blob pulled in parts), and blobs this
node seeds whole (`swarm.relay_seeds`: a warm start); 410 for one that failed its end-to-end check
here lately, so that a receiver drops what it took from this node. How many: `swarm.relay_fanout`
streams per blob (per part) of one arriving from the origin, one of a blob rooted at a seed (seeded
here, or received from a chain: `Arrival.chain`), and only to a receiver this node is ahead of;
otherwise 503, and the receiver asks another source.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable

from fastapi import APIRouter, Request, Response

from agent.cache.arrivals import Arrival, Arrivals
from agent.cache.layout import is_blob_id
from agent.http.stream import arrival_response, parse_range


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
    blob of that size is pulled from the origin in (agent.swarm.relay `blob_parts`): each is a relay
    tree of its own, with `fanout` streams per node. `seeded(blob_id)`: a blob this node seeds whole, as
    an arrival that is complete (None when it seeds no such blob, or offers none: `swarm.relay_seeds`)."""
    router = APIRouter(tags=["relay"], include_in_schema=False)
    streams: dict[tuple[str, int], int] = {}
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
        if arrival.available(start) <= start:
            # Not ahead of the receiver: it asks another source. Streaming only from a node that is ahead
            # keeps the relay a tree (two receivers waiting on each other would stall both).
            return Response(status_code=503, headers={"Retry-After": "1"})
        key = (blob_id, sum(1 for begin, _ in parts(arrival.size) if begin <= start))
        with lock:
            # A stream rooted at a seed moves at link speed: passed on to one node at a time (a chain), it
            # keeps every uplink's whole rate; a tree would split each parent's among its children.
            if streams.get(key, 0) >= (1 if arrival.state == "finished" or arrival.chain else fanout):
                return Response(status_code=503, headers={"Retry-After": "1"})
            streams[key] = streams.get(key, 0) + 1
        done = False

        def release() -> None:
            nonlocal done
            with lock:
                if done:
                    return
                done = True
                left = streams.get(key, 1) - 1
                if left > 0:
                    streams[key] = left
                else:
                    streams.pop(key, None)

        try:
            return arrival_response(arrival, span, {}, stall, release)
        except BaseException:
            release()
            raise

    return router
