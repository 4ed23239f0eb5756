"""The hub's view of a directory: repos, their files, blob ids and commits.

`root/<org>/<name>/` holds the files of a repo's `main` branch, and `root/<org>/<name>/.refs/<ref>/` those
of a ref the Hub makes itself (`.refs/pr/1/` is `refs/pr/1`, a pull request's head; `.refs/convert/parquet/`
is `refs/convert/parquet`). A commit is a sha1 over
the sorted (path, git oid) pairs, so editing a file moves `main` to a new commit. Every
commit reported while the process runs stays resolvable: its file list (path, size,
mtime, blob ids) is kept in memory. The bytes are still read from the working files, so
an old commit's file whose bytes changed on disk is no longer servable (the server
answers 404 EntryNotFound for it rather than serve the wrong bytes).

Hashing is the expensive part (a 2 GiB shard takes seconds), so hashes are cached per
(path, size, mtime_ns, inode): each file is hashed once per process unless it changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.cache.layout import is_commit

LFS_MIN_SIZE = 10 * 2**20
"""Files this large are stored in LFS regardless of their name (as the Hub's 10 MiB rule)."""

# The default .gitattributes of a new Hub repo: these suffixes are LFS at any size.
LFS_SUFFIXES = frozenset(
    ".7z .arrow .bin .bz2 .ckpt .ftz .gguf .gz .h5 .joblib .mlmodel .model .msgpack .npy .npz .onnx .ot "
    ".parquet .pb .pickle .pkl .pt .pth .rar .safetensors .tar .tflite .tgz .wasm .xz .zip .zst".split()
)

REFS_DIR = ".refs"
_HUB_REF = re.compile(r"^refs/(pr/[1-9][0-9]{0,8}|convert/[a-z][a-z0-9_-]{0,63})$")
"""The refs the Hub itself makes: a pull request's head (`refs/pr/N`), a conversion (`refs/convert/parquet`,
`refs/convert/duckdb`). Nothing else maps to a folder, so no revision names a path outside `.refs/`."""

SKIPPED_NAMES = frozenset({".git", ".refs.json", REFS_DIR})
"""Top-level entries of a repo directory that are never repo files."""

INCOMPLETE_SUFFIX = ".incomplete"
"""Files being written (by make_model or an admin's copy) end so and are never listed."""

_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HASH_CHUNK = 8 * 2**20


def is_lfs(path: str, size: int) -> bool:
    """Whether the Hub would store this file in LFS (content addressed by sha256)."""
    return size >= LFS_MIN_SIZE or os.path.splitext(path)[1].lower() in LFS_SUFFIXES


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with this content (what the Hub reports as ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that stands in the git tree for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def valid_repo_id(repo_id: str) -> bool:
    """`org/name`, each a plain name segment (no dots-only, no slashes, no traversal)."""
    parts = repo_id.split("/")
    return len(parts) == 2 and all(_SEGMENT_RE.match(p) and p not in {".", ".."} for p in parts)


def safe_repo_path(path: str) -> bool:
    """A relative POSIX path inside a repo: no empty, `.` or `..` segments, no backslashes or NULs. Only
    what would leave the repo is refused (400): any other name the Hub answers 404 if it has no such file,
    as this hub does (the cache's own rule, agent.cache.layout `safe_relpath`, is stricter)."""
    if not path or "\\" in path or "\x00" in path or path.startswith("/"):
        return False
    return not any(part in ("", ".", "..") for part in path.split("/"))


@dataclass(frozen=True)
class RepoFile:
    """One file of one commit: where its bytes are and what they must hash to."""

    path: str
    """POSIX path inside the repo."""
    abs_path: Path
    size: int
    mtime_ns: int
    inode: int
    oid: str
    """Git object id: the blob sha1 for plain files, the pointer file's sha1 for LFS files."""
    sha256: str | None
    """LFS oid (sha256 of the content), None for plain git files."""

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size)) if self.sha256 else 0

    def unchanged(self) -> bool:
        """The working file still has the size and mtime this entry was hashed with."""
        try:
            st = os.stat(self.abs_path)
        except OSError:
            return False
        return (st.st_size, st.st_mtime_ns, st.st_ino) == (self.size, self.mtime_ns, self.inode)


@dataclass(frozen=True)
class Snapshot:
    """The files of one commit, by path."""

    repo_id: str
    commit: str
    files: dict[str, RepoFile]

    @property
    def last_modified_ns(self) -> int:
        return max((f.mtime_ns for f in self.files.values()), default=0)

    def directories(self) -> set[str]:
        """Every directory path that holds a file (not the root)."""
        dirs: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return dirs


