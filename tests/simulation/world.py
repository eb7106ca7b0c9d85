"""One simulated world: a seed's data, drift, faults and kills, and whole runs of the engine.

A seed chooses everything (`Scenario`): how big the data is, how the service changes while
it is read (every Nth request to any set, or only to one set, a small one included; inserts
below, between and above held keys; updates that move cursors; deletes; documents), which
faults it injects (5xx, cut bodies, dropped connections, 429s, tokens that expire), how
requests in flight interleave, and where a run is killed. The engine runs as a Dagster run
would run it (each family's extraction, then its sets' loads into a real DuckDB warehouse
through real Parquet), in process, against the sandbox behind `InProcessService`.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from connectors.clinical_records.catalogue import (
    ALL_BY_NAME,
    CLAIMS,
    FAMILIES,
    PAGE_SIZE,
    EntitySet,
)
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.meter import Look
from connectors.clinical_records.settings import Settings
from connectors.clinical_records.transport import Wire
from connectors.sandbox.app import Sandbox
from connectors.sandbox.config import SandboxConfig, ScriptedDrift
from sync import phase
from sync.extract import Extraction
from sync.inputs import set_inputs
from sync.packed import extract_family
from sync.progress import Progress
from sync.reconcile_mark import Blind
from sync.service_memory import ServiceMemory
from sync.settle import Settlement, settle
from sync.strategy import Mode, Options
from tests.simulation.backends import BACKENDS, Backend
from tests.simulation.pool import Scheduler, SimPool
from tests.simulation.service import InProcessService
from warehouse.lake import Lake

SMALL_SETS = ("Branches", "Physicians", "AppointmentTypes")
# What a change may be aimed at: a small set alone, or with a set it is asked about (counts
# per parent), or a large set alone.
AIMS = (
    *((name,) for name in SMALL_SETS),
    *(("Branches", name) for name in ("Prescriptions", "Claims", "Patients", "Appointments")),
    ("Physicians", "Prescriptions"),
    ("AppointmentTypes", "Appointments"),
    ("Prescriptions",),
    ("Claims",),
    ("Patients",),
    ("Appointments",),
)
PLACES = ("below", "between", "above")


class Killed(BaseException):
    """The run was killed here (SIGKILL): nothing after it runs, no `finally` cleans up
    what the process held but what a dead process's files would show."""


class SimClock:
    """The client's and the service's clock: moves on with every request and every sleep;
    its jitter (a retry's backoff) drawn from the seed, not from the process."""

    def __init__(self, step: float, seed: int) -> None:
        self.now, self.step = 1_000.0, step
        self.stamps = 0
        self.jitter = random.Random(seed)

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        """Wall time for the looks' stamps: strictly increasing, one thread sends all."""
        self.stamps += 1
        return float(self.stamps)

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def tick(self) -> None:
        self.now += self.step

    def uniform(self, low: float, high: float) -> float:
        return self.jitter.uniform(low, high)


