"""The daemon's Python threads carry their names at the OS level; libtorrent's keep the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.stack import native_threads
from tests.support.cluster import AgentProcess

_PROBE = """
import json, threading
from agent.daemon.threadnames import name_os_threads

def names():
    seen = {}
    def look():
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen[threading.current_thread().name] = f.read().strip()
    for name in ("fetch-file_0", "api /var/lib/weightswarm/admin.sock"):
        t = threading.Thread(target=look, name=name)
        t.start()
        t.join()
    return seen

before = names()
named = name_os_threads()
print(json.dumps({"before": before, "named": named, "again": name_os_threads(), "after": names(),
                  "main": open("/proc/self/comm").read().strip()}))
"""


def test_a_python_thread_started_after_the_call_names_itself_at_the_os_level():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    process = os.path.basename(sys.executable)[:15]
    assert set(got["before"].values()) == {process}  # unnamed: every thread shows the process's name
    assert got["named"] and got["again"]
    # The kernel keeps 15 bytes of a name; the main thread keeps the process's (what ps shows).
    assert got["after"] == {
        "fetch-file_0": "fetch-file_0",
        "api /var/lib/weightswarm/admin.sock": "api /var/lib/we",
    }
    assert got["main"] == process


def test_an_agents_libtorrent_threads_are_the_ones_left_with_the_process_name(tmp_path, origin, tracker):
    a = AgentProcess(tmp_path, "a", origin.hub.url, tracker)
    try:
        a.start()
        assert a.proc is not None
        pid = a.proc.pid
        comms = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comms[int(tid)] = f.read().strip()
        process = comms[pid]
        assert {"swarm-alerts", "peer-gate", "malloc-trim"} <= set(comms.values())
        native = {tid for (_, tid) in native_threads(pid)}
        # libtorrent's session runs threads of its own (at least its network thread), and only those
        # are counted as native: never a thread the daemon named, never the main thread.
        assert native and pid not in native
        assert all(comms[tid] == process for tid in native)
        assert {tid for tid, comm in comms.items() if comm == process and tid != pid} == native
    finally:
        a.stop()
