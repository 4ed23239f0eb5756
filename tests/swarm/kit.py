"""What the tests against real libtorrent sessions share: blobs with their metainfo, and swarms opened
with test settings (the `swarms` fixture, in conftest.py, closes them at teardown)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from agent.core.metainfo import PieceHasher, info_dict
from agent.core.swarm_settings import SwarmSettings
from agent.swarm.session import Swarm
from wirekit.bencode import bencode

MiB = 2**20
PIECE = 256 * 1024
TEST_SETTINGS = SwarmSettings(ssrf_mitigation=False, web_seed_retry=1, resume_interval=1.0)


@dataclass
class Blob:
    blob_id: str
    data: bytes
    info: bytes

    @property
    def sha256(self) -> str:
        return self.blob_id


def make_blob(size: int, seed: int) -> Blob:
    data = hashlib.shake_256(seed.to_bytes(8, "big")).digest(size)
    blob_id = hashlib.sha256(data).hexdigest()
    hasher = PieceHasher(PIECE)
    hasher.update(data)
    return Blob(blob_id, data, bencode(info_dict(blob_id, size, PIECE, hasher.digest())))


def write_blob(directory: Path, blob: Blob) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / blob.blob_id
    path.write_bytes(blob.data)
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def open_swarm(opened: list[Swarm], resume_dir: Path, **overrides: object) -> Swarm:
    settings = SwarmSettings(**{**TEST_SETTINGS.__dict__, **overrides})  # type: ignore[arg-type]
    swarm = Swarm(settings, resume_dir)
    swarm.admit(["127.0.0.1"])  # what the daemon's peer gate does with the tracker's agents
    opened.append(swarm)
    return swarm
