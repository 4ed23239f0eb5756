"""`agent ls --cluster`: the real CLI (a subprocess) asks a real tracker which nodes hold which model,
after two real in-process agents fetched one through it."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from agent.core.progress import human_bytes
from tests.support.cluster import agent_cli, fetch_all_and_verify
from tests.support.procs import free_port, loop_until

HEADER = ["REPO", "REVISIONS", "COMMIT", "FILES", "SIZE", "COPIES", "HOLDERS"]


def test_ls_cluster_lists_copies_and_holders(origin, tracker, make_agent) -> None:
    a = make_agent("a", origin, tracker)
    b = make_agent("b", origin, tracker)
    statuses = fetch_all_and_verify([a, b], origin)
    commit = Path(statuses[0]["snapshot"]).name
    holders = sorted(f"127.0.0.1:{d.swarm.listen_port}" for d in (a, b))

    def both_seed_everything() -> bool:
        resp = httpx.get(f"{tracker.url}/v1/models?holders=true", headers=tracker.auth, timeout=5)
        commits = [c for m in resp.json()["models"] for c in m["commits"] if c["commit"] == commit]
        return bool(commits) and commits[0]["holders"] == holders

    # The agents register the manifest and announce their blobs in the background.
    loop_until(both_seed_everything, timeout=30, what="both agents listed as seeders of every file")

    # The URL from the environment (WEIGHTSWARM_TRACKER), the token file as an option.
    table = agent_cli(
        "ls", "--cluster", "--tracker-token-file", str(tracker.token_file),
        env={"WEIGHTSWARM_TRACKER": tracker.url},
    )
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == HEADER
    (row,) = [line for line in lines[1:] if line.startswith(origin.repo_id + " ")]
    cells = row.split()
    assert cells[:4] == [origin.repo_id, "-", commit[:12], str(len(origin.files))], row
    assert " ".join(cells[4:-2]) == human_bytes(origin.size), row
    assert cells[-2] == "2", f"two complete copies: {row}"
    assert cells[-1] == ",".join(holders), row

    as_json = agent_cli(
        "ls", "--cluster", "--json", "--tracker", tracker.url, "--tracker-token-file", str(tracker.token_file)
    )
    assert as_json.returncode == 0, as_json.stderr
    (model,) = [m for m in json.loads(as_json.stdout)["models"] if m["repo_id"] == origin.repo_id]
    (entry,) = [c for c in model["commits"] if c["commit"] == commit]
    assert entry["complete_copies"] == 2 and entry["holders"] == holders
    assert all(f["holders"] == holders for f in entry["files"])


def test_ls_cluster_failures_are_one_line(tmp_path: Path) -> None:
    down = agent_cli("ls", "--cluster", "--tracker", f"http://127.0.0.1:{free_port()}")
    assert down.returncode != 0
    assert "unreachable" in down.stderr and "Traceback" not in down.stderr, down.stderr
    assert down.stdout == ""

    missing = agent_cli("ls", "--cluster")
    assert missing.returncode == 2, missing.stderr
    assert "--tracker" in missing.stderr and "Traceback" not in missing.stderr

    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    bad = agent_cli("ls", "--cluster", "--tracker", "http://127.0.0.1:1", "--tracker-token-file", str(empty))
    assert bad.returncode == 2 and "--tracker-token-file" in bad.stderr, bad.stderr
