"""Signed manifests of hub-less models (agent.core.signing): the canonical payload, Ed25519 signatures,
`verified_published_manifest` refusing every tampering, `agent keygen`, and publishing refusing to
start without the signing key."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

from agent.cli.main import main
from agent.core.errors import ConfigError, IntegrityError, RefusedError
from agent.core.settings import DaemonSettings, Settings
from agent.core.signing import (
    generate_keypair,
    manifest_payload,
    sign_manifest,
    verified_published_manifest,
    verify_manifest,
)
from agent.fetch.publish import publish_directory
from agent.tracking.client import TrackerClient

REPO, COMMIT = "me/finetune", "c" * 40
FILES = [
    {"path": "model.safetensors", "size": 1234, "blob_id": "a" * 64, "infohash": "1" * 40},
    {"path": "config.json", "size": 56, "blob_id": "b" * 64, "infohash": None},
]
PRIVATE, PUBLIC = generate_keypair()


def published(files: list[dict[str, Any]] = FILES, signature: str | None = "sign") -> dict[str, Any]:
    """A tracker's GET answer for REPO@COMMIT; "sign": signed with PRIVATE over exactly `files`."""
    if signature == "sign":
        signature = sign_manifest(PRIVATE, manifest_payload(REPO, COMMIT, files))
    return {"repo_id": REPO, "commit": COMMIT, "files": files, "published": True, "signature": signature}


def test_the_payload_is_canonical_json_of_the_signed_fields_only():
    files = [{"path": "b/x", "size": 2, "blob_id": "f" * 40, "infohash": "9" * 40}, {**FILES[0]}]
    # Written out by hand from the format: sorted keys, compact separators, the files in path order
    # ("b/x" < "model.safetensors") whatever order they came in, each with path, size and blob id only.
    expected = (
        '{"commit":"' + COMMIT + '","files":['
        '{"blob_id":"' + "f" * 40 + '","path":"b/x","size":2},'
        '{"blob_id":"' + "a" * 64 + '","path":"model.safetensors","size":1234}'
        '],"kind":"weightswarm-manifest-v1","repo_id":"me/finetune"}'
    )
    assert manifest_payload(REPO, COMMIT, files).decode() == expected
    assert manifest_payload(REPO, COMMIT, list(reversed(files))).decode() == expected
    for bad in ({**FILES[0], "size": "1234"}, {**FILES[0], "size": True}, {**FILES[0], "path": None}):
        with pytest.raises(ValueError):
            manifest_payload(REPO, COMMIT, [bad])


def test_a_signature_is_ed25519_over_the_payload():
    payload = manifest_payload(REPO, COMMIT, FILES)
    signature = sign_manifest(PRIVATE, payload)
    raw = base64.b64decode(signature)
    assert len(raw) == 64 and len(signature) == 88
    # Checked with the library directly, not with verify_manifest: an Ed25519 pair, a valid signature.
    public, private = load_pem_public_key(PUBLIC), load_pem_private_key(PRIVATE, None)
    assert isinstance(public, Ed25519PublicKey) and isinstance(private, Ed25519PrivateKey)
    assert private.public_key().public_bytes_raw() == public.public_bytes_raw()
    public.verify(raw, payload)
    assert verify_manifest(PUBLIC, payload, signature)
    assert not verify_manifest(PUBLIC, payload + b" ", signature)
    assert not verify_manifest(generate_keypair()[1], payload, signature)
    for garbage in ("", "not base64!", base64.b64encode(raw[:63]).decode(), signature[:-4]):
        assert not verify_manifest(PUBLIC, payload, garbage), garbage


def test_unusable_keys_are_config_errors_naming_the_option():
    with pytest.raises(ConfigError, match="--publisher-signing-key-file"):
        sign_manifest(PUBLIC, b"x")  # a public key where the private one belongs
    with pytest.raises(ConfigError, match="--publisher-public-key-file"):
        verify_manifest(PRIVATE, b"x", "A" * 86 + "==")
    with pytest.raises(ConfigError, match="--publisher-public-key-file"):
        verify_manifest(
            b"-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n", b"x", "A" * 86 + "=="
        )


def test_a_published_manifest_verifies_and_yields_only_the_signed_fields():
    files = verified_published_manifest(published(), PUBLIC, REPO, COMMIT)
    assert files == [{k: f[k] for k in ("path", "size", "blob_id")} for f in FILES]
    # Infohashes are not signed (each blob's metainfo is fixed at the tracker; its bytes are checked
    # against the blob id): another value there changes nothing, and none is handed back.
    other = [{**f, "infohash": "7" * 40} for f in FILES]
    signed_over_files = published()["signature"]
    assert verified_published_manifest(published(other, signed_over_files), PUBLIC, REPO, COMMIT) == files
    reordered = published(list(reversed(FILES)), signed_over_files)
    assert sorted(map(str, verified_published_manifest(reordered, PUBLIC, REPO, COMMIT))) == sorted(
        map(str, files)
    )


