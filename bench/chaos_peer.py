"""A peer that sends corrupt pieces, for `bench/chaos.py` (scenario corrupt-peer): stock libtorrent, not
the agent, holding the tracker's credentials as a compromised node would.

    python -m bench.chaos_peer BLOBS.json --hub ROOT --repo ORG/NAME --tracker URL --token-file F
                                          --passkey-file F --listen IP:PORT --dir WORK

For every blob in BLOBS.json (`[{"path": ..., "blob_id": ...}]`) it takes the metainfo the tracker
publishes, writes the origin's bytes with one byte flipped in every 16 KiB block under WORK, and seeds
that, claiming every piece (resume-style, so libtorrent never checks them: an agent's own seeds are
checked lazily on first read and would not send a bad piece). Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.request
from pathlib import Path
from types import FrameType

import libtorrent as lt

_FLIP_EVERY = 16 * 1024


def _metainfo(tracker: str, token: str, blob_id: str) -> bytes:
    url = f"{tracker}/v1/blobs/{blob_id}/metainfo"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return bytes(resp.read())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("blobs", type=Path)
    p.add_argument("--hub", type=Path, required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--tracker", required=True)
    p.add_argument("--token-file", type=Path, required=True)
    p.add_argument("--passkey-file", type=Path, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--dir", type=Path, required=True)
    args = p.parse_args(argv)
    token = args.token_file.read_text().strip()
    announce = f"{args.tracker}/announce/{args.passkey_file.read_text().strip()}"
    ses = lt.session({
        "listen_interfaces": args.listen,
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "announce_to_all_trackers": True,
    })
    args.dir.mkdir(parents=True, exist_ok=True)
    for blob in json.loads(args.blobs.read_text()):
        info = _metainfo(args.tracker, token, blob["blob_id"])
        ti = lt.torrent_info(b"d4:info" + info + b"e")
        data = bytearray((args.hub / args.repo / blob["path"]).read_bytes())
        for offset in range(100, len(data), _FLIP_EVERY):
            data[offset] ^= 0xFF
        (args.dir / ti.name()).write_bytes(bytes(data))
        atp = lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(args.dir)
        atp.have_pieces = [True] * ti.num_pieces()
        atp.trackers = [announce]
        atp.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        ses.add_torrent(atp)
    print("seeding corrupt pieces", flush=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
