"""One family's extraction: a set and the sets that ride in its pages, read together.

The request is the unit of cost, and a page holds a hundred records however large they are.
`$expand` with a nested `$count` (spec 4.2) lets one page of Patients carry every
appointment and document of its hundred patients, and one page of Prescriptions every
claim and insurance verification (`EntitySet.packs` in the catalogue). Completeness is
proved, never assumed:

1. **Per parent.** A parent whose nested count exceeds the children that came (the service
   cut the collection short) has its children read by a filter on the reference
   (documents: listed per patient).
2. **Per set.** Children that no parent reaches (a null or a dangling reference) are the
   set's count when the read began less the nested counts. Those with a null reference are
   read by `<reference> eq null`, those held under a parent not read by key, and every
   child of such a parent by reference (sync/orphans.py), the rest found by the
   reconciliation's key ranges. Where that costs more than reading the set alone
   (dangling references spread through the keys), the set is read alone instead, and the
   plan says why (sync/rider_plan.py).
3. **Under change.** Every set but the documents keeps its own `Reconciler`: what moved
   during the read is re-read before the batch is committed. An increment of a child (it
   has `updated_at`) reads its cursor range as well; a child the warehouse holds under a
   parent read whole, and that did not come with it, is gone.

Documents have no entity set: they come with their patients, or, where the service refuses
to expand them (a 400, remembered in `ServiceMemory` and retried on the snapshot cadence),
they are listed per patient. Logs carry counts only, never an id (PHI).

Who rides and who is read alone is decided before any request (sync/family_plan.py); this
module carries that plan out and measures each phase's requests to the set it works for.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from connectors.clinical_records.catalogue import (
    DOCUMENTS,
    PAGE_SIZE,
    RIDES_WITH,
    EntitySet,
)
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import BadRequest
from sync.extract import Batches, BatchWriter, Extraction, extract, record_writer
from sync.family_plan import PackedRead, plan_family
from sync.phase import Phase, enter
from sync.progress import Progress
from sync.reconcile import Reconciler
from sync.riders import Rider, SetInput, complete
from sync.service_memory import DOCUMENTS_REFUSED, ServiceMemory
from sync.strategy import Mode, Plan

log = logging.getLogger(__name__)


def extract_family(
    family: Sequence[EntitySet],
    inputs: Mapping[str, SetInput],
    client: ClinicalClient,
    batches: Batches,
    *,
    run_id: str,
    progress: Progress,
    memory: ServiceMemory,
    say: Any = log,
) -> dict[str, Extraction]:
    """Extract the selected sets of `family` (root first) in as few requests as is exact."""
    plans = {name: one.plan for name, one in inputs.items()}
    family_read = plan_family(family, plans, memory.refuses(DOCUMENTS_REFUSED))
    results = {c.name: _skipped(plans[c.name], run_id) for c in family_read.skipped}
    if family_read.packed is not None:
        results.update(
            _packed_read(
                family_read.packed,
                inputs,
                client,
                batches,
                run_id=run_id,
                progress=progress,
                memory=memory,
                say=say,
            )
        )
    for entity in family_read.read_separately:
        one = inputs[entity.name]
        say.info(f"{entity.name}: {one.plan.mode.value} ({one.plan.reason})")
        results[entity.name] = extract(
            one.plan,
            client,
            batches,
            run_id=run_id,
            previous_watermark=one.watermark,
            progress=progress,
            held=one.held,
        )
    spent = {n: int(r.stats.get("requests", 0)) for n, r in results.items() if r.stats}
    say.info(
        f"{family[0].name} and its family: {sum(spent.values())} requests "
        f"({', '.join(f'{n} {k}' for n, k in spent.items())})"
    )
    return results


def _skipped(plan: Plan, run_id: str) -> Extraction:
    return Extraction(plan.entity.name, plan.mode, plan.reason, run_id)


def _packed_read(
    read: PackedRead,
    inputs: Mapping[str, SetInput],
    client: ClinicalClient,
    batches: Batches,
    *,
    run_id: str,
    progress: Progress,
    memory: ServiceMemory,
    say: Any,
) -> dict[str, Extraction]:
    """Carry out `read`: the parents' pages, the children unpacked from them, then each
    child completed (sync/riders.py); every phase measured to the set it works for."""
    started = time.monotonic()
    spent: dict[str, dict[str, float]] = defaultdict(dict)  # per set, what its phases cost
    root, payer = read.root, read.payer.name
    root_input = inputs[root.name] if read.root_plan is not None else None
    enter(Phase.EXTRACT, payer)
    root_writer = root_reconciler = None
    if root_input is not None:
        root_writer = batches.writer(root_input.plan, run_id, root_input.watermark)
        if root_input.plan.moves_watermark:
            root_reconciler = Reconciler(
                root, client, to_batch=root_writer.add, held=root_input.held
            )
    riders = [_rider(child, inputs[child.name], client, batches, run_id) for child in read.carried]
    if read.listed:
        say.info(f"{DOCUMENTS.name}: the service refused to expand them; listed per patient")
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

    parents: list[Any] = []  # extended as the pages come: a refusal midway keeps what came
    progress.start(root.name)
    try:
        with client.stats.measure(spent[payer]):
            parents.extend(
                _parent_keys(read, riders, client, root_writer, root_reconciler, progress)
            )
    except BadRequest as refused:
        if not any(c is DOCUMENTS for c in read.expanded) or parents:
            raise
        memory.refuse(DOCUMENTS_REFUSED)
        say.warning(
            f"{DOCUMENTS.name}: the service refused $expand of them ({refused.status}); they "
            f"are listed per patient, one request each, until it is tried again"
        )
        read = read.listing_documents()
        with client.stats.measure(spent[payer]):
            parents.extend(
                _parent_keys(read, riders, client, root_writer, root_reconciler, progress)
            )
    progress.finish(root.name)
    if any(c is DOCUMENTS for c in read.expanded):
        memory.accepted(DOCUMENTS_REFUSED)

    results: dict[str, Extraction] = {}
    if root_input is not None:
        result = Extraction(root.name, root_input.plan.mode, root_input.plan.reason, run_id)
        if root_reconciler:
            with client.stats.measure(spent[root.name]):
                result.reconciled(root_reconciler, root_reconciler.finish())
        assert root_writer is not None
        root_writer.finish(root_reconciler.deleted_keys() if root_reconciler else None)
        record_writer(result, root_writer, len(parents))
        results[root.name] = result
    for r in riders:
        if r.entity in read.listed:
            r.parents_cut_short = list(parents)
        with client.stats.measure(spent[r.entity.name]):
            results[r.entity.name] = complete(r, parents, client, memory, say)
        results[r.entity.name].reason = r.choice
    for name, result in results.items():
        result.stats = spent[name]
        result.seconds = round(time.monotonic() - started, 3)
    return results


def _parent_keys(
    read: PackedRead,
    riders: list[Rider],
    client: ClinicalClient,
    root_writer: BatchWriter | None,
    root_reconciler: Reconciler | None,
    progress: Progress,
) -> Iterator[Any]:
    """The parents' pages as they come: each parent's key, once its expanded children are
    taken off it onto their riders; the root's records to its writer and reconciler."""
    root, expanded = read.root, [r for r in riders if r.entity not in read.listed]
    for page in client.iter_pages(root, read.query()):
        for record in page.records:
            key = record.get(root.key)
            for r in expanded:
                _unpack(r, record, key, page.answered)
            yield key
        for r in expanded:
            r.end_page(page.answered)
        if root_writer:
            root_writer.add(page.records)
        if root_reconciler:
            root_reconciler.read(page.records)
        progress.page(root.name, len(page.records), page.total)


def _rider(
    child: EntitySet,
    child_input: SetInput,
    client: ClinicalClient,
    batches: Batches,
    run_id: str,
) -> Rider:
    _, nav = RIDES_WITH[child.name]
    writer = batches.writer(child_input.plan, run_id, child_input.watermark)
    reconciler = None
    if child.contained_in is None:
        held = child_input.held if child_input.plan.mode is Mode.INCREMENTAL else ()
        reconciler = Reconciler(child, client, to_batch=writer.add, held=held)
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


def _unpack(rider: Rider, record: dict, parent: Any, answered: float) -> None:
    """Take a parent's expanded children off it; note the parent if they did not all come."""
    children = record.pop(rider.nav.name, None)
    count = record.pop(f"{rider.nav.name}@odata.count", None)
    if not isinstance(children, list) or not isinstance(count, int) or count > len(children):
        rider.parents_cut_short.append(parent)
        return
    rider.take(parent, children, count, answered)
