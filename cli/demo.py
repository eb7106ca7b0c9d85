"""`clinical-sync demo`: the product in two minutes on a fresh machine.

An embedded sandbox, a full sync, a day of changes at the source, the nightly sync, and what
the warehouse then holds; through the same Dagster assets a scheduled run uses.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from cli import exit_codes
from cli.commands import terminal_progress
from cli.output import format_table, status_text
from pipelines import home
from warehouse.private import private_dir
from warehouse.publish import working_path

ANALYTICS_QUERY = """
SELECT category,
       count(*) AS claims,
       sum(total_claim_amount) AS billed,
       sum(total_claim_paid) AS paid,
       sum(total_claim_balance) AS open_balance
FROM analytics.prescription_claims
GROUP BY category
ORDER BY billed DESC
"""


# What the demo's "Next" suggests: a question an analyst asks, on the warehouse just built.
TRY_QUERY = (
    'WAREHOUSE_PATH={path} .venv/bin/clinical-sync sql -c "SELECT branch_name, '
    "sum(total_claim_balance) AS open_balance FROM analytics.prescription_summary "
    'GROUP BY 1 ORDER BY 2 DESC LIMIT 5"'
)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _fresh(root: Path) -> tuple[Path, Path]:
    """The demo's own lake and warehouse, emptied: each demo starts from nothing."""
    lake, warehouse = root / "lake", root / "warehouse.duckdb"
    for folder in (lake, working_path(warehouse).parent):
        shutil.rmtree(folder, ignore_errors=True)
    for leftover in (warehouse, warehouse.with_name(warehouse.name + ".wal")):
        leftover.unlink(missing_ok=True)
    private_dir(root)
    return lake, warehouse


def demo(args: argparse.Namespace) -> int:
    import duckdb

    from connectors.sandbox.config import SandboxConfig
    from connectors.sandbox.server import SandboxServer
    from pipelines.runner import sync
    from warehouse.load import status as warehouse_status

    lake, warehouse = _fresh(Path(args.dir))
    config = SandboxConfig(seed=args.seed, scale=args.scale, rate=args.rate, burst=args.burst)
    _say(f"1. starting a sandbox (scale {args.scale:g}, {args.rate:g} requests/s) ...")
    with SandboxServer(config) as server, home.instance(warehouse, runs_here=True) as instance:
        env = {**server.env(), "CLINICAL_LIMITER_PATH": str(Path(args.dir) / "ratelimit.sqlite")}
        counts = server.store.counts()
        _say("   source: " + ", ".join(f"{n} {c:,}" for n, c in counts.items()))

        def run(title: str, **options: object):
            _say(f"\n{title}")
            with terminal_progress():
                report = sync(
                    env,
                    lake_root=str(lake),
                    warehouse_path=str(warehouse),
                    instance=instance,
                    log_level="WARNING",
                    tags={"clinical-sync/demo": "true"},
                    **options,  # type: ignore[arg-type]
                )
            _say(report.table())
            _say("\n".join(report.check_lines()))
            if not report.success:
                raise RuntimeError(f"demo sync failed: {report.failure}")
            return report

        full = run("2. full sync (every entity set snapshotted) ...", full=True)
        with server.store.lock:
            changes = server.store.advance(seconds=86400)
        changed = {n: c for n, c in changes.items() if any(c.values())}
        _say(
            "\n3. a day passes at the source: "
            + ", ".join(
                f"{n} +{c['inserted']}/~{c['updated']}/-{c['deleted']}" for n, c in changed.items()
            )
        )
        nightly = run(
            "4. nightly sync (exact: the sets without updated_at read whole, their children in\n"
            "   their pages; Appointments and Claims past their watermark; small sets whole) ..."
        )

    ratio = nightly.requests / full.requests if full.requests else 0.0
    _say(f"\n5. requests: full sync {full.requests}, nightly sync {nightly.requests} ({ratio:.0%})")
    _say(
        "   (every run ends equal to the source: the day's inserts, updates and hard deletes of\n"
        "   every set and document, what changed while it read caught up; CLINICAL_NIGHTLY_BUDGET\n"
        "   caps the requests: the stalest sets are read first, the others report their staleness)"
    )
    _say(status_text(warehouse_status(warehouse)))
    with duckdb.connect(str(warehouse), read_only=True) as con:
        _say("\n6. analytics.prescription_claims by category:")
        result = con.execute(ANALYTICS_QUERY)
        names = [d[0] for d in result.description]
        _say(format_table([names, *[[str(v) for v in r] for r in result.fetchall()]]))
    query = TRY_QUERY.format(path=warehouse)
    _say(
        "\nNext:\n"
        "  clinical-sync status     these tables again (it shows the demo's warehouse until a\n"
        "                           sync writes data/warehouse.duckdb)\n"
        f"  a query to try:          {query}\n"
        "  make dev                 the Dagster UI (http://127.0.0.1:3000) against a sandbox;\n"
        "                           the demo's runs: WAREHOUSE_PATH="
        f"{warehouse} make dev\n"
        f"  {warehouse}   the demo's DuckDB file (schemas clinical, analytics, ops)"
    )
    return exit_codes.EXACT if full.exact and nightly.exact else exit_codes.NOT_EXACT


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="sandbox, full sync, changes, nightly sync, summary")
    p.add_argument("--scale", type=float, default=1.0, help="sandbox data scale (1: ~18k rows)")
    p.add_argument("--rate", type=float, default=5.0, help="requests/s (the spec's top plan)")
    p.add_argument("--burst", type=int, default=10, help="requests allowed at once above the rate")
    p.add_argument("--seed", type=int, default=7, help="seed of the sandbox's data (default: 7)")
    p.add_argument("--dir", default=home.DEMO_DIR, help="the demo's own lake and warehouse")
    p.set_defaults(func=demo)
