"""One family's extraction: a set and the sets that ride in its pages, read together.

The request is the unit of cost, and a page holds a hundred records however large they are.
`$expand` with a nested `$count` (spec 4.2) lets one page of Patients carry every
appointment and document of its hundred patients, and one page of Prescriptions every
claim and insurance verification (`EntitySet.packs` in the catalogue). Completeness is
proved, never assumed:

1. **Per parent.** A parent whose nested count exceeds the children that came (the service
   cut the collection short) has its children read the plain way, by a filter on the
   reference (documents: listed per patient).
2. **Per set.** Children that no parent reaches (a null or a dangling reference) are the
   set's count when the read began less the nested counts. Those with a null reference are
   read by `<reference> eq null`; the rest are found by the reconciliation's key ranges.
   Where that costs more than reading the set plainly (dangling references spread through
   the keys), the set is read plainly instead, and the plan says why.
3. **Under change.** Every set but the documents keeps its own `Reconciler`: what moved
   during the read is re-read before the batch is committed. An increment of a child (it
   has `updated_at`) reads its cursor range as well; a child the warehouse holds under a
   parent read whole, and that did not come with it, is gone.

Documents have no entity set: they come with their patients, or, where the service refuses
to expand them (a 400, remembered in `ServiceMemory` and retried on the snapshot cadence),
they are listed per patient. Logs carry counts only, never an id (PHI).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from connectors.clinical_records.catalogue import (
    DOCUMENTS,
    PAGE_SIZE,
    RIDES_WITH,
    Edm,
    EntitySet,
    Navigation,
)
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentsClient
from connectors.clinical_records.errors import BadRequest, NotFound
from connectors.clinical_records.paging import record_key
from connectors.clinical_records.query import Expand, F, Query
from pipelines.extract import BatchWriter, Extraction, cursor_filter, extract
from pipelines.progress import Progress
from pipelines.reconcile import Reconciler, Reconciliation
from pipelines.service_memory import ServiceMemory
from pipelines.strategy import Mode, Plan
from warehouse.lake import Lake

log = logging.getLogger(__name__)

DOCUMENTS_BLIND = (
    "a document uploaded or deleted during the run under a patient already read is seen by "
    "the next run (documents have no set to count)"
)


@dataclass
class SetInput:
    """What one selected set of the family starts from."""

    plan: Plan
    watermark: str | None = None
    held: set[Any] = field(default_factory=set)  # live keys (an increment reconciles them)
    parents: dict[Any, Any] = field(default_factory=dict)  # live key -> its parent's key


def _canonical(value: Any) -> str | None:
    """A key or a reference, comparable across sets: digits as the number they spell."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    return str(int(text)) if text.lstrip("-").isdigit() else text


class Meter:
    """Attributes the shared client's counters to the set a phase works for."""

    def __init__(self, client: ClinicalClient) -> None:
        self.client = client
        self.spent: dict[str, dict[str, float]] = {}

    def charge(self, name: str, work: Callable[[], Any]) -> Any:
        before = self.client.stats.as_dict()
        try:
            return work()
        finally:
            after = self.client.stats.as_dict()
            mine = self.spent.setdefault(name, {})
            for k, v in after.items():
                mine[k] = round(mine.get(k, 0) + v - before.get(k, 0), 3)


@dataclass
class Rider:
    """A child set riding in its parent's pages during one run."""

    entity: EntitySet
    nav: Navigation
    input: SetInput
    writer: BatchWriter
    reconciler: Reconciler | None
    arrived: list[dict] = field(default_factory=list)
    reached: int = 0  # the nested counts of the parents read
    short: list[Any] = field(default_factory=list)  # parents whose children did not all come
    fetched: int = 0
    keys: set[Any] = field(default_factory=set)  # of every record taken, in the API's kind
    no_parent: set[Any] = field(default_factory=set)  # held or taken with a null reference
    choice: str = ""

    def take(self, records: list[dict]) -> None:
        for start in range(0, len(records), PAGE_SIZE):  # as pages come: the writer's rhythm
            self.writer.add(records[start : start + PAGE_SIZE])
        if self.reconciler:
            self.reconciler.read(records)
        self.fetched += len(records)
        numeric = self.entity.key_field.type is Edm.INT32
        for record in records:
            key = record_key(record.get(self.entity.key), numeric)
            self.keys.add(key)
            if record.get(self.nav.remote) is None:
                self.no_parent.add(key)
            else:
                self.no_parent.discard(key)


def orphan_cost(pages: int, nulls: int, dangling: int) -> int:
    """Requests to find the children no parent reaches: the null ones by a filter, each
    dangling one by halving key ranges (bounded by reading the whole set)."""
    found = math.ceil(nulls / PAGE_SIZE) + (1 if nulls else 0)
    if dangling:
        found += min(pages, math.ceil(dangling * (2 + math.log2(max(2, pages / dangling)))))
    return found