@dataclass(frozen=True)
class Scenario:
    """Everything a seed chooses."""

    seed: int
    scale: float
    values: str
    dangling: float
    drift_every: int  # 0: no change at every Nth request
    drift_only: tuple[str, ...]  # the sets a change is aimed at (every `aim_every`th request)
    aim_every: int
    drift_counts: tuple[int, int, int]  # inserts, updates, deletes per change
    place: str | None
    error_rate: float
    drop_rate: float
    garble_rate: float
    throttle_rate: float
    token_lifetime: float
    expand_cap: int | None
    refuse_document_expand: bool
    refuse_filter_or: bool
    eagerness: float  # how often a request in flight is answered before a later one
    in_flight_at_cancel: float
    family_order: tuple[int, ...]
    kill_at: int | None  # the request (counted over the whole scenario) a kill falls on
    runs: tuple[str, ...]  # "full", "nightly", with a day of changes before each nightly
    busy_day: bool  # that day updates more Claims than a page holds: the window is split

    @classmethod
    def of(cls, seed: int) -> Scenario:
        rng = random.Random(seed)
        aimed = rng.choice(((), (), *AIMS))
        drift_every = rng.choice((0, 1, 2, 3, 5, 9, 13)) if not aimed else 0
        faulty = rng.random() < 0.4
        return cls(
            seed=seed,
            scale=rng.choice((0.01, 0.02, 0.04, 0.06, 0.15)),  # 0.15: sets of several pages
            values=rng.choice(("spec", "spec", "wide")),
            dangling=rng.choice((0.0, 0.0, 0.02, 0.1)),
            drift_every=drift_every,
            drift_only=aimed,
            aim_every=rng.choice((1, 1, 2)),
            drift_counts=(rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, 2)),
            place=rng.choice((None, *PLACES)),
            error_rate=0.05 if faulty else 0.0,
            drop_rate=0.02 if faulty else 0.0,
            garble_rate=0.02 if faulty else 0.0,
            throttle_rate=0.02 if faulty else 0.0,
            token_lifetime=rng.choice((300.0, 300.0, 4.0, 1.5)),
            expand_cap=rng.choice((None, None, None, 5, 40)),
            refuse_document_expand=rng.random() < 0.1,
            refuse_filter_or=rng.random() < 0.2,
            eagerness=rng.choice((0.0, 0.2, 0.5)),
            in_flight_at_cancel=rng.choice((0.0, 0.5, 1.0)),
            family_order=tuple(rng.sample(range(len(FAMILIES)), len(FAMILIES))),
            kill_at=rng.randint(5, 400) if rng.random() < 0.25 else None,
            runs=rng.choice((("full", "nightly"), ("full", "nightly", "nightly"))),
            busy_day=rng.random() < 0.2,  # drawn last: every earlier draw keeps its seed's value
        )

    def sandbox_config(self) -> SandboxConfig:
        inserts, updates, deletes = self.drift_counts
        config = SandboxConfig(
            seed=self.seed,
            scale=self.scale,
            values=self.values,
            dangling=self.dangling,
            token_lifetime=self.token_lifetime,
            error_rate=self.error_rate,
            drop_rate=self.drop_rate,
            garble_rate=self.garble_rate,
            throttle_rate=self.throttle_rate,
            drift_every=self.drift_every,
            drift_inserts=inserts,
            drift_updates=updates,
            drift_deletes=deletes,
            drift_seed=self.seed,
            fault_seed=self.seed,
            expand_cap=self.expand_cap,
            refuse_document_expand=self.refuse_document_expand,
            refuse_filter_or=self.refuse_filter_or,
        )
        return config

    def drift_script(self) -> list[ScriptedDrift]:
        """A change before every `aim_every`th request to each set the drift aims at."""
        inserts, updates, deletes = self.drift_counts
        return [
            ScriptedDrift(name, n, inserts or 1, updates, deletes, self.place)
            for name in self.drift_only
            for n in range(1, 400, self.aim_every)
        ]


@dataclass
class RunResult:
    """What one run of the engine said about each set it read."""

    kind: str
    killed: bool = False
    extractions: dict[str, Extraction] = field(default_factory=dict)
    settlement: Settlement = field(default_factory=Settlement)
    first_request: int = 0  # the journal's number of the run's first answer
    last_request: int = 0

    def reported(self, name: str) -> int | None:
        """Records by which the run says `name` may differ (None: not read this run)."""
        extraction = self.extractions.get(name)
        if extraction is None or extraction.mode is Mode.SKIP:
            return None
        return self.settlement.reconciliation(name, extraction.reconciliation).unreconciled

    def blind(self, name: str) -> frozenset[Blind]:
        """What the run declared it could not see in the set (at its last look)."""
        extraction = self.extractions[name]
        found = self.settlement.reconciliation(name, extraction.reconciliation)
        return frozenset(Blind[b] for b in found.blind_to)


