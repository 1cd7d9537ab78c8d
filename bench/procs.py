"""Child processes of a benchmark run, and the CPU each of them used in a measured window."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil


class Service:
    """A long-running child (broker process, nats-server, receiver) with its output in a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        logdir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = logdir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; only this process (and its group)."""
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout=grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return await self.proc.wait()


def main_thread_seconds(pid: int) -> float:
    """User + system CPU of a process's main thread alone (its Python thread, where the other
    threads are a client's native runtime)."""
    try:
        for thread in psutil.Process(pid).threads():
            if thread.id == pid:
                return float(thread.user_time + thread.system_time)
    except psutil.Error:
        pass
    return 0.0


def cpu_seconds(pid: int, *, with_children: bool) -> float:
    """User + system CPU of a process; with children, also of its live and reaped children.

    PostgreSQL backends are children of the postmaster: a backend that exits between two
    snapshots moves from the live children to the postmaster's reaped-children times, so the
    sum stays continuous.
    """
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        total = times.user + times.system
        if with_children:
            total += times.children_user + times.children_system
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child_times = child.cpu_times()
                    total += child_times.user + child_times.system
        return total
    except psutil.Error:
        return 0.0


@dataclass
class CpuMeter:
    """Named groups of processes; `snapshot()` twice, then `percent()` per group (100 = a core)."""

    groups: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)
    main_threads: dict[str, list[int]] = field(default_factory=dict)
    _start: dict[str, float] = field(default_factory=dict)
    _end: dict[str, float] = field(default_factory=dict)
    _t0: float = 0.0
    _t1: float = 0.0

    def add(self, group: str, pid: int, *, with_children: bool = False) -> None:
        self.groups.setdefault(group, []).append((pid, with_children))

    def add_main_thread(self, group: str, pid: int) -> None:
        """Also meter the main thread of `pid` alone, as `<group> main thread`."""
        self.main_threads.setdefault(f"{group} main thread", []).append(pid)

    def _measure(self) -> dict[str, float]:
        measured = {
            group: sum(cpu_seconds(pid, with_children=kids) for pid, kids in members)
            for group, members in self.groups.items()
        }
        for group, pids in self.main_threads.items():
            measured[group] = sum(main_thread_seconds(pid) for pid in pids)
        # The whole machine, other sessions' processes included: tells how noisy the window was.
        machine = psutil.cpu_times()
        measured["machine"] = (
            machine.user
            + machine.nice
            + machine.system
            + machine.irq
            + (machine.softirq + getattr(machine, "steal", 0.0))
        )
        return measured

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = self._measure()

    def stop(self) -> None:
        self._t1 = time.monotonic()
        self._end = self._measure()

    def percent(self) -> dict[str, float]:
        elapsed = max(self._t1 - self._t0, 1e-6)
        return {
            group: round(100.0 * (self._end.get(group, 0.0) - start) / elapsed, 1)
            for group, start in self._start.items()
        }
