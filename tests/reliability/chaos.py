"""``make chaos``: the long reliability run. ``python -m tests.reliability.chaos [--duration S]
[--seed N] [--clients C]``; prints the summary and exits 1 on any violation."""

from __future__ import annotations

import argparse
import random
import sys

from tests.reliability.harness import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos", description=__doc__)
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of load")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1, 10**6)
    print(f"chaos: seed {seed}, {args.duration:.0f} s of load, {args.clients} clients", flush=True)
    summary = run(seed, args.duration, clients=args.clients)
    print(summary.render(), flush=True)
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
