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
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.clinical_records.catalogue import (
    DOCUMENTS,
    PAGE_SIZE,
    RIDES_WITH,
    EntitySet,
)
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import BadRequest
from connectors.clinical_records.query import Expand, Query
from sync.extract import BatchWriter, Extraction, cursor_filter, extract, fill
from sync.phase import Phase, enter
from sync.progress import Progress
from sync.reconcile import Reconciler
from sync.riders import Rider, SetInput, complete
from sync.service_memory import DOCUMENTS_REFUSED, ServiceMemory
from sync.strategy import Mode, Plan
from warehouse.lake import Lake

log = logging.getLogger(__name__)


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
                root, carrying, riding, inputs, client, lake, run_id, progress, memory, say
            )
        )
    for entity in alone:
        one = inputs[entity.name]
        say.info(f"{entity.name}: {one.plan.mode.value} ({one.plan.reason})")
        results[entity.name] = extract(
            one.plan,
            client,
            lake,
            run_id=run_id,
            previous_watermark=one.watermark,
            progress=progress,
            held=one.held,
        )
    spent = {n: int(r.stats.get("requests", 0)) for n, r in results.items() if r.stats}
    say.info(
        f"{root.name} and its family: {sum(spent.values())} requests "
        f"({', '.join(f'{n} {k}' for n, k in spent.items())})"
    )
    return results


def _skipped(plan: Plan, run_id: str) -> Extraction:
    return Extraction(plan.entity.name, plan.mode, plan.reason, run_id)


def _packed_read(
    root: EntitySet,
    root_input: SetInput | None,
    riding: list[EntitySet],
    inputs: Mapping[str, SetInput],
    client: ClinicalClient,
    lake: Lake,
    run_id: str,
    progress: Progress,
    memory: ServiceMemory,
    say: Any,
) -> dict[str, Extraction]:
    """The root read whole (or its keys only, to carry its children), children unpacked."""
    started = time.monotonic()
    spent: dict[str, dict[str, float]] = defaultdict(dict)  # per set, what its phases cost
    carrier = root.name if root_input is not None else riding[0].name  # who pays the read
    enter(Phase.EXTRACT, carrier)
    root_writer = root_reconciler = None
    if root_input is not None:
        root_writer = BatchWriter(lake, root_input.plan, run_id, root_input.watermark)
        if root_input.plan.moves_watermark:
            root_reconciler = Reconciler(root, client, take=root_writer.add, held=root_input.held)
    riders = [_rider(child, inputs[child.name], client, lake, run_id) for child in riding]
    listed_alone = [
        r for r in riders if r.entity is DOCUMENTS and memory.refuses(DOCUMENTS_REFUSED)
    ]
    if listed_alone:
        say.info(f"{DOCUMENTS.name}: the service refused to expand them; listed per patient")
    expanded = [r for r in riders if r not in listed_alone]
    if root_reconciler:  # a root that carries children is counted: the plan's estimate
        with client.stats.measure(spent[root.name]):
            root_reconciler.begin(counted=bool(riders))
    for r in riders:
        if r.reconciler:
            with client.stats.measure(spent[r.entity.name]):
                r.reconciler.begin(counted=True)
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
        with client.stats.measure(spent[carrier]):
            read(expanded)
    except BadRequest as refused:
        if not any(r.entity is DOCUMENTS for r in expanded) or parents:
            raise
        memory.refuse(DOCUMENTS_REFUSED)
        say.warning(
            f"{DOCUMENTS.name}: the service refused $expand of them ({refused.status}); they "
            f"are listed per patient, one request each, until it is tried again"
        )
        listed_alone += [r for r in expanded if r.entity is DOCUMENTS]
        expanded = [r for r in expanded if r.entity is not DOCUMENTS]
        with client.stats.measure(spent[carrier]):
            read(expanded)
    progress.finish(root.name)
    if any(r.entity is DOCUMENTS for r in expanded):
        memory.accepted(DOCUMENTS_REFUSED)

    results: dict[str, Extraction] = {}
    if root_input is not None:
        result = Extraction(root.name, root_input.plan.mode, root_input.plan.reason, run_id)
        if root_reconciler:
            with client.stats.measure(spent[root.name]):
                result.reconciliation = root_reconciler.finish()
            result.source_total = root_reconciler.total
        assert root_writer is not None
        root_writer.finish(root_reconciler.deleted_keys() if root_reconciler else None)
        fill(result, root_writer, len(parents))
        results[root.name] = result
    for r in riders:
        if r in listed_alone:
            r.short = list(parents)
        with client.stats.measure(spent[r.entity.name]):
            results[r.entity.name] = complete(r, parents, client, memory, say)
        results[r.entity.name].reason = r.choice
    for name, result in results.items():
        result.stats = spent[name]
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
