"""urllib3 vs httpx for the origin download: throughput and CPU seconds on loopback.

The agent uses two HTTP client libraries: urllib3 for the origin download engine
(agent/origin/: parallel range GETs read with `readinto` straight into preallocated buffers) and
httpx for everything else (tracker client, agent API client, the HF endpoint's async proxy).
This measures what moving the download engine to httpx would cost, or gain.

What it does:
  1. writes a test model (default 1 GiB in 1 safetensors shard) with `agent make-test-model`;
  2. starts the test hub with `agent serve-hub`, uncapped, in a separate process (so it does
     not share the client's GIL; it answers with sendfile, so its own CPU is small);
  3. follows the hub's 302 once, so every client reads the same signed CDN URL;
  4. downloads the shard, each time in a fresh subprocess that times only the download
     (wall seconds, and CPU seconds user+sys of all its threads from getrusage(RUSAGE_SELF)),
     then checks the bytes (xxh3, outside the timed part). Variants:
       urllib3 fp.readinto   PoolManager, `resp._fp.readinto` (http.client's readinto) straight
                             into the sink, as agent/origin/ranges.py does (`read_body_into`);
       urllib3 readinto      (--variants) the same with urllib3's public `resp.readinto`, which
                             reads a bytes object and copies it;
       httpx iter_raw        one httpx.Client shared by the threads, `iter_raw()`, each chunk
                             copied into the sink (the least work httpx's API allows);
       httpx iter_bytes      (--variants) the same with `iter_bytes()` (the decoder path);
       httpx async           httpx.AsyncClient, `aiter_raw()`, all ranges on one asyncio loop;
     with 8 parallel range requests (8 threads, 8 connections; an eighth of the file each) and
     as one plain GET on one connection; into two sinks:
       mem    one preallocated bytearray of the file's size, its pages touched before the clock
              starts (readinto: no copy in Python);
       file   a preallocated file written with os.pwrite (as the agent does; urllib3 through a
              1 MiB buffer per thread, httpx straight from each chunk), in --sink-dir: /dev/shm
              by default, so the disk's writeback of the previous run does not blur the next;
  5. runs the variants interleaved (run 1 of each, then run 2 of each, ...) so a busy neighbour
     hurts all alike, and prints the median MB/s and CPU seconds per variant, each run's wall
     time, and CPU relative to urllib3 fp.readinto in the same sink and connection count.

Usage:
  .venv/bin/python -m bench.http_clients                         # 1 GiB, 5 runs, ~4 min on 2 CPUs
  .venv/bin/python -m bench.http_clients --variants urllib3-fp,urllib3,httpx-raw,httpx-bytes
  .venv/bin/python -m bench.http_clients --size 256MiB --runs 3
  .venv/bin/python -m bench.http_clients --workdir /tmp/wsh      # keep the model between runs
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypedDict

import httpx
import urllib3
import xxhash

from bench.origin_fetch import AGENT, HERE, REPO, start_hub, stop

READ_BLOCK = 1 << 20
"""Bytes per readinto for the file sink, as agent/origin/ranges.py's READ_BLOCK."""

VARIANTS = ["urllib3-fp", "urllib3", "httpx-raw", "httpx-bytes", "httpx-async"]
DEFAULT_VARIANTS = ["urllib3-fp", "httpx-raw", "httpx-async"]
LABELS = {
    "urllib3-fp": "urllib3 fp.readinto",
    "urllib3": "urllib3 readinto",
    "httpx-raw": "httpx iter_raw",
    "httpx-bytes": "httpx iter_bytes",
    "httpx-async": "httpx async aiter_raw",
}
BASELINE = "urllib3-fp"


class Run(TypedDict):
    wall: float
    cpu: float
    xxh3: str


# --- the worker: one download in its own process ------------------------------------------------


class Sink:
    """Where the body goes: a preallocated bytearray (`mem`) or a preallocated file (`file`)."""

    def __init__(self, kind: str, size: int, path: Path) -> None:
        self.kind = kind
        self.size = size
        self.path = path
        self.fd = -1
        self.view = memoryview(bytearray(0))
        if kind == "mem":
            self.view = memoryview(bytearray(size))
            # Touch every page now: calloc'd pages fault on first write, which would otherwise be
            # counted against whichever client writes them (the agent reuses small warm buffers).
            zeros = bytes(READ_BLOCK)
            for pos in range(0, size, READ_BLOCK):
                n = min(READ_BLOCK, size - pos)
                self.view[pos : pos + n] = zeros[:n]
        else:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.posix_fallocate(self.fd, 0, size)

    def put(self, chunk: bytes, pos: int) -> None:
        """A chunk from httpx: copied into the buffer, or written to the file as it is."""
        if self.fd < 0:
            self.view[pos : pos + len(chunk)] = chunk
        else:
            os.pwrite(self.fd, chunk, pos)

    def digest(self) -> str:
        if self.fd < 0:
            return xxhash.xxh3_64_hexdigest(self.view)
        with mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ) as m:
            return xxhash.xxh3_64_hexdigest(m)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.path.unlink(missing_ok=True)


