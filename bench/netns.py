"""A multi-node harness on one machine: Linux network namespaces, veth pairs, a bridge, `tc` shaping.

Topology (one run, every name prefixed `ws-<run_id>-`)::

    ns n0 (eth0 10.213.0.10) ─veth─┐
    ns n1 (eth0 10.213.0.11) ─veth─┤
    ...                            ├── ns br: Linux bridge br0 (no address)
    ns origin (eth0 10.213.0.2) ──┤
    ns tracker (eth0 10.213.0.3) ─┘

- Addresses come from a private /24 that exists only inside the namespaces this run
  created; no namespace has a default route, so nothing a node runs can leave the box.
  Every veth is created directly inside its namespaces, so the host's own network
  namespace never sees an interface of ours.
- Shaping (HTB on both ends of each veth): the node-side end's egress is the node's
  upload, the bridge-side end's egress is the node's download. The origin's node-side end
  carries `origin_rate` (its upload); its download is the node rate.
- Teardown (`close`, also from `atexit` and on SIGTERM/SIGINT) kills every process
  `spawn` started, by PID (SIGTERM, bounded wait, SIGKILL), then deletes every veth and
  namespace it created. `cleanup_stale(prefix)` removes what a crashed run left behind.

Needs root and iproute2 (`ip`, `tc`). `python -m bench.netns --check` builds a small
cluster and reports measured vs configured rates (a Python socket sender/receiver).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType

SUBNET = "10.213.0"
"""First three octets of the private /24 used only inside this run's namespaces."""

_CMD_TIMEOUT = 20.0
_STOP_GRACE = 10.0
_STATS = "/sys/class/net/eth0/statistics/"
"""A member's link counters, in its namespace."""


