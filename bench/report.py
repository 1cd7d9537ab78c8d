"""The printed table, the targets of issue 7, and bench/results/<date>.json."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.env import Measured
from bench.retention import retention_sections, retention_targets
from bench.scenarios import PAIRS, Runner, median_ratio

LATENCY_KEYS = (
    "wakeup",
    "pull",
    "publish",
    "fetch",
    "list",
    "script",
    "claim_to_delivered",
    "enqueue",
    "past_ack_wait",
)
CPU_ORDER = ("api", "pg", "gen", "pgbench", "dispatcher", "receiver", "bridge", "nats", "sweeper")


def primary_latency(m: Measured) -> tuple[str, dict[str, Any]]:
    for key in LATENCY_KEYS:
        found = m.latency_ms.get(key)
        if found and found.get("n"):
            return key, found
    return "", {}


def cpu_text(cpu: dict[str, float]) -> str:
    parts = [f"{k} {cpu[k]:.0f}" for k in CPU_ORDER if k in cpu and cpu[k] >= 0.5]
    if "machine" in cpu:
        parts.append(f"(machine {cpu['machine']:.0f})")
    return " ".join(parts)


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def row(m: Measured, ratio: str = "") -> list[str]:
    if m.status != "ok":
        note = m.notes[0][:80] if m.notes else ""
        return [m.name, m.status, "-", "-", "-", "-", note]
    key, lat = primary_latency(m)
    p50 = fmt(lat.get("p50"), 2) if lat else "-"
    p99 = fmt(lat.get("p99"), 2) if lat else "-"
    if key and key not in ("pull", "publish", "fetch", "script", "wakeup"):
        p50 = f"{p50} ({key})"
    rate = fmt(m.rate, 0)
    if "statements_per_s" in m.extra:
        rate = f"{m.extra['statements_per_s']:.1f} stmt/s"
    if any("lower bound" in n for n in m.notes):
        rate = f">={rate}"
    per_request = m.api_us_per_request
    return [m.name, rate, p50, p99, cpu_text(m.cpu), fmt(per_request, 0), ratio]


def median_row(m: Measured, note: str) -> list[str]:
    """The row of a paired scenario's median run, named without its round."""
    cells = row(m, note)
    cells[0] = m.name.split(" [round")[0]
    return cells


def markdown(rows: list[list[str]]) -> str:
    header = [
        "scenario",
        "jobs/s",
        "p50 ms",
        "p99 ms",
        "CPU % of a core",
        "API CPU µs/request",
        "ratio / note",
    ]
    table = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in table)


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    verdict: str  # PASS | FAIL | n/a

    def as_dict(self) -> dict[str, str]:
        return {
            "target": self.name,
            "goal": self.goal,
            "measured": self.measured,
            "verdict": self.verdict,
        }


def _find(runner: Runner, prefix: str, group: str | None = None) -> list[Measured]:
    return [
        m
        for m in runner.results
        if m.name.startswith(prefix) and (group is None or m.group == group)
    ]


