"""A node that holds a model keeps starting its pods through a Hub outage: `agent wait` against a real
`agent serve` while the origin answers 503, then with the origin really stopped, then with the daemon
restarted during the outage (README "On a laptop"; docs/agent.md "When the origin is down")."""

from __future__ import annotations

import time

from tests.support.cluster import REPO, AgentProcess, agent_cli, assert_snapshot_verifies

QUICK = 6.0
"""Seconds `agent wait` may take through an outage: one quick try at the origin and the cache's check,
not the 8-13 s of an origin client's retries (nor the daemon's 10 minutes of origin patience)."""


def _served_lines(agent: AgentProcess) -> list[str]:
    return [line for line in agent.log.read_text().splitlines() if "from the cache" in line]


def test_wait_through_an_origin_outage_and_a_restart_during_it(tmp_path, origin, tracker):
    agent = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    agent.start()
    try:
        first = agent_cli("wait", REPO, "--agent", agent.url, "--timeout", "60")
        assert first.returncode == 0, first.stderr
        snapshot = first.stdout.strip().splitlines()[-1]
        assert _served_lines(agent) == []

        revision = f"/api/models/{REPO}/revision/main"
        outages = {
            "503": lambda: origin.hub.faults.path_status.update({revision: (503, {})}),
            "refused": origin.hub.stop,  # nothing listens there any more
            "restarted in the outage": lambda: (agent.stop(), agent.start()),
        }
        for outage, start in outages.items():
            start()
            before = len(_served_lines(agent))
            started = time.monotonic()
            res = agent_cli("wait", REPO, "--agent", agent.url, "--timeout", "60")
            took = time.monotonic() - started
            assert res.returncode == 0, (outage, res.stderr)
            assert res.stdout.strip().splitlines()[-1] == snapshot
            assert took < QUICK, (outage, took, res.stderr)
            said = _served_lines(agent)[before:]
            assert len(said) == 1 and "cannot be asked" in said[0] and "WARNING" in said[0], (outage, said)
        assert_snapshot_verifies(snapshot, origin)
    finally:
        agent.stop()
