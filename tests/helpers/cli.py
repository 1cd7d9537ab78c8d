"""`webhook-broker` (the installed console script) as a real process: one command run to its
end, or one `serve` whose output goes to a file read afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers.waiting import eventually_sync

EXECUTABLE = Path(sys.executable).with_name("webhook-broker")
START_TIMEOUT = 60.0


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The test runner's environment without broker settings, and a HOME of our own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_BROKER__")}
    env["HOME"] = str(home)
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXECUTABLE), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


class Broker:
    """One `webhook-broker` process; stdout and stderr go to files we read afterwards."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.stderr_path = cwd / "stderr.log"
        with self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(
                [str(EXECUTABLE), *args], cwd=cwd, env=env, stdout=err, stderr=err
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_ready(self, base_url: str) -> httpx.Response:
        def ready() -> httpx.Response | None:
            if self.process.poll() is not None:
                pytest.fail(f"broker exited with {self.process.returncode}:\n{self.stderr}")
            try:
                response = httpx.get(f"{base_url}/_status", timeout=2)
            except httpx.TransportError:
                return None
            return response if response.status_code == 200 else None

        response = eventually_sync(ready, START_TIMEOUT, 0.1, what=f"{base_url}/_status: 200")
        assert response is not None  # eventually_sync returns only a truthy answer
        return response

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