def extract_family(
    family: Sequence[EntitySet],
    inputs: Mapping[str, SetInput],
    client: ClinicalClient,
    lake: Lake,
    *,
    run_id: str,
    progress: Progress,
    memory: ServiceMemory,
    say: Any = log,
) -> dict[str, Extraction]:
    """Extract the selected sets of `family` (root first) in as few requests as is exact."""
    root, children = family[0], family[1:]
    meter = Meter(client)
    results: dict[str, Extraction] = {}
    root_input = inputs.get(root.name)
    root_whole = root_input is not None and root_input.plan.mode is Mode.SNAPSHOT
    riding: list[EntitySet] = []
    plain: list[EntitySet] = []
    for child in children:
        child_input = inputs.get(child.name)
        if child_input is None or child_input.plan.mode is Mode.SKIP:
            if child_input is not None:
                results[child.name] = _skipped(child_input.plan, run_id)
            continue
        rides = child_input.plan.mode in (Mode.SNAPSHOT, Mode.INCREMENTAL)
        (riding if rides and (root_whole or child.contained_in) else plain).append(child)
    alone = plain if root_whole or root_input is None else [root, *plain]
    carrying = root_input if root_whole else None
    if riding or carrying is not None:
        results.update(
            _packed_read(
                root, carrying, riding, inputs, client, lake, meter, run_id, progress, memory, say
            )
        )
    for entity in alone:
        one = inputs[entity.name]
        say.info(f"{entity.name}: {one.plan.mode.value} ({one.plan.reason})")
        results[entity.name] = meter.charge(
            entity.name,
            lambda i=one: extract(
                i.plan,
                client,
                lake,
                run_id=run_id,
                previous_watermark=i.watermark,
                progress=progress,
                held=i.held,
            ),
        )
    for name, result in results.items():
        if name in meter.spent:
            result.stats = meter.spent[name]
    spent = {n: int(v.get("requests", 0)) for n, v in meter.spent.items()}
    say.info(
        f"{root.name} and its family: {sum(spent.values())} requests "
        f"({', '.join(f'{n} {k}' for n, k in spent.items())})"
    )
    return results


def _skipped(plan: Plan, run_id: str) -> Extraction:
    return Extraction(plan.entity.name, plan.mode.value, plan.reason, run_id)


def _packed_read(
    root: EntitySet,
    root_input: SetInput | None,
    riding: list[EntitySet],
    inputs: Mapping[str, SetInput],
    client: ClinicalClient,
    lake: Lake,
    meter: Meter,
    run_id: str,
    progress: Progress,
    memory: ServiceMemory,
    say: Any,
) -> dict[str, Extraction]:
    """The root read whole (or its keys only, to carry its children), children unpacked."""
    started = time.monotonic()
    carrier = root.name if root_input is not None else riding[0].name  # who pays the read
    root_writer = root_reconciler = None
    if root_input is not None:
        root_writer = BatchWriter(lake, root_input.plan, run_id, root_input.watermark)
        if root_input.plan.moves_watermark:
            root_reconciler = Reconciler(root, client, take=root_writer.add, held=root_input.held)
    riders = [_rider(child, inputs[child.name], client, lake, run_id) for child in riding]
    listed_alone = [r for r in riders if r.entity is DOCUMENTS and memory.refuses_documents()]
    if listed_alone:
        say.info(f"{DOCUMENTS.name}: the service refused to expand them; listed per patient")
    expanded = [r for r in riders if r not in listed_alone]
    if root_reconciler:
        meter.charge(root.name, root_reconciler.begin)
    for r in riders:
        if r.reconciler:
            meter.charge(r.entity.name, lambda r=r: r.reconciler.begin(counted=True))
    _announce(
        root, root_input, root_reconciler.started_total if root_reconciler else None, riders, say
    )

    select = None if root_input is not None else [root.key]
    filter_ = cursor_filter(root_input.plan) if root_input is not None else None
    parents: list[Any] = []
    progress.start(root.name)

    def read(with_: list[Rider]) -> None:
        query = Query(
            root,
            filter=filter_,
            select=select,
            expand=[Expand(r.nav.name, count=True) for r in with_],
        )
        for page in client.iter_pages(root, query):
            for record in page.records:
                key = record.get(root.key)
                parents.append(key)
                for r in with_:
                    _unpack(r, record, key)
            if root_writer:
                root_writer.add(page.records)
            if root_reconciler:
                root_reconciler.read(page.records)
            progress.page(root.name, len(page.records), page.total)

    try:
        meter.charge(carrier, lambda: read(expanded))
    except BadRequest as refused:
        if not any(r.entity is DOCUMENTS for r in expanded) or parents:
            raise
        memory.refuse_documents()
        say.warning(
            f"{DOCUMENTS.name}: the service refused $expand of them ({refused.status}); they "
            f"are listed per patient, one request each, until it is tried again"
        )
        listed_alone += [r for r in expanded if r.entity is DOCUMENTS]
        expanded = [r for r in expanded if r.entity is not DOCUMENTS]
        meter.charge(carrier, lambda: read(expanded))
    progress.finish(root.name)
    if any(r.entity is DOCUMENTS for r in expanded):
        memory.documents_expanded()

    results: dict[str, Extraction] = {}
    for r in riders:
        if r in listed_alone:
            r.short = list(parents)
        results[r.entity.name] = meter.charge(
            r.entity.name, lambda r=r: _complete(r, parents, client, say)
        )
        results[r.entity.name].reason = r.choice
    if root_input is not None:
        result = Extraction(root.name, root_input.plan.mode.value, root_input.plan.reason, run_id)
        if root_reconciler:
            result.reconciliation = meter.charge(root.name, root_reconciler.finish)
            result.source_total = root_reconciler.total
        assert root_writer is not None
        root_writer.finish(root_reconciler.deleted_keys() if root_reconciler else None)
        _fill(result, root_writer, len(parents))
        results[root.name] = result
    for result in results.values():
        result.seconds = round(time.monotonic() - started, 3)
    return results


