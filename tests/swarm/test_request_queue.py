"""How many block requests a peer keeps in flight to an agent, seen from a stock libtorrent client.

libtorrent caps its requests to a peer at the number that peer advertises in its extension handshake
(`reqq`), over its own `max_out_request_queue`: the depth is set where the blocks come from, and an
agent advertises `swarm.request_queue_limit`.
"""

from __future__ import annotations

import time
from pathlib import Path

from agent.core.swarm_settings import SwarmSettings
from tests.support.procs import loop_until
from tests.support.stock import add_blob, stock_session
from tests.swarm.kit import MiB, make_blob, open_swarm, write_blob

LIMIT = SwarmSettings().request_queue_limit


def _deepest_queue(seed_port: int, blob_info: bytes, save: Path, seconds: float) -> int:
    """A stock client downloads from the seed at `seed_port` for `seconds`; the most blocks it had
    requested of it and not yet received. TCP only, as agents speak; and whole pieces off: libtorrent
    picks them past its cap, by up to 8 MiB, which would blur it."""
    ses = stock_session(enable_outgoing_utp=False, whole_pieces_threshold=0)
    handle = add_blob(ses, blob_info, save)
    handle.connect_peer(("127.0.0.1", seed_port))
    deepest = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not handle.status().is_seeding:
        for p in handle.get_peer_info():
            deepest = max(deepest, p.download_queue_length)
        time.sleep(0.02)
    return deepest


def test_a_client_keeps_no_more_requests_in_flight_to_an_agent_than_it_allows(tmp_path, swarms):
    """A seed that sends 8 MiB/s: a stock client's queue (3 s of the rate, libtorrent's default) would
    grow past 1,500 blocks; to an agent it stays within the limit the agent advertises. The control, a
    stock seed at the same rate, lets it grow past that limit: the cap is the agent's, not the
    client's."""
    blob = make_blob(64 * MiB, 21)
    path = write_blob(tmp_path / "s", blob)
    agent = open_swarm(swarms, tmp_path / "a-state", upload_rate_limit=8 * MiB)
    ih = agent.seed(path, blob.info, [])
    assert agent.wait(ih, timeout=30).state == "seeding"
    to_agent = _deepest_queue(agent.listen_port, blob.info, tmp_path / "from-agent", 4.0)

    stock = stock_session(upload_rate_limit=8 * MiB)
    seeding = add_blob(stock, blob.info, tmp_path / "s")
    loop_until(lambda: seeding.status().is_seeding, timeout=30, what="the stock seed's check")
    to_stock = _deepest_queue(stock.listen_port(), blob.info, tmp_path / "from-stock", 4.0)

    assert 0 < to_agent <= LIMIT < to_stock, (to_agent, to_stock)
