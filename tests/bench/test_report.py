"""bench/report.py: the targets read our paired rounds' runs, and issue 40's claim latency
compares each side's median over the pairs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.env import Measured, Settings
from bench.report import claim_latency_target, targets
from bench.scenarios import Runner

PULL = "HTTP pull(100) + batch ack, 4 pollers"


def pair(ours: tuple[float, float], pgbench: tuple[float, float]) -> dict[str, float]:
    return {
        "ceiling": 40000.0,
        "ours": 30000.0,
        "ratio": 0.75,
        "ours_p50": ours[0],
        "ours_p99": ours[1],
        "ceiling_p50": pgbench[0],
        "ceiling_p99": pgbench[1],
    }


@pytest.mark.parametrize(
    ("pairs", "verdict", "measured"),
    [
        (
            [pair((7.7, 18.0), (8.4, 25.7)), pair((8.3, 17.6), (8.5, 18.6)),
             pair((6.7, 15.1), (9.4, 19.7))],
            "PASS",
            "p50 7.7 against 8.5 ms, p99 17.6 against 19.7 ms (medians of 3 pairs)",
        ),
        # A p99 over pgbench's fails it, though the p50 is under.
        ([pair((7.2, 19.7), (8.5, 15.8))], "FAIL", "p50 7.2 against 8.5 ms, p99 19.7 against"),
        # Level is "at or under".
        ([pair((8.0, 16.0), (8.0, 16.0))], "PASS", "p50 8.0 against 8.0 ms"),
    ],
)  # fmt: skip
def test_claim_latency_against_pgbench(
    pairs: list[dict[str, float]], verdict: str, measured: str
) -> None:
    target = claim_latency_target(pairs)
    assert target is not None
    assert target.verdict == verdict
    assert target.measured.startswith(measured)


def test_claim_latency_needs_pairs_with_latencies() -> None:
    assert claim_latency_target([]) is None
    assert claim_latency_target([{"ceiling": 1.0, "ours": 1.0, "ratio": 1.0}]) is None


def run(name: str, group: str, rate: float, p50: float, p99: float) -> Measured:
    return Measured(
        name, group, jobs=int(rate * 8), seconds=8.0,
        latency_ms={"pull": {"n": 100, "p50": p50, "p99": p99}},
    )  # fmt: skip


def test_targets_read_the_paired_runs_not_others_of_the_same_name() -> None:
    paired = [run(f"{PULL} [round {n}]", "ours", 33000.0, 7.0, 16.0) for n in (1, 2, 3)]
    slower = [
        # The overflow section's priority-group runs and its own plain rounds, the same names.
        run(f'{PULL}, overflow consumer, {{"group": "jobs"}} [round {n}]', "ours", 16000, 12, 30)
        for n in (1, 2, 3)
    ] + [run(f"{PULL} [round {n}]", "ours", 20000.0, 11.0, 27.0) for n in (1, 2, 3)]
    pgqueuer = Measured("pgqueuer dequeue (QueueManager, batch 100)", "baseline", 176000, 8.0)
    fake: Any = SimpleNamespace(
        s=Settings(),
        results=[*paired, *slower, pgqueuer],
        pairs={},
        paired_runs={"pull-batch": paired},
    )
    found = {t.name: t for t in targets(cast(Runner, fake))}
    versus = found["pull + batch ack vs pgqueuer dequeue at batch 100"]
    assert (versus.measured, versus.verdict) == ("1.50x", "PASS")
    latency = found["claim (pull) latency at 4 pollers"]
    assert latency.measured == "p50 7.0 ms, p99 16.0 ms"
