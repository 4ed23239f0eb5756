"""The origin's client API (agent.origin.hub_api), as the HF endpoint asks it, and which kinds have one
(agent.origin.kinds): against the real test hub, a port nothing listens on, and a server that fails."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.core.errors import ConfigError, OriginError
from agent.core.settings import OriginSettings
from agent.origin.answers import file_metadata, same_host
from agent.origin.hub_api import MAX_HOPS, HubClientApi, Unreachable
from agent.origin.kinds import NoClientApi, open_client_api, open_origin
from tests.support.cluster import Origin
from tests.support.procs import free_port

TOKEN = "hf_client_token_0123456789"


def api_for(url: str) -> HubClientApi:
    api = open_client_api(OriginSettings(endpoint=url, connect_timeout=2.0, read_timeout=5.0))
    assert isinstance(api, HubClientApi)
    return api


def test_hub_origins_have_a_client_api_and_buckets_say_why_not():
    assert api_for("https://huggingface.co/").endpoint == "https://huggingface.co"
    assert api_for("http://mirror.internal:8080").endpoint == "http://mirror.internal:8080"
    for scheme in ("s3", "gs", "az"):
        with pytest.raises(NoClientApi) as refused:
            open_client_api(OriginSettings(endpoint=f"{scheme}://models/llama-ft"))
        message = str(refused.value)
        assert f"object storage ({scheme}://)" in message
        assert "hub origins only (http://, https://)" in message
        assert "llama-ft" not in message  # fit for a client: no bucket name
    with pytest.raises(NoClientApi, match="no known kind"):
        open_client_api(OriginSettings(endpoint="ftp://files.internal/models"))
    with pytest.raises(ConfigError, match="no origin kind"):  # the fetch engine's side, unchanged
        open_origin(OriginSettings(endpoint="ftp://files.internal/models"))


def test_the_hub_api_reads_model_info_and_follows_resolve_on_the_hub_only(origin: Origin):
    api = api_for(origin.hub.url)
    info = asyncio.run(api.model_info(origin.repo_id))
    assert info.status == 200 and b'"private"' in info.body
    assert info.headers.get("CONTENT-TYPE", "").startswith("application/json")  # case-insensitive
    listed = asyncio.run(api.get(f"/api/models/{origin.repo_id}/tree/main", [("recursive", "true")], None))
    assert listed.status == 200 and b'"path"' in listed.body

    origin.hub.reset_counters()
    shard = next(p for p in origin.files if p.endswith(".safetensors"))
    small = next(p for p in origin.files if p.endswith(".json"))
    lfs_hops = asyncio.run(api.resolve_hops(f"/{origin.repo_id}/resolve/main/{shard}", f"Bearer {TOKEN}"))
    # An LFS file's 302 goes to the CDN, another host: not followed, its headers are the metadata.
    assert len(lfs_hops) == 1 and lfs_hops[0].status == 302
    meta = file_metadata(lfs_hops, shard)
    assert meta.size == len(origin.files[shard]) and not same_host(meta.url, origin.hub.url)
    small_hops = asyncio.run(api.resolve_hops(f"/{origin.repo_id}/resolve/main/{small}", f"Bearer {TOKEN}"))
    # A small file's 307 stays on the hub: followed, with the client's Authorization.
    assert [h.status for h in small_hops][-1] == 200 and len(small_hops) >= 2
    assert file_metadata(small_hops, small).size == len(origin.files[small])
    seen = [r for r in origin.hub.requests if r.method == "HEAD"]
    assert len(seen) == len(lfs_hops) + len(small_hops) and all(r.authorized for r in seen)
    assert not [r for r in origin.hub.requests if r.bucket == "cdn"]


class _Failing(BaseHTTPRequestHandler):
    """503 on /api/..., an endless same-host redirect on anything else."""

    def do_GET(self) -> None:
        self._answer()

    def do_HEAD(self) -> None:
        self._answer()

    def _answer(self) -> None:
        if self.path.startswith("/api/"):
            self.send_response(503)
        else:
            self.send_response(307)
            self.send_header("Location", self.path + "x")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def failing() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_5xx_or_no_answer_is_unreachable_and_a_redirect_loop_an_origin_error(failing: str):
    for url in (failing, f"http://127.0.0.1:{free_port()}"):  # a 503, then a port nothing listens on
        api = api_for(url)
        with pytest.raises(Unreachable):
            asyncio.run(api.get("/api/models/acme/m", [], None))
        with pytest.raises(Unreachable):
            asyncio.run(api.model_info("acme/m"))
        with pytest.raises(Unreachable):
            asyncio.run(api.auth_check("acme/m", f"Bearer {TOKEN}"))
    with pytest.raises(Unreachable):
        asyncio.run(api_for(f"http://127.0.0.1:{free_port()}").resolve_hops("/acme/m/resolve/main/a", None))
    with pytest.raises(OriginError, match=f"more than {MAX_HOPS} times"):
        asyncio.run(api_for(failing).resolve_hops("/acme/m/resolve/main/a", None))
