"""The official NATS clients besides nats-py, as test processes: @nats-io/jetstream
(tests/js, node) and nats-jetstream (its own Python 3.13 venv, `.venv-nats-jetstream`), each
driven over JSON lines on stdin/stdout. `install` makes sure both are installed."""

from __future__ import annotations

import asyncio
import fcntl
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JS_DIR = REPO / "tests" / "js"
PY_VENV = REPO / ".venv-nats-jetstream"
PY_CLIENT = REPO / "tests" / "clients" / "nats_jetstream_client.py"
DRIVERS = {
    "js": ["node", str(JS_DIR / "manage.mjs")],
    "nats-jetstream": [
        str(PY_VENV / "bin" / "python"),
        str(REPO / "tests" / "clients" / "nats_jetstream_manage.py"),
    ],
}


def install() -> None:
    """scripts/test installs both clients (tests/clients/install); a test run without that
    runs the same script."""
    script = REPO / "tests" / "clients" / "install"
    # The script marks each client installed as its last step; test processes side by side
    # (pytest -n) check under a lock on the script, so the first installs and the others wait
    # for it, and none starts on a client another is still installing.
    done = (JS_DIR / "node_modules" / ".installed", PY_VENV / ".installed")
    with script.open("rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(marker.exists() for marker in done):
            subprocess.run([str(script)], check=True)


class ClientError(Exception):
    pass


def argv_of(kind: str) -> list[str]:
    if kind == "js":
        return ["node", str(JS_DIR / "client.mjs")]
    return [str(PY_VENV / "bin" / "python"), str(PY_CLIENT)]


class ClientProcess:
    """One client process (tests/js/*.mjs, or a nats-jetstream driver in tests/clients): a
    command in as a JSON line, an answer out as one."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @classmethod
    async def spawn(cls, argv: Sequence[str]) -> ClientProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=JS_DIR,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=16 * 1024 * 1024,
        )
        return cls(proc)

    @classmethod
    async def start(cls, kind: str) -> ClientProcess:
        """The official client of `kind` (tests/js/client.mjs or the nats-jetstream one)."""
        return await cls.spawn(argv_of(kind))

    async def answer(self, op: str, within: float = 30, **args: Any) -> Any:
        """The answer as the process wrote it: {"ok": ...} or {"error": ...}."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
        await self._proc.stdin.drain()
        line = await asyncio.wait_for(self._proc.stdout.readline(), within)
        assert line, f"the client ended during {op}"
        return json.loads(line)

    async def call(self, op: str, within: float = 30, **args: Any) -> Any:
        """The answer's "ok" part; its "error" raised as a ClientError."""
        answer = await self.answer(op, within, **args)
        if "error" in answer:
            raise ClientError(f"{op}: {answer['error']}")
        return answer["ok"]

    async def close(self) -> None:
        if self._proc.returncode is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