def _rider(
    child: EntitySet, child_input: SetInput, client: ClinicalClient, lake: Lake, run_id: str
) -> Rider:
    _, nav = RIDES_WITH[child.name]
    writer = BatchWriter(lake, child_input.plan, run_id, child_input.watermark)
    reconciler = None
    if child.contained_in is None:
        held = child_input.held if child_input.plan.mode is Mode.INCREMENTAL else ()
        reconciler = Reconciler(child, client, take=writer.add, held=held)
    return Rider(child, nav, child_input, writer, reconciler)


def _announce(
    root: EntitySet,
    root_input: SetInput | None,
    root_total: int | None,
    riders: list[Rider],
    say: Any,
) -> None:
    """The plan and its expected cost, before the first page: what rides with whom."""
    carried = ", ".join(f"{r.entity.name} ({r.input.plan.mode.value})" for r in riders)
    if root_input is not None:
        head = f"{root.name}: {root_input.plan.mode.value} ({root_input.plan.reason})"
    else:
        head = f"{root.name}: keys only, to carry its children"
    line = head + (f"; its pages carry {carried}" if carried else "")
    if root_total is not None:
        expected = math.ceil(root_total / PAGE_SIZE) + 2 + sum(_expected(r) for r in riders)
        line += f"; about {expected} requests expected"
    say.info(line)


def _expected(rider: Rider) -> int:
    """A rider's own requests, as its last run left it: the children no parent reached."""
    if rider.reconciler is None:
        return 0
    no_parent = sum(1 for parent in rider.input.parents.values() if parent is None)
    if rider.input.plan.mode is Mode.INCREMENTAL:
        return 4  # the increment's page, the null count, the probe
    return 3 + math.ceil(no_parent / PAGE_SIZE)


def _unpack(rider: Rider, record: dict, parent: Any) -> None:
    """Take a parent's expanded children off it; note the parent if they did not all come."""
    children = record.pop(rider.nav.name, None)
    count = record.pop(f"{rider.nav.name}@odata.count", None)
    if not isinstance(children, list) or not isinstance(count, int) or count > len(children):
        rider.short.append(parent)
        return
    rider.reached += count
    rider.arrived.extend(children)


