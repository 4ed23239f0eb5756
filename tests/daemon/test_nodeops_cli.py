"""`agent publish` / `verify` / `rm` with real daemons, tracker and origin; JSON logs without tokens."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import subprocess
from pathlib import Path

import httpx
from click.testing import CliRunner
from huggingface_hub import scan_cache_dir

from agent.cache.eviction import scan_cache
from agent.cli.logs import JsonFormatter, RedactSecrets, redact
from agent.cli.main import main
from agent.core.settings import Settings
from agent.core.signing import generate_keypair, verified_published_manifest
from agent.daemon.node import Daemon
from agent.fetch.engine import fetch_snapshot
from agent.hub.server import HubServer
from agent.hub.testmodel import make_model
from tests.support.cluster import BIN, agent_settings, publisher_keys
from tests.support.procs import free_port

SECRET = "hf_SuperSecretToken0123456789"


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_verify_detects_a_corrupt_blob_and_repairs_it_from_the_origin(tmp_path):
    root = tmp_path / "src"
    make_model(root, "acme/tiny", total_bytes=2**20, shards=2, seed=1)
    with HubServer(root) as hub:
        settings = Settings.from_env_defaults(cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
        settings = dataclasses.replace(
            settings, origin=dataclasses.replace(settings.origin, endpoint=hub.url)
        )
        result = fetch_snapshot(settings, "acme/tiny")
        shard = next(f for f in result.files if f.path.endswith(".safetensors"))
        blob = settings.cache_dir / "models--acme--tiny" / "blobs" / shard.blob_id
        good = blob.read_bytes()
        flip_a_byte(blob)  # same size: the cheap size check cannot see it
        args = [
            "--cache-dir",
            str(settings.cache_dir),
            "--state-dir",
            str(settings.state_dir),
            "--agent",
            "off",
        ]

        runner = CliRunner()
        report = runner.invoke(main, ["verify", "acme/tiny", *args, "--no-repair"])
        assert report.exit_code == 6, report.output
        assert "1 corrupt" in report.output and shard.blob_id[:16] in report.output

        fixed = runner.invoke(main, ["verify", "acme/tiny", *args, "--origin", hub.url])
        assert fixed.exit_code == 0, fixed.output
        assert "repaired 1 of 1" in fixed.output
        assert blob.read_bytes() == good
        assert not scan_cache_dir(settings.cache_dir).warnings
        clean = runner.invoke(main, ["verify", *args])
        assert clean.exit_code == 0 and "0 corrupt" in clean.output, clean.output


def test_publish_on_one_agent_fetch_on_another_with_no_origin_at_all(tracker, tmp_path):
    model_dir = tmp_path / "my-finetune"
    paths = make_model(tmp_path / "gen", "me/finetune", total_bytes=2**20, shards=2, seed=5)
    model_dir.mkdir()
    files = {}
    for p in paths:
        rel = p.relative_to(tmp_path / "gen" / "me" / "finetune")
        if rel.name.startswith("."):
            continue  # `.gitattributes`: publish skips hidden files
        (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / rel).write_bytes(p.read_bytes())
        files[rel.as_posix()] = p.read_bytes()
    no_origin = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    signing_key, public_key = (p.read_bytes() for p in publisher_keys())
    daemons = []
    try:
        # A publishes (the publisher's private key, no public key); B fetches (only the public key).
        for name, keys in (
            ("a", {"publisher_signing_key": signing_key, "publisher_public_key": None}),
            ("b", {"publisher_signing_key": None, "publisher_public_key": public_key}),
        ):
            s = agent_settings(tmp_path, name, no_origin, tracker)
            # No origin to ask whether it has the repo id: an air-gapped cluster's setting.
            daemon = dataclasses.replace(
                s.daemon, publish_roots=(tmp_path,), publish_unchecked_ids=True, **keys
            )
            s = dataclasses.replace(s, origin=dataclasses.replace(s.origin, max_retries=1), daemon=daemon)
            d = Daemon(s)
            daemons.append(d)
            d.start()
        a, b = daemons
        runner = CliRunner()
        out = runner.invoke(
            main, ["publish", str(model_dir), "--repo-id", "local/finetune", "--agent", a.admin_url]
        )
        assert out.exit_code == 0, out.output
        commit = out.output.strip().splitlines()[-1]
        # The README: the commit is the sha1 of the sorted (path, sha256) list, which agent.fetch.publish
        # serialises as compact JSON; computed here from the bytes, not with agent.fetch.publish.
        pairs = sorted([rel, hashlib.sha256(data).hexdigest()] for rel, data in files.items())
        assert commit == hashlib.sha1(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()
        # The tracker holds A's signature of exactly these files, which the public key verifies.
        manifest = httpx.get(
            f"{tracker.url}/v1/manifests/local/finetune/{commit}", headers=tracker.auth, timeout=10
        ).json()
        signed = verified_published_manifest(manifest, public_key, "local/finetune", commit)
        assert sorted((f["path"], f["size"], f["blob_id"]) for f in signed) == sorted(
            (rel, len(data), hashlib.sha256(data).hexdigest()) for rel, data in files.items()
        )

        job = b.request_model("local/finetune", "main")
        assert job.wait(90), job.status()
        st = job.status()
        assert st.phase == "Ready", st.error
        assert st.commit == commit and st.bytes_from_origin == 0
        assert st.bytes_from_peers >= sum(len(d) for d in files.values())
        snap = Path(st.snapshot or "")
        for rel, data in files.items():
            assert (snap / rel).read_bytes() == data, rel
        assert not scan_cache_dir(b.settings.cache_dir).warnings

        # A corrupt copy on B is found and repaired through B's daemon (from A, still no origin).
        shard = next(r for r in files if r.endswith(".safetensors"))
        blob_id = hashlib.sha256(files[shard]).hexdigest()
        flip_a_byte(b.settings.cache_dir / "models--local--finetune" / "blobs" / blob_id)
        args = ["--cache-dir", str(b.settings.cache_dir), "--state-dir", str(b.settings.state_dir)]
        fixed = runner.invoke(main, ["verify", "local/finetune", *args, "--agent", b.admin_url])
        assert fixed.exit_code == 0 and "repaired 1 of 1" in fixed.output, fixed.output
        assert (snap / shard).read_bytes() == files[shard]

        # `agent rm` through the daemon: it stops seeding the blobs it deletes.
        assert blob_id in b.held_blobs()
        gone = runner.invoke(main, ["rm", "local/finetune", "--agent", b.admin_url])
        assert gone.exit_code == 0, gone.output
        assert blob_id not in b.held_blobs()
        assert "local/finetune" not in scan_cache(b.settings.cache_dir)
    finally:
        for d in reversed(daemons):
            d.stop()


def _model_folder(tmp_path: Path, repo: str, seed: int) -> Path:
    """A model folder to publish (generated files, hidden ones left out as publish skips them)."""
    folder = tmp_path / "publish" / repo.split("/")[1]
    for p in make_model(tmp_path / "gen", repo, total_bytes=2**18, shards=1, seed=seed):
        rel = p.relative_to(tmp_path / "gen" / repo)
        if not rel.name.startswith("."):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(p.read_bytes())
    return folder


def test_publishing_needs_the_signing_key_and_fetching_the_right_public_key(tracker, tmp_path):
    """An agent without the signing key refuses to publish before copying a byte; a manifest signed
    with another key than the agents' public key, or an agent without a public key, plans nothing."""
    folder = _model_folder(tmp_path, "me/ft", seed=21)
    no_origin = f"http://127.0.0.1:{free_port()}"
    public_key = publisher_keys()[1].read_bytes()

    def node(name: str, **keys: object) -> Daemon:
        s = agent_settings(tmp_path, name, no_origin, tracker)
        daemon = dataclasses.replace(
            s.daemon, publish_roots=(tmp_path / "publish",), publish_unchecked_ids=True, **keys
        )
        d = Daemon(dataclasses.replace(s, origin=dataclasses.replace(s.origin, max_retries=1), daemon=daemon))
        daemons.append(d)
        d.start()
        return d

    daemons: list[Daemon] = []
    runner = CliRunner()
    try:
        unsigned = node("unsigned", publisher_signing_key=None)
        out = runner.invoke(
            main, ["publish", str(folder), "--repo-id", "local/ft", "--agent", unsigned.admin_url]
        )
        assert out.exit_code != 0 and "--publisher-signing-key-file" in out.output, out.output
        assert not (unsigned.settings.cache_dir / "models--local--ft").exists(), "nothing was copied"

        # A standalone publish signed with a key that is not the cluster's publisher key.
        wrong_key = tmp_path / "wrong.key"
        wrong_key.write_bytes(generate_keypair()[0])
        standalone = [
            "publish", str(folder), "--repo-id", "local/ft",
            "--cache-dir", str(tmp_path / "standalone" / "hub"),
            "--state-dir", str(tmp_path / "standalone" / "state"),
            "--tracker", tracker.url,
            "--tracker-token-file", str(tracker.token_file),
            "--publisher-token-file", str(tracker.publisher_token_file),
            "--origin", no_origin, "--publish-unchecked-ids",
        ]  # fmt: skip
        refused = runner.invoke(main, standalone)
        assert refused.exit_code != 0 and "--publisher-signing-key-file" in refused.output, refused.output
        published = runner.invoke(main, [*standalone, "--signing-key-file", str(wrong_key)])
        assert published.exit_code == 0, published.output
        commit = published.output.strip().splitlines()[-1]
        manifest = httpx.get(
            f"{tracker.url}/v1/manifests/local/ft/{commit}", headers=tracker.auth, timeout=10
        ).json()
        assert manifest["published"] is True and manifest["signature"]

        for name, keys, why in (
            ("verifier", {"publisher_public_key": public_key}, "signature does not verify: refusing it"),
            ("keyless", {"publisher_public_key": None}, "--publisher-public-key-file"),
        ):
            job = node(name, **keys).request_model("local/ft", "main")
            assert job.wait(60), job.status()
            st = job.status()
            assert st.phase == "Failed" and why in (st.error or ""), (name, st.error)
    finally:
        for d in reversed(daemons):
            d.stop()


