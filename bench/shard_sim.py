"""A model of the broker on several PostgreSQL primaries, driven by measured costs.

Not a measurement: nothing here runs the broker on more than one database. It takes the
database CPU a job costs at each step, as a full `python -m bench` run measured it (the results
JSON: pgbench running the broker's own claim, ack and publish statements on this machine), plus
the archive's cost from the pipeline bench (docs/pipeline.md), and asks what N primaries would
sustain when channels are spread over them by a hash of the channel id and the load over the
channels is skewed (Zipf).

    python -m bench.shard_sim                       # the newest full run, N = 1, 2, 4, 8
    python -m bench.shard_sim --zipf 0 --channels 200 --json

The model:
- A primary is its CPU: `cores` x 1000 ms of database CPU a second, each job costing the sum
  of its steps (its share of the publish with fan-out, the claim, the ack, the archive). The
  pgbench rows it reads ran the database at 186-194% of the machine's 200%, so CPU is what
  bounded them there.
- A channel lives on one primary: slot = hash(channel id) mod `slots`, primary = slot mod N
  (a slot table, so that moving a slot moves its channels and nothing else). A channel's jobs
  never leave its primary, so the hottest primary saturates first and a single channel can
  never go faster than one primary.
- Sustained throughput is the total offered load (all channels growing in the same proportion)
  at which the busiest primary reaches its capacity: capacity / the largest primary's share.
  A fluid simulation with Poisson arrivals per second checks that bound: the highest offered
  rate whose backlog stays bounded over the simulated time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
# The last full run (all scenarios, 3 rounds) on this machine: docs/performance.md.
DEFAULT_RESULTS = RESULTS / "2026-11-26T21-28-19.json"

# The pgbench rows (the database alone, the broker's own statements, 4 clients: the machine's
# two cores saturated) whose PostgreSQL CPU per job gives each step's cost. A scenario's rounds
# ("... [round 2]") count as further rows of it; the median is taken.
CLAIM = "pgbench claim(100), 4 clients"
CLAIM_BATCH_ACK = "pgbench claim(100) + batch ack, 4 clients"
CLAIM_EACH_ACK = "pgbench claim(100) + per-job ack, 4 clients"
PUBLISH = "pgbench publish, fan-out 5, 4 clients"
FAN_OUT = 5

# The archive is measured by the pipeline bench, which writes no results file: its numbers as
# docs/pipeline.md gives them (2026-11-22, `python -m bench.pipeline_bench`, 1,000,000 jobs,
# local[*] on this 2-core machine under a load average of 6 to 8). Plan and delete are
# statements on the primary (one backend each: their seconds are one core's); the export's
# 32.2 s are mostly Spark's, its JDBC read on the primary not measured apart.
ARCHIVE_SOURCE = "docs/pipeline.md, bench.pipeline_bench of 2026-11-22"
ARCHIVED_JOBS = 766_708
ARCHIVE_PLAN_S = 3.9
ARCHIVE_DELETE_S = 6.2
ARCHIVE_EXPORT_S = 32.2


@dataclass(frozen=True, slots=True)
class Costs:
    """Database CPU milliseconds per job for each step, and the cores a primary has."""

    claim: float
    batch_ack: float
    each_ack: float
    publish: float  # per job created: the message, its fan-out, ledger count and NOTIFY
    archive: float
    cores: int
    source: str

    def per_job(self, ack: str = "batch", archive: bool = True) -> float:
        acked = self.batch_ack if ack == "batch" else self.each_ack
        return self.publish + self.claim + acked + (self.archive if archive else 0.0)

    def capacity(self, ack: str = "batch", archive: bool = True) -> float:
        """Jobs a second one primary sustains: its CPU over the cost of one job's life."""
        return self.cores * 1000.0 / self.per_job(ack, archive)


def _rows(results: dict[str, Any], name: str) -> list[float]:
    found = [
        float(r["cpu_ms_per_job"]["pg"])
        for r in results["results"]
        if r.get("status") == "ok"
        and (r["name"] == name or r["name"].startswith(name + " [round "))
        and r.get("cpu_ms_per_job", {}).get("pg")
    ]
    if not found:
        raise ValueError(f"the results hold no row {name!r} with the database's CPU per job")
    return found


def step_cost(results: dict[str, Any], name: str) -> float:
    """The median PostgreSQL CPU ms per job of a scenario's rows."""
    return statistics.median(_rows(results, name))


@dataclass(frozen=True, slots=True)
class Check:
    """A measured pgbench scenario against what the model makes of its own cost."""

    scenario: str
    measured_jobs_per_s: float  # median of its rows
    pg_cpu_percent: float  # median: of the machine's cores x 100
    modelled_jobs_per_s: float  # cores x 1000 / its cost

    @property
    def error(self) -> float:
        return self.modelled_jobs_per_s / self.measured_jobs_per_s - 1


