"""bench/budget.py: the API CPU per request a rate target leaves on a shared machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.budget import Run, allowance_us, newest, rows


def run(rate: float, api: float, machine: float, api_us: float, per_job: float = 1.0) -> Run:
    return Run(rate, {"api": api, "machine": machine, "pg": machine - api}, api_us, per_job)


@pytest.mark.parametrize(
    ("ours", "target_rate", "allowed"),
    [
        # One request per job: the API 1 ms and everything else 1 ms per job at 1,000/s.
        (run(1000, 100, 200, 1000), 1000, 1000),  # the rate we ran at: what we spent
        (run(1000, 100, 200, 1000), 1250, 600),  # 1.6 ms a job in all, 1 ms of it not ours
        (run(1000, 100, 200, 1000), 2000, 0),  # the others alone fill the machine
        (run(1000, 100, 200, 1000), 4000, -500),  # not even a free API would reach it
        # Fan-out 5: a publish request makes 5 jobs, so each request has 5 jobs' share.
        (run(5000, 100, 200, 1000, per_job=0.2), 6250, 600),
        # A machine not full in our run is held at what it reached: 1.2 ms a job, not 1.6.
        (run(1000, 50, 150, 500), 1250, 200),
    ],
)
def test_allowance(ours: Run, target_rate: float, allowed: float) -> None:
    assert allowance_us(ours, target_rate) == pytest.approx(allowed)


def result(
    name: str, group: str, rate: float, api_us: float | None, status: str = "ok"
) -> dict[str, Any]:
    return {
        "name": name,
        "group": group,
        "status": status,
        "jobs": rate * 8,
        "jobs_per_s": rate,
        "cpu_percent": {"api": 100.0, "pg": 90.0, "machine": 200.0},
        "api_us_per_request": api_us,
        "extra": {"requests": rate * 8 / 50},
    }


PULL = "HTTP pull(100) + batch ack, 4 pollers"


def doc() -> dict[str, Any]:
    return {
        "results": [
            result(f"{PULL} [round 1]", "ours", 30000.04, 700.0),
            result(f"{PULL}, bare floor route [round 1]", "floor", 31000, 450.0),
            # The console section's own round 2 of the same name, before the paired one.
            result(f"{PULL} [round 2]", "ours", 25000.0, 800.0),
            result(f"{PULL} [round 2]", "ours", 20000.0, 900.0),
            # Round 3's ceiling failed; round 2 has no floor run.
            result(f"{PULL} [round 3]", "ours", 21000.0, 950.0),
            result(f"{PULL}, bare floor route [round 3]", "floor", 22000.0, 300.0),
            result("pgqueuer dequeue (QueueManager, batch 100)", "baseline", 24000, None),
        ],
        "pairs": {
            "pull-batch": {
                "rounds": [
                    {"ceiling": 40000.0, "ours": 30000.0},
                    {"ceiling": 40000.0, "ours": 20000.0},
                    {"ceiling": 0.0, "ours": 21000.0},
                ]
            },
        },
    }


def test_rows_pair_each_round_with_its_own_runs() -> None:
    found = rows(doc())
    assert [(r.target, r.round_no, r.target_rate) for r in found] == [
        ("pull-batch at 75% of its ceiling", 1, 30000.0),
        ("pull-batch at 75% of its ceiling", 2, 30000.0),
        ("pull-batch at 1.5x pgqueuer's dequeue", 1, 36000.0),
        ("pull-batch at 1.5x pgqueuer's dequeue", 2, 36000.0),
    ]
    assert [r.ours.api_us for r in found[:2]] == [700.0, 900.0]
    assert found[0].floor is not None and found[0].floor.rate == 31000
    assert found[1].floor is None
    assert found[0].ours.requests_per_job == pytest.approx(1 / 50)


def test_a_failed_pgqueuer_run_sets_no_target() -> None:
    failed = doc()
    failed["results"][-1].update(status="failed", jobs_per_s=0.0)
    assert [r.target for r in rows(failed)] == ["pull-batch at 75% of its ceiling"] * 2


def test_newest_skips_status_files_and_runs_without_pairs(tmp_path: Path) -> None:
    (tmp_path / "2026-11-28T01-00-00.json").write_text(json.dumps(doc()))
    (tmp_path / "2026-11-28T02-00-00.json").write_text(json.dumps({"results": [], "pairs": {}}))
    (tmp_path / "status-2026-11-28T03-00-00.json").write_text("{}")
    picked = newest(tmp_path)
    assert picked is not None and picked[0].name == "2026-11-28T01-00-00.json"
