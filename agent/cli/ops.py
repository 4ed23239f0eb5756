"""The node-operations commands of the `agent` CLI: `rm`, `verify`, `publish`, `keygen` (registered on
the group by agent.cli.main), plus helpers for `serve` (cache limits, pins) and `ls` (a daemon, else
the cache).

Each works with a running daemon when one answers (so it can stop seeding what it deletes, seed
what it publishes) and directly on the cache otherwise.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import click

from agent.cli.common import choose_daemon, handle_errors, local_agent_url, with_origin
from agent.core.errors import EXIT_INTEGRITY, ConfigError, DaemonError
from agent.core.settings import Settings
from clikit import env_option


def with_ops_settings(
    settings: Settings,
    cache_max_bytes: str | None,
    cache_max_disk_percent: float | None,
    pins: tuple[str, ...],
) -> Settings:
    from agent.cache.eviction import parse_ref
    from agent.cache.layout import check_repo_id
    from agent.daemon.serve_settings import overridden
    from agent.hub.testmodel import parse_size

    max_bytes = None
    if cache_max_bytes:
        try:
            max_bytes = parse_size(cache_max_bytes)
        except ValueError as exc:
            raise ConfigError(f"--cache-max-bytes: {exc}") from None
    for pin in pins:
        check_repo_id(parse_ref(pin)[0])
    ops = {
        "ops.cache_max_bytes": max_bytes,
        "ops.cache_max_disk_percent": cache_max_disk_percent,
        "ops.pins": pins,
    }
    result: Settings = overridden(settings, ops)
    return result


def _local_settings(cache_dir: Path | None, state_dir: Path | None) -> Settings:
    return Settings.from_env_defaults(cache_dir=cache_dir, state_dir=state_dir)


def _daemon(agent_url: str | None, explicit_local: bool) -> Any:
    """An AgentClient for --agent URL, or the default local daemon if it answers (and nothing says
    to work on a given cache directly); None for standalone."""
    from agent.http.client import AgentClient

    url = choose_daemon(agent_url, explicit_local)
    return AgentClient(url) if url is not None else None


def list_models(agent_url: str | None, cache_dir: Path | None) -> list[dict[str, Any]]:
    """`agent ls`: the daemon's view (with seeding counts); without one, the cache read directly."""
    from agent.http.client import AgentClient

    if cache_dir is None:
        client = AgentClient(agent_url or local_agent_url())
        try:
            return client.models()
        except DaemonError as exc:
            click.echo(f"note: {exc}; listing the local cache instead", err=True)
        finally:
            client.close()
    from agent.cache.eviction import scan_cache
    from agent.cache.partials import partials_of

    settings = _local_settings(cache_dir, None)
    models = []
    for repo in scan_cache(settings.cache_dir).values():
        snapshots = [
            {
                "commit": commit,
                "path": str(snap.path),
                "files": len(snap.files),
                "bytes": sum(repo.blobs.get(b, 0) for b in snap.files.values()),
                "seeding": "-",
            }
            for commit, snap in sorted(repo.snapshots.items())
        ]
        partials = partials_of(repo.root, settings.state_dir)
        models.append(
            {"repo_id": repo.repo_id, "refs": repo.refs, "snapshots": snapshots, "partials": partials}
        )
    return models


def cluster_models(tracker: str | None, token_file: Path | None) -> list[dict[str, Any]]:
    """`agent ls --cluster`: every model the tracker knows, with the seeders ("ip:port") per commit."""
    from agent.daemon.serve_settings import read_secret
    from agent.tracking.client import TrackerClient

    if not tracker:
        raise ConfigError("--cluster asks the tracker: give --tracker URL (or WEIGHTSWARM_TRACKER)")
    token = read_secret(token_file, "--tracker-token-file")
    daemon = dataclasses.replace(_local_settings(None, None).daemon, tracker_url=tracker, tracker_token=token)
    client = TrackerClient(tracker, token, daemon)
    try:
        return client.models(holders=True)
    finally:
        client.close()


