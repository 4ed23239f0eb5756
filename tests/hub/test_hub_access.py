"""The test hub decides access as huggingface.co does, seen through the real huggingface_hub client:
model info carries `private` and `gated`, `?expand=` answers only what was asked, a private repo looks
like a missing one, a gated repo's files need a token granted access (401 / 403 GatedRepo), and
`auth_check` agrees with the files. Plus the faults the HF endpoint's tests inject."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

from agent.hub.server import HubServer
from tests.support.cluster import write_models

OPEN = "org/open"
GATED = "org/gated"
MANUAL = "org/manual"
PRIVATE = "org/private"
OWNER = "hf_owner_token_0123456789"
GRANTED = "hf_granted_token_0123456789"
UNGRANTED = "hf_ungranted_token_0123456"
WRONG = "hf_wrong_token_00000000000"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    write_models(root, (OPEN, GATED, MANUAL, PRIVATE), total_bytes=64 * 1024, shards=1, seed=0)
    return root


@pytest.fixture
def hub(root: Path, make_hub) -> HubServer:
    return make_hub(
        root,
        tokens=[OWNER],
        grants={GRANTED: [GATED, PRIVATE], UNGRANTED: []},
        gated={GATED: "auto", MANUAL: "manual"},
        private=[PRIVATE],
    )


def api(hub: HubServer, token: str | bool) -> HfApi:
    return HfApi(endpoint=hub.url, token=token)


def test_model_info_says_private_and_gated(hub: HubServer):
    anon = api(hub, False)
    assert (anon.model_info(OPEN).private, anon.model_info(OPEN).gated) == (False, False)
    assert (anon.model_info(GATED).private, anon.model_info(GATED).gated) == (False, "auto")
    assert anon.model_info(MANUAL).gated == "manual"
    assert api(hub, GRANTED).model_info(PRIVATE).private is True
    raw = httpx.get(f"{hub.url}/api/models/{OPEN}").json()
    assert raw["private"] is False and raw["gated"] is False


@pytest.mark.parametrize("param", ["expand", "expand[]"])
def test_expand_answers_only_what_was_asked(hub: HubServer, param: str):
    body = httpx.get(f"{hub.url}/api/models/{GATED}", params=[(param, "private"), (param, "sha")]).json()
    assert sorted(body) == ["_id", "id", "private", "sha"]  # no `gated`: it was not asked for
    assert body["private"] is False and body["sha"] == hub.commit_for(GATED)
    info = api(hub, False).model_info(GATED, expand=["private"])
    assert info.private is False and info.gated is None
    bad = httpx.get(f"{hub.url}/api/models/{OPEN}", params={"expand": "nonsense"})
    assert bad.status_code == 400


def test_private_repo_looks_like_a_missing_one(hub: HubServer):
    for token, status in ((False, 401), (UNGRANTED, 404)):
        for repo in (PRIVATE, "org/missing"):
            with pytest.raises(RepositoryNotFoundError) as err:
                api(hub, token).model_info(repo)
            assert err.value.response.status_code == status, (token, repo)
            assert err.value.response.headers["X-Error-Code"] == "RepoNotFound"
    for token in (OWNER, GRANTED):
        assert api(hub, token).model_info(PRIVATE).id == PRIVATE


def test_gated_files_need_a_granted_token(hub: HubServer, tmp_path: Path):
    caches = iter(range(100))

    def get(token: str | bool, repo: str = GATED) -> Path:
        cache = tmp_path / str(next(caches))  # a fresh cache each: no fallback to a cached copy
        return Path(hf_hub_download(repo, "config.json", endpoint=hub.url, cache_dir=cache, token=token))

    assert get(GRANTED).read_bytes() == get(OWNER).read_bytes()
    for token, status in ((False, 401), (UNGRANTED, 403)):
        with pytest.raises(GatedRepoError) as err:
            get(token, MANUAL)
        assert err.value.response.status_code == status
    with pytest.raises(GatedRepoError):
        get(GRANTED, MANUAL)  # granted GATED, not MANUAL
    with pytest.raises(HfHubHTTPError) as wrong:
        get(WRONG)
    assert wrong.value.response.status_code == 401 and not isinstance(wrong.value, RepositoryNotFoundError)
    assert get(UNGRANTED, OPEN).is_file() and get(False, OPEN).is_file()


def test_auth_check_agrees_with_the_files(hub: HubServer):
    for token in (False, UNGRANTED, GRANTED):
        api(hub, token).auth_check(OPEN)
    api(hub, GRANTED).auth_check(GATED)
    api(hub, GRANTED).auth_check(PRIVATE)
    with pytest.raises(GatedRepoError):
        api(hub, False).auth_check(GATED)
    with pytest.raises(GatedRepoError) as err:
        api(hub, UNGRANTED).auth_check(GATED)
    assert err.value.response.status_code == 403
    for token, status in ((False, 401), (UNGRANTED, 404)):
        with pytest.raises(RepositoryNotFoundError) as missing:
            api(hub, token).auth_check(PRIVATE)
        assert missing.value.response.status_code == status
    wrong = httpx.get(f"{hub.url}/api/models/{OPEN}/auth-check", headers={"Authorization": f"Bearer {WRONG}"})
    assert wrong.status_code == 401


def test_path_faults_and_omitted_fields(hub: HubServer):
    path = f"/api/models/{GATED}/auth-check"
    hub.faults.path_status[path] = (307, {"Location": f"{hub.url}/api/models/{OPEN}/auth-check"})
    resp = httpx.get(f"{hub.url}{path}", headers={"Authorization": f"Bearer {UNGRANTED}"})
    assert resp.status_code == 307 and resp.headers["Location"].endswith(f"/api/models/{OPEN}/auth-check")
    hub.faults.model_info_omit.add("gated")
    assert "gated" not in httpx.get(f"{hub.url}/api/models/{OPEN}").json()
    hub.faults.reset()
    assert httpx.get(f"{hub.url}{path}", headers={"Authorization": f"Bearer {GRANTED}"}).status_code == 200
    assert httpx.get(f"{hub.url}/api/models/{OPEN}").json()["gated"] is False
    # Each request is recorded with its query string and whether it carried a token (never the token).
    authed = {"Authorization": f"Bearer {OWNER}"}
    httpx.get(f"{hub.url}/api/models/{OPEN}", params={"expand": "private"}, headers=authed)
    last = hub.requests[-1]
    assert (last.path, last.query, last.authorized) == (f"/api/models/{OPEN}", "expand=private", True)
