"""bench/budget.py: the API CPU per request a rate target leaves on a shared machine."""

from __future__ import annotations

from typing import Any

import pytest

from bench.budget import Run, allowance_us, rows


def run(rate: float, api: float, machine: float, api_us: float) -> Run:
    return Run(rate, {"api": api, "machine": machine, "pg": machine - api}, api_us)


@pytest.mark.parametrize(
    ("ours", "target_rate", "allowed"),
    [
        # One request per job: the API 1 ms and everything else 1 ms per job at 1,000/s.
        (run(1000, 100, 200, 1000), 1000, 1000),  # the rate we ran at: what we spent
        (run(1000, 100, 200, 1000), 1250, 600),  # 1.6 ms a job in all, 1 ms of it not ours
        (run(1000, 100, 200, 1000), 2000, 0),  # the others alone fill the machine
        (run(1000, 100, 200, 1000), 4000, -500),  # not even a free API would reach it
        # Fan-out 5: a publish request makes 5 jobs, so each request has 5 jobs' share.
        (run(5000, 100, 200, 1000), 6250, 600),
        # A machine not full in our run is held at what it reached.
        (run(1000, 50, 150, 500), 1000, 500),
    ],
)
def test_allowance(ours: Run, target_rate: float, allowed: float) -> None:
    assert allowance_us(ours, target_rate) == pytest.approx(allowed)


def result(name: str, group: str, rate: float, api_us: float | None) -> dict[str, Any]:
    return {
        "name": name,
        "group": group,
        "jobs_per_s": rate,
        "cpu_percent": {"api": 100.0, "pg": 90.0, "machine": 200.0},
        "api_us_per_request": api_us,
    }


def test_rows_pair_each_round_with_its_floor_and_pgqueuer() -> None:
    doc = {
        "results": [
            result("HTTP pull(100) + batch ack [round 1]", "ours", 30000.04, 700.0),
            result("HTTP pull(100) + batch ack, bare floor route [round 1]", "floor", 31000, 450.0),
            result("HTTP pull(100) + batch ack [round 2]", "ours", 20000.0, 900.0),
            result("pgqueuer dequeue (QueueManager, batch 100), 4 workers", "ours", 24000, None),
        ],
        "pairs": {
            "pull-batch": {
                "rounds": [
                    {"ceiling": 40000.0, "ours": 30000.0},
                    {"ceiling": 40000.0, "ours": 20000.0},
                ]
            },
            "floor pull-batch": {"rounds": [{"ceiling": 450.0, "ours": 700.0}]},
        },
    }
    found = rows(doc)
    assert [(r.target, r.round_no, r.target_rate) for r in found] == [
        ("pull-batch at 75% of its ceiling", 1, 30000.0),
        ("pull-batch at 75% of its ceiling", 2, 30000.0),
        ("pull-batch at 1.5x pgqueuer's dequeue", 1, 36000.0),
        ("pull-batch at 1.5x pgqueuer's dequeue", 2, 36000.0),
    ]
    assert found[0].ours.api_us == 700.0
    assert found[0].floor is not None and found[0].floor.api_us == 450.0
    assert found[1].floor is None
    # Round 1 ran at the target's rate: its allowance is what it spent.
    assert found[0].allowed == pytest.approx(700.0, rel=1e-4)
