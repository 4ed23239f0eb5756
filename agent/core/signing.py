"""Signed manifests of hub-less models (Ed25519).

A model published with `agent publish` has no origin to vouch for it: its manifest (which path is
which blob) comes from the tracker alone, and anyone holding the tracker's publisher token could
register one. So the publisher signs each manifest with its private key
(`--publisher-signing-key-file`), the tracker stores the signature, and every agent verifies it
with the publisher's public key (`--publisher-public-key-file`) before it plans a single file from
it. The signature covers exactly what planning uses: the repo id, the commit and each file's path,
size and blob id (the blob id is the content's sha256, checked after download); nothing else of
the tracker's answer (infohashes, `published`, swarm counts) is trusted for what lands on disk.

`agent keygen DIR` makes a key pair (`generate_keypair`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.core.errors import ConfigError, IntegrityError

PAYLOAD_KIND = "weightswarm-manifest-v1"
"""Domain separation: a signature over a manifest payload can never pass as one over anything else."""

SIGNATURE_BYTES = 64
"""An Ed25519 signature; 88 characters in base64."""


def manifest_payload(repo_id: str, commit: str, files: Sequence[Mapping[str, Any]]) -> bytes:
    """The canonical bytes a publisher signs for repo_id@commit: compact JSON with sorted keys, the
    files sorted by path, each only {path, size, blob_id}. ValueError for a malformed file entry
    (a size that is not an integer, a path or blob id that is not a string), so a tampered manifest
    cannot be coerced into the payload of a genuine one."""
    out = []
    for f in files:
        path, size, blob_id = f.get("path"), f.get("size"), f.get("blob_id")
        if not isinstance(path, str) or not isinstance(blob_id, str):
            raise ValueError("each file needs a string path and blob_id")
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError(f"size of {path[:100]!r} is not an integer")
        out.append({"path": path, "size": size, "blob_id": blob_id})
    out.sort(key=lambda f: (f["path"], f["blob_id"], f["size"]))
    doc = {"kind": PAYLOAD_KIND, "repo_id": repo_id, "commit": commit, "files": out}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def generate_keypair() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair: (private key PEM, PKCS#8 unencrypted; public key PEM)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    """The signing key, or ConfigError (naming the option, never the key) when it is not an
    unencrypted Ed25519 private key in PEM."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            "--publisher-signing-key-file is not an unencrypted Ed25519 private key in PEM "
            "(make one with `agent keygen DIR`)"
        )
    return key


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    """The publisher's public key, or ConfigError when it is not an Ed25519 public key in PEM."""
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(
            "--publisher-public-key-file is not an Ed25519 public key in PEM "
            "(`agent keygen DIR` writes it as publisher.pub)"
        )
    return key


def sign_manifest(private_key_pem: bytes, payload: bytes) -> str:
    """The base64 Ed25519 signature of `payload` (`manifest_payload`)."""
    return base64.b64encode(load_private_key(private_key_pem).sign(payload)).decode("ascii")


def verify_manifest(public_key_pem: bytes, payload: bytes, signature: str) -> bool:
    """Whether `signature` (base64) is the publisher's over `payload`. False for a wrong, malformed
    or truncated signature; ConfigError when the public key itself is unusable."""
    key = load_public_key(public_key_pem)
    try:
        raw = base64.b64decode(signature.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, AttributeError):
        return False
    if len(raw) != SIGNATURE_BYTES:
        return False
    try:
        key.verify(raw, payload)
    except InvalidSignature:
        return False
    return True


def verified_published_manifest(
    manifest: Mapping[str, Any], public_key_pem: bytes | None, repo_id: str, commit: str
) -> list[dict[str, Any]]:
    """The files ({path, size, blob_id}, exactly what the signature covers) of a tracker manifest
    (`GET /v1/manifests/...`) of repo_id@commit, when the publisher role wrote it and its signature
    verifies with the publisher's public key for exactly this repo id, commit and file list.
    IntegrityError otherwise: planning must not use a byte of it."""
    where = f"the tracker's manifest of {repo_id}@{commit[:12]}"
    if manifest.get("published") is not True:
        raise IntegrityError(f"{where} was not written by the publisher: it carries no signature to trust")
    if public_key_pem is None:
        raise IntegrityError(
            f"{where} is a published (hub-less) model, and this agent has no publisher key to check its "
            "signature: start the agent with --publisher-public-key-file"
        )
    files = manifest.get("files")
    signature = manifest.get("signature")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise IntegrityError(f"{where} has no file list: refusing it")
    try:
        payload = manifest_payload(repo_id, commit, files)
    except ValueError as exc:
        raise IntegrityError(f"{where} is malformed ({exc}): refusing it") from None
    if not isinstance(signature, str) or not signature:
        raise IntegrityError(
            f"{where} has no publisher signature, so its signature does not verify: refusing it"
        )
    if not verify_manifest(public_key_pem, payload, signature):
        raise IntegrityError(
            f"{where}: the publisher signature does not verify: refusing it (changed since it was "
            "signed, or signed with another key than --publisher-public-key-file)"
        )
    return [{"path": f["path"], "size": f["size"], "blob_id": f["blob_id"]} for f in files]