def _commit_of(files: dict[str, RepoFile]) -> str:
    digest = hashlib.sha1()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].oid}\n".encode())
    return digest.hexdigest()


class RepoStore:
    """Scans repo directories on demand and remembers every commit it has reported."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._hashes: dict[tuple[str, int, int, int], tuple[str, str | None]] = {}
        self._commits: dict[tuple[str, str], Snapshot] = {}
        self._blobs: dict[str, list[RepoFile]] = {}

    def repo_dir(self, repo_id: str) -> Path | None:
        if not valid_repo_id(repo_id):
            return None
        directory = self.root / repo_id
        return directory if directory.is_dir() else None

    def repo_ids(self) -> list[str]:
        """Every `org/name` folder under the root."""
        found = []
        for org in sorted(p for p in self.root.iterdir() if p.is_dir()):
            found += [f"{org.name}/{n.name}" for n in sorted(org.iterdir()) if n.is_dir()]
        return [r for r in found if valid_repo_id(r)]

    def _walk(self, directory: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
        stack = [(directory, "")]
        while stack:
            current, prefix = stack.pop()
            with os.scandir(current) as it:
                for entry in it:
                    if not prefix and entry.name in SKIPPED_NAMES:
                        continue
                    if entry.name.endswith(INCOMPLETE_SUFFIX):
                        continue
                    rel = prefix + entry.name
                    if entry.is_dir(follow_symlinks=False):  # no loops, no walking out of the repo
                        stack.append((Path(entry.path), rel + "/"))
                    elif entry.is_file():
                        yield rel, Path(entry.path), entry.stat()

    def _hash(self, abs_path: Path, rel: str, st: os.stat_result) -> tuple[str, str | None]:
        key = (str(abs_path), st.st_size, st.st_mtime_ns, st.st_ino)
        cached = self._hashes.get(key)
        if cached is not None:
            return cached
        if is_lfs(rel, st.st_size):
            digest = hashlib.sha256()
            with open(abs_path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
            sha256 = digest.hexdigest()
            result: tuple[str, str | None] = (git_blob_sha1(lfs_pointer(sha256, st.st_size)), sha256)
        else:
            result = (git_blob_sha1(abs_path.read_bytes()), None)
        self._hashes[key] = result
        return result

    def head(self, repo_id: str, ref: str | None = None) -> Snapshot | None:
        """The current `main` of a repo, or of a Hub-made `ref` (re-scanned now); None if there is none."""
        directory = self.repo_dir(repo_id)
        if directory is not None and ref is not None:
            directory = directory.joinpath(REFS_DIR, *ref.split("/")[1:]) if _HUB_REF.match(ref) else None
        if directory is None or not directory.is_dir():
            return None
        with self._lock:
            files: dict[str, RepoFile] = {}
            for rel, abs_path, st in self._walk(directory):
                oid, sha256 = self._hash(abs_path, rel, st)
                files[rel] = RepoFile(rel, abs_path, st.st_size, st.st_mtime_ns, st.st_ino, oid, sha256)
            commit = _commit_of(files)
            known = self._commits.get((repo_id, commit))
            if known is not None and all(known.files[p] == f for p, f in files.items()):
                return known
            snapshot = Snapshot(repo_id, commit, files)
            self._commits[(repo_id, commit)] = snapshot
            for entry in files.values():
                if entry.sha256:
                    self._blobs.setdefault(entry.sha256, []).append(entry)
            return snapshot

    def resolve(self, repo_id: str, revision: str) -> Snapshot | None:
        """`main`, a Hub-made ref (`refs/pr/N`, `refs/convert/NAME`) or a commit this process has
        reported; None for an unknown revision."""
        if revision == "main":
            return self.head(repo_id)
        if revision.startswith("refs/"):
            return self.head(repo_id, revision)
        if is_commit(revision):
            with self._lock:
                known = self._commits.get((repo_id, revision))
            if known is not None:
                return known
            head = self.head(repo_id)
            return head if head is not None and head.commit == revision else None
        return None

    def blob(self, sha256: str) -> RepoFile | None:
        """A file whose current bytes have this sha256 (for the CDN route), if any is unchanged."""
        with self._lock:
            candidates = list(self._blobs.get(sha256, ()))
        return next((c for c in reversed(candidates) if c.unchanged()), None)
