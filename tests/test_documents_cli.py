"""`clinical-sync documents` against a sandbox: every accepted type, the checks before sending,
the service's refusals as messages and exit codes, and a file that round-trips."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from cli.main import main
from connectors.clinical_records.catalogue import ACCEPTED_DOCUMENT_TYPES, MAX_UPLOAD_BYTES
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client
from warehouse.publish import working_path

pytestmark = pytest.mark.integration

PATIENT = "1003"
SUFFIX = {"DOCX": "docx", "JPEG": "jpg"}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with SandboxServer(SandboxConfig(seed=5, scale=0.05)) as srv:
        monkeypatch.chdir(tmp_path)  # no stray .env
        for name, value in srv.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("CLINICAL_RATE_LIMIT", "200")
        monkeypatch.setenv("CLINICAL_BURST", "50")
        monkeypatch.setenv("CLINICAL_LIMITER_PATH", str(tmp_path / "ratelimit.sqlite"))
        monkeypatch.setenv("LAKE_ROOT", str(tmp_path / "lake"))
        yield srv


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["documents", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_each_accepted_type_round_trips_and_delete_then_404(server, tmp_path, capsys):
    uploaded: dict[str, tuple[str, bytes]] = {}
    for mime, label in ACCEPTED_DOCUMENT_TYPES.items():
        source = tmp_path / f"scan.{SUFFIX.get(label, label.lower())}"
        content = f"{label} bytes of a scan ".encode() * 500
        source.write_bytes(content)
        code, out, _ = run(capsys, "upload", PATIENT, str(source), "--type", label)
        assert code == 0, out
        assert mime in out and f"{len(content)} bytes" in out
        uploaded[mime] = (out.split()[1].rstrip(":"), content)

    code, out, _ = run(capsys, "list", PATIENT)
    assert code == 0 and all(doc in out for doc, _ in uploaded.values())
    code, out, _ = run(capsys, "list", PATIENT, "--type", "PDF")
    assert uploaded["application/pdf"][0] in out and uploaded["image/png"][0] not in out

    with api_client(server) as http:
        for mime, (doc, content) in uploaded.items():
            target = tmp_path / f"back-{doc}"
            code, out, _ = run(capsys, "download", PATIENT, doc, "--output", str(target))
            assert code == 0 and f"({mime})" in out
            assert target.read_bytes() == content
            assert target.stat().st_mode & 0o077 == 0
            served = http.get(f"Patients({PATIENT})/Documents({doc})/$value")
            assert served.headers["content-type"].split(";")[0] == mime

    doc, _ = uploaded["image/png"]
    assert run(capsys, "delete", PATIENT, doc)[0] == 0
    code, _, err = run(capsys, "download", PATIENT, doc, "--output", str(tmp_path / "gone"))
    assert code == 1 and "not found (404)" in err
    code, _, err = run(capsys, "delete", PATIENT, doc)
    assert code == 1 and "404" in err
    assert not (tmp_path / "gone").exists()


def test_refused_before_sending_and_by_the_service(server, tmp_path, capsys):
    assert run(capsys, "list", PATIENT)[0] == 0
    before = server.stats()["requests"]
    text = tmp_path / "notes.txt"
    text.write_text("not a document")
    code, _, err = run(capsys, "upload", PATIENT, str(text))
    assert code == 1 and "not sent" in err and "not an accepted type" in err
    big = tmp_path / "huge.pdf"
    with big.open("wb") as out:
        out.truncate(MAX_UPLOAD_BYTES + 1)
    code, _, err = run(capsys, "upload", PATIENT, str(big))
    assert code == 1 and "not sent" in err and str(MAX_UPLOAD_BYTES) in err
    assert server.stats()["requests"] == before  # nothing reached the service

    # a declared type is checked too; an unknown patient is the service's 404
    fake = tmp_path / "fake.pdf"
    fake.write_bytes(b"plain text")
    code, _, err = run(capsys, "upload", PATIENT, str(fake), "--content-type", "text/plain")
    assert code == 1 and "not sent" in err  # our check first
    code, _, err = run(capsys, "upload", "99999999", str(fake))
    assert code == 1 and "not found (404)" in err
    code, _, err = run(capsys, "list", PATIENT, "--since", "yesterday")
    assert code == 2 and "--since" in err
    code, _, err = run(capsys, "upload", PATIENT, str(tmp_path / "missing.pdf"))
    assert code == 2 and "no file" in err


def test_configuration_error_exits_2(server, monkeypatch, capsys):
    monkeypatch.delenv("CLINICAL_API_KEY")
    code, _, err = run(capsys, "list", PATIENT)
    assert code == 2 and "CLINICAL_API_KEY" in err


def test_documents_sync_lists_every_document_into_the_warehouse(
    server, tmp_path, capsys, monkeypatch
):
    warehouse = tmp_path / "wh.duckdb"
    monkeypatch.setenv("WAREHOUSE_PATH", str(warehouse))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    source = tmp_path / "card.pdf"
    source.write_bytes(b"%PDF-1.4 insurance card " * 100)
    code, out, _ = run(capsys, "upload", PATIENT, str(source), "--type", "Insurance")
    assert code == 0, out

    assert main(["sync", "--only", "Patients"]) == 0  # documents are listed per known patient
    capsys.readouterr()
    code, out, err = run(capsys, "sync", "--full")
    assert code == 0, err
    assert "requests" in out and "run " in out

    truth = {d["id"] for d in server.store.ground_truth()["Documents"]}
    with duckdb.connect(str(warehouse), read_only=True) as con:
        held = {
            row[0]
            for row in con.execute(
                'SELECT "id" FROM "clinical"."patient_documents" WHERE "_deleted_at" IS NULL'
            ).fetchall()
        }
    assert held == truth and len(truth) > 1
    assert not any(doc in out + err for doc in truth)  # ids are data, not log lines

    listed = out.split("run ")[-1].strip()
    with duckdb.connect(str(warehouse), read_only=True) as con:
        (row,) = con.execute(
            'SELECT "status", "entities", "fetched" FROM "ops"."sync_runs" WHERE "run_id" = ?',
            [listed],
        ).fetchall()
    assert row == ("success", ["Documents"], len(truth))

    monkeypatch.setenv("CLINICAL_CLIENT_SECRET", "not-the-secret-5c2d")
    code, _, err = run(capsys, "sync", "--full")
    assert code == 1 and "invalid_client" in err
    with duckdb.connect(str(working_path(warehouse)), read_only=True) as con:  # unpublished
        runs = con.execute('SELECT "status", "message" FROM "ops"."sync_runs"').fetchall()
    failed = [message for status, message in runs if status == "failed"]
    assert len(failed) == 1 and "invalid_client" in failed[0]
    assert "not-the-secret-5c2d" not in failed[0] + err
