"""The HF endpoint's access decision (docs/security.md: P2P never widens access). Real agent daemons,
a real test hub that decides access as huggingface.co does, real huggingface_hub clients.

Every attack starts from a node that already holds the bytes (a granted client fetched them), so the
only thing between another client and those bytes is the endpoint's own decision."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from agent.daemon.node import Daemon
from agent.http.hf_access import Visibility, visibility_of
from agent.hub.server import HubServer
from agent.origin.hub_api import Answer
from tests.support.cluster import Origin, same_files, write_models
from tests.support.procs import loop_until

OPEN = "acme/open"
GATED = "acme/gated"
PRIVATE = "acme/private"
OWNER = "hf_owner_token_abcdef0123456"
GOOD = "hf_granted_token_0123456789a"
OTHER = "hf_valid_but_not_granted_0123"
WRONG = "hf_not_a_token_at_all_000000"
SHARD = "model-00001-of-00002.safetensors"


class Hub:
    """Three repos on one test hub: public, gated (GOOD granted), private (GOOD granted)."""

    def __init__(self, server: HubServer, files: dict[str, dict[str, bytes]]) -> None:
        self.server = server
        self.files = files
        self.url = server.url

    def origin(self, repo_id: str) -> Origin:
        return Origin.of(self.server, repo_id, self.files[repo_id])

    def auth_checks(self, repo_id: str) -> int:
        return sum(1 for r in self.server.requests if r.path == f"/api/models/{repo_id}/auth-check")


@pytest.fixture
def hub(tmp_path: Path, make_hub) -> Hub:
    root = tmp_path / "hub"
    files = write_models(root, (OPEN, GATED, PRIVATE), total_bytes=2**20, shards=2, seed=21)
    grants = {GOOD: [GATED, PRIVATE], OTHER: []}
    server = make_hub(root, tokens=[OWNER], grants=grants, gated={GATED: "manual"}, private=[PRIVATE])
    return Hub(server, files)


@pytest.fixture
def agent(hub: Hub, make_agent) -> Daemon:
    """A node with no HF token of its own: every byte it holds came with a client's token."""
    daemon: Daemon = make_agent("node", hub.origin(OPEN), None)
    return daemon


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def get(
    agent: Daemon, repo_id: str, path: str, token: str | None = None, rev: str = "main"
) -> httpx.Response:
    return httpx.get(f"{agent.api_url}/{repo_id}/resolve/{rev}/{path}", headers=bearer(token), timeout=60)


def cache_with_good_token(hub: Hub, agent: Daemon, repo_id: str) -> str:
    """The node holds the repo, fetched with GOOD's token through the daemon itself (so the HF
    endpoint has decided nothing yet); the commit."""
    job = agent.request_model(repo_id, "main", token=GOOD)
    assert job.wait(60) and job.status().phase == "Ready", job.status()
    return hub.server.commit_for(repo_id)


def assert_refused(
    resp: httpx.Response, hub: Hub, repo_id: str, status: int | None, code: str | None
) -> None:
    assert resp.status_code != 200 and hub.files[repo_id][SHARD] not in resp.content
    assert len(resp.content) < 4096
    if status is not None:
        assert resp.status_code == status, (resp.status_code, resp.headers.get("X-Error-Message"))
    if code is not None:
        assert resp.headers.get("X-Error-Code") == code


# -- what the origin must say for "public" ---------------------------------------------------------


def _info(status: int, body: object = None, **headers: str) -> Answer:
    resp = httpx.Response(status, json=body, headers=headers)
    return Answer(resp.status_code, resp.headers, resp.content)


@pytest.mark.parametrize(
    ("resp", "public"),
    [
        (_info(200, {"id": OPEN, "private": False, "gated": False}), True),
        (_info(200, {"id": OPEN, "private": False}), False),  # `?expand=private` leaves `gated` out
        (_info(200, {"id": OPEN, "gated": False}), False),
        (_info(200, {"id": OPEN, "private": False, "gated": None}), False),
        (_info(200, {"id": OPEN, "private": False, "gated": "auto"}), False),
        (_info(200, {"id": OPEN, "private": False, "gated": "manual"}), False),
        (_info(200, {"id": OPEN, "private": "false", "gated": "false"}), False),
        (_info(200, {"id": OPEN, "private": 0, "gated": 0}), False),
        (_info(200, [{"private": False, "gated": False}]), False),
        (_info(307, Location=f"/api/models/{OPEN}"), False),
        (_info(401, {"error": "Repository not found"}, **{"X-Error-Code": "RepoNotFound"}), False),
    ],
)
def test_public_only_when_the_origin_says_private_false_and_gated_false(resp: Answer, public: bool):
    seen = visibility_of(OPEN, resp)
    assert isinstance(seen, Visibility) and seen.public is public
    if not public:
        assert seen.refusal[0] >= 400