def _complete(rider: Rider, parents: list[Any], client: ClinicalClient, say: Any) -> Extraction:
    """Everything the parents' pages did not bring, then the rider's batch."""
    plan = rider.input.plan
    entity = rider.entity
    result = Extraction(entity.name, plan.mode.value, plan.reason, rider.writer.run_id)
    if entity is DOCUMENTS:
        rider.take(rider.arrived)
        rider.take(list(_list_documents(client, rider.short)))
        rider.choice = (
            f"with their patients; {len(rider.short)} patients listed alone"
            if rider.short
            else "with their patients"
        )
        rider.writer.finish()
        result.reconciliation = Reconciliation(blind=DOCUMENTS_BLIND)
        result.source_total = rider.fetched
        _fill(result, rider.writer, rider.fetched)
        say.info(f"{entity.name}: {rider.fetched} read, {rider.choice}")
        return result
    reconciler = rider.reconciler
    assert reconciler is not None and reconciler.started_total is not None
    pages = max(1, math.ceil(reconciler.started_total / PAGE_SIZE))
    remote = rider.nav.remote
    numeric = entity.key_field.type is Edm.INT32
    read_whole = {_canonical(p) for p in parents} - {_canonical(p) for p in rider.short}
    # Held last run under a parent that was not read now (deleted, or never there): a
    # snapshot asks for each by key. Held under a parent read whole, and not come with it:
    # gone.
    known, gone = [], []
    for k, parent in rider.input.parents.items():
        key = record_key(k if numeric else str(k), numeric)
        if key is None:
            continue
        if parent is None:
            rider.no_parent.add(key)
            continue
        (gone if _canonical(parent) in read_whole else known).append(key)
    if plan.mode is Mode.SNAPSHOT:
        not_reached = max(0, reconciler.started_total - rider.reached)
        nulls = client.count(entity, F(remote) == None) if not_reached else 0  # noqa: E711
        new = max(0, not_reached - nulls - len(known))
        find = orphan_cost(pages, nulls, new) + len(known) + len(rider.short)
        if find < pages:
            rider.choice = (
                f"with its parents; {nulls} with no parent read by filter, {len(known)} held "
                f"under a parent not read asked for by key, about {new} new with a missing "
                f"parent found by key ranges, {len(rider.short)} parents read alone "
                f"(about {find} requests against {pages} to read it alone)"
            )
            rider.take(rider.arrived)
            if nulls:
                rider.take(_all(client, entity, F(remote) == None))  # noqa: E711
        else:
            rider.choice = (
                f"read alone: {nulls} with no parent, {len(known)} under a parent not read "
                f"and about {new} new with a missing parent would cost about {find} "
                f"requests to find, reading it costs {pages}"
            )
            rider.take(_all(client, entity, None))
            known, rider.short = [], []
    else:
        rider.take(rider.arrived)
        rider.take(_all(client, entity, cursor_filter(plan)))
        rider.choice = f"{plan.reason}, and with its parents; {len(rider.short)} parents read alone"
        known = []  # their writes come by cursor; a delete among them shows in the count
        _settle_no_parent(rider, client, reconciler)
    for parent in rider.short:
        rider.take(_all(client, entity, F(remote) == parent))
    known = [k for k in known if k not in rider.keys]
    found = list(_by_key(client, entity, known))
    rider.take(found)
    reconciler.forget(k for k in gone if k not in rider.keys)
    there = {record_key(r.get(entity.key), numeric) for r in found}
    reconciler.forget(k for k in known if k not in there)
    say.info(f"{entity.name}: {rider.choice}")
    result.reconciliation = reconciler.finish()
    result.source_total = reconciler.total
    rider.writer.finish(reconciler.deleted_keys())
    _fill(result, rider.writer, rider.fetched)
    return result


def _settle_no_parent(rider: Rider, client: ClinicalClient, reconciler: Reconciler) -> None:
    """An increment's children with a null reference, held or just read: one count tells
    whether any was deleted; only then are they read again (by filter) to find which."""
    entity, remote = rider.entity, rider.nav.remote
    expected = set(rider.no_parent)
    if client.count(entity, F(remote) == None) == len(expected):  # noqa: E711
        return
    records = _all(client, entity, F(remote) == None)  # noqa: E711
    numeric = entity.key_field.type is Edm.INT32
    there = {record_key(r.get(entity.key), numeric) for r in records}
    rider.take(records)
    reconciler.forget(expected - there)


def _by_key(client: ClinicalClient, entity: EntitySet, keys: list[Any]) -> Iterator[dict]:
    """Each record by its key, several in flight; one deleted meanwhile (404) is not."""

    def one(key: Any) -> dict | None:
        try:
            return client.get(entity, key)
        except NotFound:
            return None

    with ThreadPoolExecutor(max_workers=client.settings.max_in_flight) as pool:
        for record in pool.map(one, keys):
            if record is not None:
                yield record


def _all(client: ClinicalClient, entity: EntitySet, condition: Any) -> list[dict]:
    return [
        r
        for page in client.iter_pages(entity, Query(entity, filter=condition))
        for r in page.records
    ]


def _list_documents(client: ClinicalClient, patients: list[Any]) -> Iterator[dict]:
    """Each patient's documents, several requests in flight (the limiter paces them); a
    patient deleted meanwhile (404) has none."""
    docs = DocumentsClient(client)

    def one(patient: Any) -> list[dict]:
        try:
            return docs.list(str(patient))
        except NotFound:
            return []

    with ThreadPoolExecutor(max_workers=client.settings.max_in_flight) as pool:
        for records in pool.map(one, patients):
            yield from records


def _fill(result: Extraction, writer: BatchWriter, fetched: int) -> None:
    result.files = writer.files
    result.rejected = writer.rejected
    result.watermark = writer.watermark
    result.fetched = fetched
