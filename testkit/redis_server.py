"""A real Redis (or Valkey) server for tests and benchmarks: loopback port, temp dir, own process.

    with RedisServer(tmp_path) as server:        # starts redis-server on 127.0.0.1:<free port>
        url = server.url                         # redis://127.0.0.1:<port>/0
        server.restart()                         # same port, same dir (AOF kept when enabled)
        server.kill()                            # SIGKILL, as a crash would

Tests skip (with the reason below) only when no server binary is installed; anything else that
goes wrong while starting one is an error. Install: `apt-get install -y redis-server`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest

SKIP_REASON = ("no redis-server or valkey-server on PATH; install one "
               "(`apt-get install -y redis-server`) to run the remote-tier tests")


def server_binary() -> str | None:
    return shutil.which("redis-server") or shutil.which("valkey-server")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(*, cluster: bool = False) -> int:
    """A free loopback port; for a cluster node also port + 10000 (its bus) is free."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not cluster:
            return port
        port = 20000 + port % 30000  # NOTE: a cluster node needs port + 10000 <= 65535
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RuntimeError("no free loopback port found")


def _ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process on 127.0.0.1; its files live under `root`."""

    def __init__(self, root: str | os.PathLike, *, port: int | None = None,
                 args: Sequence[str] = (), appendonly: bool = False) -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError(SKIP_REASON)
        self.binary = binary
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.args = list(args)
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        return out.strip()

    def start(self, timeout: float = 15.0) -> "RedisServer":
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.root), "--daemonize", "no", "--save", "",
               "--appendonly", "yes" if self.appendonly else "no",
               "--logfile", str(self.log_path), *self.args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            if _ping(self.port):
                return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer PING within {timeout}s:\n"
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean shutdown; with appendonly the data survives a restart)."""
        if not self.is_running():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash or a pulled cable would."""
        if self.is_running():
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> "RedisServer":
        self.stop()
        return self.start()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisCluster3:
    """Three redis-server processes in cluster mode, slots split evenly, no replicas."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.attempt = 0
        self.nodes = self._make_nodes()

    def _make_nodes(self) -> list[RedisServer]:
        # NOTE: ports are picked before any node binds: keep the three nodes' ports and bus
        # ports (port + 10000) pairwise distinct, or two nodes race for one port.
        ports: list[int] = []
        while len(ports) < 3:
            p = free_port(cluster=True)
            if not {p, p + 10000} & {q for x in ports for q in (x, x + 10000)}:
                ports.append(p)
        return [RedisServer(self.root / f"try{self.attempt}" / f"node{i}", port=port,
                            args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                  "--cluster-node-timeout", "2000"])
                for i, port in enumerate(ports)]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30.0, attempts: int = 3) -> "RedisCluster3":
        """Start and join the nodes; on a failed start (a port taken between picking and binding,
        no convergence) retry with fresh ports and directories."""
        for self.attempt in range(attempts):
            if self.attempt:
                self.nodes = self._make_nodes()
            try:
                return self._start_once(timeout)
            except Exception:  # noqa: BLE001 - any failed start is retried, the last one raised
                if self.attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "RedisCluster3":
        import redis

        clients = [redis.Redis(port=n.port, socket_timeout=5) for n in self.nodes]
        try:
            for node in self.nodes:
                node.start()
            bounds = [0, 5461, 10923, 16384]
            for i, c in enumerate(clients):
                c.execute_command("CLUSTER ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
            for n in self.nodes[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", n.port)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                infos = [c.cluster("info") for c in clients]  # parsed into dicts
                if all(str(i.get("cluster_state")) == "ok"
                       and int(i.get("cluster_known_nodes", 0)) == 3 for i in infos):
                    return self
                time.sleep(0.1)
            raise RuntimeError(f"cluster did not reach cluster_state:ok in {timeout}s")
        except BaseException:
            self.stop()
            raise
        finally:
            for c in clients:
                c.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "RedisCluster3":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- pytest fixtures (tests/conftest.py loads this module as a plugin) --------------------------
requires_server = pytest.mark.skipif(server_binary() is None, reason=SKIP_REASON)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """A fresh, empty server per test, stopped afterwards."""
    if server_binary() is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()
