"""`python -m tests.chaos --seconds 1800 --seed 7`: one chaos run; exit 1 on a violation."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tests.chaos.run import Settings, run, summary_line, write


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seconds", type=float, default=120.0, help="time under faults")
    parser.add_argument("--chaos-minutes", type=float, help="the same, in minutes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=10.0, help="messages/s per publisher")
    parser.add_argument("--out", type=Path, default=Path("chaos-summary.json"))
    args = parser.parse_args()
    seconds = args.chaos_minutes * 60 if args.chaos_minutes is not None else args.seconds
    settings = Settings(
        seconds=seconds,
        seed=args.seed,
        publishers=args.publishers,
        per_second=args.rate,
        out=args.out,
    )
    summary = asyncio.run(run(settings))
    write(summary, args.out)
    print(summary_line(summary))
    for violation in summary["violations"][:20]:
        print(json.dumps(violation, default=str), file=sys.stderr)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