def have_netns_support() -> str | None:
    """None when this machine can run the harness, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (Debian package iproute2)"
    return None


def _run(
    argv: Sequence[str], check: bool = True, timeout: float = _CMD_TIMEOUT, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[:300]}")
    return proc


def _list_netns() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_pids(pids: Sequence[int], grace: float = _STOP_GRACE) -> None:
    """SIGTERM each PID, wait up to `grace` seconds for all, then SIGKILL the rest."""
    live = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            live.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        live = [pid for pid in live if _alive(pid)]
        if live:
            time.sleep(0.05)
    for pid in live:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie that is not our child still answers kill(0); /proc says it is gone
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cleanup_stale(prefix: str = "ws-") -> list[str]:
    """Delete namespaces named `prefix*` left by a crashed run (killing their processes by PID)."""
    removed = []
    for ns in _list_netns():
        if not ns.startswith(prefix):
            continue
        pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]
        _kill_pids(pids)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    return removed


@dataclass
class Proc:
    """A process started inside a namespace by `Cluster.spawn`."""

    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    stdout_path: Path | None
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        if self.stdout_path is None or not self.stdout_path.exists():
            return ""
        return self.stdout_path.read_text(errors="replace")


class Cluster:
    """N node namespaces + origin + tracker around a bridge, shaped with tc. A context manager."""

    def __init__(
        self,
        nodes: int,
        node_rate: float = 120e6,
        origin_rate: float = 30e6,
        run_id: str | None = None,
        prefix: str = "ws",
        extra: Sequence[str] = ("origin", "tracker"),
    ) -> None:
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes must be 1..200: {nodes}")
        self.node_rate = float(node_rate)
        self.origin_rate = float(origin_rate)
        self.run_id = run_id or uuid.uuid4().hex[:6]
        self.prefix = f"{prefix}-{self.run_id}"
        self.nodes = [f"n{i}" for i in range(nodes)]
        self.members = [*extra, *self.nodes]
        self._addr: dict[str, str] = {}
        for k, name in enumerate(extra):
            self._addr[name] = f"{SUBNET}.{2 + k}"
        for i, name in enumerate(self.nodes):
            self._addr[name] = f"{SUBNET}.{10 + i}"
        self._created: list[str] = []
        self._procs: list[Proc] = []
        self._closed = False
        self._old_handlers: dict[int, object] = {}

    # -- names ---------------------------------------------------------------------------
    def ns(self, name: str) -> str:
        """The namespace of member `name` ("n0", "origin", "tracker", or "br" for the bridge)."""
        return f"{self.prefix}-{name}"

    def ip(self, name: str) -> str:
        """The address of member `name` inside the cluster."""
        return self._addr[name]

    def mac(self, name: str) -> str:
        """The MAC address of member `name`'s eth0 (locally administered, from its address)."""
        return f"02:77:73:00:00:{int(self._addr[name].rsplit('.', 1)[1]):02x}"

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: FrameType | None) -> None:
            # Turn SIGTERM into an exception so every `finally` (ours and the caller's) runs.
            raise SystemExit(128 + signum)

        self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_term)

    def _build(self) -> None:
        br = self.ns("br")
        self._add_ns(br)
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        for k, name in enumerate(self.members):
            ns = self.ns(name)
            self._add_ns(ns)
            peer = f"v{k}"
            _run([
                "ip", "link", "add", "eth0", "netns", ns, "address", self.mac(name),
                "type", "veth", "peer", "name", peer, "netns", br,
            ])
            _run(["ip", "-n", br, "link", "set", peer, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", peer, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.ip(name)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            up = self.origin_rate if name == "origin" else self.node_rate
            self._shape(ns, "eth0", up)
            self._shape(br, peer, self.node_rate)
        # Every member knows every other's MAC address from the start. The kernel keeps one ARP table
        # for all namespaces, capped at net.ipv4.neigh.default.gc_thresh3 (1024) learned entries: 34
        # members that all talk to each other need 1,122, and past the cap a connection to a member not
        # in the table yet waits out its SYN retries ("neighbor table overflow!" in dmesg). That held
        # one node of every 32-node run 10 s per connect. Permanent entries do not count toward the cap.
        for name in self.members:
            table = "".join(
                f"neigh replace {self.ip(other)} lladdr {self.mac(other)} dev eth0 nud permanent\n"
                for other in self.members if other != name
            )
            _run(["ip", "-n", self.ns(name), "-batch", "-"], stdin=table)

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    @staticmethod
    def _shape(ns: str, dev: str, rate: float) -> None:
        """HTB at `rate` bytes/s on the egress of `dev` (burst: 5 ms of the rate, at least 64 KiB)."""
        if rate <= 0:
            return
        bits = f"{int(rate * 8)}bit"
        burst = str(max(64 * 1024, int(rate * 0.005)))
        _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
        _run(
            [
                "tc",
                "-n",
                ns,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:10",
                "htb",
                "rate",
                bits,
                "ceil",
                bits,
                "burst",
                burst,
                "cburst",
                burst,
            ]
        )

    def close(self) -> None:
        """Stop every process we started, then delete every veth and namespace we created."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop_all()
        finally:
            br = self.ns("br")
            if br in self._created:
                for k in range(len(self.members)):
                    _run(["ip", "-n", br, "link", "del", f"v{k}"], check=False)
            for ns in reversed(self._created):
                _run(["ip", "netns", "del", ns], check=False)
            self._created.clear()
            for signum, handler in self._old_handlers.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]
            atexit.unregister(self.close)

    # -- processes -----------------------------------------------------------------------
    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdout_path: Path | None = None,
    ) -> Proc:
        """Start `argv` inside member `name`'s namespace; stdout+stderr go to `stdout_path`."""
        if self._closed:
            raise RuntimeError("cluster is closed")
        full = ["ip", "netns", "exec", self.ns(name), *argv]
        out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
        try:
            # A new session so a Ctrl-C at the terminal reaches us, not the children: we stop them.
            popen = subprocess.Popen(
                full,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        finally:
            if stdout_path:
                out.close()  # type: ignore[union-attr]
        proc = Proc(name=name, argv=list(argv), popen=popen, stdout_path=stdout_path)
        self._procs.append(proc)
        return proc

    def run(self, name: str, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a short command inside member `name` and return its output (bounded)."""
        return _run(["ip", "netns", "exec", self.ns(name), *argv], check=False, timeout=timeout)

    def stop(self, proc: Proc, grace: float = _STOP_GRACE) -> None:
        """SIGTERM the process (by PID), wait up to `grace`, then SIGKILL; reap it."""
        if proc.poll() is None:
            _kill_pids([proc.pid], grace)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self, grace: float = _STOP_GRACE) -> None:
        """Stop every process `spawn` started, all at once (one shared grace period)."""
        procs = list(self._procs)
        _kill_pids([p.pid for p in procs if p.poll() is None], grace)
        for p in procs:
            try:
                p.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()

    @property
    def procs(self) -> list[Proc]:
        return list(self._procs)

    def sent(self, member: str) -> tuple[int, int]:
        """Bytes and packets `member`'s link has sent since its namespace was created, headers included (veth
        passes TCP's segments of up to 64 KiB on whole: a packet is one such segment)."""
        out = self.run(member, ["cat", _STATS + "tx_bytes", _STATS + "tx_packets"], timeout=5).stdout.split()
        return int(out[0]), int(out[1])

    def received(self, member: str) -> int:
        """Bytes `member`'s link has received since its namespace was created, headers included."""
        return int(self.run(member, ["cat", _STATS + "rx_bytes"], timeout=5).stdout)

    def net_counters(self) -> dict[str, dict[str, int]]:
        """Counters that tell a slow network apart from a slow process, per member (each counts from its
        namespace's creation: subtract an earlier reading). `listen_drops`: connections a listener's full
        accept queue refused (its process did not accept in time); `syn_retrans`: SYNs sent again (a
        connect that waits 1, 3, 7 s); `rto`: retransmission timeouts; `qdisc_drops`: packets the shaped
        links dropped (both ends of the member's veth)."""
        names = {"ListenDrops": "listen_drops", "TCPSynRetrans": "syn_retrans", "TCPTimeouts": "rto"}
        counters = {}
        for k, member in enumerate(self.members):
            got = dict.fromkeys((*names.values(), "qdisc_drops"), 0)
            text = self.run(member, ["cat", "/proc/net/netstat"], timeout=5).stdout.splitlines()
            for head, values in zip(text[::2], text[1::2], strict=False):
                for key, value in zip(head.split()[1:], values.split()[1:], strict=False):
                    if key in names:
                        got[names[key]] += int(value)
            for ns, dev in ((self.ns(member), "eth0"), (self.ns("br"), f"v{k}")):
                out = _run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev], check=False).stdout
                got["qdisc_drops"] += sum(int(d) for d in re.findall(r"dropped (\d+)", out))
            counters[member] = got
        return counters


# -- shaping check -----------------------------------------------------------------------

_RECEIVER = r"""
import socket, sys, time, json
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(30)
n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.monotonic()
    n += len(b)
print(json.dumps({"bytes": n, "seconds": time.monotonic() - (t0 or time.monotonic())}), flush=True)
"""

_SENDER = r"""
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
buf = b"\0" * (1 << 20); end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end: c.sendall(buf)
c.close()
"""


def measure_rate(
    cluster: Cluster, src: str, dst: str, seconds: float, workdir: Path, port: int = 5201
) -> float:
    """Bytes/s that one TCP stream from member `src` to member `dst` achieves for `seconds`."""
    out = workdir / f"recv-{src}-{dst}.txt"
    recv = cluster.spawn(dst, [sys.executable, "-c", _RECEIVER, cluster.ip(dst), str(port)], stdout_path=out)
    deadline = time.monotonic() + 15
    while "ready" not in recv.output():
        if time.monotonic() > deadline or recv.poll() is not None:
            raise RuntimeError(f"receiver in {dst} did not start: {recv.output()[-300:]}")
        time.sleep(0.05)
    send = cluster.spawn(src, [sys.executable, "-c", _SENDER, cluster.ip(dst), str(port), str(seconds)])
    send.wait(timeout=seconds + 30)
    recv.wait(timeout=30)
    result = json.loads(recv.output().splitlines()[-1])
    cluster.stop(send)
    cluster.stop(recv)
    return float(result["bytes"]) / max(float(result["seconds"]), 1e-9)


def check_shaping(
    node_rate: float, origin_rate: float, seconds: float, workdir: Path
) -> list[tuple[str, float, float]]:
    """(path, configured B/s, measured B/s) for node→node, origin→node and node→origin."""
    rows = []
    with Cluster(nodes=2, node_rate=node_rate, origin_rate=origin_rate) as c:
        for src, dst, want in (
            ("n0", "n1", node_rate),
            ("origin", "n0", origin_rate),
            ("n1", "origin", node_rate),
        ):
            rows.append((f"{src} -> {dst}", want, measure_rate(c, src, dst, seconds, workdir)))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.netns", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="measure shaped rates vs configured")
    p.add_argument("--cleanup", metavar="PREFIX", help="delete namespaces left by a crashed run (e.g. ws-)")
    p.add_argument("--node-rate", type=float, default=120e6, help="bytes/s each way per node")
    p.add_argument("--origin-rate", type=float, default=30e6, help="origin upload bytes/s")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)
    reason = have_netns_support()
    if reason:
        print(f"error: the harness {reason}", file=sys.stderr)
        return 2
    if args.cleanup:
        print("removed:", " ".join(cleanup_stale(args.cleanup)) or "nothing")
    if args.check:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ws-netns-") as tmp:
            rows = check_shaping(args.node_rate, args.origin_rate, args.seconds, Path(tmp))
        print(f"{'path':<18}{'configured MB/s':>17}{'measured MB/s':>15}{'ratio':>8}")
        for path, want, got in rows:
            print(f"{path:<18}{want / 1e6:>17.1f}{got / 1e6:>15.1f}{got / want:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
