"""A base model and its fine-tune on one node: disk and origin bytes, weightswarm vs huggingface_hub.

The fine-tune shares what real ones share with their base (`agent.hub.testmodel.make_family`):
`.gitattributes`, the model card, the tokenizer and its config, the index and the first shard.
Both tools fetch base then fine-tune into a fresh hub cache from the same test hub (in this
process, on loopback); the table gives the bytes each took from the origin for the second repo
and the bytes the cache holds on disk (each inode once, as `du` counts), and the ratio to the
lower bound (the distinct content of the two repos).

Usage:
  .venv/bin/python bench/shared_content.py [--size 256MiB] [--shards 4]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from agent.hub.server import HubServer
from agent.hub.testmodel import make_family, parse_size

BASE, TUNED = "bench/base", "bench/tuned"
BIN = Path(sys.executable).parent


def disk_bytes(root: Path) -> int:
    """Bytes of the regular files under `root`, each inode once (what `du` counts)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(dirpath, name))
            if not os.path.islink(os.path.join(dirpath, name)):
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def fetch_hf(hub: HubServer, cache: Path, repo_id: str) -> None:
    code = (
        "import sys; from huggingface_hub import snapshot_download; "
        "snapshot_download(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3])"
    )
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    subprocess.run([sys.executable, "-c", code, repo_id, str(cache), hub.url], check=True, env=env)


def fetch_agent(hub: HubServer, cache: Path, repo_id: str) -> None:
    subprocess.run(
        [str(BIN / "agent"), "fetch", repo_id, "--cache-dir", str(cache),
         "--state-dir", str(cache.parent / "state"), "--origin", hub.url, "--agent", "off", "--quiet"],
        check=True, stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="256MiB", help="tensor bytes per model")
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ws-shared-") as tmp:
        root = Path(tmp) / "hub"
        make_family(root, BASE, TUNED, total_bytes=parse_size(args.size), shards=args.shards)
        contents = {hashlib.sha256(p.read_bytes()).digest(): p.stat().st_size
                    for r in (BASE, TUNED) for p in (root / r).rglob("*") if p.is_file()}
        tuned_bytes = sum(p.stat().st_size for p in (root / TUNED).rglob("*") if p.is_file())
        bound = sum(contents.values())
        rows = []
        with HubServer(root) as hub:
            hub.warm()
            for name, fetch in (("huggingface_hub", fetch_hf), ("weightswarm agent fetch", fetch_agent)):
                cache = Path(tmp) / name.split()[0] / "hub"
                fetch(hub, cache, BASE)
                hub.reset_counters()
                fetch(hub, cache, TUNED)
                rows.append((name, hub.egress_bytes, disk_bytes(cache)))
    mib = 2**20
    print(f"base + fine-tune, {args.size} each in {args.shards} shards; fine-tune alone "
          f"{tuned_bytes / mib:.1f} MiB; distinct content (bound) {bound / mib:.1f} MiB\n")
    print("| tool | origin MiB for the fine-tune | disk MiB for both | disk ÷ bound |")
    print("|---|---|---|---|")
    for name, egress, disk in rows:
        print(f"| {name} | {egress / mib:.1f} | {disk / mib:.1f} | {disk / bound:.2f} |")


if __name__ == "__main__":
    main()