def cluster_rows(models: list[dict[str, Any]]) -> list[tuple[str, str, str, int, int, int, str]]:
    """One row per commit: repo, the publisher's revisions pointing at it ("-": none), commit, files,
    bytes, complete copies and holders ("ip:port, ..." or "-")."""
    rows = []
    for m in models:
        revisions = m.get("revisions") or {}
        for c in m.get("commits") or []:
            refs = ",".join(sorted(r for r, commit in revisions.items() if commit == c["commit"])) or "-"
            files = c.get("files") or []
            rows.append(
                (
                    str(m["repo_id"]),
                    refs,
                    str(c["commit"])[:12],
                    len(files),
                    sum(int(f.get("size") or 0) for f in files),
                    int(c.get("complete_copies") or 0),
                    ",".join(c.get("holders") or []) or "-",
                )
            )
    return rows


def register(main: click.Group) -> None:
    main.add_command(rm_command)
    main.add_command(verify_command)
    main.add_command(publish_command)
    main.add_command(keygen_command)


_CACHE_OPTS = (
    env_option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
               help="Hub cache directory [default: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub]."),
    env_option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
               help="The agent's state directory [default: ~/.local/state/weightswarm]."),
    env_option("--agent", "agent_url", metavar="URL",
               help="The agent daemon to work through ('off' = directly on the cache) [default: the local "
                    "daemon if it answers and no --cache-dir is given]."),
)  # fmt: skip


def _cache_options(func: Any) -> Any:
    for option in reversed(_CACHE_OPTS):
        func = option(func)
    return func


@click.command("rm")
@click.argument("ref", metavar="REPO[@REV]")
@_cache_options
@env_option(
    "--force",
    is_flag=True,
    default=False,
    help="Remove it even while pods on the node, a running fetch or --pin use it.",
)
@handle_errors
def rm_command(
    ref: str, cache_dir: Path | None, state_dir: Path | None, agent_url: str | None, force: bool
) -> None:
    """Remove a model (one revision, or every revision) from the cache; blobs no revision uses go too.

    Through the agent, a model in use on the node is refused unless --force."""
    from agent.cache.eviction import parse_ref, remove_model
    from agent.cache.layout import check_repo_id
    from agent.core.progress import human_bytes

    repo_id, rev = parse_ref(ref)
    check_repo_id(repo_id)
    client = _daemon(agent_url, explicit_local=bool(cache_dir or state_dir))
    if client is not None:
        try:
            out = client.remove_model(repo_id, rev, force)
        finally:
            client.close()
        snaps, blobs, freed = out["snapshots"], out["blobs"], out["bytes_freed"]
        partials = out.get("partials") or []
    else:
        removed = remove_model(_local_settings(cache_dir, state_dir), repo_id, rev)
        snaps, blobs, freed = removed.snapshots, removed.blobs, removed.bytes_freed
        partials = list(removed.partials)
    unfinished = f", {len(partials)} partial download(s)" if partials else ""
    what = f"{len(snaps)} revision(s), {len(blobs)} blob(s){unfinished}"
    click.echo(f"removed {ref}: {what}, {human_bytes(freed)} freed")


