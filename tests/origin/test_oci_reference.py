"""oci:// references, the allow-list and the docker config, by the distribution spec's and docker's rules."""

from __future__ import annotations

import base64
import json

import pytest

from agent.core.errors import AuthError, ConfigError
from agent.kube.requests import parse_model_ref
from agent.origin.oci.auth import Authorizer, Credentials, credentials_for, parse_challenge
from agent.origin.oci.reference import allowed_registry, commit_of, parse_oci_url

DIGEST = "sha256:" + "ab" * 32


def test_a_reference_names_a_tag_a_digest_or_latest():
    ref = parse_oci_url("oci://reg.example:5000/org/model:v1.2")
    assert (ref.registry, ref.repository, ref.tag) == ("reg.example:5000", "org/model", "v1.2")
    assert ref.revision == "v1.2"
    pinned = parse_oci_url(f"oci://ghcr.io/org/model@{DIGEST}")
    assert pinned.reference == DIGEST and pinned.revision == "ab" * 20 == commit_of(DIGEST)
    assert parse_oci_url("oci://ghcr.io/org/model").tag == "latest"
    for bad in ("oci://ghcr.io/Org/Model:v1", "oci://ghcr.io/org/model@sha256:12", "oci:///model:v1",
                "s3://b/model", "oci://ghcr.io/org/../model:v1"):
        with pytest.raises(ConfigError):
            parse_oci_url(bad)


def test_the_allow_list_takes_whole_path_segments():
    allowed = ("oci://reg.example:5000/models",)
    assert allowed_registry("oci://reg.example:5000/models/llama:v1", allowed)
    for refused in ("oci://reg.example:5000/modelsx/llama:v1", "oci://reg.example/models/llama:v1",
                    "oci://other:5000/models/llama:v1"):
        with pytest.raises(ConfigError, match="--registry"):
            allowed_registry(refused, allowed)
    assert allowed_registry("oci://reg.example/any/thing:v1", ("oci://reg.example",))


def test_a_pod_annotation_names_a_registry_model_by_its_tag():
    ref = parse_model_ref("acme/llama=oci://reg.example:5000/models/llama:v1")
    assert (ref.repo_id, ref.revision) == ("acme/llama", "v1")
    assert ref.source == "oci://reg.example:5000/models/llama:v1"


def test_the_docker_config_gives_each_registry_its_login(tmp_path):
    config = tmp_path / "config.json"
    auth = base64.b64encode(b"me:pw:with:colons").decode()
    config.write_text(json.dumps({"auths": {"https://reg.example:5000/v1/": {"auth": auth},
                                            "other.example": {"username": "u", "password": "p"}}}))
    found = credentials_for("reg.example:5000", config)
    assert found is not None and (found.username, found.password) == ("me", "pw:with:colons")
    assert "pw" not in repr(found)
    assert credentials_for("reg.example", config) is None  # another port is another registry
    assert credentials_for("nowhere.example", tmp_path / "missing.json") is None
    config.write_text(json.dumps({"auths": {"reg.example:5000": {"auth": "not base64!"}}}))
    with pytest.raises(AuthError, match="not base64"):
        credentials_for("reg.example:5000", config)


def test_a_bearer_challenge_is_read_as_registries_send_it():
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:samalba/my-app:pull,push"'
    )
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                      "scope": "repository:samalba/my-app:pull,push"}


def test_the_login_goes_to_a_plain_http_token_realm_only_for_a_registry_named_plain_http():
    """A registry (or whoever answers for it) naming an http:// realm would get the login in clear:
    refused before any request, unless the operator named the registry in --oci-plain-http."""
    asked: list[tuple[str, dict[str, str]]] = []

    def get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        asked.append((url, headers))
        return 200, json.dumps({"token": "t0k3n", "expires_in": 300}).encode()

    login = Credentials("puller", "s3cret")
    challenge = 'Bearer realm="http://evil.example/token",service="reg",scope="repository:m:pull"'
    strict = Authorizer("reg.example", login, plain_http=False, get=get)
    with pytest.raises(AuthError, match="not HTTPS; refused") as caught:
        strict.challenged(challenge, None, "acme/m")
    assert asked == [] and "s3cret" not in str(caught.value) and strict.header() is None
    named = Authorizer("reg.example:5000", login, plain_http=True, get=get)
    named.challenged(challenge, None, "acme/m")
    assert named.header() == "Bearer t0k3n"
    ((url, headers),) = asked
    assert url.startswith("http://evil.example/token?") and headers == {"Authorization": login.basic()}
    assert "s3cret" not in repr(named) and "s3cret" not in repr(login)
