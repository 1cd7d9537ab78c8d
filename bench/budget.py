"""`python -m bench.budget [RESULTS.json]`: the API CPU a throughput target leaves (issue 40).

On two cores the API, PostgreSQL and the load generator share one budget of CPU, so a rate
target for an HTTP scenario is also a ceiling on the API's CPU per request: whatever the other
processes spend per job stays, and the rest of the machine's CPU, spread over the target's
jobs per second, is what each job's requests may cost in the API. For every paired round of a
full `python -m bench` run (the newest results file with paired rounds by default) this prints
that allowance beside what our API and the bare floor route (bench/floor.py) spent in the same
round.

First order only: it holds the other processes' CPU per job and the machine's total at what
our run measured, where in fact PostgreSQL's CPU per job rises a little as the machine fills,
and a machine our run left partly idle (193% of 200, say) could give the API a few percent
more. An allowance below the floor's own figure means the target asks for an API cheaper than
a route that checks nothing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.scenarios import FLOOR_NOTE, PAIRS

RESULTS = Path(__file__).resolve().parent / "results"

# Issue 40's targets: the share of its ceiling each paired scenario (scenarios.PAIRS) is to
# reach, and pull + batch ack against pgqueuer's batch-100 dequeue.
SHARE_TARGETS = {"publish": 0.50, "pull-each": 0.25, "pull-batch": 0.75}
PGQUEUER_TARGET = 1.5
PGQUEUER_ROW = "pgqueuer dequeue"
assert set(SHARE_TARGETS) <= set(PAIRS)


@dataclass(frozen=True)
class Run:
    """One measured run: jobs/s, CPU in % of one core by process group, API µs per request,
    and HTTP requests per job (0.2 for a publish that makes 5 jobs)."""

    rate: float
    cpu: dict[str, float]
    api_us: float
    requests_per_job: float


def allowance_us(ours: Run, target_rate: float) -> float:
    """The API µs per request left at `target_rate` jobs/s: the machine's CPU as our run used
    it, spread over the target's jobs, less what everything but the API spent per job in our
    run, per request."""
    machine_s_per_job = ours.cpu["machine"] / 100 / target_rate
    others_s_per_job = (ours.cpu["machine"] - ours.cpu["api"]) / 100 / ours.rate
    return (machine_s_per_job - others_s_per_job) / ours.requests_per_job * 1e6


@dataclass(frozen=True)
class Row:
    scenario: str  # its name in scenarios.PAIRS
    target: str
    round_no: int
    target_rate: float
    ours: Run
    floor: Run | None

    @property
    def allowed(self) -> float:
        return allowance_us(self.ours, self.target_rate)


def _run(result: dict[str, Any]) -> Run:
    return Run(
        result["jobs_per_s"],
        result["cpu_percent"],
        result["api_us_per_request"],
        result["extra"]["requests"] / result["jobs"],
    )


def _ours(results: list[dict[str, Any]], round_no: int, rate: float) -> dict[str, Any] | None:
    """The round's run of ours whose rate the pair recorded (rounded as the pairs are): other
    sections (overflow, console) run a scenario of the same name in rounds of their own."""
    suffix = f" [round {round_no}]"
    for result in results:
        if (
            result.get("group") == "ours"
            and result.get("status", "ok") == "ok"
            and result["name"].endswith(suffix)
            and round(result["jobs_per_s"], 1) == rate
            and result.get("api_us_per_request")
        ):
            return result
    return None


def _floor(results: list[dict[str, Any]], ours: dict[str, Any]) -> dict[str, Any] | None:
    """The floor run of the same round: ours's name with the floor's note before its round."""
    head, _, tail = ours["name"].rpartition(" [round ")
    name = f"{head}{FLOOR_NOTE} [round {tail}"
    for result in results:
        if result.get("group") == "floor" and result["name"] == name:
            return result if result.get("api_us_per_request") else None
    return None


def rows(doc: dict[str, Any]) -> list[Row]:
    results, pairs = doc["results"], doc["pairs"]
    out: list[Row] = []
    for scenario, share in SHARE_TARGETS.items():
        for i, pair in enumerate(pairs.get(scenario, {}).get("rounds", [])):
            ours = _ours(results, i + 1, pair["ours"])
            if ours is None or not pair["ceiling"]:  # a failed run on either side
                continue
            floor = _floor(results, ours)
            out.append(
                Row(
                    scenario,
                    f"{scenario} at {share:.0%} of its ceiling",
                    i + 1,
                    share * pair["ceiling"],
                    _run(ours),
                    _run(floor) if floor else None,
                )
            )
    dequeue = [
        r
        for r in results
        if r["name"].startswith(PGQUEUER_ROW) and r.get("status") == "ok" and r["jobs_per_s"]
    ]
    if dequeue:
        target_rate = PGQUEUER_TARGET * dequeue[0]["jobs_per_s"]
        for row in [r for r in out if r.scenario == "pull-batch"]:
            out.append(
                Row(
                    row.scenario,
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
        "| target | round | jobs/s needed | ours jobs/s | API µs/request allowed | ours µs "
        "| bare floor µs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in found:
        floor = f"{row.floor.api_us:.0f}" if row.floor else "-"
        lines.append(
            f"| {row.target} | {row.round_no} | {row.target_rate:,.0f} | {row.ours.rate:,.0f} "
            f"| {row.allowed:.0f} | {row.ours.api_us:.0f} | {floor} |"
        )
    return "\n".join(lines)


def newest(folder: Path) -> tuple[Path, list[Row]] | None:
    """The newest results file (bench/status.py's files excluded) with paired rounds."""
    for path in sorted(folder.glob("20*.json"), reverse=True):
        found = rows(json.loads(path.read_text()))
        if found:
            return path, found
    return None


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", nargs="?", type=Path, help="a results file (default: the newest)")
    args = p.parse_args()
    if args.results:
        path, found = args.results, rows(json.loads(args.results.read_text()))
    else:
        path, found = newest(RESULTS) or (RESULTS, [])
    if not found:
        raise SystemExit("no paired rounds of publish, pull-each or pull-batch found")
    print(f"{path.name}\n")
    print(table(found))


if __name__ == "__main__":
    main()
