"""Documents against a sandbox: they ride in the patients' pages, the table equals the
sandbox's document truth after uploads and deletes (no per-patient request), the service's
refusals and caps are met by listing per patient, content is held by hash, and no document
id or content reaches a log."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance

from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentsClient
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.runner import sync, sync_documents
from sync.document_content import MANIFEST_TABLE, content_store
from sync.service_memory import DOCUMENTS_REFUSED, MEMORY_FILE
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


def _env(srv: SandboxServer, tmp_path: Path) -> dict[str, str]:
    return {
        **srv.env(),
        "CLINICAL_RATE_LIMIT": "200",
        "CLINICAL_BURST": "50",
        "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
    }


@pytest.mark.e2e
def test_documents_ride_with_patients_and_follow_uploads_and_deletes(tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse.duckdb"
    paths = {"lake_root": str(lake), "warehouse_path": str(warehouse)}
    with SandboxServer(SandboxConfig(seed=5, scale=0.05)) as srv:
        env = _env(srv, tmp_path)
        with DagsterInstance.ephemeral() as instance:
            # 1. the sync: documents in the patients' pages, not one request per patient
            first = sync(env, instance=instance, **paths)
            assert first.success, first.failure
            assert table_rows(warehouse) == truth_rows(srv) and truth_rows(srv)
            assert first.entities["Documents"]["mode"] == "snapshot"
            patients = srv.store.counts()["Patients"]
            assert int(first.entities["Patients"]["requests"]) < patients / 10
            assert int(first.entities["Documents"]["requests"]) == 0

            # 2. content, as the documents_sync job with download_content
            done = sync_documents(env, content=True, instance=instance, **paths)
            assert done.success, done.failure
            assert done.figures["content_downloaded"] == len(truth_rows(srv))

        store = content_store(lake)
        with duckdb.connect(str(warehouse), read_only=True) as con:
            held = con.execute(f'SELECT "document_id", "sha256", "size" FROM {MANIFEST_TABLE}')
            manifest = {doc: (sha, size) for doc, sha, size in held.fetchall()}
        assert set(manifest) == set(truth_rows(srv))
        for sha, size in manifest.values():
            assert store.verify(sha) and store.path_for(sha).stat().st_size == size
            assert store.path_for(sha).stat().st_mode & 0o077 == 0

        # 3. uploads and deletes by anyone: the next run sees them all, deletes marked
        secrets: list[bytes] = []
        with ClinicalClient(settings_for(srv, tmp_path)) as client:
            docs = DocumentsClient(client)
            target = next(iter(truth_rows(srv).values()))[0]
            victims = srv.store.ground_truth()["Documents"][:2]
            for n in range(2):
                source = tmp_path / f"new-{n}.pdf"
                secrets.append(f"%PDF-1.4 secret-{uuid.uuid4().hex}".encode())
                source.write_bytes(secrets[-1])
                docs.upload(target, source, document_type="Referral")
            for victim in victims:
                docs.delete(victim["patient_id"], victim["id"])
        with DagsterInstance.ephemeral() as instance:
            second = sync_documents(env, content=True, instance=instance, **paths)
        assert second.success, second.failure
        assert second.figures["rows_inserted"] == 2 and second.figures["rows_soft_deleted"] == 2
        assert second.figures["content_downloaded"] == 2
        assert table_rows(warehouse) == truth_rows(srv)

        # no document id and no content in any log line, Dagster event or console output
        every_id = {*(v["id"] for v in victims), *manifest, *truth_rows(srv)}
        out, err = capsys.readouterr()
        logged = "\n".join([caplog.text, out, err])
        assert "GET Patients" in logged  # the scan sees the request log lines
        assert not [d for d in every_id if d in logged]
        assert not [s for s in secrets if s.decode() in logged]


@pytest.mark.e2e
@pytest.mark.parametrize("switch", ["expand_cap", "refuse_document_expand"])
def test_a_service_that_caps_or_refuses_expansion_is_met_per_patient(switch, tmp_path, caplog):
    """Nested collections cut at 3, or `$expand=Documents` refused with the spec's 400: the
    same exact tables, more requests, the reason logged; a refusal is remembered."""
    caplog.set_level(logging.INFO)
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse.duckdb"
    paths = {"lake_root": str(lake), "warehouse_path": str(warehouse)}
    with SandboxServer(SandboxConfig(seed=5, scale=0.05)) as srv:
        srv.configure(**{switch: 3 if switch == "expand_cap" else True})
        env = _env(srv, tmp_path)
        with DagsterInstance.ephemeral() as instance:
            report = sync(env, instance=instance, log_level="INFO", **paths)
            assert report.success, report.failure
            assert table_rows(warehouse) == truth_rows(srv) and truth_rows(srv)
            truth = srv.store.ground_truth()
            for name in ("Appointments", "Claims", "InsuranceVerifications"):
                table = (
                    name.lower() if name != "InsuranceVerifications" else "insurance_verifications"
                )
                with duckdb.connect(str(warehouse), read_only=True) as con:
                    (live,) = con.execute(
                        f'SELECT count(*) FROM "clinical"."{table}" WHERE "_deleted_at" IS NULL'
                    ).fetchone()
                assert live == len(truth[name]), name
            patients = srv.store.counts()["Patients"]
            spent = {n: int(float(f["requests"])) for n, f in report.entities.items()}
            if switch == "refuse_document_expand":  # one request per patient, and remembered
                assert spent["Documents"] >= patients, spent
                memory = lake / MEMORY_FILE
                assert DOCUMENTS_REFUSED in memory.read_text()
                assert memory.stat().st_mode & 0o077 == 0
                again = sync(env, instance=instance, log_level="INFO", **paths)
                assert again.success and table_rows(warehouse) == truth_rows(srv)
                refused = srv.stats().get("status_400", 0)
                assert refused == 1, srv.stats()  # asked once, not again
            else:  # more parents cut short than pages in the set: the set is read alone
                crowded = Counter(a["patient_id"] for a in truth["Appointments"])
                short = sum(1 for n in crowded.values() if n > 3)
                pages = -(-len(truth["Appointments"]) // 100)
                assert short > pages and spent["Appointments"] < short, (short, spent)


@pytest.mark.reliability
def test_faults_lose_nothing_and_keep_no_partial_content(tmp_path):
    """500s, dropped connections and 429s while reading and downloading: the same table."""
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse.duckdb"
    paths = {"lake_root": str(lake), "warehouse_path": str(warehouse)}
    with SandboxServer(SandboxConfig(seed=3, scale=0.05)) as srv:
        env = _env(srv, tmp_path)
        srv.configure(error_rate=0.1, drop_rate=0.03, throttle_rate=0.03)
        with DagsterInstance.ephemeral() as instance:
            report = sync_documents(
                env, content=True, instance=instance, log_level="WARNING", **paths
            )
        assert report.success, report.failure
        injected = sum(v for k, v in srv.stats().items() if k.startswith("injected_"))
        assert injected > 0
        assert table_rows(warehouse) == truth_rows(srv)
        assert report.figures["content_downloaded"] == len(truth_rows(srv))
    store = content_store(lake)
    assert list((store.root / "_tmp").iterdir()) == []
    with duckdb.connect(str(warehouse), read_only=True) as con:
        shas = [r[0] for r in con.execute(f'SELECT "sha256" FROM {MANIFEST_TABLE}').fetchall()]
    assert shas and all(store.verify(sha) for sha in shas)


@pytest.mark.e2e
def test_content_is_asked_of_the_patient_as_the_service_names_it(tmp_path):
    """A patient "00123": its document's content is `/Patients(00123)/Documents(..)/$value`,
    not `/Patients(123)/...`, which names no patient (or another one)."""
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse.duckdb"
    paths = {"lake_root": str(lake), "warehouse_path": str(warehouse)}
    with SandboxServer(SandboxConfig(seed=5, scale=0.02)) as srv:
        template = srv.store.ground_truth()["Patients"][0]
        srv.control().plant("Patients", {**template, "id": "00123"})
        source = tmp_path / "zeros.pdf"
        source.write_bytes(b"%PDF-1.4 a patient whose id has leading zeros")
        with ClinicalClient(settings_for(srv, tmp_path)) as client:
            uploaded = DocumentsClient(client).upload("00123", source)
        with DagsterInstance.ephemeral() as instance:
            done = sync_documents(
                _env(srv, tmp_path), content=True, instance=instance, log_level="WARNING", **paths
            )
        assert done.success, done.failure
        assert done.figures["content_missing"] == 0
        assert done.figures["content_downloaded"] == len(truth_rows(srv))
        assert table_rows(warehouse)[uploaded["id"]][0] == "00123"
        assert table_rows(warehouse) == truth_rows(srv)
    with duckdb.connect(str(warehouse), read_only=True) as con:
        (sha,) = con.execute(
            f'SELECT "sha256" FROM {MANIFEST_TABLE} WHERE "document_id" = ?', [uploaded["id"]]
        ).fetchone()
    assert content_store(lake).path_for(sha).read_bytes() == source.read_bytes()
