"""A private redis-server for benchmarks and tests: the Debian binary on a free loopback port, without
persistence (a restart loses every key, as a cache-mode Redis does), stopped by its PID."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


class RedisServer:
    """`start()` waits until it answers PING; `kill()` then `start()` restarts it on the same port."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        import redis

        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes"]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        with redis.Redis(host="127.0.0.1", port=self.port) as client:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"redis-server exited with {self.proc.returncode}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server not answering after {timeout:.0f}s") from None
                    time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL and reap (a crash, for restart tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; reaped either way."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
