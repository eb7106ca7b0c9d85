"""`python -m tests.simulation --seed N`: replay one seed and tell its story;
`--seeds A:B` runs a range and prints the silent ones (what `make soak` runs)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.simulation.explore import explore, replay

if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order: a seed replays alike
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.simulation", *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m tests.simulation")
    parser.add_argument("--seed", type=int, help="replay this seed and print what happened")
    parser.add_argument("--seeds", help="A:B, the seeds from A to B-1")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.seed is not None:
        sys.exit(0 if replay(args.seed) else 1)
    first, _, last = (args.seeds or "0:100").partition(":")
    started = time.monotonic()
    failures, beyond = explore(range(int(first), int(last)), workers=args.workers)
    seconds = time.monotonic() - started
    print(
        f"{int(last) - int(first)} seeds in {seconds:.0f} s: {len(failures)} failed "
        f"(silent or crashed); {beyond} sets not exact beyond the floor their run told"
    )
    sys.exit(1 if failures else 0)