# -- attacks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("param", ["expand", "expand[]"])
def test_client_query_parameters_cannot_make_a_gated_repo_public(hub: Hub, agent: Daemon, param: str):
    commit = cache_with_good_token(hub, agent, GATED)
    # The client's own model-info requests go to the origin as asked, and come back without `gated`.
    for rest in (GATED, f"{GATED}/revision/main", f"{GATED}/revision/{commit}"):
        info = httpx.get(f"{agent.api_url}/api/models/{rest}", params={param: "private"}, timeout=30)
        assert info.status_code == 200 and info.json().get("private") is False and "gated" not in info.json()
    for rev in ("main", commit):
        assert_refused(get(agent, GATED, SHARD, rev=rev), hub, GATED, 401, "GatedRepo")
    # The agent asked for itself: the fixed model-info URL, no query string, no client's token.
    own = [r for r in hub.server.requests if r.path == f"/api/models/{GATED}" and not r.authorized]
    assert any(r.query == "" for r in own)


def test_a_model_info_without_gated_is_not_public(hub: Hub, agent: Daemon):
    commit = cache_with_good_token(hub, agent, GATED)
    hub.server.faults.model_info_omit.add("gated")  # a mirror or proxy that does not send the field
    assert "gated" not in httpx.get(f"{agent.api_url}/api/models/{GATED}", timeout=30).json()
    for rev in ("main", commit):
        assert_refused(get(agent, GATED, SHARD, rev=rev), hub, GATED, None, None)
    # Even a truly public repo goes only to tokens the origin accepts while the field is missing.
    assert_refused(get(agent, OPEN, SHARD), hub, OPEN, None, None)
    assert get(agent, OPEN, SHARD, OTHER).content == hub.files[OPEN][SHARD]


def test_a_redirect_on_the_access_check_is_not_a_grant(hub: Hub, agent: Daemon):
    commit = cache_with_good_token(hub, agent, GATED)
    # What the origin's resolve HEAD says to a granted token: a 302 to the CDN with the file's metadata.
    real = httpx.head(f"{hub.url}/{GATED}/resolve/main/{SHARD}", headers=bearer(OWNER))
    assert real.status_code == 302
    meta = {
        k: real.headers[k] for k in ("X-Repo-Commit", "ETag", "X-Linked-Etag", "X-Linked-Size", "Location")
    }
    api = f"{hub.url}/api/models"
    hub.server.faults.path_status.update(
        {
            # Each redirect points where a followed request would be told "yes".
            f"/api/models/{GATED}": (307, {"Location": f"{api}/{OPEN}"}),
            f"/api/models/{GATED}/auth-check": (307, {"Location": f"{api}/{OPEN}/auth-check"}),
            f"/{GATED}/resolve/main/{SHARD}": (302, meta),
            f"/{GATED}/resolve/{commit}/{SHARD}": (302, meta),
        }
    )
    for token in (None, OTHER, GOOD):  # GOOD too: a redirect is no decision, whoever asks
        for rev in ("main", commit):
            assert_refused(get(agent, GATED, SHARD, token, rev), hub, GATED, 502, None)
    hub.server.faults.reset()
    assert_refused(get(agent, GATED, SHARD, OTHER), hub, GATED, 403, "GatedRepo")
    assert get(agent, GATED, SHARD, GOOD).content == hub.files[GATED][SHARD]


