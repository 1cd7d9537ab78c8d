"""py-spy sampling of a broker process during a scenario, summarised into where the CPU went."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

# Library of a frame's file, most specific first; the leaf frame's library gets the sample.
LIBRARIES = (
    ("sqlalchemy", "sqlalchemy/"),
    ("psycopg", "psycopg"),
    ("pydantic", "pydantic"),
    ("fastapi", "fastapi/"),
    ("starlette", "starlette/"),
    ("uvicorn", "uvicorn/"),
    ("httptools", "httptools"),
    ("json", "json/"),
    ("asyncio", "asyncio/"),
    ("logging", "logging/"),
    ("nats", "nats/"),
    ("app", "/app/"),
)


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


async def record(pid: int, seconds: float, out: Path) -> dict[str, Any]:
    """Sample `pid` for `seconds` (100 Hz, without pausing it) and summarise the stacks."""
    binary = py_spy()
    if binary is None:
        return {"error": "py-spy is not installed (pip install py-spy, in the dev extra)"}
    proc = await asyncio.create_subprocess_exec(
        binary,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, int(seconds))),
        "--rate",
        "100",
        "--format",
        "raw",
        "--nonblocking",
        "-o",
        str(out),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=seconds + 60)
    raw = await asyncio.to_thread(_read, out)
    if proc.returncode != 0 or raw is None:
        return {"error": output.decode(errors="replace")[-500:]}
    return summarise(raw)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _library(path: str) -> str:
    for name, mark in LIBRARIES:
        if mark in path:
            return name
    return "other"


def summarise(raw: str, top: int = 25) -> dict[str, Any]:
    """Self time by library, and inclusive time of the busiest functions (% of samples)."""
    self_by_library: Counter[str] = Counter()
    self_by_function: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        names = []
        for frame in frames:
            match = FRAME.match(frame)
            func, path = (match["func"], match["file"]) if match else (frame, "")
            names.append((func, path))
        leaf_func, leaf_path = names[-1]
        self_by_library[_library(leaf_path)] += count
        self_by_function[f"{leaf_func} ({_short(leaf_path)})"] += count
        for func, path in {(f, p) for f, p in names}:
            inclusive[f"{func} ({_short(path)})"] += count
    if not total:
        return {"samples": 0}

    def share(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(name, round(100.0 * c / total, 1)) for name, c in counter.most_common(n)]

    return {
        "samples": total,
        "self_by_library_pct": dict(share(self_by_library, 20)),
        "self_top_pct": share(self_by_function, top),
        "inclusive_top_pct": share(inclusive, top * 2),
    }


def _short(path: str) -> str:
    for mark in ("site-packages/", "/work/main/"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path.rsplit("/", 2)[-1] if "/" in path else path