def checks(results: dict[str, Any]) -> list[Check]:
    """How far "a primary is its CPU" is from the rows it is built on: where PostgreSQL did
    not get the whole machine (pgbench's own client takes CPU beside it), it overstates."""
    cores = int(results["machine"]["cpus"])
    out = []
    for name in (CLAIM, CLAIM_BATCH_ACK, CLAIM_EACH_ACK, PUBLISH):
        rows = [
            r
            for r in results["results"]
            if r.get("status") == "ok"
            and (r["name"] == name or r["name"].startswith(name + " [round "))
        ]
        out.append(
            Check(
                scenario=name,
                measured_jobs_per_s=statistics.median(float(r["jobs_per_s"]) for r in rows),
                pg_cpu_percent=statistics.median(float(r["cpu_percent"]["pg"]) for r in rows),
                modelled_jobs_per_s=cores * 1000.0 / step_cost(results, name),
            )
        )
    return out


def archive_cost() -> float:
    """Database ms per archived job: the plan and delete statements' time (one core's)."""
    return (ARCHIVE_PLAN_S + ARCHIVE_DELETE_S) * 1000.0 / ARCHIVED_JOBS


def costs_from(results: dict[str, Any], source: str = "") -> Costs:
    claim = step_cost(results, CLAIM)
    return Costs(
        claim=claim,
        # An ack is measured with the claim it follows: the difference is the ack's.
        batch_ack=step_cost(results, CLAIM_BATCH_ACK) - claim,
        each_ack=step_cost(results, CLAIM_EACH_ACK) - claim,
        publish=step_cost(results, PUBLISH),
        archive=archive_cost(),
        cores=int(results["machine"]["cpus"]),
        source=source or str(results.get("started", "")),
    )


