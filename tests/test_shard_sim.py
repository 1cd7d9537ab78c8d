"""bench/shard_sim.py's arithmetic (docs/operations/scaling.md): step costs taken from a
results file's rows, one primary's capacity, the hash placement, the bottleneck bound and the
fluid simulation that checks it."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from bench import shard_sim
from bench.shard_sim import (
    Costs,
    backlog_bounded,
    checks,
    costs_from,
    placement,
    run_model,
    shares,
    simulated_sustained,
    slot_of,
    sustained,
    utilisation,
    zipf_weights,
)


def _row(name: str, pg: float, status: str = "ok") -> dict[str, Any]:
    # A row as the bench writes it: PostgreSQL at 150% of 2 cores for this rate.
    return {
        "name": name,
        "status": status,
        "jobs_per_s": 1500 / pg,
        "cpu_percent": {"pg": 150.0, "machine": 190.0},
        "cpu_ms_per_job": {"pg": pg, "api": 0.5},
    }


def _results() -> dict[str, Any]:
    return {
        "started": "2026-01-01T00:00:00+0000",
        "machine": {"cpus": 2},
        "results": [
            _row("pgbench claim(100), 1 client", 9.0),  # another client count: not read
            _row("pgbench claim(100), 4 clients", 0.02),
            _row("pgbench claim(100) + batch ack, 4 clients", 0.05),
            _row("pgbench claim(100) + batch ack, 4 clients [round 1]", 0.03),
            _row("pgbench claim(100) + batch ack, 4 clients [round 2]", 0.04),
            _row("pgbench claim(100) + batch ack, 4 clients [round 3]", 7.0, status="failed"),
            _row("pgbench claim(100) + per-job ack, 4 clients", 0.12),
            _row("pgbench publish, fan-out 5, 4 clients", 0.06),
            _row("pgbench publish, fan-out 5, 4 clients [round 1]", 0.04),
        ],
    }


def test_step_costs_are_medians_of_a_scenarios_rounds_and_an_ack_is_less_its_claim() -> None:
    costs = costs_from(_results())
    assert costs.claim == 0.02
    assert math.isclose(costs.batch_ack, 0.04 - 0.02)  # median of 0.05, 0.03, 0.04
    assert math.isclose(costs.each_ack, 0.12 - 0.02)
    assert math.isclose(costs.publish, 0.05)  # median of two: their mean
    assert math.isclose(costs.archive, (3.9 + 6.2) * 1000 / 766_708)
    assert costs.cores == 2
    assert costs.source == "2026-01-01T00:00:00+0000"


def test_the_model_is_checked_against_its_own_rows() -> None:
    found = {c.scenario: c for c in checks(_results())}
    claim = found["pgbench claim(100), 4 clients"]
    assert claim.measured_jobs_per_s == pytest.approx(1500 / 0.02)
    assert claim.pg_cpu_percent == 150
    # The model gives PostgreSQL both cores where it had one and a half: a third too high.
    assert claim.modelled_jobs_per_s == pytest.approx(2000 / 0.02)
    assert claim.error == pytest.approx(2000 / 1500 - 1)


def test_a_missing_scenario_is_named() -> None:
    results = _results()
    results["results"] = [r for r in results["results"] if "publish" not in r["name"]]
    with pytest.raises(ValueError, match="pgbench publish, fan-out 5, 4 clients"):
        costs_from(results)


def test_one_primary_sustains_its_cores_over_a_jobs_cost() -> None:
    costs = Costs(
        claim=0.02, batch_ack=0.01, each_ack=0.1, publish=0.05, archive=0.02, cores=2, source=""
    )
    assert math.isclose(costs.per_job(), 0.1)
    assert math.isclose(costs.capacity(), 20_000)  # 2,000 CPU ms a second / 0.1 ms
    assert math.isclose(costs.capacity(ack="each", archive=False), 2000 / 0.17)


def test_zipf_weights_are_shares_falling_by_rank() -> None:
    flat = zipf_weights(4, 0)
    assert flat == [0.25] * 4
    skewed = zipf_weights(3, 1)
    assert math.isclose(sum(skewed), 1)
    assert math.isclose(skewed[0] / skewed[1], 2) and math.isclose(skewed[0] / skewed[2], 3)


def test_placement_is_a_stable_hash_of_the_channel_id_over_the_slots() -> None:
    ids = [f"channel-{k}" for k in range(2000)]
    slots = [slot_of(c, 64) for c in ids]
    assert slots == [slot_of(c, 64) for c in ids]  # not Python's per-process hash()
    assert set(slots) == set(range(64))
    placed = placement(ids, 4, 64)
    assert placed == [s % 4 for s in slots]
    counts = [placed.count(p) for p in range(4)]
    assert all(400 < c < 600 for c in counts), counts


def test_the_busiest_primary_bounds_the_total() -> None:
    spread = shares([0.5, 0.2, 0.2, 0.1], [0, 1, 1, 0], 2)
    assert [round(s, 9) for s in spread] == [0.6, 0.4]
    # The first primary takes 60% of all jobs: it is full at 1,000/0.6 jobs/s in total.
    assert math.isclose(sustained(1000, spread), 1000 / 0.6)
    assert [round(u, 9) for u in utilisation(spread)] == [1, round(0.4 / 0.6, 9)]
    # One channel never runs faster than one primary, however many there are.
    assert math.isclose(sustained(1000, shares([0.5, 0.5], [0, 0], 8)), 1000)


def test_the_fluid_simulation_finds_the_bound() -> None:
    spread = [0.6, 0.4]
    bound = sustained(1000, spread)
    assert backlog_bounded(1000, spread, 0.95 * bound, 300, random.Random(3))
    assert not backlog_bounded(1000, spread, 1.05 * bound, 300, random.Random(3))
    assert math.isclose(simulated_sustained(1000, spread, 600), bound, rel_tol=0.03)


def test_n_primaries_with_equal_channels_scale_close_to_n() -> None:
    costs = Costs(0.02, 0.01, 0.1, 0.05, 0.02, 2, "")
    flat = run_model(costs, primaries=(1, 4), channels=4000, zipf=0, trials=3)
    assert flat[0].sustained_jobs_per_s == pytest.approx(costs.capacity())
    assert flat[0].utilisation == [1.0]
    assert 3.6 < flat[1].scaling <= 4
    assert flat[1].utilisation[0] == 1.0 and len(flat[1].utilisation) == 4
    # Skewed, the hottest channel alone takes its primary's share: scaling is capped by it.
    skewed = run_model(costs, primaries=(8,), channels=1000, zipf=1.1, trials=3)
    assert skewed[0].scaling <= 1 / skewed[0].top_channel_share + 1e-9


def test_the_command_reads_a_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # bench/results/ is not in the repository: a clean clone has no run to read.
    results = tmp_path / "run.json"
    results.write_text(json.dumps(_results()), encoding="utf-8")
    argv = ["--results", str(results), "--json", "--trials", "3", "--primaries", "1,2"]
    assert shard_sim.main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert [o["primaries"] for o in document["outcomes"]] == [1, 2]
    assert document["costs"]["cores"] == 2
    assert document["capacity_one_primary"] == pytest.approx(
        document["outcomes"][0]["sustained_jobs_per_s"]
    )


def test_without_a_results_file_the_command_says_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="python -m bench"):
        shard_sim.main(["--results", str(tmp_path / "none.json")])