def median_run(runs: list[Measured]) -> Measured | None:
    ok = [m for m in runs if m.status == "ok"]
    if not ok:
        return None
    ordered = sorted(ok, key=lambda m: m.rate)
    return ordered[(len(ordered) - 1) // 2]


def check(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def targets(runner: Runner) -> list[Target]:
    s = runner.s
    out: list[Target] = []
    # The paired rounds' runs: the overflow, console and consume sections run scenarios of
    # the same name beside variants that are slower on purpose (a priority group, open pages).
    pull_batch = median_run(runner.paired_runs.get("pull-batch", []))
    goproto = median_run(_find(runner, "Go protocol"))
    pgq = median_run(_find(runner, "pgqueuer dequeue"))
    pgq_published = median_run(_find(runner, "pgqueuer as its benchmark runs"))
    for ours, goal, minimum in (
        ("pull-batch", "HTTP pull(100) + batch ack >= 30% of the pgbench claim + batch ack", 0.30),
        ("pull-each", "HTTP pull + one ack POST per job >= 10% of claim + per-job ack", 0.10),
        ("publish", "HTTP publish, fan-out 5 >= 15% of the pgbench publish ceiling", 0.15),
    ):
        ratio = median_ratio(runner.pairs.get(ours, []))
        n = len(runner.pairs.get(ours, []))
        out.append(
            Target(
                goal.split(" >=")[0],
                ">= " + f"{minimum:.0%}",
                "-" if ratio is None else f"{ratio:.1%} (median of {n} pairs)",
                check(None if ratio is None else ratio >= minimum),
            )
        )
    if pull_batch and goproto and goproto.rate:
        x = pull_batch.rate / goproto.rate
        out.append(
            Target("pull + batch ack vs the Go protocol", ">= 10x", f"{x:.1f}x", check(x >= 10))
        )
    for key, mode in (("bridge", "client"), ("bridge-hybrid", "hybrid")):
        nats_pairs = runner.pairs.get(key, [])
        goal = f"NATS bridge ({mode}) vs real JetStream"
        if nats_pairs:
            x = median_ratio(nats_pairs) or 0.0
            measured = f"{x:.1%} (median of {len(nats_pairs)} pairs)"
            out.append(Target(goal, ">= 50%", measured, check(x >= 0.5)))
        else:
            out.append(Target(goal, ">= 50%", "not run or not available", "n/a"))
    if pull_batch and pgq_published and pgq_published.rate:
        x = pull_batch.rate / pgq_published.rate
        out.append(
            Target(
                "pull + batch ack vs pgqueuer as its benchmark runs",
                ">= 3x",
                f"{x:.1f}x",
                check(x >= 3),
            )
        )
    if pull_batch and pgq and pgq.rate:
        x = pull_batch.rate / pgq.rate
        out.append(
            Target(
                f"pull + batch ack vs pgqueuer dequeue at batch {s.batch}",
                ">= 1.5x (issue 40)",
                f"{x:.2f}x",
                check(x >= 1.5),
            )
        )
    if pull_batch:
        lat = pull_batch.latency_ms.get("pull", {})
        if lat.get("n"):
            out.append(
                Target(
                    f"claim (pull) latency at {s.pollers} pollers",
                    "p50 < 10 ms, p99 < 25 ms",
                    f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms",
                    check(lat["p50"] < 10 and lat["p99"] < 25),
                )
            )
    latency = claim_latency_target(runner.pairs.get("pull-batch", []))
    if latency:
        out.append(latency)
    overflow_pairs = runner.pairs.get("overflow", [])
    if overflow_pairs:
        x = median_ratio(overflow_pairs) or 0.0
        out.append(
            Target(
                "pull + batch ack, overflow terms vs none",
                "(no target: the cost)",
                f"{x:.1%} (median of {len(overflow_pairs)} pairs)",
                "n/a",
            )
        )
    console_pairs = runner.pairs.get("console", [])
    if console_pairs:
        out.append(console_target(console_pairs))
    ours_back = _find(runner, "Redelivery past", "ours")
    theirs_back = _find(runner, "Redelivery past", "baseline")
    if ours_back and ours_back[0].status == "ok":
        lat = ours_back[0].latency_ms["past_ack_wait"]
        ref = theirs_back[0].latency_ms.get("past_ack_wait", {}) if theirs_back else {}
        versus = f" (JetStream: p50 {ref['p50']:.0f}, max {ref['max']:.0f})" if ref.get("n") else ""
        out.append(
            Target(
                "bridge (hybrid): redelivery past the ack wait",
                "<= 500 ms",
                f"p50 {lat['p50']:.0f} ms, max {lat['max']:.0f} ms{versus}",
                check(lat["max"] <= 500),
            )
        )
    consume_pairs = runner.pairs.get("consume", [])
    if consume_pairs:
        x = median_ratio(consume_pairs) or 0.0
        out.append(
            Target(
                "client consume() + ack() per job vs raw pull + batch ack",
                ">= 60%",
                f"{x:.1%} (median of {len(consume_pairs)} pairs)",
                check(x >= 0.6),
            )
        )
    for kind in ("long-poll wake-up", "streaming pull wake-up"):
        wake = _find(runner, kind)
        if wake and wake[0].latency_ms.get("wakeup", {}).get("n"):
            lat = wake[0].latency_ms["wakeup"]
            out.append(
                Target(
                    kind,
                    "p50 < 10 ms, p99 < 50 ms",
                    f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms",
                    check(lat["p50"] < 10 and lat["p99"] < 50),
                )
            )
    pushed = _find(runner, "push delivery to a local receiver")
    if pushed and "ratio_to_best_client" in pushed[0].extra:
        x = pushed[0].extra["ratio_to_best_client"]
        out.append(
            Target(
                "push deliveries vs the best bare client loop",
                ">= 50%",
                f"{x:.1%} of {pushed[0].extra['best_client']}'s fastest loop"
                f" (median of {len(pushed[0].extra.get('round_ratios', [x]))} runs; pairs"
                f" {', '.join(f'{r:.1%}' for r in pushed[0].extra.get('round_ratios', []))})",
                check(x >= 0.5),
            )
        )
    idle = _find(runner, f"{s.idle_pollers} idle long-pollers")
    if idle and idle[0].status == "ok":
        due = idle[0].extra["statements_per_s_due_to_pollers"]
        out.append(
            Target(
                f"{s.idle_pollers} idle long-pollers",
                "<= 10 statements/s",
                f"{due:.1f}/s beyond the idle baseline",
                check(due <= 10 if s.idle_pollers >= 100 else None),
            )
        )
    if len(idle) > 1 and idle[1].status == "ok" and idle[0].status == "ok":
        plain, waiting = (m.extra["statements_per_s"] for m in idle[:2])
        out.append(
            Target(
                idle[1].name.split(" (")[0],
                "no more statements/s than without them (+1/s)",
                f"{waiting:.1f}/s, {plain:.1f}/s without",
                check(waiting <= plain + 1),
            )
        )
    small = _find(runner, "claim latency, " + f"{s.small_backlog:,}")
    large = _find(runner, "claim latency, " + f"{s.large_backlog:,}")
    if small and large:
        a = small[0].latency_ms.get("pull", {})
        b = large[0].latency_ms.get("pull", {})
        if a.get("n") and b.get("n"):
            x = b["p50"] / a["p50"]
            out.append(
                Target(
                    f"claim p50 at {s.large_backlog:,} vs {s.small_backlog:,} queued",
                    "<= 1.5x (issue: 10M vs 10k)",
                    f"{x:.2f}x ({b['p50']:.1f} vs {a['p50']:.1f} ms)",
                    check(x <= 1.5),
                )
            )
    soak = _find(runner, "soak")
    if soak and "loss_first_to_last_minute" in soak[0].extra:
        loss = soak[0].extra["loss_first_to_last_minute"]
        out.append(
            Target(
                "soak: first to last minute",
                "<= 10% loss",
                f"{loss:.1%}",
                check(loss is not None and loss <= 0.10),
            )
        )
    else:
        out.append(
            Target("soak: first to last minute", "<= 10% loss", "not run (--soak 600)", "n/a")
        )
    out += [Target(*t) for t in retention_targets(runner.results)]
    return out


def console_target(pairs: list[dict[str, float]]) -> Target:
    """Issue 38: with the console's pages open, pull + batch ack falls by no more than the
    round-to-round spread of the runs without them ((fastest - slowest) / their median)."""
    name = "pull + batch ack with 20 console pages open vs none"
    goal = "fall <= round-to-round spread"
    fall = 1.0 - (median_ratio(pairs) or 0.0)
    plain = [p["ceiling"] for p in pairs]
    statements = statistics.median(p.get("console_statements_per_s", 0.0) for p in pairs)
    measured = (
        f"fall {fall:.1%} (median of {len(pairs)} pairs); console {statements:.1f} statements/s"
    )
    if len(plain) < 2:
        return Target(name, goal, measured + "; one round: no spread", "n/a")
    spread = (max(plain) - min(plain)) / statistics.median(plain)
    return Target(name, goal, f"{measured}; spread {spread:.1%}", check(fall <= spread))


FLOOR_LABELS = {
    "publish": "HTTP publish",
    "pull-each": "HTTP pull({batch}) + one ack",
    "pull-batch": "HTTP pull({batch}) + batch ack",
}


def floor_rows(runner: Runner) -> list[list[str]]:
    rows: list[list[str]] = []
    for ours, label in FLOOR_LABELS.items():
        pairs = runner.pairs.get(f"floor {ours}", [])
        if not pairs:
            continue
        label = label.format(batch=runner.s.batch)
        floor = median_run(_find(runner, label, "floor"))
        mine = median_run(runner.paired_runs.get(ours, []))
        ratios = ", ".join(f"{p['ratio']:.2f}x" for p in pairs)
        if floor:
            rows.append(median_row(floor, f"floor (median run of {len(pairs)})"))
        if mine:
            ratio = median_ratio(pairs) or 0.0
            rows.append(median_row(mine, f"{ratio:.2f}x the floor's CPU/request ({ratios})"))
    return rows


def claim_latency_target(pairs: list[dict[str, float]]) -> Target | None:
    """Issue 40: claim latency p50 and p99 at or under pgbench's claim + batch ack in the same
    run; each side's median over the paired rounds, each round's pgbench run beside ours."""
    rounds = [p for p in pairs if "ours_p50" in p]
    if not rounds:
        return None
    ours_p50, ours_p99, pg_p50, pg_p99 = (
        statistics.median(p[key] for p in rounds)
        for key in ("ours_p50", "ours_p99", "ceiling_p50", "ceiling_p99")
    )
    return Target(
        "claim latency vs pgbench's claim + batch ack beside it",
        "p50 and p99 at or under pgbench's (issue 40)",
        f"p50 {ours_p50:.1f} against {pg_p50:.1f} ms, p99 {ours_p99:.1f} against "
        f"{pg_p99:.1f} ms (medians of {len(rounds)} pairs)",
        check(ours_p50 <= pg_p50 and ours_p99 <= pg_p99),
    )


def floor_targets(runner: Runner) -> list[Target]:
    """Issue 40: API CPU per request for publish and for a single ack at most 2x the bare
    floor route's in the same run (pull + one ack per job: all but one in 101 requests are
    single acks)."""
    out = []
    for ours, what in (("publish", "publish"), ("pull-each", "single ack (pull + one ack)")):
        pairs = runner.pairs.get(f"floor {ours}", [])
        ratio = median_ratio(pairs)
        out.append(
            Target(
                f"API CPU per request, {what}, vs the bare floor",
                "<= 2.0x",
                "-" if ratio is None else f"{ratio:.2f}x (median of {len(pairs)} pairs)",
                check(None if ratio is None else ratio <= 2.0),
            )
        )
    return out


def tables(runner: Runner) -> str:
    sections: list[str] = []
    matrix = [m for m in runner.results if m.group == "ceiling" and "[round" not in m.name]
    if matrix:
        sections.append(
            "Database ceiling: pgbench with our statements (-M prepared)\n\n"
            + markdown([row(m) for m in matrix])
        )
    paired: list[list[str]] = []
    for ours, script in PAIRS.items():
        pairs = runner.pairs.get(ours, [])
        if not pairs:
            continue
        mine = median_run(runner.paired_runs.get(ours, []))
        ceilings = [
            m
            for m in runner.results
            if m.group == "ceiling" and m.extra.get("script") == script and "[round" in m.name
        ]
        ceiling = median_run(ceilings)
        ratio = median_ratio(pairs)
        ratios = ", ".join(f"{p['ratio']:.1%}" for p in pairs)
        if ceiling:
            paired.append(median_row(ceiling, f"ceiling (median run of {len(pairs)})"))
        if mine:
            paired.append(
                median_row(mine, f"{ratio:.1%} of ceiling (rounds: {ratios})" if ratio else "")
            )
    jetstream = median_run(_find(runner, "NATS JetStream"))
    nats_paired = False
    for key, mode in (("bridge", "client"), ("bridge-hybrid", "hybrid")):
        nats_pairs = runner.pairs.get(key, [])
        bridge = median_run(_find(runner, f"NATS bridge ({mode})"))
        if not (nats_pairs and jetstream and bridge):
            continue
        if not nats_paired:
            paired.append(median_row(jetstream, f"baseline (median run of {len(nats_pairs)})"))
            nats_paired = True
        ratios = ", ".join(f"{p['ratio']:.1%}" for p in nats_pairs)
        ratio = median_ratio(nats_pairs) or 0.0
        paired.append(median_row(bridge, f"{ratio:.1%} of JetStream (rounds: {ratios})"))
    if paired:
        sections.append(
            "Ours against the ceiling (and the bridge against JetStream), measured back to "
            "back (median run of the rounds)\n\n" + markdown(paired)
        )
    floor = floor_rows(runner)
    if floor:
        sections.append(
            "API CPU per request: ours against the bare floor route (bench/floor.py: the same "
            "server stack, pool and statement shape, no auth, no validation), back to back "
            "(median run of the rounds)\n\n" + markdown(floor)
        )
    others = [
        m
        for m in runner.results
        if m.group in ("ours", "baseline")
        and "[round" not in m.name
        and not (nats_paired and m.name.startswith("NATS "))
    ]
    if others:
        sections.append("Other scenarios and peers\n\n" + markdown([row(m) for m in others]))
    sections += retention_sections(runner.results)
    goals = targets(runner) + floor_targets(runner)
    sections.append(
        "Targets (issue 7, unless a goal names another)\n\n"
        + "\n".join(
            "| " + " | ".join(cells) + " |"
            for cells in [
                ["target", "goal", "measured", "verdict"],
                ["---"] * 4,
                *([t.name, t.goal, t.measured, t.verdict] for t in goals),
            ]
        )
    )
    return "\n\n".join(sections)


def write_json(path: Path, runner: Runner, meta: dict[str, Any]) -> None:
    data = {
        **meta,
        "results": [m.as_dict() for m in runner.results],
        "pairs": {
            k: {"rounds": v, "median_ratio": median_ratio(v)} for k, v in runner.pairs.items()
        },
        "targets": [t.as_dict() for t in targets(runner)],
        "best_ceiling_clients": runner.best_clients,
        "plans": runner.plans,
        "profiles": runner.profiles,
        "log": runner.log,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
