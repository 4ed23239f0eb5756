"""A registry model's tar layers (agent.origin.oci.tarlayer): moved whole, unpacked on every node.

A tar layer's digest is known before its first byte, so the layer itself is the blob the cluster moves
(leases, relay, BitTorrent, checked against its digest on every node, as a raw layer is). Its files' ids
are not known before it is read, and taking them from the first node that unpacks it would let any
writer of the tracker's manifests name other content for a layer, which no node could check without the
layer: so each node unpacks each layer itself. Every file is hashed as it is written and installed as a
blob of the hub cache (`blobs/<sha256>`, snapshot entries link to it), so a file that equals a Hub LFS
file another repo holds is stored once; the plan's entry for the layer becomes the files it holds, and
the engine then links the snapshot as for any model.

Nothing of a layer reaches the snapshot until every layer is read and checked: each one's listing
(no links, no `..` or absolute path, within the free disk), no path twice across the layers and the raw
files, no file where another needs a directory. A refused layer fails the fetch with its one line.

A layer's own bytes live under `<state_dir>/layers/` (a hub-cache layout of their own,
`models--org--name/blobs/<layer sha256>`), never in the hub cache: they are no file of any snapshot, and
vLLM, `agent ls`, `rm`, `verify` and eviction see only the unpacked files. A standalone `agent fetch`
removes a layer once it is unpacked (nothing would seed it); a daemon keeps and seeds it while it runs,
so its peers take it from the nodes that have it, and removes what is left at its next start
(`clear_layers`). A commit unpacked here before is planned from its record (agent.cache.provenance)
when every file it wants is still complete in the cache: the layer is not read again.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.cache.layout import BlobDigest, RepoCache, StateDir
from agent.cache.locks import blob_lock
from agent.cache.provenance import Provenance
from agent.core.errors import IntegrityError, NotFoundError
from agent.core.plan import FetchPlan, FileEntry
from agent.core.settings import Settings
from agent.fetch.cached import wanted
from agent.origin.oci.tarlayer import Unpacked, unpack_layer

FetchLayers = Callable[[FetchPlan, Settings], None]
"""Brings every blob of a plan of layers, verified, into the cache its `Settings.cache_dir` names (an
engine run with the caller's source: the origin alone, or the swarm)."""


def layered(plan: FetchPlan) -> bool:
    return any(e.archive for e in plan.files)


def clear_layers(state_dir: Path) -> None:
    """A daemon's start: layers kept for its peers by the last run are seeded no more, so they go."""
    shutil.rmtree(StateDir(state_dir).layers, ignore_errors=True)


def unpack_layers(
    settings: Settings,
    plan: FetchPlan,
    include: Sequence[str],
    exclude: Sequence[str],
    fetch: FetchLayers,
    keep: bool,
) -> FetchPlan:
    """`plan` with each tar layer's entry replaced by the files it holds (those `include`/`exclude`
    want), installed as blobs of the hub cache; `keep`: leave the layers in the state dir for seeding."""
    layers = [e for e in plan.files if e.archive]
    if not layers:
        return plan
    cache = RepoCache(settings.cache_dir, settings.state_dir, plan.repo_id)
    others = plan.all_paths - {e.path for e in layers}
    before = _unpacked_before(settings, cache, plan, others, include, exclude)
    if before is not None:
        return _expanded(plan, layers, *before, include, exclude)
    on_disk = dataclasses.replace(settings, cache_dir=StateDir(settings.state_dir).layers)
    held = RepoCache(on_disk.cache_dir, settings.state_dir, plan.repo_id)
    try:
        fetch(dataclasses.replace(plan, files=tuple(layers), all_paths=frozenset(e.path for e in layers)),
              on_disk)
        cache.prepare()
        unpacked, every = _unpack_all(settings, cache, held, plan, layers, others, include, exclude)
    finally:
        if not keep:
            for layer in layers:
                held.blob_path(layer.blob_id).unlink(missing_ok=True)
                held.sidecar_path(layer.blob_id).unlink(missing_ok=True)
    files = [FileEntry(u.path, u.size, u.sha256, True) for u in unpacked]
    return _expanded(plan, layers, files, every, include, exclude)


def _expanded(
    plan: FetchPlan,
    layers: list[FileEntry],
    files: list[FileEntry],
    every: set[str],
    include: Sequence[str],
    exclude: Sequence[str],
) -> FetchPlan:
    kept = tuple(e for e in plan.files if not e.archive) + tuple(files)
    if not kept:
        raise NotFoundError(f"{plan.repo_id}@{plan.revision}: no file of its layers matches --include "
                            f"{list(include)} / --exclude {list(exclude)}")
    all_paths = (plan.all_paths - {e.path for e in layers}) | every
    return dataclasses.replace(plan, files=kept, all_paths=frozenset(all_paths))


def _unpacked_before(
    settings: Settings,
    cache: RepoCache,
    plan: FetchPlan,
    others: frozenset[str],
    include: Sequence[str],
    exclude: Sequence[str],
) -> tuple[list[FileEntry], set[str]] | None:
    """The layers' wanted files as this node recorded them for this commit (its manifest digest: the same
    layers), when each is still complete in the cache; else None."""
    record = Provenance(settings.state_dir).listing(plan.repo_id, plan.commit)
    if record is None:
        return None
    paths, known = record
    every = {p for p in paths if p not in others}
    chosen = [p for p in sorted(every) if wanted(p, include, exclude)]
    if not every or any(p not in known or not cache.blob_is_complete(*known[p]) for p in chosen):
        return None
    return [FileEntry(p, known[p][1], known[p][0], True) for p in chosen], every


def _unpack_all(
    settings: Settings,
    cache: RepoCache,
    held: RepoCache,
    plan: FetchPlan,
    layers: list[FileEntry],
    others: frozenset[str],
    include: Sequence[str],
    exclude: Sequence[str],
) -> tuple[list[Unpacked], set[str]]:
    """Every layer unpacked into temp files beside the blobs, the paths checked across all of them; then
    the wanted files installed. On any refusal the temp files go and nothing is installed."""
    seen = set(others)
    every: set[str] = set()
    written: list[Path] = []
    unpacked: list[Unpacked] = []
    numbers = itertools.count()
    try:
        for layer in layers:
            what = f"{plan.repo_id}/{layer.path}"

            def target_for(path: str, what: str = what, layer: FileEntry = layer) -> Path | None:
                if path in seen:
                    raise IntegrityError(f"{what}: {path[:200]!r} is also a file of another layer; refused")
                seen.add(path)
                every.add(path)
                if not wanted(path, include, exclude):
                    return None
                written.append(cache.blobs_dir / f".unpack-{layer.blob_id[:16]}-{next(numbers)}.tmp")
                return written[-1]

            room = shutil.disk_usage(cache.blobs_dir).free - settings.fetch.min_free_bytes
            unpacked += unpack_layer(held.blob_path(layer.blob_id), layer.archive, what, max(0, room),
                                     target_for)
        parents = {"/".join(p.split("/")[:i]) for p in seen for i in range(1, p.count("/") + 1)}
        clash = sorted(parents & seen)
        if clash:
            raise IntegrityError(f"{plan.repo_id}: {clash[0][:200]!r} is a file of one layer and a directory "
                                 "of another; refused")
        for u in unpacked:
            _install(cache, u)
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    return unpacked, every


def _install(cache: RepoCache, u: Unpacked) -> None:
    """`blobs/<sha256>` from a file unpacked here, or linked from a repo of the cache that holds it."""
    with blob_lock(cache.cache_dir, cache.repo_id, u.sha256):
        if cache.adopt_blob(u.sha256, u.size):
            return
        h = u.hashes
        cache.install_blob(u.sha256, u.written, BlobDigest(h.size, 0, h.xxh3, h.piece_length, h.pieces))
