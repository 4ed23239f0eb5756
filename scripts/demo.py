"""The weightswarm demo on loopback (`./dev demo`): one model reaches three agents, mostly peer to peer.

What it does (no root, no network beyond 127.0.0.1):
 1. writes a test model (256 MiB, 4 safetensors shards) into a hub directory;
 2. starts an origin hub (`agent serve-hub`, capped at 50 MB/s in total, as a slow or
    rate-limited Hugging Face would be), a tracker (`tracker serve` with a generated token
    and announce passkey) and three node daemons (`agent serve`, each with its own cache, ports and name);
 3. asks all three to fetch the model at once (`agent fetch REPO --agent URL`), showing
    progress; then reports per agent the time and the bytes from the origin vs from peers,
    and the origin egress ÷ model size (without the swarm it would be 3.0);
 4. proves that consumers read the result: an offline
    `huggingface_hub.snapshot_download(local_files_only=True)` and a `safetensors` load of
    every shard from one agent's cache, bytes compared with the origin's files.
Exits 0 only if every step verified. Every process it starts is stopped by PID at the end,
also on Ctrl-C. `--standalone` runs the same three fetches without daemons (origin only),
for comparison. Work files: a temp dir (printed), removed unless --keep.

`--origin s3`: the same from object storage instead of a hub (helpers in scripts/demo_s3.py):
 1. the same test model is written, then uploaded to a bucket (s3://demo-models/models/tiny-llama)
    on a local S3 server (moto's `moto_server`, authentication off, on a free loopback port);
 2. the tracker and three daemons start as above, each with `--bucket s3://demo-models/models/tiny-llama`
    and `AWS_*` variables pointing at the store through a relay that counts the store's egress;
 3. all three run `agent fetch s3://demo-models/models/tiny-llama --repo-id demo/tiny-llama --agent URL`
    at once: one node reads the objects (and learns their sha256), the others take the bytes from the
    swarm; the report shows per agent the time and the bytes from the store vs from peers, the store
    egress ÷ model size, and checks that one agent read the store (`store_check`: the agents kept
    <= 1.1 x model size of it; its egress, higher when moto's slow ranged reads were hedged, < 2.0 x);
 4. the same consumer checks: offline snapshot_download of demo/tiny-llama, safetensors loads, bytes
    equal to the files written.
With `--standalone`: three `agent fetch s3://… --repo-id demo/tiny-llama --agent off`, each from the store.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import demo_s3
import httpx

from agent.http.agent_httpx import http_client

BIN = Path(sys.executable).parent
REPO = "demo/tiny-llama"
AGENTS = 3
MiB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """Our environment minus ambient HF/weightswarm settings, so the demo sees only what it sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIGHTSWARM_", "HF_", "HUGGING_FACE_"))}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    return env


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


class DemoError(Exception):
    pass


