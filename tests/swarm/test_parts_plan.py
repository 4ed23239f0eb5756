"""agent.relay.directory `blob_parts` and `part_key`: how a blob is cut for several origin holders; and
agent.relay.admission: the keys and the rule that decide how many hold parts at once."""

from __future__ import annotations

import dataclasses

import pytest

from agent.core.settings import Settings
from agent.relay.admission import MORE, ONE, admission_key, judge
from agent.relay.directory import blob_parts, part_key

MiB = 2**20


def settings(holders: int, part_min: int) -> Settings:
    s = Settings.from_env_defaults(env={})
    swarm = dataclasses.replace(s.swarm, origin_holders=holders, origin_part_min=part_min)
    return dataclasses.replace(s, swarm=swarm)


@pytest.mark.parametrize(
    ("size", "holders", "part_min", "parts"),
    [
        (127 * MiB, 8, 64 * MiB, 1),  # under two parts' minimum: one holder
        (128 * MiB, 8, 64 * MiB, 2),
        (512 * MiB + 12345, 8, 64 * MiB, 8),
        (10 * 2**30, 8, 64 * MiB, 8),  # the setting bounds it
        (10 * 2**30, 1, 64 * MiB, 1),
    ],
)
def test_parts_cover_the_blob_in_order_at_chunk_boundaries(size, holders, part_min, parts):
    s = settings(holders, part_min)
    got = blob_parts(size, s)
    assert len(got) == parts
    assert got[0][0] == 0 and got[-1][1] == size
    chunk = s.fetch.chunk_size
    for (_, end), (start, _) in zip(got, got[1:], strict=False):
        assert end == start and start % chunk == 0  # the origin engine's resume record counts chunks
    sizes = [end - start for start, end in got]
    assert max(sizes) - min(sizes) <= chunk + size % chunk  # near-equal


def test_part_keys_are_blob_ids_the_tracker_takes_and_differ_per_part_and_split():
    blob = "ab" * 32
    keys = {part_key(blob, k, n) for n in (2, 4) for k in range(n)}
    keys |= {admission_key(blob, n, what) for n in (2, 4) for what in ("alone", "probe", MORE, ONE)}
    assert len(keys) == 14 and blob not in keys
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)


@pytest.mark.parametrize(
    ("alone", "shared", "verdict"),
    [
        (4e6, 4e6, MORE),  # an origin that caps each client: the lead kept its rate
        (4e6, 3.7e6, MORE),  # ... give or take the noise of a few seconds
        (30e6, 15e6, ONE),  # one that caps its total: the second client took half
        (7.5e6, 6e6, ONE),  # ... with four clients on it already, a fifth takes a fifth
        (0.0, 0.0, ONE),  # nothing measured: no more holders
    ],
)
def test_more_holders_pay_only_when_the_lead_keeps_its_rate(alone, shared, verdict):
    assert judge(alone, shared) == verdict
