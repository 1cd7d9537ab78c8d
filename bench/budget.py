"""`python -m bench.budget [RESULTS.json]`: the API CPU a throughput target leaves (issue 40).

On two cores the API, PostgreSQL and the load generator share one budget of CPU, so a rate
target for an HTTP scenario is also a ceiling on the API's CPU per request: whatever the other
processes spend per job stays, and the rest of the machine's CPU, divided by the target's rate,
is what each job's requests may cost in the API. For every paired round of a full
`python -m bench` run (the newest results file by default) this prints that allowance beside
what our API spent and what the bare floor route (bench/floor.py) spent in the same round.

First order only: it holds the other processes' CPU per job and the machine's total (as
measured in our run) fixed at the higher rate, where in fact PostgreSQL's CPU per job rises a
little as the machine fills. An allowance below the floor's own figure means the target asks
for an API cheaper than a route that checks nothing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# Issue 40's targets: the share of the paired ceiling, by the pair's name in the results.
SHARE_TARGETS = {"publish": 0.50, "pull-each": 0.25, "pull-batch": 0.75}
PGQUEUER_TARGET = 1.5  # pull + batch ack against pgqueuer's batch-100 dequeue
PGQUEUER_ROW = "pgqueuer dequeue"


@dataclass(frozen=True)
class Run:
    """One measured run: jobs/s, CPU in % of one core by process group, API µs per request."""

    rate: float
    cpu: dict[str, float]
    api_us: float

    @property
    def requests_per_job(self) -> float:
        return self.cpu["api"] / 100 / self.rate / (self.api_us * 1e-6)


def allowance_us(ours: Run, target_rate: float) -> float:
    """The API µs per request left at `target_rate` jobs/s: the machine's CPU in our run,
    less what everything but the API spent per job in it, per request."""
    machine_s_per_job = ours.cpu["machine"] / 100 / target_rate
    others_s_per_job = (ours.cpu["machine"] - ours.cpu["api"]) / 100 / ours.rate
    return (machine_s_per_job - others_s_per_job) / ours.requests_per_job * 1e6


@dataclass(frozen=True)
class Row:
    target: str
    round_no: int
    target_rate: float
    ours: Run
    floor: Run | None

    @property
    def allowed(self) -> float:
        return allowance_us(self.ours, self.target_rate)


def _run(result: dict[str, Any]) -> Run:
    return Run(result["jobs_per_s"], result["cpu_percent"], result["api_us_per_request"] or 0.0)


def _measured(results: list[dict[str, Any]], group: str, rate: float) -> dict[str, Any] | None:
    """The run of `group` whose rate the pair recorded (rounded as the pairs are)."""
    for result in results:
        if result.get("group") == group and round(result["jobs_per_s"], 1) == rate:
            return result
    return None


def rows(doc: dict[str, Any]) -> list[Row]:
    results, pairs = doc["results"], doc["pairs"]
    out: list[Row] = []
    for name, share in SHARE_TARGETS.items():
        floors = pairs.get(f"floor {name}", {}).get("rounds", [])
        for i, pair in enumerate(pairs.get(name, {}).get("rounds", [])):
            ours = _measured(results, "ours", pair["ours"])
            if ours is None or not ours.get("api_us_per_request"):
                continue
            floor = None
            if i < len(floors):
                floor = next(
                    (
                        r
                        for r in results
                        if r.get("group") == "floor"
                        and r.get("api_us_per_request") == floors[i]["ceiling"]
                    ),
                    None,
                )
            out.append(
                Row(
                    f"{name} at {share:.0%} of its ceiling",
                    i + 1,
                    share * pair["ceiling"],
                    _run(ours),
                    _run(floor) if floor else None,
                )
            )
    pgqueuer = [r for r in results if r["name"].startswith(PGQUEUER_ROW)]
    if pgqueuer:
        target_rate = PGQUEUER_TARGET * pgqueuer[0]["jobs_per_s"]
        for row in [r for r in out if r.target.startswith("pull-batch")]:
            out.append(
                Row(
                    f"pull-batch at {PGQUEUER_TARGET}x pgqueuer's dequeue",
                    row.round_no,
                    target_rate,
                    row.ours,
                    row.floor,
                )
            )
    return out


def table(found: list[Row]) -> str:
    lines = [
        "| target | round | rate needed | ours | API µs/request allowed | ours | bare floor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in found:
        floor = f"{row.floor.api_us:.0f}" if row.floor else "-"
        lines.append(
            f"| {row.target} | {row.round_no} | {row.target_rate:,.0f} | {row.ours.rate:,.0f} "
            f"| {row.allowed:.0f} | {row.ours.api_us:.0f} | {floor} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", nargs="?", type=Path, help="a results file (default: the newest)")
    args = p.parse_args()
    path = args.results or max(RESULTS.glob("*.json"))
    print(f"{path.name}\n")
    print(table(rows(json.loads(path.read_text()))))


if __name__ == "__main__":
    main()