@click.command("verify")
@click.argument("ref", metavar="[REPO[@REV]]", required=False)
@_cache_options
@env_option("--origin", metavar="URL", help="Hub endpoint for standalone repairs [default: $HF_ENDPOINT].")
@env_option("--token", metavar="TOKEN", help="Hub token for standalone repairs [default: $HF_TOKEN].")
@env_option("--no-repair", is_flag=True, default=False, help="Only report corrupt blobs.")
@handle_errors
def verify_command(
    ref: str | None,
    cache_dir: Path | None,
    state_dir: Path | None,
    agent_url: str | None,
    origin: str | None,
    token: str | None,
    no_repair: bool,
) -> None:
    """Re-hash every blob (sha256 / git sha1) and re-fetch corrupt ones; non-zero exit if any stays bad."""
    from agent.cache.verify import BlobCheck, repair, verify_cache

    settings = with_origin(_local_settings(cache_dir, state_dir), origin, token)
    client = _daemon(agent_url, explicit_local=bool(cache_dir or state_dir or origin or token))

    def report(check: BlobCheck) -> None:
        if not check.ok:
            where = ", ".join(p for _c, p in check.uses[:3]) or "no snapshot"
            click.echo(f"CORRUPT {check.repo_id} {check.blob_id[:16]}… ({where}): {check.problem}", err=True)

    checks = verify_cache(settings, ref, report)
    bad = [c for c in checks if not c.ok]
    click.echo(f"verified {len(checks)} blob(s): {len(checks) - len(bad)} ok, {len(bad)} corrupt")
    if bad and not no_repair:
        try:
            still = repair(
                settings,
                bad,
                _refetcher(settings, client, explicit_origin=bool(origin), token=token),
                forget=client.forget_blob if client is not None else None,
            )
        finally:
            if client is not None:
                client.close()
        click.echo(f"repaired {len(bad) - len(still)} of {len(bad)} corrupt blob(s)")
        bad = still
    for check in bad:
        click.echo(_still_bad(settings, check), err=True)
    if bad:
        raise SystemExit(EXIT_INTEGRITY)


def _still_bad(settings: Settings, check: Any) -> str:
    """One line: the blob, and what was removed with it and how to get it back."""
    from agent.cache.provenance import Provenance

    line = f"still corrupt: {check.repo_id} {check.blob_id} ({check.problem})"
    commits = sorted({c for c, _p in check.uses})
    if not commits:
        return line
    origin = Provenance(settings.state_dir).origin_of(check.repo_id)
    again = f"agent fetch {check.repo_id} --revision {commits[0]}" + (f" --origin {origin}" if origin else "")
    refs = f" and refs {', '.join(check.dropped_refs)}" if check.dropped_refs else ""
    return f"{line}; its snapshot entries{refs} are removed: `{again}` brings them back"


def _refetcher(settings: Settings, client: Any, explicit_origin: bool, token: str | None) -> Any:
    """Fetch again from where each repo came from (agent.cache.provenance), unless --origin says where."""
    from agent.cache.provenance import Provenance
    from agent.core.progress import Progress
    from agent.origin.bucket_url import is_bucket_url
    from agent.origin.oci.reference import is_oci_url

    def refetch(repo_id: str, commit: str, paths: list[str]) -> None:
        recorded = None if explicit_origin else Provenance(settings.state_dir).origin_of(repo_id)
        if client is not None:
            from agent.http.client import fetch_via_agent

            # The daemon fetches from its own origin; a bucket model names its bucket.
            source = recorded if recorded and (is_bucket_url(recorded) or is_oci_url(recorded)) else ""
            fetch_via_agent(client.url, repo_id, commit, paths, (), Progress(quiet=True), source=source)
            return
        from agent.fetch.engine import fetch_snapshot

        s = settings
        if recorded and recorded != settings.origin.endpoint:
            # $HF_TOKEN is for $HF_ENDPOINT: another origin gets only a token given with --token.
            there = dataclasses.replace(settings.origin, endpoint=recorded, token=token)
            s = dataclasses.replace(settings, origin=there)
        fetch_snapshot(s, repo_id, commit, paths)

    return refetch


