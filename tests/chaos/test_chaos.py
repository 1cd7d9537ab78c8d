"""The small chaos run CI makes: a minute of faults with a fixed seed (each fault kind at
least once), then every invariant. The 30-minute run's command and summary are in the
docs/operations/reliability.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.chaos.run import Settings, run, summary_line, write

SEED = int(os.environ.get("CHAOS_SEED", "20261125"))
SECONDS = float(os.environ.get("CHAOS_SECONDS", "60"))


# The minute of faults, its drain (Settings.drain_seconds, 120 s) and the start of PostgreSQL,
# nats-server and the broker processes: past the suite's per-test timeout, far under this.
@pytest.mark.timeout(600)
async def test_a_short_chaos_run_keeps_every_invariant(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    minutes = request.config.getoption("--chaos-minutes")
    seconds = SECONDS if minutes is None else minutes * 60
    seed = request.config.getoption("--chaos-seed") or SEED
    out = tmp_path / "chaos-summary.json"
    summary = await run(Settings(seconds=seconds, seed=seed, out=out))
    write(summary, out)
    print(summary_line(summary))
    assert set(summary["faults"]) >= {
        "kill",
        "pause",
        "stop",
        "pg-restart",
        "pg-outage",
        "nats-restart",
        "consumer-delete",
        "partition-drop",
    }
    assert summary["jobs"].keys() <= {"DELIVERED", "DEAD"}
    assert summary["invariant checks"] > summary["messages"]
    first = "\n".join(json.dumps(v, default=str) for v in summary["violations"][:5])
    assert summary["violations"] == [], f"{summary_line(summary)}\n{first}"
