"""CPU priority across sessions: the autogroup nice value.

With the kernel's scheduler autogroups on (`/proc/sys/kernel/sched_autogroup_enabled`, the
default of Debian's kernel for processes outside a CPU cgroup), CPU time is shared first between
sessions, and a process's nice value only orders it against the processes of its own session.
A process at nice 19 in a session of its own (started by setsid, cron, a supervisor, or
pg_ctl, which calls setsid) then gets as much CPU as the broker's session: measured on the
bench's machine, two spinning loops on one core in two sessions took 53% and 47% with one of
them at nice 19 (docs/performance.md, "Retention").
The session's own nice value (`/proc/<pid>/autogroup`) is what makes it yield.
"""

from __future__ import annotations

from pathlib import Path

_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroups_on() -> bool:
    """Whether the kernel shares CPU between sessions first (Linux only)."""
    try:
        return _ENABLED.read_text().strip() == "1"
    except OSError:
        return False


def autogroup_nice(pid: int | None = None) -> int | None:
    """The nice value of the autogroup of `pid` (this process if None); None where there is
    none to read, as for a process in the root autogroup (init's session, which has no
    autogroup of its own: the kernel shows its file empty)."""
    try:
        text = Path(f"/proc/{pid or 'self'}/autogroup").read_text()
    except OSError:
        return None
    _, _, value = text.strip().rpartition(" nice ")
    return int(value) if value.lstrip("-").isdigit() else None


def nice_autogroup(value: int, pid: int | None = None) -> bool:
    """Set the nice value of the autogroup of `pid` (this process if None), that is of every
    process in its session; whether it took. Raising it needs no privilege; lowering it below
    the current value does, and is then refused by the kernel."""
    try:
        Path(f"/proc/{pid or 'self'}/autogroup").write_text(str(value))
    except OSError:
        return False
    return autogroup_nice(pid) == value
