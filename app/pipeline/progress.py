"""Progress lines on stderr for long runs, and the one JSON summary line per run on stdout."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, name: str = "pipeline") -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._name = name
        self._started = time.monotonic()

    def line(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        print(f"[{elapsed:8.1f}s] {self._name}: {text}", file=self._stream, flush=True)


def summary_line(summary: dict[str, Any]) -> str:
    """One line of JSON that log shippers and the bench can parse."""
    return json.dumps(summary, sort_keys=True, default=str, separators=(",", ":"))
