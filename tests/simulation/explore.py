"""Seeds by the thousand: each one a world played whole and judged; a silent one named with
the command that replays it."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from tests.simulation.oracle import Verdict, judge
from tests.simulation.world import Scenario, World

REPLAY = "PYTHONHASHSEED=0 .venv/bin/python -m tests.simulation --seed {seed}"


@dataclass
class Outcome:
    seed: int
    silent: list[str]  # a set wrong while its run called it exact, each as a line
    crashed: str = ""  # the engine raised where it should have reported
    beyond_floor: int = 0  # sets called not exact that differ by more than their floor

    @property
    def failed(self) -> bool:
        return bool(self.silent or self.crashed)

    def __str__(self) -> str:
        lines = [f"seed {self.seed}: " + (self.crashed or "silent"), *self.silent]
        return "\n  ".join([*lines, "replay: " + REPLAY.format(seed=self.seed)])


def play(
    seed: int, backend: str = "model", *, settle_at_end: bool = True
) -> tuple[Outcome, list[Verdict]]:
    """One seed's world, played and judged after every run that was not killed;
    `settle_at_end`: False leaves out the run's end (sync/settle.py), as the engine was."""
    scenario = Scenario.of(seed)
    world = World(scenario, backend, settle_at_end=settle_at_end)
    verdicts: list[Verdict] = []
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)  # a seed's faults warn by the hundred
    try:
        for run in world.play():
            if not run.killed:
                verdicts += judge(run, world.service.journal, world.backend)
    except Exception:
        return Outcome(seed, [], traceback.format_exc(limit=-6)), verdicts
    finally:
        world.close()
        logging.disable(before)  # the process's other work (a test's caplog) warns as before
    beyond = sum(v.beyond_floor for v in verdicts)
    return Outcome(seed, [str(v) for v in verdicts if v.silent], beyond_floor=beyond), verdicts


def _outcome(seed: int) -> Outcome:
    return play(seed)[0]


def explore(seeds: Iterable[int], workers: int = 1) -> tuple[list[Outcome], int]:
    """Every seed played; the failed ones, printed as they come, and how many sets ended
    beyond the floor their run told (not a failure: the figure is a floor)."""
    failures, beyond = [], 0
    if workers <= 1:
        outcomes = map(_outcome, seeds)
    else:
        pool = ProcessPoolExecutor(workers)
        outcomes = pool.map(_outcome, seeds, chunksize=4)
    for done, outcome in enumerate(outcomes, 1):
        beyond += outcome.beyond_floor
        if outcome.failed:
            print(outcome, flush=True)
            failures.append(outcome)
        if done % 100 == 0:
            print(f"{done} seeds played, {len(failures)} failed", file=sys.stderr, flush=True)
    return failures, beyond


def replay(seed: int) -> bool:
    """One seed, with its scenario and every set's verdict; True when nothing was silent."""
    print(Scenario.of(seed))
    outcome, verdicts = play(seed)
    for verdict in verdicts:
        said = "SILENT " if verdict.silent else "beyond " if verdict.beyond_floor else "ok     "
        print(said + str(verdict))
    if outcome.crashed:
        print(outcome.crashed)
    return not outcome.failed
