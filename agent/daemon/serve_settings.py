"""`agent serve`'s options onto one `Settings`, built once (the CLI's only job is to call
`build_serve_settings`).

One mechanism for every override: `overridden` sets "section.field" paths of the settings in one pass.
Options that set a field as given are a table (`FIELDS`); the few that need work first (secret files
read, keys checked, URLs normalised, the node's name, the kube switches) are computed in
`build_serve_settings` and go through the same `overridden`.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.core.errors import ConfigError
from agent.core.settings import Settings
from agent.core.signing import load_private_key, load_public_key
from agent.daemon.listeners import split_hostport
from agent.origin.bucket_url import split_bucket_url
from agent.origin.oci.reference import allowed_prefix, plain_http_hosts

FIELDS: Mapping[str, str] = {
    "interop_public": "swarm.interop_public",
    "peer_gate": "swarm.peer_gate",
    "super_seed": "swarm.super_seed",
    "relay_seeds": "swarm.relay_seeds",
    "relay_fanout": "swarm.relay_fanout",
    "relay_min_rate": "swarm.relay_min_rate",
    "origin_holders": "swarm.origin_holders",
    "origin_part_min": "swarm.origin_part_min",
    "disk_io": "swarm.disk_io",
    "peer_socket_buffer": "swarm.peer_receive_socket_buffer",
    "upload_rate_limit": "swarm.upload_rate_limit",
    "download_rate_limit": "swarm.download_rate_limit",
    "stall_timeout": "swarm.stall_timeout",
    "origin_timeout": "origin.answer_within",
    "resume_interval": "swarm.resume_interval",
    "admin_socket": "daemon.admin_socket",
    "pods_socket": "daemon.pods_socket",
    "metrics_on_network": "daemon.metrics_on_network",
    "publish_unchecked_ids": "daemon.publish_unchecked_ids",
    "buckets": "daemon.buckets",
    "registries": "daemon.registries",
    "oci_plain_http": "origin.oci_plain_http",
    "lease_ttl": "daemon.lease_ttl",
    "fd_reserve": "daemon.fd_reserve",
    "api_max_connections": "daemon.api_limits.max_connections",
    "api_max_connections_per_client": "daemon.api_limits.max_per_client",
    "api_header_timeout": "daemon.api_limits.header_timeout",
    "api_keepalive_timeout": "daemon.api_limits.keepalive_timeout",
    "api_body_timeout": "daemon.api_limits.body_timeout",
    "probe_listen": "daemon.probe_listen",
    "kube": "kube.enabled",
    "kubeconfig": "kube.kubeconfig",
}
"""`agent serve` options that set one settings field as given (None: the field keeps its default)."""


def overridden(settings: Any, values: Mapping[str, object]) -> Any:
    """`settings` (a frozen dataclass) with each "section.field[.field]" path of `values` set; None values
    are skipped (the option was not given)."""
    nested: dict[str, dict[str, object]] = {}
    direct: dict[str, object] = {}
    for path, value in values.items():
        if value is None:
            continue
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, inner in nested.items():
        direct[head] = overridden(getattr(settings, head), inner)
    return dataclasses.replace(settings, **direct) if direct else settings


def read_secret(path: Path | None, option: str) -> str | None:
    """The stripped contents of a secret file given as `option`; None when no file was given."""
    if path is None:
        return None
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {option} {path}: {exc.strerror}") from None
    if not secret:
        raise ConfigError(f"{option} {path} is empty")
    return secret


def _key_bytes(path: Path | None, option: str, load: Callable[[bytes], object]) -> bytes | None:
    """A PEM key file's bytes, checked now: a bad key fails at start, not at the first fetch."""
    secret = read_secret(path, option)
    if secret is None:
        return None
    load(secret.encode())
    return secret.encode()


def build_serve_settings(
    *,
    cache_dir: Path | None,
    state_dir: Path | None,
    tracker: str | None,
    tracker_token_file: Path | None,
    origin: str | None,
    token: str | None,
    bt_listen: str,
    api_listen: str,
    node_name: str | None,
    tracker_passkey_file: Path | None = None,
    publisher_token_file: Path | None = None,
    publisher_public_key_file: Path | None = None,
    publisher_signing_key_file: Path | None = None,
    publish_roots: Sequence[Path] = (),
    watch_namespace: str | None = None,
    kube_preheat: str = "on",
    kube_node_labels: str = "on",
    **fields: Any,
) -> Settings:
    """`agent serve`'s options onto one Settings: the named ones here need work first, every other one
    is a key of `FIELDS` (an unknown one is a programming error: TypeError)."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise TypeError(f"build_serve_settings() got unknown options {unknown}")
    split_hostport(bt_listen, "--bt-listen")
    split_hostport(api_listen, "--api-listen")
    for bucket in fields.get("buckets") or ():
        split_bucket_url(bucket)  # a wrong --bucket fails at start, not at the first request
    for registry in fields.get("registries") or ():
        allowed_prefix(registry)
    if "oci_plain_http" in fields:
        fields["oci_plain_http"] = plain_http_hosts(fields["oci_plain_http"])
    if tracker and not tracker.startswith(("http://", "https://")):
        raise ConfigError(f"--tracker must be an http(s) URL, got {tracker!r}")
    settings = Settings.from_env_defaults(cache_dir=cache_dir, state_dir=state_dir)
    derived: dict[str, object] = {
        "swarm.listen": bt_listen,
        "daemon.api_listen": api_listen,
        "daemon.tracker_url": tracker.rstrip("/") if tracker else None,
        "daemon.tracker_token": read_secret(tracker_token_file, "--tracker-token-file"),
        "daemon.tracker_passkey": read_secret(tracker_passkey_file, "--tracker-passkey-file"),
        "daemon.publisher_token": read_secret(publisher_token_file, "--publisher-token-file"),
        "daemon.node_name": node_name or socket.gethostname(),
        "daemon.publish_roots": tuple(Path(r).resolve() for r in publish_roots),
        "daemon.publisher_public_key": _key_bytes(
            publisher_public_key_file, "--publisher-public-key-file", load_public_key
        ),
        "daemon.publisher_signing_key": _key_bytes(
            publisher_signing_key_file, "--publisher-signing-key-file", load_private_key
        ),
        "origin.endpoint": (origin or settings.origin.endpoint).rstrip("/"),
        "origin.token": token or settings.origin.token,
        # The watcher needs the real node name (the downward API's spec.nodeName), not the hostname:
        # left empty without --node-name, so the watcher refuses to start with an actionable line.
        "kube.node_name": node_name or "",
        "kube.namespace": watch_namespace or None,
        "kube.preheat": kube_preheat == "on",
        "kube.node_labels": kube_node_labels == "on",
    }
    given = {FIELDS[name]: value for name, value in fields.items()}
    result: Settings = overridden(settings, given | derived)
    return result
