"""Case 2: `clinical-sync sync` killed with SIGKILL in every phase of a run (reading a set,
reconciling it, writing a lake file, loading a table, publishing), then resumed.

The run says where it is (`CLINICAL_PHASE_FILE`, sync/phase.py): a kill is aimed at the
k-th phase of a kind the run enters, k and a delay within the phase drawn per seed, so
the kills land in every phase and at many moments of each. A still source: after a series
of kills, one run to completion equals it, no watermark ever passes an unloaded row. A
drifting source under faults (issue 29: drift every few requests, 5% errors, 4 s tokens):
each kill is followed by a run to completion that must equal the source as it stands when
it ends; `make soak` runs at least 30 such cycles across seeds and phases.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from connectors.clinical_records.catalogue import ENTITY_SETS, EntitySet
from connectors.sandbox.server import SandboxServer
from sync.phase import PHASE_FILE, Phase
from sync.strategy import parse_watermark
from tests.reliability.conftest import (
    SIZE,
    SYNC_TIMEOUT,
    Ledger,
    Target,
    assert_equal_to_source,
    assert_lake_sound,
    assert_matches,
    assert_reconciled,
    canonical,
    compare,
    sandbox_config,
    summary_modes,
    truth,
)

pytestmark = pytest.mark.reliability

POLL = 0.002
# The longest random delay after a phase is entered before the kill, in seconds: about
# what one such phase lasts at CI size, so a kill lands anywhere in it (or just past it).
DELAY: dict[Phase, float] = {
    Phase.EXTRACT: 0.1,
    Phase.RECONCILE: 0.05,
    Phase.LAKE: 0.005,
    Phase.LOAD: 0.3,
    Phase.PUBLISH: 0.02,
}


def phase_target(server: SandboxServer, root: Path, **env: str) -> Target:
    """A target whose runs say which phase they are in."""
    return Target(server, root, extra_env={PHASE_FILE: str(root / "phase"), **env})


def _sightings(marker: Path) -> Iterator[str]:
    """Each new line the run writes to its phase file, as the poll sees it."""
    last = None
    while True:
        try:
            line = marker.read_text().strip()
        except FileNotFoundError:
            line = None
        if line and line != last:
            last = line
            yield line
        else:
            yield ""


def kill_in(target: Target, phase: Phase, rng: random.Random, log: Path, *args: str) -> str | None:
    """Start `clinical-sync sync ARGS` and SIGKILL it in `phase`: at the k-th time it is
    seen entering one (k from `rng`, the first if the run never shows that many), after a
    random delay within the phase. The phase line current at the kill; None if the run
    ended first."""
    target.root.mkdir(parents=True, exist_ok=True)
    marker = Path(target.env()[PHASE_FILE])
    for wanted in (rng.randint(1, 4), 1):
        marker.unlink(missing_ok=True)
        proc = target.start("sync", *args, log=log)
        deadline = time.monotonic() + SYNC_TIMEOUT
        seen = 0
        for line in _sightings(marker):
            seen += line.split()[:1] == [phase]
            if seen >= wanted or proc.poll() is not None:
                break
            assert time.monotonic() < deadline, f"no {phase} phase within {SYNC_TIMEOUT} s"
            time.sleep(POLL)
        time.sleep(rng.uniform(0, DELAY[phase]))
        at = marker.read_text().strip() if marker.exists() else ""
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return at
        proc.wait(timeout=30)  # it ended first: the next run tries at the first sighting
    return None


def count_kill(ledger: Ledger, at: str | None) -> None:
    """A kill the run did not outlive, by the phase it was in."""
    if at:
        ledger.crashes_survived += 1
        ledger.kills[at.split()[0]] += 1


def resume(target: Target, ledger: Ledger) -> subprocess.CompletedProcess:
    """`clinical-sync sync` to completion after a kill: it must end equal to the drifting
    source, its reconciliation with nothing left over."""
    mark = len(target.server.store.changes)
    done = target.sync()
    assert "sync failed" not in done.stderr
    assert_reconciled(target)
    assert_equal_to_source(target, ledger, since=mark, modes=summary_modes(done.stdout))
    ledger.changes_during_runs += len(target.server.store.changes) - mark
    return done


def cursor_text(value: object) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def assert_watermarks_cover_loaded_rows(target: Target, source: dict[str, list[dict]]) -> None:
    """No committed watermark passed a source record that is not in the warehouse."""
    if not target.warehouse.exists():
        return
    try:
        marks = dict(target.query('SELECT "entity", "watermark" FROM "ops"."sync_state"'))
    except duckdb.CatalogException:
        return  # killed before the schema was created
    ent: EntitySet
    for ent in ENTITY_SETS:
        mark = marks.get(ent.name)
        if ent.cursor is None or mark is None:
            continue
        limit = parse_watermark(ent, mark)
        held = set(r[0] for r in target.query(f'SELECT "{ent.key}" FROM "clinical"."{ent.table}"'))
        behind = [
            key
            for key, record in canonical(ent, source[ent.name]).items()
            if record[ent.cursor] is not None
            and parse_watermark(ent, cursor_text(record[ent.cursor])) <= limit
            and key not in held
        ]
        assert not behind, f"{ent.name}: watermark {mark} passed unloaded keys {behind[:3]}"


def test_sync_survives_sigkill_in_every_phase(tmp_path, ledger):
    """A kill in each phase (three under `make soak`), then a run to completion."""
    rng = random.Random(6)
    with SandboxServer(sandbox_config(seed=47, scale=0.1, latency=0.01)) as server:
        target = phase_target(server, tmp_path / "target")
        source = truth(server)  # the source stays still: the end state is known
        killed = []
        for n, phase in enumerate([p for _ in range(1 + SIZE // 5) for p in Phase]):
            if at := kill_in(target, phase, rng, tmp_path / f"kill-{n}.log"):
                killed.append(at)
                ledger.kills[at.split()[0]] += 1
            assert_watermarks_cover_loaded_rows(target, source)
        assert len(killed) >= 3, f"the syncs finished before the kills: {killed}"
        ledger.crashes_survived += len(killed)

        done = target.sync()
        assert "sync failed" not in done.stderr
        assert_matches(compare(target, source), ledger)
        assert_watermarks_cover_loaded_rows(target, source)
        assert_lake_sound(target)


FAULTS = {"error_rate": 0.05, "token_lifetime": 4}
# Every 10 collection requests at CI size, every 33 under `make soak` (test_drift.py: the
# same changes per set read at 10x the data).
DRIFT = {"drift_every": max(10, 10 * SIZE // 3)}
SEEDS = range(1, 2 if SIZE == 1 else 7)  # x 5 phases: 5 kills at CI size, 30 under soak
EACH_RESUMED = SIZE > 1  # under soak every kill is followed by a run to the end, compared


@pytest.mark.parametrize("seed", SEEDS)
def test_killed_in_every_phase_and_resumed_under_drift_ends_equal(seed, tmp_path, ledger):
    """Per seed, a kill in each phase (in an order the seed draws), each followed by a run
    to completion (at CI size: the next kill's run, and one to completion after the last)
    that must equal the drifting source: nothing missing, stale or held twice; the sets
    without updated_at only where drift changed a key during that run (test_drift.py)."""
    rng = random.Random(seed)
    config = sandbox_config(seed=80 + seed, fault_seed=seed, drift_seed=seed, **FAULTS, **DRIFT)
    with SandboxServer(config) as server:
        target = phase_target(server, tmp_path / "target")
        control = server.control()
        phases = list(Phase)
        rng.shuffle(phases)
        for n, phase in enumerate(phases):
            if n == 2:  # a day of changes at the clinic: the later runs are nightly increments
                control.advance(
                    seconds=86400, insert_fraction=0.02, update_fraction=0.02, delete_fraction=0.01
                )
            args = ("--full",) if n == 0 else ()
            count_kill(ledger, kill_in(target, phase, rng, tmp_path / f"kill-{n}.log", *args))
            if EACH_RESUMED or n == len(phases) - 1:
                resume(target, ledger)
        assert_lake_sound(target)
        ledger.add_faults(control.stats())
