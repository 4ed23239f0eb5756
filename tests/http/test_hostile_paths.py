"""Hostile paths and queries on the channels anyone can reach (the network listener, the pods' socket):
nothing of them reaches the origin unchecked, and no input makes a 5xx.

Requests are sent as raw bytes on a socket: an HTTP client library would normalise `..` away before it
left, and the attacker's requests are exactly what they typed.
"""

from __future__ import annotations

import itertools
import re
import socket
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent.daemon.node import Daemon
from tests.support.cluster import Origin

NASTY = [
    "r" * 10_000,
    "%00",
    "a%00b",
    "..",
    "%2e%2e",
    ".",
    "%2F",
    "a%2F..%2Fb",
    "%ff%fe",
    "%",
    "x%2",
    "%0d%0aX-Injected:%20yes",
    "~user",
    "a:b",
    "@%7B1%7D",
    "refs%2Fpr%2F1",
    "\u00e9t\u00e9".encode().decode("latin-1"),  # raw UTF-8 bytes in the path
]


def raw_request(address: str | Path, target: str, method: str = "GET", body: bytes = b"") -> int:
    """Send one request exactly as given; the answer's status."""
    if isinstance(address, Path):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(address))
    else:
        parts = urlsplit(address)
        sock = socket.create_connection((parts.hostname, parts.port))
    with sock:
        sock.settimeout(30)
        head = f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode("latin-1") + b"\r\n" + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    match = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    assert match, answer[:200]
    return int(match.group(1))


def origin_paths(origin: Origin) -> list[str]:
    return [r.path for r in origin.hub.requests]


@pytest.mark.parametrize(
    "target",
    [
        "/api/models/../../_stats",
        "/api/models/%2e%2e/%2e%2e/_stats",
        "/api/models/acme/%2e%2e/_stats",
        "/api/models/acme/tiny/tree/main/%2e%2e/%2e%2e/%2e%2e/_stats",
        "/acme/tiny/resolve/main/..%2F..%2Fx",
    ],
)
def test_a_path_that_climbs_out_of_the_api_is_refused_and_the_origin_sees_nothing(
    origin: Origin, make_agent, target: str
):
    agent: Daemon = make_agent("solo", origin, None)
    origin.hub.reset_counters()
    assert raw_request(agent.api_url, target) == 400
    assert origin_paths(origin) == []


def test_only_the_documented_query_parameters_reach_the_origin(origin: Origin, make_agent):
    agent: Daemon = make_agent("solo", origin, None)
    origin.hub.reset_counters()
    target = f"/api/models/{origin.repo_id}?expand=sha&admin=1&path=/_stats&securityStatus=true"
    assert raw_request(agent.api_url, target) == 200
    [asked] = origin.hub.requests
    assert asked.path == f"/api/models/{origin.repo_id}"
    assert sorted(asked.query.split("&")) == ["expand=sha", "securityStatus=true"], asked.query
    # A route the Hub has but this endpoint does not pass on: 404 here, nothing there.
    origin.hub.reset_counters()
    assert raw_request(agent.api_url, f"/api/models/{origin.repo_id}/discussions") == 404
    assert origin_paths(origin) == []


def test_a_long_revision_is_a_400_and_a_ten_thousand_byte_one_a_414(origin: Origin, make_agent):
    agent: Daemon = make_agent("solo", origin, None)
    # 2,000 bytes: within the listener's 8 KiB target, past git's 255: the route refuses it.
    assert raw_request(agent.api_url, f"/{origin.repo_id}/resolve/{'r' * 2_000}/config.json") == 400
    # 10,000 bytes: past the target the listener takes at all (servekit.limits).
    assert raw_request(agent.api_url, f"/{origin.repo_id}/resolve/{'r' * 10_000}/config.json") == 414


def _templates(app) -> list[tuple[str, str]]:
    """(method, path template) of every route of `app`, as its OpenAPI document lists them."""
    with warnings.catch_warnings():  # GET and HEAD of one route share an operation id: not our concern
        warnings.simplefilter("ignore", UserWarning)
        paths = app.openapi()["paths"]
    return [(method.upper(), path) for path, methods in sorted(paths.items()) for method in sorted(methods)]


def _fill(template: str, value: str, good: dict[str, str]) -> list[str]:
    """`template` with each of its parameters in turn set to `value`, the others to good values."""
    names = re.findall(r"{(\w+)}", template)
    targets = []
    for bad in names:
        target = template
        for name in names:
            target = target.replace(f"{{{name}}}", value if name == bad else good.get(name, "x"))
        targets.append(target)
    return targets or [template + "/" + value]


@pytest.mark.timeout(240)
def test_a_walk_of_every_route_with_hostile_inputs_finds_no_5xx(origin: Origin, make_agent, tmp_path: Path):
    pods = tmp_path / "pods.sock"
    agent: Daemon = make_agent("solo", origin, None, daemon={"pods_socket": pods})
    org, name = origin.repo_id.split("/")
    good = {
        "org": org,
        "name": name,
        "rev": "main",
        "path": "config.json",
        "rest": origin.repo_id,
        "blob_id": "0" * 64,
        "job_id": "0" * 32,
    }
    channels = {
        agent.api_url: agent.api_server.server.config.app,
        pods: next(s for s in agent.servers if s.where == str(pods)).server.config.app,
    }
    seen = []
    for address, app in channels.items():
        for (method, template), value in itertools.product(_templates(app), NASTY):
            body = b"{\"repo_id\": \"" + value.encode("latin-1") + b"\"}" if method == "POST" else b""
            for target in _fill(template, value, good):
                status = raw_request(address, target, method, body)
                seen.append((status, method, target[:120]))
    assert {t for _, _, t in seen if "/resolve/" in t} and {t for _, _, t in seen if "/api/models/" in t}
    errors = [s for s in seen if s[0] >= 500]
    assert errors == [], errors[:20]
    assert any(s[0] == 400 for s in seen) and any(s[0] == 404 for s in seen)
