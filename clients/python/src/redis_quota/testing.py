"""A throwaway redis-server with the module loaded, for tests (yours and ours).

    with RedisServer("/path/to/libredis_quota.so") as server:
        r = redis.Redis(port=server.port)

Each server gets a free port and a temp dir, and is killed and cleaned up on ``stop()``.
``stop()`` then ``start()`` again brings it back on the same port, empty (to test what a
client does while Redis is down).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def find_module(start: Path | None = None) -> Path:
    """``$QUOTA_MODULE``, else ``target/debug/libredis_quota.so`` in the nearest parent
    directory of ``start`` (default: the working directory) that has one."""
    env = os.environ.get("QUOTA_MODULE")
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        cand = d / "target" / "debug" / "libredis_quota.so"
        if cand.exists():
            return cand
    raise FileNotFoundError("libredis_quota.so: set QUOTA_MODULE or run `cargo build`")


class RedisServer:
    """redis-server (``$REDIS_SERVER`` or ``redis-server`` on PATH) with the module."""

    def __init__(
        self,
        module: str | Path,
        args: Sequence[str] = (),
        module_args: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        self.module = Path(module).resolve()
        self.args = list(args)
        self.module_args = list(module_args)
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rq-pytest-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Starts the server and waits until it answers PING."""
        exe = os.environ.get("REDIS_SERVER", "redis-server")
        cmd = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--loadmodule",
            str(self.module),
            *self.module_args,
            *self.args,
        ]
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 (closed with the process)
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {timeout_s}s")

    def ping(self) -> bool:
        """Whether the server answers PING now (raw RESP: no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.dir / "redis.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Kills the server (its data is lost) and waits for it to exit."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def close(self) -> None:
        """Stops the server and removes its temp dir."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
