"""What the documents sync's budget plan promises and what a run spends.

The sandbox (its own process) allows 5 requests/s and answers each request in 200 ms; the
Patients are synced first, then the documents sync runs twice: a first (full) listing of
every patient, then an ordinary night after 10 patients were noted by `clinical-sync
documents`. Each run logs its expected requests and duration before starting.

Run: .venv/bin/python benchmarks/documents_listing.py [--scale 0.25] [--rate 5] [--latency 0.2]
Target: requests spent within 2 % of the plan; duration within 15 % of requests / rate.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dagster import DagsterInstance

from benchmarks.common import add_sandbox_options, limited_sandbox, record
from connectors.clinical_records.settings import Settings
from pipelines.documents import DocumentsReport, note_patient, sync_documents
from pipelines.documents_plan import DocumentsOptions
from pipelines.runner import sync


def figures(report: DocumentsReport, rate: float) -> dict[str, object]:
    return {
        "mode": report.mode,
        "patients_listed": report.patients_listed,
        "requests_expected": report.requests_expected,
        "requests_spent": report.requests_spent,
        "seconds_expected": report.seconds_expected,
        "seconds": report.seconds,
        "rate_utilisation": round(report.requests_spent / report.seconds / rate, 3)
        if report.seconds
        else 0.0,
        "documents_seen": report.documents_seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sandbox_options(parser, scale=0.25, latency=0.2)
    args = parser.parse_args()
    with limited_sandbox(args) as (env, tmp):
        lake, warehouse = tmp / "lake", tmp / "warehouse.duckdb"
        with DagsterInstance.ephemeral() as instance:
            sync(
                env,
                lake_root=str(lake),
                warehouse_path=str(warehouse),
                only=["Patients"],
                instance=instance,
                log_level="WARNING",
            )
        settings = Settings.from_env(env, dotenv_path=None)
        first = sync_documents(
            settings, lake_root=lake, warehouse_path=warehouse, run_id=uuid.uuid4().hex
        )
        for patient in range(1000, 1010):
            note_patient(lake, str(patient))
        night = sync_documents(
            settings,
            lake_root=lake,
            warehouse_path=warehouse,
            run_id=uuid.uuid4().hex,
            options=DocumentsOptions(),
        )
    results = {"first": figures(first, args.rate), "night": figures(night, args.rate)}
    for name, values in results.items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in values.items()))
    record("documents_listing", {"args": vars(args), **results})


if __name__ == "__main__":
    main()