def ranges_of(size: int, connections: int) -> list[tuple[int, int, bool]]:
    """(start, end, ranged) per connection: one plain GET, or `connections` equal ranges."""
    if connections == 1:
        return [(0, size, False)]
    step = -(-size // connections)
    return [(s, min(s + step, size), True) for s in range(0, size, step)]


def urllib3_fetch(
    pool: urllib3.PoolManager, url: str, sink: Sink, parts: list[tuple[int, int, bool]], fp: bool
) -> None:
    def one(start: int, end: int, ranged: bool) -> None:
        headers = {"Range": f"bytes={start}-{end - 1}"} if ranged else {}
        resp = pool.request(
            "GET", url, headers=headers, redirect=False, preload_content=False, decode_content=False
        )
        assert resp.status == (206 if ranged else 200), resp.status
        raw = resp._fp if fp else resp  # type: ignore[attr-defined]
        assert not fp or isinstance(raw, http.client.HTTPResponse)
        buf = memoryview(bytearray(READ_BLOCK)) if sink.fd >= 0 else None
        pos = start
        while pos < end:
            if buf is None:
                n = raw.readinto(sink.view[pos : min(pos + READ_BLOCK, end)])
            else:
                n = raw.readinto(buf[: min(READ_BLOCK, end - pos)])
                os.pwrite(sink.fd, buf[:n], pos)
            if not n:
                raise RuntimeError(f"body ended at {pos} of {start}-{end}")
            pos += n
        resp.release_conn()

    run_threads(one, parts)


def httpx_fetch(
    client: httpx.Client, url: str, sink: Sink, parts: list[tuple[int, int, bool]], raw: bool
) -> None:
    def one(start: int, end: int, ranged: bool) -> None:
        headers = {"Range": f"bytes={start}-{end - 1}"} if ranged else {}
        with client.stream("GET", url, headers=headers) as resp:
            assert resp.status_code == (206 if ranged else 200), resp.status_code
            pos = start
            for chunk in resp.iter_raw() if raw else resp.iter_bytes():
                sink.put(chunk, pos)
                pos += len(chunk)
            if pos != end:
                raise RuntimeError(f"body ended at {pos} of {start}-{end}")

    run_threads(one, parts)


def httpx_async_fetch(
    client: httpx.AsyncClient, url: str, sink: Sink, parts: list[tuple[int, int, bool]]
) -> None:
    async def main() -> None:
        async with client:

            async def one(start: int, end: int, ranged: bool) -> None:
                headers = {"Range": f"bytes={start}-{end - 1}"} if ranged else {}
                async with client.stream("GET", url, headers=headers) as resp:
                    assert resp.status_code == (206 if ranged else 200), resp.status_code
                    pos = start
                    async for chunk in resp.aiter_raw():
                        sink.put(chunk, pos)
                        pos += len(chunk)
                    if pos != end:
                        raise RuntimeError(f"body ended at {pos} of {start}-{end}")

            await asyncio.gather(*(one(*p) for p in parts))

    asyncio.run(main())


def run_threads(fn: Callable[[int, int, bool], None], parts: list[tuple[int, int, bool]]) -> None:
    if len(parts) == 1:
        fn(*parts[0])
        return
    errors: list[BaseException] = []

    def guarded(*args: object) -> None:
        try:
            fn(*args)  # type: ignore[arg-type]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=p) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def worker(variant: str, connections: int, sink_kind: str, url: str, size: int, path: Path) -> None:
    # The client, its pool and the sink are made before the clock starts (a long-lived client in
    # the agent; httpx builds an SSL context up front): only the download is timed.
    sink = Sink(sink_kind, size, path)
    parts = ranges_of(size, connections)
    limits = httpx.Limits(max_connections=len(parts), max_keepalive_connections=len(parts))
    download: Callable[[], None]
    if variant.startswith("urllib3"):
        pool = urllib3.PoolManager(maxsize=len(parts), block=False, retries=False, timeout=60)
        download = partial(urllib3_fetch, pool, url, sink, parts, variant == "urllib3-fp")
    elif variant == "httpx-async":
        aclient = httpx.AsyncClient(limits=limits, timeout=60)
        download = partial(httpx_async_fetch, aclient, url, sink, parts)
    else:
        client = httpx.Client(limits=limits, timeout=60)
        download = partial(httpx_fetch, client, url, sink, parts, variant == "httpx-raw")
    try:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        download()
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        print(json.dumps({"wall": wall, "cpu": cpu, "xxh3": sink.digest()}))
    finally:
        sink.close()


# --- the driver -----------------------------------------------------------------------------------


def cdn_url(hub: str, path: str) -> str:
    """The URL the hub redirects the shard to (the first listing waits while the hub hashes)."""
    resp = urllib3.request("GET", f"{hub}/{REPO}/resolve/main/{path}", redirect=False, timeout=600)
    if resp.status != 302:
        raise SystemExit(f"expected a 302 from the hub, got {resp.status}")
    location = resp.headers["Location"]
    return location if location.startswith("http") else hub + location


def one_run(variant: str, connections: int, sink: str, url: str, size: int, sink_dir: Path) -> Run:
    cmd = [
        sys.executable,
        "-m",
        "bench.http_clients",
        "--worker",
        variant,
        str(connections),
        sink,
        url,
        str(size),
        str(sink_dir / f"ws-http-sink-{os.getpid()}.bin"),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{variant} x{connections} {sink} failed: {res.stderr[-2000:]}")
    run: Run = json.loads(res.stdout.strip().splitlines()[-1])
    return run


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        w_variant, w_connections, w_sink, w_url, w_size, w_path = sys.argv[2:8]
        worker(w_variant, int(w_connections), w_sink, w_url, int(w_size), Path(w_path))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="shard bytes (default 1GiB)")
    ap.add_argument("--runs", type=int, default=5, help="runs per variant; the median is reported")
    ap.add_argument("--connections", type=int, default=8, help="parallel range requests (default 8)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"any of {','.join(VARIANTS)}")
    ap.add_argument("--sinks", default="mem,file", help="mem, file or both (default mem,file)")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    shm = Path("/dev/shm")
    ap.add_argument("--sink-dir", type=Path, default=shm if shm.is_dir() else None, help="for the file sink")
    args = ap.parse_args()
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants: {', '.join(sorted(unknown))}")

    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="ws-http-"))
    scratch.mkdir(parents=True, exist_ok=True)
    origin = scratch / "origin"
    if not (origin / REPO).exists():
        subprocess.run(
            [*AGENT, "make-test-model", str(origin), REPO, "--size", args.size, "--shards", "1"],
            check=True,
            cwd=HERE,
            stdout=subprocess.DEVNULL,
        )
    shard = next(p for p in (origin / REPO).iterdir() if p.suffix == ".safetensors")
    size = shard.stat().st_size
    with shard.open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        expected = xxhash.xxh3_64_hexdigest(m)

    # Connection count first, then the sink, so a table block compares like with like.
    configs = [
        (conns, sink, v)
        for conns in (args.connections, 1)
        for sink in args.sinks.split(",")
        for v in variants
        # One connection: the threaded and async clients do the same thing; keep one of each library.
        if conns > 1 or v in ("urllib3-fp", "httpx-raw")
    ]
    results: dict[tuple[int, str, str], list[Run]] = {c: [] for c in configs}
    proc, hub = start_hub(origin, None)
    t_start = time.monotonic()
    try:
        url = cdn_url(hub, shard.name)
        for _ in range(args.runs):
            for conns, sink, v in configs:
                r = one_run(v, conns, sink, url, size, args.sink_dir or scratch)
                if r["xxh3"] != expected:
                    raise SystemExit(f"{v} x{conns} {sink}: wrong bytes (xxh3 {r['xxh3']} != {expected})")
                results[(conns, sink, v)].append(r)
    finally:
        stop(proc)

    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    took = time.monotonic() - t_start
    print(
        f"\n{size / 2**20:.0f} MiB shard from `agent serve-hub` on loopback (uncapped, sendfile); "
        f"{os.cpu_count()} CPUs; median of {args.runs} interleaved runs ({took:.0f} s); "
        f"load average at the end {load}; file sink in {args.sink_dir or scratch}"
    )
    print("CPU s: user+sys of the client process during the download; x base: CPU s / urllib3 fp.readinto's")
    head = (
        f"{'connections':<12} {'sink':<5} {'client':<22} {'MB/s':>6} {'CPU s':>6} {'x base':>7}  "
        "wall s per run"
    )
    print(head)
    print("-" * len(head))
    for conns, sink, v in configs:
        rs = results[(conns, sink, v)]
        wall = statistics.median(r["wall"] for r in rs)
        cpu = statistics.median(r["cpu"] for r in rs)
        base_rs = results.get((conns, sink, BASELINE))
        base = f"{cpu / statistics.median(r['cpu'] for r in base_rs):>7.2f}" if base_rs else f"{'-':>7}"
        label = f"{conns} ranges" if conns > 1 else "1 plain GET"
        runs = " ".join(f"{r['wall']:.2f}" for r in rs)
        print(f"{label:<12} {sink:<5} {LABELS[v]:<22} {size / wall / 1e6:>6.0f} {cpu:>6.2f} {base}  {runs}")
    if args.workdir is None:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
