"""The broker's processes as real OS processes: started from the CLI with one config file, and
killed, paused, stopped and restarted by the fault schedule. Every exit is recorded with how
it came about, so that the run can tell a crash from a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# A stopping process (SIGTERM) must be gone within this; its log prints its own bound.
EXIT_BOUND_SECONDS = 30.0


@dataclass
class Exit:
    process: str
    code: int | None  # None: still running when the bound passed (then killed)
    how: str  # "killed" (SIGKILL by the schedule), "stopped" (SIGTERM), "crashed" (on its own)
    seconds: float  # from the signal to the exit (0 for a crash)


@dataclass
class BrokerProcess:
    """One broker process kind (`api`, `sweeper`, `dispatcher`, `bridge`) and its incarnations."""

    name: str
    command: str
    config: Path
    env: dict[str, str] = field(default_factory=dict)
    metrics_url: str = ""
    popen: subprocess.Popen[bytes] | None = None
    paused: bool = False
    busy: bool = False  # a fault is stopping or restarting it: its exit is the fault's
    exits: list[Exit] = field(default_factory=list)
    starts: int = 0

    @property
    def log(self) -> Path:
        return self.config.parent / f"{self.name}.log"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "app", "--config", str(self.config), self.command],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.config.parent,
                env={**os.environ, "HOME": str(self.config.parent), **self.env},
            )
        self.paused = False
        self.starts += 1

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check(self) -> Exit | None:
        """An exit nobody asked for (recorded, and the process is gone)."""
        if self.busy or self.popen is None or self.popen.poll() is None:
            return None
        gone = Exit(self.name, self.popen.returncode, "crashed", 0.0)
        self.exits.append(gone)
        self.popen = None
        return gone

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.kill()
        self.popen.wait()
        self.exits.append(Exit(self.name, self.popen.returncode, "killed", 0.0))
        self.popen = None

    def pause(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.popen is not None and self.paused:
            self.popen.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> Exit:
        """SIGTERM and wait for the exit (within EXIT_BOUND_SECONDS, else SIGKILL)."""
        assert self.popen is not None
        self.resume()
        started = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.popen.wait(timeout=EXIT_BOUND_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
            self.popen.kill()
            self.popen.wait()
        gone = Exit(self.name, code, "stopped", round(time.monotonic() - started, 2))
        self.exits.append(gone)
        self.popen = None
        return gone

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