def zipf_weights(channels: int, s: float) -> list[float]:
    """Each channel's share of the load: rank k gets k^-s, normalised (s = 0: all equal)."""
    raw = [k**-s for k in range(1, channels + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def slot_of(channel_id: str, slots: int) -> int:
    """A stable hash of the channel id (not Python's hash(), which is salted per process)."""
    digest = hashlib.blake2b(channel_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % slots


def placement(channel_ids: Sequence[str], primaries: int, slots: int) -> list[int]:
    """The primary each channel lives on: its slot, the slots dealt round robin."""
    return [slot_of(c, slots) % primaries for c in channel_ids]


def shares(weights: Sequence[float], placed: Sequence[int], primaries: int) -> list[float]:
    """Each primary's share of the total load."""
    out = [0.0] * primaries
    for weight, primary in zip(weights, placed, strict=True):
        out[primary] += weight
    return out


def sustained(capacity: float, primary_shares: Sequence[float]) -> float:
    """The total jobs/s at which the busiest primary is at its capacity."""
    return capacity / max(primary_shares)


def utilisation(primary_shares: Sequence[float]) -> list[float]:
    """Each primary's busy fraction at the sustained rate (the busiest at 1)."""
    top = max(primary_shares)
    return [s / top for s in primary_shares]


def _poisson(rng: random.Random, mean: float) -> float:
    # Normal approximation: the means here are thousands of jobs a second.
    if mean <= 0:
        return 0.0
    return max(0.0, rng.gauss(mean, math.sqrt(mean)))


def backlog_bounded(
    capacity: float,
    primary_shares: Sequence[float],
    offered: float,
    seconds: int,
    rng: random.Random,
) -> bool:
    """Whether every primary's backlog stays under a second of its work over `seconds`, with
    Poisson arrivals each second at `offered` jobs/s in total."""
    backlog = [0.0] * len(primary_shares)
    for _ in range(seconds):
        for i, share in enumerate(primary_shares):
            backlog[i] = max(0.0, backlog[i] + _poisson(rng, offered * share) - capacity)
    return all(b < capacity for b in backlog)


def simulated_sustained(
    capacity: float,
    primary_shares: Sequence[float],
    seconds: int = 600,
    seed: int = 1,
    precision: float = 0.002,
) -> float:
    """The highest offered jobs/s (found by bisection) whose backlog stays bounded."""
    low, high = 0.0, capacity * len(primary_shares)
    while high - low > precision * high:
        mid = (low + high) / 2
        if backlog_bounded(capacity, primary_shares, mid, seconds, random.Random(seed)):
            low = mid
        else:
            high = mid
    return low


@dataclass(frozen=True, slots=True)
class Outcome:
    primaries: int
    sustained_jobs_per_s: float  # the median trial's
    worst_jobs_per_s: float  # the worst trial's
    simulated_jobs_per_s: float  # the fluid simulation's, median trial
    scaling: float  # sustained over one primary's capacity
    efficiency: float  # sustained over N capacities
    utilisation: list[float]  # per primary at the sustained rate, median trial, busiest first
    top_channel_share: float


def run_model(
    costs: Costs,
    *,
    primaries: Sequence[int] = (1, 2, 4, 8),
    channels: int = 1000,
    zipf: float = 1.1,
    slots: int = 4096,
    trials: int = 21,
    ack: str = "batch",
    archive: bool = True,
    sim_seconds: int = 600,
) -> list[Outcome]:
    """Each N over `trials` sets of channel ids (the hash placement differs between them)."""
    capacity = costs.capacity(ack, archive)
    weights = zipf_weights(channels, zipf)
    outcomes = []
    for n in primaries:
        tried = []
        for trial in range(trials):
            ids = [f"t{trial}-channel-{k:06d}" for k in range(channels)]
            spread = shares(weights, placement(ids, n, slots), n)
            tried.append((sustained(capacity, spread), spread))
        tried.sort(key=lambda t: t[0])
        rate, spread = tried[len(tried) // 2]
        outcomes.append(
            Outcome(
                primaries=n,
                sustained_jobs_per_s=rate,
                worst_jobs_per_s=tried[0][0],
                simulated_jobs_per_s=simulated_sustained(capacity, spread, sim_seconds),
                scaling=rate / capacity,
                efficiency=rate / (capacity * n),
                utilisation=sorted(utilisation(spread), reverse=True),
                top_channel_share=weights[0],
            )
        )
    return outcomes


def _table(
    costs: Costs, found: Sequence[Check], outcomes: Sequence[Outcome], ack: str, archive: bool
) -> str:
    lines = [
        f"costs from {costs.source} ({costs.cores} cores); archive from {ARCHIVE_SOURCE}",
        "database CPU ms per job: "
        f"publish+fan-out {costs.publish:.4f}, claim {costs.claim:.4f}, "
        f"batch ack {costs.batch_ack:.4f}, per-job ack {costs.each_ack:.4f}, "
        f"archive {costs.archive:.4f}",
        f"one primary: {costs.capacity(ack, archive):,.0f} jobs/s "
        f"({costs.per_job(ack, archive):.4f} ms a job, {ack} ack"
        f"{', archive' if archive else ''})",
        "",
        "the model against its own rows: scenario, measured jobs/s, PostgreSQL CPU, modelled",
        *(
            f"  {c.scenario:<42} {c.measured_jobs_per_s:>8,.0f} {c.pg_cpu_percent:>5.0f}%"
            f" {c.modelled_jobs_per_s:>8,.0f} ({c.error:+.0%})"
            for c in found
        ),
        "",
        "N  sustained jobs/s  worst  simulated  x one  efficiency  utilisation (busiest first)",
    ]
    for o in outcomes:
        util = " ".join(f"{u:.0%}" for u in o.utilisation)
        lines.append(
            f"{o.primaries:<2} {o.sustained_jobs_per_s:>16,.0f} {o.worst_jobs_per_s:>6,.0f}"
            f" {o.simulated_jobs_per_s:>10,.0f} {o.scaling:>6.2f} {o.efficiency:>10.0%}  {util}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shard_sim", description=__doc__)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--primaries", default="1,2,4,8", help="comma-separated N")
    parser.add_argument("--channels", type=int, default=1000)
    parser.add_argument("--zipf", type=float, default=1.1, help="skew exponent (0: uniform)")
    parser.add_argument("--slots", type=int, default=4096)
    parser.add_argument("--trials", type=int, default=21, help="sets of channel ids")
    parser.add_argument("--ack", choices=("batch", "each"), default="batch")
    parser.add_argument("--no-archive", action="store_true", help="leave the archive out")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        raise SystemExit(
            f"no results file {args.results}: run `python -m bench` (bench/results/ is this"
            " machine's, not in the repository) or name one with --results"
        )
    results = json.loads(args.results.read_text(encoding="utf-8"))
    costs = costs_from(results, f"{args.results.name} (run started {results.get('started')})")
    archive = not args.no_archive
    found = checks(results)
    outcomes = run_model(
        costs,
        primaries=[int(n) for n in args.primaries.split(",")],
        channels=args.channels,
        zipf=args.zipf,
        slots=args.slots,
        trials=args.trials,
        ack=args.ack,
        archive=archive,
    )
    if args.json:
        document = {
            "costs": asdict(costs),
            "capacity_one_primary": costs.capacity(args.ack, archive),
            "checks": [{**asdict(c), "error": c.error} for c in found],
            "settings": {k: str(v) for k, v in vars(args).items()},
            "outcomes": [asdict(o) for o in outcomes],
        }
        print(json.dumps(document, indent=2))
    else:
        print(_table(costs, found, outcomes, args.ack, archive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
