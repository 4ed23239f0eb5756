"""Entitlement before bytes (its section in docs/security.md): a node fetches a gated or
private repo from its peers only after the origin accepted the token the request runs with; while the
origin cannot be asked, only what this node recorded the origin's yes for (or a signed, published
hub-less model). Real agents, a real tracker and the real test hub, on loopback.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agent.cache.layout import StateDir, repo_folder_name
from agent.daemon.node import Daemon
from agent.fetch.entitlement import ENTITLEMENT_TTL, MAX_TOKENS_PER_REPO, Entitlements
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from tests.support.cluster import (
    TOKEN,
    TrackerProcess,
    admin_request,
    wait_until_seeded,
    write_models,
)
from tests.support.cluster import fetch_until_done as _fetch

GOOD = "hf_granted_token_0123456789abcdef"
"""Granted the gated and the private repo."""
OTHER = "hf_valid_but_not_granted_token_98765"
"""A valid token the origin refuses for the gated repo (403 GatedRepo) and hides the private one from."""
GATED = "acme/gated"
OPEN = "acme/open"
HIDDEN = "acme/hidden"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


# -- the store, alone -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_record_grants_the_token_it_was_made_for_and_no_other(tmp_path):
    clock = Clock()
    store = Entitlements(StateDir(tmp_path), clock)
    store.record(GATED, "main", COMMIT, public=False, token=GOOD)
    store.record(OPEN, "main", COMMIT, public=True, token=None)
    assert store.allows(GATED, GOOD) == "token"
    assert store.allows(GATED, OTHER) is None
    assert store.allows(GATED, None) is None
    assert store.allows(OPEN, OTHER) == "public" and store.allows(OPEN, None) == "public"
    assert store.allows(HIDDEN, GOOD) is None
    assert store.commit_for(GATED, "main") == COMMIT and store.commit_for(GATED, "v2") is None

    # Kept across restarts (same key, same file); a refusal by the origin drops the token at once.
    again = Entitlements(StateDir(tmp_path), clock)
    assert again.allows(GATED, GOOD) == "token"
    again.forget(GATED, GOOD)
    assert again.allows(GATED, GOOD) is None
    assert Entitlements(StateDir(tmp_path), clock).allows(GATED, GOOD) is None


def test_an_anonymous_grant_is_not_a_grant_to_a_token_and_the_reverse(tmp_path):
    store = Entitlements(StateDir(tmp_path), Clock())
    store.record(GATED, "main", COMMIT, public=False, token=None)  # a mirror that sends no `gated`
    assert store.allows(GATED, None) == "token"
    assert store.allows(GATED, GOOD) is None


def test_records_expire_so_a_revoked_token_is_cut_off_during_a_long_outage(tmp_path):
    clock = Clock()
    store = Entitlements(StateDir(tmp_path), clock)
    store.record(GATED, "main", COMMIT, public=False, token=GOOD)
    store.record(OPEN, "main", COMMIT, public=True, token=None)
    clock.now += ENTITLEMENT_TTL - 60
    assert store.allows(GATED, GOOD) == "token" and store.allows(OPEN, None) == "public"
    clock.now += 120
    assert store.allows(GATED, GOOD) is None and store.allows(OPEN, None) is None
    assert store.commit_for(GATED, "main") is None
    # A week is the bound the docstring promises (independent of the code's arithmetic).
    assert ENTITLEMENT_TTL == 7 * 24 * 3600


def test_a_repo_no_longer_public_needs_a_token_again(tmp_path):
    store = Entitlements(StateDir(tmp_path), Clock())
    store.record(GATED, "main", COMMIT, public=True, token=None)
    store.record(GATED, "main", COMMIT, public=False, token=GOOD)
    assert store.allows(GATED, None) is None and store.allows(GATED, GOOD) == "token"


def test_the_state_dir_holds_no_token_and_its_files_are_private(tmp_path):
    store = Entitlements(StateDir(tmp_path), Clock())
    for i in range(MAX_TOKENS_PER_REPO + 5):
        store.record(GATED, "main", COMMIT, public=False, token=f"{GOOD}-{i}")
    store.record(GATED, "main", COMMIT, public=False, token=GOOD)
    state = StateDir(tmp_path)
    for path in (state.entitlements, state.entitlement_key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or GOOD.encode() not in path.read_bytes(), path
    tokens = json.loads(state.entitlements.read_bytes())["repos"][GATED]["tokens"]
    assert len(tokens) == MAX_TOKENS_PER_REPO  # bounded: the oldest went
    assert store.allows(GATED, GOOD) == "token" and store.allows(GATED, f"{GOOD}-0") is None


def test_an_unreadable_record_file_grants_nothing(tmp_path):
    state = StateDir(tmp_path)
    Entitlements(state, Clock()).record(GATED, "main", COMMIT, public=False, token=GOOD)
    state.entitlements.write_text("{not json")
    assert Entitlements(state, Clock()).allows(GATED, GOOD) is None
    # A replaced key makes the old HMACs match nothing (fail closed), never a crash.
    Entitlements(state, Clock()).record(GATED, "main", COMMIT, public=False, token=GOOD)
    state.entitlement_key.write_bytes(b"short")
    assert Entitlements(state, Clock()).allows(GATED, GOOD) is None


# -- real agents ----------------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, make_hub) -> HubServer:
    """A gated, a public and a private repo; GOOD may read all, OTHER only the public one."""
    root = tmp_path / "hub-root"
    write_models(root, (GATED, OPEN, HIDDEN), total_bytes=2**20, shards=2, seed=11)
    grants = {GOOD: [GATED, HIDDEN], OTHER: []}
    return make_hub(root, grants=grants, gated=[GATED], private=[HIDDEN])


@pytest.fixture
def agents(hub: HubServer, make_agent) -> Callable[..., Daemon]:
    def make(name: str, tracker: TrackerProcess, **daemon: object) -> Daemon:
        # One try: an origin that is down fails the plan at once instead of after a backoff.
        agent: Daemon = make_agent(name, hub, tracker, daemon=daemon, origin_client={"max_retries": 1})
        return agent

    return make


def _ready(d: Daemon, repo_id: str, token: str | None, revision: str = "main") -> dict:
    st = _fetch(d, repo_id, token, revision)
    assert st["phase"] == "Ready", st
    return st


def _refused(d: Daemon, repo_id: str, token: str | None, *needles: str, revision: str = "main") -> dict:
    st = _fetch(d, repo_id, token, revision)
    assert st["phase"] == "Failed", st
    for needle in needles:
        assert needle in (st["error"] or ""), st["error"]
    assert st["bytes_from_peers"] == 0 and st["bytes_from_origin"] == 0 and st["bytes_done"] == 0, st
    return st


def _no_bytes_of(d: Daemon, blobs: set[str]) -> None:
    """`d` holds, seeds and downloads no byte of these blobs: no file, no torrent."""
    assert not blobs & set(d.held_blobs())
    assert d.swarm.torrents() == []
    on_disk = {p.name.split(".")[0] for p in d.settings.cache_dir.rglob("*") if p.is_file()}
    assert not blobs & on_disk, on_disk


def _rm(d: Daemon, repo_id: str) -> None:
    resp = admin_request(d.admin_url, "DELETE", f"/v1/models/{repo_id}", params={"force": "true"})
    assert resp.status_code == 200, resp.text


def test_a_token_the_origin_refuses_gets_no_byte_from_peers(tracker, agents, hub):
    a = agents("a", tracker)
    good = _ready(a, GATED, GOOD)
    blobs = {f["blob_id"] for f in good["files"]}
    wait_until_seeded(tracker, a)

    b = agents("b", tracker)
    # A valid token not granted the repo: the origin's 403 is the answer, though A seeds every blob.
    _refused(b, GATED, OTHER, "403 GatedRepo", "the requester's token")
    # No token at all: the origin's 401.
    _refused(b, GATED, None, "401 GatedRepo", "no token")
    _no_bytes_of(b, blobs)
    for blob_id in blobs:
        state = tracker.blob(blob_id)
        assert state["seeders"] == 1 and state["leechers"] == 0, state  # B never joined a swarm
    assert all(a.swarm.status(ih).bytes_uploaded == 0 for ih in a.held_blobs().values())


def test_an_agent_written_manifest_of_a_repo_the_origin_hides_or_lacks_is_refused(tracker, agents, hub):
    a = agents("a", tracker)
    hidden = _ready(a, HIDDEN, GOOD)  # A writes the (agent-role) manifest of the private repo
    wait_until_seeded(tracker, a)
    blobs = {f["blob_id"] for f in hidden["files"]}
    commit = hidden["commit"]

    # Any agent may write a manifest: one under a repo id the origin does not have, naming the
    # private repo's blobs, would be a way around the origin's check.
    files = [{"path": f["path"], "size": f["size"], "blob_id": f["blob_id"], "infohash": ih}
             for f in hidden["files"] for ih in [a.held_blobs().get(f["blob_id"])]]
    resp = httpx.put(
        f"{tracker.url}/v1/manifests/ghost/model/{commit}",
        json={"revision": None, "files": files},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert resp.status_code in (200, 201), resp.text

    b = agents("b", tracker)
    # The origin hides the private repo from OTHER (404): the tracker's unpublished manifest is no way in.
    _refused(b, HIDDEN, OTHER, "not found", "the requester's token", revision=commit)
    _refused(b, "ghost/model", GOOD, "not found", revision=commit)
    _no_bytes_of(b, blobs)
    assert all(a.swarm.status(ih).bytes_uploaded == 0 for ih in a.held_blobs().values())


def test_with_the_origin_down_only_what_this_node_proved_is_fetched_from_peers(tracker, agents, hub):
    a = agents("a", tracker)
    b = agents("b", tracker)
    gated = _ready(a, GATED, GOOD)["commit"]
    public = _ready(a, OPEN, None)["commit"]
    _ready(b, GATED, GOOD)
    _ready(b, OPEN, None)
    wait_until_seeded(tracker, a)
    _rm(b, GATED)
    _rm(b, OPEN)
    c = agents("c", tracker)  # never asked the origin about anything
    hub.stop()

    # The origin cannot be asked: B may have only what the origin allowed this very token before.
    _refused(b, GATED, OTHER, "origin cannot be asked", "the requester's token")
    _refused(b, GATED, None, "origin cannot be asked", "no token")
    again = _ready(b, GATED, GOOD)
    assert again["bytes_from_origin"] == 0 and again["bytes_from_peers"] > 0, again
    # A repo the origin reported public: to any token, or none.
    assert _ready(b, OPEN, OTHER)["bytes_from_origin"] == 0
    # A node with no record asks nobody for anything while the origin is down, even for a commit
    # whose manifest the tracker has.
    _refused(c, GATED, GOOD, "origin cannot be asked", revision=gated)
    _refused(c, OPEN, None, "origin cannot be asked", revision=public)
    assert c.swarm.torrents() == []

    # What B keeps about it: HMACs and commits, never a token.
    state = StateDir(b.settings.state_dir)
    assert stat.S_IMODE(state.entitlement_key.stat().st_mode) == 0o600
    records = json.loads(state.entitlements.read_bytes())["repos"]
    assert records[OPEN]["public"] is not None and records[OPEN]["tokens"] == {}
    assert records[GATED]["public"] is None and len(records[GATED]["tokens"]) == 1
    looked_at = 0
    for path in b.settings.state_dir.rglob("*"):
        if path.is_file() and not path.is_socket():
            looked_at += 1
            data = path.read_bytes()
            assert GOOD.encode() not in data and OTHER.encode() not in data, path
    assert looked_at >= 3


@pytest.mark.parametrize("status", [429, 503])
def test_a_rate_limiting_or_failing_origin_is_an_outage_not_a_grant(tracker, agents, hub, status):
    a = agents("a", tracker)
    b = agents("b", tracker)
    _ready(a, GATED, GOOD)
    _ready(b, GATED, GOOD)
    wait_until_seeded(tracker, a)
    _rm(b, GATED)
    hub.faults.path_status[f"/api/models/{GATED}/revision/main"] = (status, {"Retry-After": "0"})

    _refused(b, GATED, OTHER, "origin cannot be asked", str(status))
    again = _ready(b, GATED, GOOD)
    assert again["bytes_from_origin"] == 0 and again["bytes_from_peers"] > 0, again
    blobs = b.settings.cache_dir / repo_folder_name(GATED) / "blobs"
    assert {p.name for p in blobs.iterdir()} >= {f["blob_id"] for f in again["files"]}


def test_a_hub_less_model_the_origin_lacks_is_fetched_only_with_a_verified_signature(
    tracker, agents, hub, tmp_path
):
    folder = tmp_path / "publish" / "ft"
    gen = tmp_path / "gen"
    for path in make_model(gen, "me/ft", total_bytes=2**19, shards=1, seed=31):
        rel = path.relative_to(gen / "me" / "ft")
        if not rel.name.startswith("."):  # publish skips hidden files
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(path.read_bytes())
    a = agents("a", tracker, publish_roots=(tmp_path / "publish",))
    body = {"directory": str(folder), "repo_id": "local/ft", "revision": "main"}
    resp = admin_request(a.admin_url, "POST", "/v1/publish", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    published = resp.json()
    wait_until_seeded(tracker, a)

    # The origin answers 404 for local/ft: the publisher's signed manifest is the plan.
    b = agents("b", tracker)
    st = _ready(b, "local/ft", None)
    assert st["commit"] == published["commit"] and st["bytes_from_peers"] > 0 and st["bytes_from_origin"] == 0
    asked = [r for r in hub.requests if r.path == "/api/models/local/ft/revision/main"]
    assert asked and all(r.status in (401, 404) for r in asked), asked
    # Without the publisher's public key a node cannot check the signature: it plans nothing from it.
    blind = agents("blind", tracker, publisher_public_key=None)
    _refused(blind, "local/ft", None, "--publisher-public-key-file")
    assert blind.swarm.torrents() == []