def test_json_logs_parse_and_never_contain_the_token(tmp_path):
    root = tmp_path / "src"
    make_model(root, "acme/tiny", total_bytes=2**18, shards=1, seed=2)
    with HubServer(root, tokens=[SECRET]) as hub:
        argv = [
            str(BIN / "agent"),
            "--log-format",
            "json",
            "--log-level",
            "DEBUG",
            "fetch",
            "acme/tiny",
            "--origin",
            hub.url,
            "--token",
            SECRET,
            "--cache-dir",
            str(tmp_path / "c"),
            "--state-dir",
            str(tmp_path / "s"),
            "--quiet",
            "--agent",
            "off",
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "DEBUG logging produced no lines"
    for line in lines:
        record = json.loads(line)
        assert {"ts", "level", "logger", "msg"} <= set(record)
    assert SECRET not in proc.stderr and SECRET not in proc.stdout


def test_the_redaction_filter_scrubs_tokens_from_any_record():
    record = logging.LogRecord(
        "x",
        logging.INFO,
        __file__,
        1,
        "sent %s with %s",
        ({"Authorization": f"Bearer {SECRET}"}, f"token={SECRET}"),
        None,
    )
    assert RedactSecrets().filter(record)
    text = JsonFormatter().format(record)
    assert SECRET not in text and "[REDACTED]" in json.loads(text)["msg"]
    assert redact("Authorization: Bearer abc.def") == "Authorization: [REDACTED]"
    assert redact("using hf_abcdefghijkl now") == "using hf_[REDACTED] now"
    # httpx's own line for a relay announce (seen at INFO in the namespace benchmark's agent logs).
    passkey = "6ffc5e41a7608fb8dbce27fd98388e64"
    line = f'HTTP Request: GET http://10.0.0.3:7480/announce/{passkey}?info_hash=%B3 "HTTP/1.1 200 OK"'
    assert redact(line) == line.replace(passkey, "[REDACTED]")
    assert redact(f"http://t/scrape/{passkey}: refused") == "http://t/scrape/[REDACTED]: refused"
    assert redact("http://t/announce/***: refused") == "http://t/announce/***: refused"  # redacted before


def test_a_daemon_under_a_cache_limit_evicts_the_lru_model_and_refuses_one_that_cannot_fit(tmp_path):
    from tests.http.test_hf_endpoint import metric

    root = tmp_path / "src"
    for i, repo in enumerate(("acme/first", "acme/second")):
        make_model(root, repo, total_bytes=2**20, shards=2, seed=10 + i)
    make_model(root, "acme/huge", total_bytes=4 * 2**20, shards=2, seed=12)
    with HubServer(root) as hub:
        s = agent_settings(tmp_path, "node", hub.url, None)
        s = dataclasses.replace(s, ops=dataclasses.replace(s.ops, cache_max_bytes=int(1.6 * 2**20)))
        d = Daemon(s)
        d.start()
        try:
            for repo in ("acme/first", "acme/second"):
                job = d.request_model(repo)
                assert job.wait(60) and job.status().phase == "Ready", job.status().error
            repos = scan_cache(s.cache_dir)
            assert repos["acme/second"].snapshots  # the new model is complete...
            assert not repos["acme/first"].snapshots  # ...because the least recently used one made room
            assert not scan_cache_dir(s.cache_dir).warnings
            assert metric(d.api_url, "weightswarm_agent_evictions_total") >= 1

            job = d.request_model("acme/huge")
            assert job.wait(60)
            st = job.status()
            assert st.phase == "Failed" and "acme/huge needs" in (st.error or ""), st.error
            assert metric(d.api_url, "weightswarm_agent_cache_full_total") == 1
            assert metric(d.api_url, "weightswarm_agent_fetch_failures_total") == 1
            assert scan_cache(s.cache_dir)["acme/second"].snapshots  # nothing evicted for a hopeless request
        finally:
            d.stop()
