"""The documents sync against a sandbox: the table equals the sandbox's document truth after
uploads and deletes, the budget plan lists only whom it must, content is held by hash, and
no document id or content reaches a log."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance, materialize

from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentsClient
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.assets import build_publish_asset
from pipelines.documents import note_patient, sync_documents
from pipelines.documents_asset import patient_documents
from pipelines.documents_content import MANIFEST_TABLE, content_store
from pipelines.documents_plan import DocumentsOptions, DocumentsState, plan_listing
from pipelines.runner import resources_from_env, sync
from tests.connector_helpers import settings_for

COMPARED = ("file_name", "content_type", "file_size_bytes", "document_type", "description")


def table_rows(warehouse: Path) -> dict[str, tuple]:
    with duckdb.connect(str(warehouse), read_only=True) as con:
        rows = con.execute(
            'SELECT "id", CAST("patient_id" AS VARCHAR), CAST("uploaded_by_id" AS VARCHAR), '
            '"uploaded_at", ' + ", ".join(f'"{c}"' for c in COMPARED) + " "
            'FROM "clinical"."patient_documents" WHERE "_deleted_at" IS NULL'
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3].astimezone(UTC), *r[4:]) for r in rows}


def truth_rows(server: SandboxServer) -> dict[str, tuple]:
    def when(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return {
        d["id"]: (
            d["patient_id"],
            d["uploaded_by_id"],
            when(d["uploaded_at"]),
            *(d[c] for c in COMPARED),
        )
        for d in server.store.ground_truth()["Documents"]
    }


@pytest.mark.e2e
def test_table_follows_uploads_and_deletes(tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse.duckdb"
    with SandboxServer(SandboxConfig(seed=5, scale=0.05)) as srv:
        env = {
            **srv.env(),
            "CLINICAL_RATE_LIMIT": "200",
            "CLINICAL_BURST": "50",
            "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
        }
        settings = settings_for(srv, tmp_path)
        with DagsterInstance.ephemeral() as instance:
            patients = sync(
                env,
                lake_root=str(lake),
                warehouse_path=str(warehouse),
                only=["Patients"],
                instance=instance,
            )
            assert patients.success
            # 1. the asset: a first, full listing, with content
            done = materialize(  # as the documents_sync job: the asset, then the publication
                [patient_documents, build_publish_asset([patient_documents])],
                resources=resources_from_env(env, str(lake), str(warehouse)),
                instance=instance,
                run_config={
                    "ops": {"clinical__patient_documents": {"config": {"download_content": True}}}
                },
            )
        assert done.success
        meta = done.asset_materializations_for_node("clinical__patient_documents")[0].metadata
        patient_count = srv.store.counts()["Patients"]
        assert meta["mode"].value == "full"
        assert meta["patients_listed"].value == meta["requests_expected"].value == patient_count
        assert meta["requests_spent"].value == patient_count  # one page per patient, no faults
        assert meta["content_requests"].value == len(truth_rows(srv))
        assert table_rows(warehouse) == truth_rows(srv) and truth_rows(srv)

        # content: every live document held once, by hash, matching its size
        store = content_store(lake)
        with duckdb.connect(str(warehouse), read_only=True) as con:
            held = con.execute(f'SELECT "document_id", "sha256", "size" FROM {MANIFEST_TABLE}')
            manifest = {doc: (sha, size) for doc, sha, size in held.fetchall()}
        assert set(manifest) == set(truth_rows(srv))
        for sha, size in manifest.values():
            assert store.verify(sha) and store.path_for(sha).stat().st_size == size
            assert store.path_for(sha).stat().st_mode & 0o077 == 0
        assert meta["content_downloaded_bytes"].value == sum(s for _, s in manifest.values())

        # 2. our uploads and deletes (noted): the next ordinary run lists just those patients
        secrets: list[bytes] = []
        with ClinicalClient(settings) as client:
            docs = DocumentsClient(client)
            target = next(iter(truth_rows(srv).values()))[0]
            victim = next(d for d in srv.store.ground_truth()["Documents"])
            for n in range(2):
                source = tmp_path / f"new-{n}.pdf"
                secrets.append(f"%PDF-1.4 secret-{uuid.uuid4().hex}".encode())
                source.write_bytes(secrets[-1])
                docs.upload(target, source, document_type="Referral")
            docs.delete(victim["patient_id"], victim["id"])
            note_patient(lake, target)
            note_patient(lake, victim["patient_id"])
            second = sync_documents(
                settings,
                lake_root=lake,
                warehouse_path=warehouse,
                run_id=uuid.uuid4().hex,
                options=DocumentsOptions(download_content=True),
            )
            assert second.mode == "incremental"
            assert (
                second.patients_listed
                == second.requests_expected
                == second.requests_spent
                == len({target, victim["patient_id"]})
            )
            assert second.documents_new == 2 and second.documents_deleted == 1
            assert second.content is not None and second.content.downloaded == 2
            assert table_rows(warehouse) == truth_rows(srv)

            # 3. a delete nobody noted: invisible to an ordinary night, marked by the full listing
            other = next(
                d for d in srv.store.ground_truth()["Documents"] if d["patient_id"] != target
            )
            docs.delete(other["patient_id"], other["id"])
        quiet = sync_documents(
            settings, lake_root=lake, warehouse_path=warehouse, run_id=uuid.uuid4().hex
        )
        assert quiet.patients_listed == 0 and quiet.requests_spent == 0
        assert other["id"] in table_rows(warehouse)
        full = sync_documents(
            settings,
            lake_root=lake,
            warehouse_path=warehouse,
            run_id=uuid.uuid4().hex,
            options=DocumentsOptions(full=True),
        )
        assert full.mode == "full" and full.documents_deleted == 1
        assert table_rows(warehouse) == truth_rows(srv)
        with duckdb.connect(str(warehouse), read_only=True) as con:
            (marked,) = con.execute(
                'SELECT count(*) FROM "clinical"."patient_documents" '
                'WHERE "_deleted_at" IS NOT NULL'
            ).fetchone()
        assert marked == 2

        # no document id and no content in any log line, Dagster event or console output
        every_id = {victim["id"], other["id"], *manifest, *truth_rows(srv)}
        out, err = capsys.readouterr()
        events = " ".join(str(e.message) for e in done.all_events)
        logged = "\n".join([caplog.text, out, err, events])
        assert "GET Documents" in logged  # the scan sees the request log lines
        assert not [d for d in every_id if d in logged]
        assert not [s for s in secrets if s.decode() in logged]


def test_plan_lists_changed_and_noted_patients_and_goes_full_on_cadence():
    now = datetime(2026, 11, 23, tzinfo=UTC)
    state = DocumentsState(
        live_patients=frozenset({"1", "2", "3", "4"}),
        changed_patients=frozenset({"2", "3"}),
        newest_upload={"3": now - timedelta(days=3), "9": now - timedelta(days=9)},
        with_documents=frozenset({"3", "9"}),
        patients_mark="2026-11-22T00:00:00+00:00",
        last_full_at=now - timedelta(days=2),
    )
    nightly = plan_listing(state, DocumentsOptions(), {"4"}, now)
    assert not nightly.full
    assert nightly.whole == ("2", "4") and nightly.since == {"3": now - timedelta(days=3)}
    assert nightly.expected_requests == 3 and nightly.expected_seconds(2.0) == 1.5
    due = plan_listing(state, DocumentsOptions(full_every=timedelta(days=1)), set(), now)
    assert due.full and due.whole == ("1", "2", "3", "4", "9") and "due" in due.reason
    asked = plan_listing(state, DocumentsOptions(full=True), set(), now)
    assert asked.full and asked.reason == "full listing requested"
    first = plan_listing(DocumentsState(), DocumentsOptions(), {"5"}, now)
    assert first.full and first.whole == ("5",) and first.reason == "first listing"


@pytest.mark.reliability
def test_faults_lose_nothing_and_keep_no_partial_content(tmp_path):
    """500s, dropped connections and 429s while listing and downloading: the same table."""
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse.duckdb"
    with SandboxServer(SandboxConfig(seed=3, scale=0.05)) as srv:
        env = {
            **srv.env(),
            "CLINICAL_RATE_LIMIT": "200",
            "CLINICAL_BURST": "50",
            "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
        }
        with DagsterInstance.ephemeral() as instance:
            assert sync(
                env,
                lake_root=str(lake),
                warehouse_path=str(warehouse),
                only=["Patients"],
                instance=instance,
                log_level="WARNING",
            ).success
        srv.configure(error_rate=0.1, drop_rate=0.03, throttle_rate=0.03)
        report = sync_documents(
            settings_for(srv, tmp_path),
            lake_root=lake,
            warehouse_path=warehouse,
            run_id=uuid.uuid4().hex,
            options=DocumentsOptions(download_content=True),
        )
        injected = sum(v for k, v in srv.stats().items() if k.startswith("injected_"))
        assert injected > 0 and report.requests_spent > report.requests_expected
        assert table_rows(warehouse) == truth_rows(srv)
        assert report.content is not None
        assert report.content.downloaded == len(truth_rows(srv)) == report.live_documents
    store = content_store(lake)
    assert list((store.root / "_tmp").iterdir()) == []
    with duckdb.connect(str(warehouse), read_only=True) as con:
        shas = [r[0] for r in con.execute(f'SELECT "sha256" FROM {MANIFEST_TABLE}').fetchall()]
    assert shas and all(store.verify(sha) for sha in shas)