class Processes:
    """Starts commands with their output in log files; stops every one of them by PID."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.env = clean_env()

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.logdir / f"{name}.log", "wb") as log:
            # Own session: a Ctrl-C at the terminal reaches only us, and we stop the children.
            p = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.procs.append((name, p))
        return p

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self, name: str, p: subprocess.Popen[bytes]) -> bool:
        if p.poll() is not None:
            raise DemoError(f"{name} exited with {p.returncode}: {self.log(name).strip()[-400:]}")
        return True

    def stop_all(self, grace: float = 10.0) -> None:
        live = [p for _, p in self.procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()


@dataclass
class Agent:
    name: str
    api: str
    """Its network listener (probes)."""
    cache: Path
    state: Path

    @property
    def admin(self) -> str:
        """Its admin socket (the default one in its state dir): jobs, and `agent fetch --agent`."""
        return f"unix://{self.state / 'admin.sock'}"
    proc: subprocess.Popen[bytes] | None = None
    fetch: subprocess.Popen[bytes] | None = None
    seconds: float | None = None
    job: dict[str, Any] | None = None


def get_json(url: str, path: str = "") -> Any:
    """GET `url` + `path` (`url` may be an agent's `unix://` socket); None unless a 200 with JSON."""
    try:
        if url.startswith("unix://"):
            with http_client(url, 5) as client:
                r = client.get(path)
        else:
            r = httpx.get(url + path, timeout=5)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fmt_mib(n: float) -> str:
    return f"{n / MiB:,.0f} MiB"


def start_origin(procs: Processes, hub: Path, rate: str) -> str:
    port = free_port()
    p = procs.start(
        "origin", [str(BIN / "agent"), "serve-hub", str(hub), "--port", str(port), "--rate-total", rate]
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: procs.check_alive("origin", p) and get_json(f"{url}/_weightswarm/stats"), 30, "the origin"
    )
    return url


def egress(origin: str) -> int:
    stats = get_json(f"{origin}/_weightswarm/stats")
    if not stats:
        raise DemoError("the origin's /_weightswarm/stats did not answer")
    return int(stats["egress_bytes"])


def secret_file(path: Path) -> Path:
    path.write_text(secrets.token_hex(16) + "\n")
    path.chmod(0o600)
    return path


def start_tracker(procs: Processes, work: Path) -> tuple[str, Path, Path]:
    """The tracker with an agent-role token and an announce passkey (files the agents get too)."""
    token = secret_file(work / "tracker.token")
    passkey = secret_file(work / "tracker.passkey")
    port = free_port()
    p = procs.start(
        "tracker",
        [
            str(BIN / "tracker"),
            "serve",
            "--port",
            str(port),
            "--db",
            str(work / "tracker.db"),
            "--token-file",
            str(token),
            "--announce-passkey-file",
            str(passkey),
        ],
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: procs.check_alive("tracker", p) and get_json(f"{url}/healthz"), 30, "the tracker")
    return url, token, passkey


def start_store(procs: Processes, model_dir: Path) -> demo_s3.CountingRelay:
    """moto's S3 server (authentication off), the model uploaded to the demo bucket, and the relay that
    counts the store's egress; every process started after this gets `AWS_*` pointing at the relay."""
    port = free_port()
    p = procs.start("moto", demo_s3.moto_argv(port))
    wait_until(lambda: procs.check_alive("moto", p) and demo_s3.listening(port), 30, "the S3 server (moto)")
    t = time.monotonic()
    try:
        files = demo_s3.upload_model(f"http://127.0.0.1:{port}", model_dir)
    except Exception as exc:  # noqa: BLE001 - boto3's errors are many; the demo reports any of them
        raise DemoError(f"uploading the model to the S3 server failed: {exc}") from exc
    relay = demo_s3.CountingRelay(port)
    procs.env = demo_s3.store_env(procs.env, relay.endpoint)
    print(
        f"demo: store http://127.0.0.1:{port} (moto_server, no auth): {files} files uploaded to "
        f"{demo_s3.bucket_url()} in {time.monotonic() - t:.1f}s; agents reach it through {relay.endpoint}"
    )
    return relay


def start_agents(
    procs: Processes, work: Path, source_args: list[str], tracker: str, token: Path, passkey: Path
) -> list[Agent]:
    agents = []
    for i in range(1, AGENTS + 1):
        name = f"agent-{i}"
        api_port, bt_port = free_port(), free_port()
        a = Agent(name, f"http://127.0.0.1:{api_port}", work / name / "hub", work / name / "state")
        a.proc = procs.start(
            name,
            [
                str(BIN / "agent"),
                "serve",
                "--cache-dir",
                str(a.cache),
                "--state-dir",
                str(a.state),
                "--tracker",
                tracker,
                "--tracker-token-file",
                str(token),
                "--tracker-passkey-file",
                str(passkey),
                *source_args,
                "--bt-listen",
                f"127.0.0.1:{bt_port}",
                "--api-listen",
                f"127.0.0.1:{api_port}",
                "--node-name",
                name,
            ],
        )
        agents.append(a)
    for a in agents:
        assert a.proc is not None
        wait_until(
            lambda a=a: procs.check_alive(a.name, a.proc) and get_json(a.api, "/readyz"),  # type: ignore[misc]
            60,
            f"{a.name} ready",
        )
    return agents


def latest_job(a: Agent) -> dict[str, Any] | None:
    jobs = get_json(a.admin, "/v1/jobs") or []
    mine = [j for j in jobs if j.get("repo_id") == REPO]
    return max(mine, key=lambda j: j.get("created", 0)) if mine else None


def by_source(job: dict[str, Any]) -> dict[str, int]:
    """Bytes per source, summed over the job's files by where each file came from.

    Per file rather than the job's byte counters: a file is fetched whole from one source
    (origin-lease holder, or peers), and the sums add up to the model size.
    """
    out = {"origin": 0, "peers": 0, "cache": 0, "pending": 0}
    for f in job.get("files") or []:
        source = f.get("source") or "pending"
        out[source] = out.get(source, 0) + int(f.get("size") or 0)
    return out


def progress_line(agents: list[Agent], elapsed: float, src: str) -> str:
    parts = []
    for a in agents:
        j = a.job or {}
        total = j.get("bytes_total") or 0
        done = j.get("bytes_done") or 0
        pct = f"{100 * done / total:3.0f}%" if total else "  …"
        mark = " done" if a.seconds is not None else ""
        parts.append(
            f"{a.name} {pct} (peers {fmt_mib(by_source(j)['peers'])}, "
            f"{src} {fmt_mib(by_source(j)['origin'])}){mark}"
        )
    return f"[{elapsed:5.1f}s] " + " | ".join(parts)


def fetch_all(
    procs: Processes,
    agents: list[Agent],
    argv_for: Callable[[Agent], list[str]],
    timeout: float,
    show_jobs: bool,
    src: str = "origin",
) -> None:
    t0 = time.monotonic()
    for a in agents:
        a.fetch = procs.start(f"fetch-{a.name}", argv_for(a))
    tty = sys.stderr.isatty()
    last_print = 0.0
    while any(a.seconds is None for a in agents):
        now = time.monotonic()
        if now - t0 > timeout:
            raise DemoError(f"fetch not complete after {timeout:.0f}s")
        for a in agents:
            assert a.fetch is not None
            if a.seconds is None and a.fetch.poll() is not None:
                if a.fetch.returncode != 0:
                    raise DemoError(
                        f"{a.name}: agent fetch failed ({a.fetch.returncode}): "
                        f"{procs.log(f'fetch-{a.name}').strip()[-400:]}"
                    )
                a.seconds = now - t0
            if show_jobs:
                a.job = latest_job(a) or a.job
        if show_jobs and (tty or now - last_print >= 2.0):
            last_print = now
            print(
                ("\r" if tty else "") + progress_line(agents, now - t0, src),
                end="" if tty else "\n",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(0.25)
    if show_jobs:
        for a in agents:
            a.job = latest_job(a) or a.job
        line = progress_line(agents, time.monotonic() - t0, src)
        print(("\r" if tty else "") + line, file=sys.stderr, flush=True)


def store_check(agents: list[Agent], size: int, ratio: float) -> tuple[str, str]:
    """The swarm's claim for a bucket: one node reads the store, about one model's worth. (A note for
    the report, what failed or "".)

    Checked on two counts: the agents' own (`bytes_from_origin`, the store's bytes each kept) and the
    store's egress, which can be higher: the origin engine asks a second connection for the rest of a
    slow range (agent.origin.hedging), and moto's ranged reads are slow and uneven (each GET reads the
    whole object, one at a time per object). A second reader would add a whole model: under 2.0 x."""
    readers = [a.name for a in agents if by_source(a.job or {})["origin"]]
    kept = sum(int((a.job or {}).get("bytes_from_origin") or 0) for a in agents) / size
    note = f"store read by {', '.join(readers) or 'no agent'}; the agents kept {kept:.2f} x model size of it"
    if ratio > kept + 0.05:
        note += ", the rest of its egress were ranges asked twice (hedged: moto answered them slowly)"
    if len(readers) != 1:
        return note, f"{len(readers)} agents read the store; the swarm should leave that to one"
    if kept > 1.1 or ratio >= 2.0:
        return note, f"store egress {ratio:.2f} x (one read: < 2), kept {kept:.2f} x (<= 1.1) model size"
    return note, ""


def snapshot_of(procs: Processes, a: Agent) -> Path:
    lines = procs.log(f"fetch-{a.name}").strip().splitlines()
    if not lines:
        raise DemoError(f"{a.name}: agent fetch printed no snapshot path")
    return Path(lines[-1].strip())


def verify_consumer(snapshot: Path, cache: Path, model_dir: Path) -> list[str]:
    """What vLLM does: offline huggingface_hub resolution + safetensors loads; bytes equal the origin's."""
    from huggingface_hub import snapshot_download
    from safetensors import safe_open

    path = Path(snapshot_download(REPO, cache_dir=str(cache), local_files_only=True))
    if path.resolve() != snapshot.resolve():
        raise DemoError(f"huggingface_hub found {path}, agent fetch reported {snapshot}")
    notes = []
    origin_files = sorted(p.relative_to(model_dir) for p in model_dir.rglob("*") if p.is_file())
    for rel in origin_files:
        got = path / rel
        if not got.is_file() or sha256(got) != sha256(model_dir / rel):
            raise DemoError(f"{rel} in the agent's cache differs from the origin's file")
    tensors = 0
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            for key in f.keys():
                f.get_tensor(key)
                tensors += 1
    notes.append(f"huggingface_hub offline: {path}")
    notes.append(
        f"{len(origin_files)} files byte-identical to the origin; {tensors} tensors loaded with safetensors"
    )
    return notes


@contextlib.contextmanager
def workdir(keep: bool, given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    tmp = tempfile.mkdtemp(prefix="weightswarm-demo-")
    try:
        yield Path(tmp)
    finally:
        if not keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> int:
    print(f"demo: work files in {work}{' (kept)' if args.keep or args.workdir else ' (removed at the end)'}")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    hub = work / "origin-hub"
    t = time.monotonic()
    subprocess.run(
        [str(BIN / "agent"), "make-test-model", str(hub), REPO, "--size", args.size, "--shards", "4"],
        check=True,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        timeout=300,
    )
    model_dir = hub / REPO
    size = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    print(f"demo: model {REPO}: {fmt_mib(size)} in {time.monotonic() - t:.1f}s -> {model_dir}")

    procs = Processes(logs)
    s3 = args.origin == "s3"
    src = "store" if s3 else "origin"
    relay: demo_s3.CountingRelay | None = None
    try:
        if s3:
            relay = start_store(procs, model_dir)
            url = demo_s3.bucket_url()
            source_args, wanted = ["--bucket", url], [url, "--repo-id", REPO]
            egress_now: Callable[[], int] = relay.egress
        else:
            origin = start_origin(procs, hub, args.origin_rate)
            print(f"demo: origin {origin} (agent serve-hub, capped at {args.origin_rate}/s in total)")
            source_args, wanted = ["--origin", origin], [REPO]
            egress_now = functools.partial(egress, origin)
        if args.standalone:
            agents = [
                Agent(f"node-{i}", "", work / f"node-{i}" / "hub", work / f"node-{i}" / "state")
                for i in range(1, AGENTS + 1)
            ]

            def argv_for(a: Agent) -> list[str]:
                return [
                    str(BIN / "agent"),
                    "fetch",
                    *wanted,
                    *(["--agent", "off"] if s3 else source_args),
                    "--cache-dir",
                    str(a.cache),
                    "--state-dir",
                    str(a.state),
                    "--quiet",
                ]

            print(f"demo: {AGENTS} standalone `agent fetch` from the {src} at once (no swarm)…")
        else:
            tracker, token, passkey = start_tracker(procs, work)
            print(f"demo: tracker {tracker} (tracker serve; token, passkey in {token.name}, {passkey.name})")
            agents = start_agents(procs, work, source_args, tracker, token, passkey)
            print("demo: agents " + ", ".join(f"{a.name} {a.api}" for a in agents))

            def argv_for(a: Agent) -> list[str]:
                return [str(BIN / "agent"), "fetch", *wanted, "--agent", a.admin]

            print(f"demo: `agent fetch {' '.join(wanted)} --agent URL` on all {AGENTS} agents at once…")
        e0 = egress_now()
        fetch_all(procs, agents, argv_for, args.timeout, show_jobs=not args.standalone, src=src)
        origin_bytes = egress_now() - e0

        print()
        print(f"{'agent':<10}{'time s':>8}{'from ' + src:>14}{'from peers':>13}")
        for a in agents:
            j = a.job or {}
            src_o = fmt_mib(by_source(j)["origin"]) if j else "-"
            src_p = fmt_mib(by_source(j)["peers"]) if j else "-"
            print(f"{a.name:<10}{a.seconds or 0:>8.1f}{src_o:>14}{src_p:>13}")
        ratio = origin_bytes / size
        print(
            f"{src} egress: {fmt_mib(origin_bytes)} = {ratio:.2f} x model size "
            f"({AGENTS} nodes; without a swarm: {AGENTS:.2f} x)"
        )
        store_failed = ""
        if s3 and not args.standalone:
            store_note, store_failed = store_check(agents, size, ratio)
            print(store_note)
        print()
        for note in verify_consumer(snapshot_of(procs, agents[0]), agents[0].cache, model_dir):
            print(f"verified ({agents[0].name}): {note}")
        for a in agents[1:]:
            if verify_consumer(snapshot_of(procs, a), a.cache, model_dir):
                print(f"verified ({a.name}): files byte-identical, tensors load")
        if store_failed:
            raise DemoError(store_failed)
        if not args.standalone and not s3 and ratio > 1.1:
            raise DemoError(f"{src} egress {ratio:.2f} x model size; the swarm should keep it <= 1.1 x")
    finally:
        procs.stop_all()
        if relay is not None:
            relay.close()
    print("demo: OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="256MiB", help="model size (default 256MiB)")
    p.add_argument(
        "--origin",
        choices=("hub", "s3"),
        default="hub",
        help="where the model is: a hub (agent serve-hub), or a bucket on a local S3 server (default hub)",
    )
    p.add_argument(
        "--origin-rate", default="50MB", help="hub origin cap, all connections together (default 50MB)"
    )
    p.add_argument("--timeout", type=float, default=90, help="seconds for the fetch before giving up")
    p.add_argument("--standalone", action="store_true", help="origin only: 3 standalone fetches, no daemons")
    p.add_argument("--workdir", type=Path, help="keep work files here instead of a temp dir")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = p.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so `finally` stops every process we started.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        with workdir(args.keep, args.workdir) as work:
            return run(args, work)
    except DemoError as exc:
        print(f"\ndemo: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndemo: interrupted; stopped everything it started", file=sys.stderr)
        return 130
    except subprocess.CalledProcessError as exc:
        print(f"\ndemo: FAILED: {' '.join(map(str, exc.cmd[:3]))} exited {exc.returncode}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