def _tampered(what: str) -> tuple[dict[str, Any], bytes | None, str, str]:
    """(manifest, public key, repo id, commit) with one thing changed after signing."""
    good = published()
    sig = good["signature"]
    big, small = FILES
    cases: dict[str, tuple[dict[str, Any], bytes | None, str, str]] = {
        "size": (published([{**big, "size": 1235}, small], sig), PUBLIC, REPO, COMMIT),
        "blob_id": (published([{**big, "blob_id": "e" * 64}, small], sig), PUBLIC, REPO, COMMIT),
        "path": (published([{**big, "path": "evil.safetensors"}, small], sig), PUBLIC, REPO, COMMIT),
        "file added": (published([*FILES, {**small, "path": "x.py"}], sig), PUBLIC, REPO, COMMIT),
        "file removed": (published([big], sig), PUBLIC, REPO, COMMIT),
        "other commit": (good, PUBLIC, REPO, "d" * 40),
        "other repo": (good, PUBLIC, "me/other", COMMIT),
        "wrong key": (good, generate_keypair()[1], REPO, COMMIT),
        "missing signature": (published(signature=None), PUBLIC, REPO, COMMIT),
        "empty signature": (published(signature=""), PUBLIC, REPO, COMMIT),
        "garbage signature": (published(signature="A" * 86 + "=="), PUBLIC, REPO, COMMIT),
        "size as a string": (published([{**big, "size": "1234"}, small], sig), PUBLIC, REPO, COMMIT),
    }
    return cases[what]


@pytest.mark.parametrize(
    "what",
    [
        "size",
        "blob_id",
        "path",
        "file added",
        "file removed",
        "other commit",
        "other repo",
        "wrong key",
        "missing signature",
        "empty signature",
        "garbage signature",
        "size as a string",
    ],
)
def test_every_tampering_is_refused(what: str):
    manifest, key, repo, commit = _tampered(what)
    with pytest.raises(IntegrityError, match="refusing it") as refused:
        verified_published_manifest(manifest, key, repo, commit)
    assert repo in str(refused.value)
    if what not in ("size as a string",):
        assert "signature does not verify: refusing it" in str(refused.value)


def test_no_public_key_or_an_agent_written_manifest_is_refused():
    with pytest.raises(IntegrityError, match="start the agent with --publisher-public-key-file"):
        verified_published_manifest(published(), None, REPO, COMMIT)
    agent_written = {**published(), "published": False, "signature": None}
    with pytest.raises(IntegrityError, match="not written by the publisher"):
        verified_published_manifest(agent_written, PUBLIC, REPO, COMMIT)
    with pytest.raises(IntegrityError, match="not written by the publisher"):
        verified_published_manifest({**published(), "published": "yes"}, PUBLIC, REPO, COMMIT)


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path):
    runner = CliRunner()
    out = runner.invoke(main, ["keygen", str(tmp_path / "keys")])
    assert out.exit_code == 0, out.output
    private, public = tmp_path / "keys" / "publisher.key", tmp_path / "keys" / "publisher.pub"
    assert out.output.strip().splitlines()[-1] == str(public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    payload = manifest_payload(REPO, COMMIT, FILES)
    assert verify_manifest(public.read_bytes(), payload, sign_manifest(private.read_bytes(), payload))
    before = private.read_bytes()
    again = runner.invoke(main, ["keygen", str(tmp_path / "keys")])
    assert again.exit_code != 0 and "exists" in again.output
    assert private.read_bytes() == before


def test_publishing_to_a_tracker_without_the_signing_key_copies_nothing(tmp_path: Path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w" * 1000)
    settings = Settings.from_env_defaults(cache_dir=tmp_path / "hub", state_dir=tmp_path / "state")
    daemon = DaemonSettings(tracker_url="http://127.0.0.1:9", tracker_token="t", publisher_token="p")
    tracker = TrackerClient("http://127.0.0.1:9", "t", daemon)  # nothing listens: it must not be asked
    try:
        for key, error, match in (
            (None, RefusedError, "--publisher-signing-key-file"),
            (PUBLIC, ConfigError, "--publisher-signing-key-file"),
        ):
            s = dataclasses.replace(settings, daemon=dataclasses.replace(daemon, publisher_signing_key=key))
            with pytest.raises(error, match=match):
                publish_directory(s, folder, "me/model", tracker=tracker)
            assert not (settings.cache_dir / "models--me--model").exists()
        no_token = dataclasses.replace(daemon, publisher_token=None, publisher_signing_key=PRIVATE)
        with pytest.raises(RefusedError, match="--publisher-token-file"):
            publish_directory(
                dataclasses.replace(settings, daemon=no_token), folder, "me/model", tracker=tracker
            )
        # Without a tracker nothing is registered, so nothing needs signing: the local cache gets it.
        local = publish_directory(settings, folder, "me/model")
        assert local.files[0]["blob_id"] == hashlib.sha256(b"w" * 1000).hexdigest() and not local.published
    finally:
        tracker.close()