def test_one_clients_grant_serves_no_other_client(hub: Hub, agent: Daemon, tmp_path: Path):
    a = get(agent, GATED, SHARD, GOOD)  # client A: the node fetches the file with A's token
    assert a.status_code == 200 and a.content == hub.files[GATED][SHARD]
    commit = hub.server.commit_for(GATED)
    asked = hub.auth_checks(GATED)
    assert asked == 1
    for rev in ("main", commit):
        assert_refused(get(agent, GATED, SHARD, None, rev), hub, GATED, 401, "GatedRepo")  # client B
        assert_refused(get(agent, GATED, SHARD, WRONG, rev), hub, GATED, 401, None)  # client C
        assert_refused(get(agent, GATED, SHARD, OTHER, rev), hub, GATED, 403, "GatedRepo")
        resp = httpx.get(
            f"{agent.api_url}/{GATED}/resolve/{rev}/{SHARD}", headers={"Authorization": GOOD}, timeout=30
        )
        assert_refused(resp, hub, GATED, 401, None)  # A's token in another scheme is another credential
    assert hub.auth_checks(GATED) == asked + 6  # each token asked the origin: A's grant was not theirs
    # A itself rides on its own grant: no second auth check within the TTL.
    assert get(agent, GATED, SHARD, GOOD, commit).content == hub.files[GATED][SHARD]
    assert hub.auth_checks(GATED) == asked + 6
    # huggingface_hub sees the Hub's own exceptions.
    with pytest.raises(GatedRepoError):
        hf_hub_download(GATED, SHARD, endpoint=agent.api_url, cache_dir=tmp_path / "b", token=False)
    assert not list((tmp_path / "b").rglob("*.safetensors"))


def test_a_private_repo_is_not_revealed(hub: Hub, agent: Daemon, tmp_path: Path):
    commit = cache_with_good_token(hub, agent, PRIVATE)
    missing = "acme/missing"
    for token, status in ((None, 401), (OTHER, 404)):
        for rest in ("", "/revision/main", f"/tree/{commit}"):
            seen = [
                httpx.get(f"{agent.api_url}/api/models/{r}{rest}", headers=bearer(token), timeout=30)
                for r in (PRIVATE, missing)
            ]
            assert [(s.status_code, s.headers.get("X-Error-Code")) for s in seen] == [
                (status, "RepoNotFound")
            ] * 2
            assert PRIVATE.encode() not in seen[0].content
        for rev in ("main", commit):
            resp = get(agent, PRIVATE, SHARD, token, rev)
            assert_refused(resp, hub, PRIVATE, status, "RepoNotFound")
            other = get(agent, missing, SHARD, token, rev)
            assert (other.status_code, other.headers.get("X-Error-Code")) == (status, "RepoNotFound")
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=agent.api_url, token=False).model_info(PRIVATE)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(PRIVATE, SHARD, endpoint=agent.api_url, cache_dir=tmp_path / "anon", token=False)
    assert not list((tmp_path / "anon").rglob("*.safetensors"))


# -- legitimate use --------------------------------------------------------------------------------


def test_snapshot_download_gated_with_the_right_token_and_public_anonymously(
    hub: Hub, agent: Daemon, tmp_path: Path
):
    same_files(
        snapshot_download(GATED, endpoint=agent.api_url, cache_dir=tmp_path / "g", token=GOOD),
        hub.files[GATED],
    )
    same_files(
        snapshot_download(OPEN, endpoint=agent.api_url, cache_dir=tmp_path / "o", token=False),
        hub.files[OPEN],
    )
    HfApi(endpoint=agent.api_url).auth_check(GATED, token=GOOD)
    # Every fetch ran with the client's own token, counted to its address; the node lent nothing.
    keys = [job.key for job in agent.jobs.all()]
    assert keys and all(k.client == "hf:127.0.0.1" and k.requester != "node" for k in keys)
    assert {k.repo_id for k in keys} == {GATED, OPEN}
    assert all(k.requester for k in keys if k.repo_id == GATED) and not any(
        k.requester for k in keys if k.repo_id == OPEN
    )
    # The public decision came from the agent's own anonymous, query-less model-info request.
    own = [r for r in hub.server.requests if r.path == f"/api/models/{OPEN}" and r.query == ""]
    assert any(not r.authorized for r in own)
    assert hub.auth_checks(OPEN) == 0


def test_a_client_over_its_job_limit_gets_429(hub: Hub, make_agent):
    agent: Daemon = make_agent("busy", hub.origin(OPEN), None, daemon={"max_jobs_per_client": 1})
    hub.server.rate_total = 128 * 1024  # the first shard takes ~4 s to arrive
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(get(agent, OPEN, SHARD)))
    worker.start()
    try:
        loop_until(lambda: any(not j.done for j in agent.jobs.all()), timeout=30, what="first job running")
        busy = get(agent, OPEN, "model-00002-of-00002.safetensors")
        assert busy.status_code == 429, busy.text
        assert int(busy.headers["Retry-After"]) > 0 and "limit" in busy.headers["X-Error-Message"]
        assert hub.files[OPEN]["model-00002-of-00002.safetensors"] not in busy.content
    finally:
        worker.join(60)
        hub.server.rate_total = None
    assert first and first[0].status_code == 200 and first[0].content == hub.files[OPEN][SHARD]