@click.command("publish")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False, exists=True))
@env_option("--repo-id", required=True, metavar="ORG/NAME", help="The id other nodes fetch it by.")
@env_option("--revision", default="main", show_default=True, help="The revision name that points at it.")
@_cache_options
@env_option("--tracker", metavar="URL", help="Tracker base URL (standalone mode; a daemon uses its own).")
@env_option(
    "--tracker-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="File with the tracker's agent-role token, for the metainfo (standalone mode).",
)
@env_option(
    "--publisher-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="File with the tracker's publisher-role token, for the manifest (standalone mode).",
)
@env_option(
    "--signing-key-file",
    "--publisher-signing-key-file",
    "signing_key_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The publisher's Ed25519 private key (PEM, `agent keygen`): signs the manifest (standalone "
    "mode with --tracker; agents refuse unsigned hub-less models).",
)
@env_option(
    "--origin",
    metavar="URL",
    help="Hub that must not have REPO_ID [default: $HF_ENDPOINT or https://huggingface.co].",
)
@env_option(
    "--publish-unchecked-ids",
    is_flag=True,
    default=False,
    help="Publish even when the origin cannot be asked whether it has REPO_ID (air-gapped).",
)
@handle_errors
def publish_command(
    directory: Path,
    repo_id: str,
    revision: str,
    cache_dir: Path | None,
    state_dir: Path | None,
    agent_url: str | None,
    tracker: str | None,
    tracker_token_file: Path | None,
    publisher_token_file: Path | None,
    signing_key_file: Path | None,
    origin: str | None,
    publish_unchecked_ids: bool,
) -> None:
    """Put a local model DIRECTORY into the cache and the swarm with no hub; print its commit id last.

    With a daemon: it copies the files into its cache, publishes manifest and metainfo to its
    tracker and seeds. Standalone: the same into --cache-dir and --tracker; an `agent serve` on that
    cache seeds it when it starts. Never under a repo id the origin has.
    """
    from agent.fetch.publish import check_publishable, publish_directory

    client = _daemon(agent_url, explicit_local=bool(cache_dir or state_dir or tracker))
    if client is not None:
        try:
            out = client.publish(str(directory.resolve()), repo_id, revision)
        finally:
            client.close()
        click.echo(
            f"published {repo_id}@{revision}: {len(out['files'])} files, seeded by {client.url}", err=True
        )
        click.echo(out["commit"])
        return
    from agent.daemon.serve_settings import build_serve_settings
    from agent.tracking.client import TrackerClient

    settings = build_serve_settings(
        cache_dir=cache_dir,
        state_dir=state_dir,
        tracker=tracker,
        tracker_token_file=tracker_token_file,
        publisher_token_file=publisher_token_file,
        publisher_signing_key_file=signing_key_file,
        publish_unchecked_ids=publish_unchecked_ids,
        origin=origin,
        token=None,
        bt_listen="127.0.0.1:0",
        api_listen="127.0.0.1:0",
        node_name=os.uname()[1],
    )
    check_publishable(settings, repo_id, registering=bool(settings.daemon.tracker_url))
    tc = None
    if settings.daemon.tracker_url:
        tc = TrackerClient(settings.daemon.tracker_url, settings.daemon.tracker_token, settings.daemon)
    try:
        result = publish_directory(settings, directory, repo_id, revision, tc)
    finally:
        if tc is not None:
            tc.close()
    where = "the tracker" if result.published else "no tracker (pass --tracker)"
    click.echo(
        f"published {repo_id}@{revision} to {where}; nobody seeds it until `agent serve` runs "
        f"on {settings.cache_dir}",
        err=True,
    )
    click.echo(result.commit)


@click.command("keygen")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@handle_errors
def keygen_command(directory: Path) -> None:
    """Make the publisher's Ed25519 key pair in DIRECTORY: `publisher.key` (private, mode 0600; for
    the agents that publish, --publisher-signing-key-file) and `publisher.pub` (for every agent,
    --publisher-public-key-file). Prints the public key's path last. Never overwrites a key."""
    from agent.core.signing import generate_keypair

    private_path, public_path = directory / "publisher.key", directory / "publisher.pub"
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise ConfigError(f"{path} exists; remove it first (a new pair invalidates every signature)")
    directory.mkdir(parents=True, exist_ok=True)
    private, public = generate_keypair()
    # O_EXCL | O_NOFOLLOW: never through a link, never over a file that appeared meanwhile; the key is
    # 0600 from its first byte on.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for path, data, mode in ((private_path, private, 0o600), (public_path, public, 0o644)):
        fd = os.open(path, flags, mode)
        with open(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(path, mode)  # the umask may have narrowed the public key's
    click.echo(f"wrote {private_path} (private: only publishing agents get it)", err=True)
    click.echo(str(public_path))