class World:
    """A seed's sandbox, lake and warehouse under a temporary folder, and its runs."""

    def __init__(
        self, scenario: Scenario, backend: str = "model", *, settle_at_end: bool = True
    ) -> None:
        self.scenario, self.settle_at_end = scenario, settle_at_end
        self.root = Path(tempfile.mkdtemp(prefix=f"sim-{scenario.seed}-"))
        self.backend: Backend = BACKENDS[backend](self.root)
        self.clock = SimClock(step=0.01, seed=scenario.seed)
        self.sandbox = Sandbox(scenario.sandbox_config(), clock=self.clock.monotonic)
        self.service = InProcessService(self.sandbox, before=self._before_request)
        self.scheduler = Scheduler(
            random.Random(scenario.seed * 7 + 1), scenario.eagerness, scenario.in_flight_at_cancel
        )
        self.wire = Wire(self.service, lambda _: SimPool(self.scheduler), self.clock)
        customer = self.sandbox.default
        self.settings = Settings(
            base_url="http://127.0.0.1:9/api",
            auth_url="http://127.0.0.1:9/auth",
            client_id=customer.client_id,
            client_secret=customer.client_secret,
            api_key=customer.api_key,
            customer=customer.name,
            max_in_flight=3,
            max_attempts=12,
            retry_budget_seconds=10_000.0,
        )
        self.lake = Lake(self.root / "lake")  # the service memory's home
        self.requests = 0
        self.runs: list[RunResult] = []
        self._killed = False

    def close(self) -> None:
        self.service.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- the scenario ---------------------------------------------------------------------

    def play(self) -> Iterator[RunResult]:
        """Every run of the scenario, each as it ends (the warehouse as it left it); a killed
        run is followed by one that resumes."""
        for number, kind in enumerate(self.scenario.runs):
            if number:
                self.sandbox.store.advance(document_fraction=0.01)
                if self.scenario.busy_day:
                    self._busy_day()
                self.service.journal.forget_truth()
            self.runs.append(self.run(kind, number))
            yield self.runs[-1]
            if self.runs[-1].killed:
                self.runs.append(self.run(kind, number, resumed=True))
                yield self.runs[-1]

    def _busy_day(self) -> None:
        """Half again a page of Claims updated today: the nightly's last look at its date
        cursor needs the day's count beside the probe (`Blind.DAY_PAIRS`), and a drift aimed at
        Claims changes the day between them."""
        held = len(self.sandbox.store.tables[CLAIMS.name])
        share = min(1.0, 1.5 * PAGE_SIZE / max(held, 1))
        self.sandbox.store.advance(
            seconds=60,
            insert_fraction=0,
            update_fraction=share,
            delete_fraction=0,
            sets=(CLAIMS.name,),
        )

    def _before_request(self, request: httpx.Request) -> None:
        """The clock moves; the run may be killed here."""
        self.clock.tick()
        self.requests += 1
        if self.scenario.kill_at is not None and self.requests == self.scenario.kill_at:
            self._killed = True
            raise Killed(f"request {self.requests}")

    # -- one run ----------------------------------------------------------------------------

    def run(self, kind: str, number: int, *, resumed: bool = False) -> RunResult:
        """One sync as Dagster runs it: per family its extraction, then its sets' loads."""
        result = RunResult(kind + (" (resumed)" if resumed else ""))
        result.first_request = len(self.service.journal.served)
        run_id = f"sim{self.scenario.seed}-{number}{'r' if resumed else ''}"
        options = Options(full=kind == "full")
        if number == 0 and not resumed:
            self.sandbox.configure(drift_script=self.scenario.drift_script())
        looks: list[Look] = []
        try:
            for place in self.scenario.family_order:
                family = FAMILIES[place]
                extractions = self._extract(family, options, run_id, looks)
                result.extractions.update(extractions)
                self._load(family, extractions)
            if self.settle_at_end:
                result.settlement = self._settle(result.extractions, looks, run_id)
        except Killed:
            result.killed = True
            self.scheduler.pending.clear()
        result.last_request = len(self.service.journal.served)
        return result

    def _extract(
        self, family: tuple[EntitySet, ...], options: Options, run_id: str, looks: list[Look]
    ) -> dict[str, Extraction]:
        with self.backend.committed() as committed:
            inputs = set_inputs(family, committed, options)
        self.lake.record_source(self.settings.base_url, self.settings.customer)
        memory = ServiceMemory(self.lake.root, retry_after=options.snapshot_every)
        with self._client() as client:
            try:
                return extract_family(
                    family,
                    inputs,
                    client,
                    self.backend.batches,
                    run_id=run_id,
                    progress=Progress(),
                    memory=memory,
                    say=_Quiet(),
                )
            finally:
                looks += client.stats.looks

    def _client(self) -> ClinicalClient:
        return ClinicalClient(self.settings, limiter=_Turns(self.scheduler), wire=self.wire)

    def _settle(
        self, extractions: dict[str, Extraction], looks: list[Look], run_id: str
    ) -> Settlement:
        """The run's end: each set touched after its last look is looked at again, loaded."""
        with self.backend.committed() as committed, self._client() as client:
            found = settle(
                {n: e.last_look for n, e in extractions.items() if e.last_look is not None},
                {n: e.mark for n, e in extractions.items()},
                looks,
                committed,
                client,
                self.backend.batches,
                run_id=run_id,
                say=_Quiet(),
            )
        for name, again in found.again.items():
            for extraction in again:
                self.backend.load(ALL_BY_NAME[name], extraction)
        return found

    def _load(self, family: tuple[EntitySet, ...], extractions: dict[str, Extraction]) -> None:
        for entity in family:
            extraction = extractions[entity.name]
            if extraction.mode is not Mode.SKIP:
                phase.enter(phase.Phase.LOAD, entity.name)
                self.backend.load(entity, extraction)


class _Turns:
    """The limiter's place in the simulation: no limit, but where a request waits for its
    slot, requests sent earlier and still in flight may be answered first."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def acquire(self) -> float:
        self.scheduler.interleave()
        return 0.0

    def throttled(self, retry_after: float) -> None:
        pass

    def succeeded(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Quiet:
    def info(self, *_: Any) -> None:
        pass

    warning = debug = error = info
