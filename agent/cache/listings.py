"""Content ids learnt for object-storage objects: listing id -> sha256 (agent.origin.bucket `listing_id`).

A bucket's listing names no content, so the first read of an object computes its sha256; this node keeps
what it learnt, one small file per object under `state_dir/listings/`, so that the same object listed
again (the same key, size, ETag and version) is planned by its content at once: linked from the cache,
or downloaded and checked against that sha256. Learnt means read here, or taken from the manifest a
commit was fetched by once every blob of it verified against those ids (agent.fetch.bucket: the trust
is that manifest's)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from agent.cache.layout import StateDir, check_blob_id, write_atomic
from agent.core.errors import UnsafePathError
from agent.core.plan import FetchPlan, FileEntry


class ListingIds:
    def __init__(self, state_dir: Path) -> None:
        self.root = StateDir(state_dir).listings

    def known(self, listing_id: str) -> str | None:
        try:
            text = (self.root / check_blob_id(listing_id)).read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        with contextlib.suppress(UnsafePathError):
            if len(text) == 64:
                return check_blob_id(text)
        return None

    def record(self, learnt: dict[str, str]) -> None:
        for listing_id, content_id in learnt.items():
            target = self.root / check_blob_id(listing_id)
            write_atomic(target, check_blob_id(content_id).encode(), fsync=False)

    def learnt(self, listed: FetchPlan, identified: FetchPlan) -> None:
        """Record the content ids of `identified`, the same plan as `listed` with its blobs installed."""
        self.record({
            a.blob_id: b.blob_id
            for a, b in zip(listed.files, identified.files, strict=True)
            if not a.content_known and b.content_known
        })

    def resolve(self, plan: FetchPlan) -> FetchPlan:
        """The plan with the content ids this node learnt for its listed objects."""
        if all(e.content_known for e in plan.files):
            return plan
        files = tuple(self._resolved(e) for e in plan.files)
        return dataclasses.replace(plan, files=files)

    def _resolved(self, entry: FileEntry) -> FileEntry:
        content = None if entry.content_known else self.known(entry.blob_id)
        if content is None:
            return entry
        return FileEntry(entry.path, entry.size, content, entry.is_lfs)
