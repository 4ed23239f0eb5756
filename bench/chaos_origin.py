"""The test hub for `bench/chaos.py`, with faults switched on from outside while it serves.

`python -m bench.chaos_origin ROOT --host H --port P --control FILE` serves ROOT like `agent serve-hub`
and reads FILE (JSON, rewritten by the chaos script) every 0.2 s:

    {"seq": 3, "rate_limit_for": 30, "retry_after": 5}   answer every file request 429 + Retry-After
    {"seq": 4, "errors": 40}                               the next 40 file requests get a 503

A new `seq` applies a command once. The faults live only in this benchmark process: the hub that
ships (`agent serve-hub`, for air-gapped clusters) has no such switch.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from agent.hub.server import HubServer

_POLL = 0.2
_QUEUE = 256
"""429s kept queued while a rate limit lasts: more than the requests of one poll interval."""


def _apply(server: HubServer, control: Path, stop: threading.Event) -> None:
    seq = -1
    limited_until = 0.0
    retry_after = "5"
    while not stop.wait(_POLL):
        try:
            cmd = json.loads(control.read_text())
        except (OSError, ValueError):
            cmd = {}
        faults = server.faults
        if cmd.get("seq", -1) != seq:
            seq = cmd.get("seq", -1)
            if "rate_limit_for" in cmd:
                limited_until = time.monotonic() + float(cmd["rate_limit_for"])
                retry_after = str(int(cmd.get("retry_after", 5)))
            if "errors" in cmd:
                with faults._lock:
                    faults.status_queue.extend([(503, {})] * int(cmd["errors"]))
        with faults._lock:
            limited = [f for f in faults.status_queue if f[0] == 429]
            if time.monotonic() < limited_until:
                want = _QUEUE - len(limited)
                headers = {"Retry-After": retry_after, "X-Error-Code": "RateLimited"}
                faults.status_queue[:0] = [(429, headers)] * max(0, want)
            elif limited:
                faults.status_queue[:] = [f for f in faults.status_queue if f[0] != 429]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--control", type=Path, required=True)
    args = p.parse_args(argv)
    server = HubServer(args.root, args.host, args.port)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    server.start()
    print(server.url, flush=True)
    worker = threading.Thread(target=_apply, args=(server, args.control, stop), daemon=True)
    worker.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
