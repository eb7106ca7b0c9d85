"""Case 6: no secret, token, API key, document content or document-id URL in anything a run
leaves behind; plain http refused off loopback; TLS through a private CA."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from connectors.clinical_records.catalogue import entity
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import ConfigError, UntrustedCertificate
from connectors.clinical_records.settings import Settings
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import record_tokens
from tests.reliability.conftest import (
    Target,
    assert_matches,
    compare,
    sandbox_config,
)
from tests.test_pipelines_resources import sqlite_values

pytestmark = pytest.mark.reliability

# A document id inside a URL path: `Documents(<id>)`, `Documents('<id>')`, `/document/<id>`.
DOCUMENT_URL = re.compile(rb"Documents\(\s*'?doc-|/document/doc-")


def readable_forms(path: Path) -> Iterator[bytes]:
    """A file's bytes, and for compressed formats its decoded values and metadata."""
    yield path.read_bytes()
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        yield repr(table.schema.metadata).encode()
        yield json.dumps(table.to_pylist(), default=str).encode()
    if path.suffix == ".db":  # Dagster's SQLite storage: run snapshots are compressed
        yield from sqlite_values(path)
    if path.suffix == ".duckdb":
        with duckdb.connect(str(path), read_only=True) as con:
            for schema, table in con.execute(
                "SELECT table_schema, table_name FROM information_schema.tables"
            ).fetchall():
                rows = con.execute(f'SELECT * FROM "{schema}"."{table}"').fetchall()
                yield repr(rows).encode()
            comments = con.execute("SELECT comment FROM duckdb_columns()").fetchall()
            yield repr(comments).encode()


def leaks(blobs: dict[str, bytes], needles: dict[str, bytes]) -> list[str]:
    found = []
    for where, blob in blobs.items():
        for name, needle in needles.items():
            if needle in blob:
                found.append(f"{name} in {where}")
        if DOCUMENT_URL.search(blob):
            found.append(f"a document-id URL in {where}")
    return found


def test_a_run_leaves_no_secret_token_or_document(tmp_path, ledger):
    secret = f"CLSECRET-{secrets.token_hex(12)}"
    api_key = f"APIKEY-{secrets.token_hex(12)}"
    wrong = f"WRONGSECRET-{secrets.token_hex(12)}"
    marker = f"PHI-CONTENT-{secrets.token_hex(12)}".encode()
    config = sandbox_config(seed=67, client_secret=secret, api_key=api_key, token_lifetime=4)
    with SandboxServer(config) as server:
        tokens = record_tokens(server)
        target = Target(server, tmp_path / "target")
        target.root.mkdir(parents=True)
        outputs: dict[str, bytes] = {}

        def run(name: str, *args: str, env: dict[str, str] | None = None):
            target.extra_env = env or {}
            done = target.run(*args)
            outputs[f"{name} stdout"] = done.stdout.encode()
            outputs[f"{name} stderr"] = done.stderr.encode()
            return done

        # Documents: one of ours with distinctive content, through the operator's commands.
        patient = str(server.store.table("Patients").rows[0]["id"])
        upload = tmp_path / "scan.pdf"
        upload.write_bytes(b"%PDF-1.4\n" + marker + b"\n%%EOF\n")
        assert run("upload", "documents", "upload", patient, str(upload)).returncode == 0
        docs = server.store.documents.all()
        ours = next(d for d in docs if d["patient_id"] == patient and d["file_name"] == "scan.pdf")
        saved = tmp_path / "downloaded.pdf"  # what the operator asked for: not scanned
        got = run("download", "documents", "download", patient, ours["id"], "--output", str(saved))
        assert got.returncode == 0 and saved.read_bytes() == upload.read_bytes()

        # A full sync with tokens dying every 4 s, then runs that fail on bad credentials.
        assert run("sync", "sync", "--full").returncode == 0, outputs["sync stderr"]
        for name, variable in (
            ("bad-secret", "CLINICAL_CLIENT_SECRET"),
            ("bad-key", "CLINICAL_API_KEY"),
        ):
            refused = run(name, "sync", "--only", "Branches", env={variable: wrong})
            assert refused.returncode != 0, name
        target.extra_env = {}
        assert_matches(compare(target, entities=[entity("Branches"), entity("Claims")]), ledger)

        needles = {
            "client secret": secret.encode(),
            "API key": api_key.encode(),
            "wrong secret": wrong.encode(),
            "document content": marker,
            **{f"token {t[:6]}...": t.encode() for t in tokens},
            **{
                f"content of seeded document {d['file_name']}": data
                for d in docs
                if (data := server.store.documents.content.get(d["id"])) and len(data) >= 24
            },
        }
        assert len(tokens) >= 2
        files = [p for p in target.root.rglob("*") if p.is_file()]
        assert any(p.suffix == ".parquet" for p in files)
        assert any(p.suffix == ".duckdb" for p in files)
        assert any("dagster" in p.parts[-2] or "storage" in p.parts for p in files)
        blobs = dict(outputs)
        for path in files:
            for n, form in enumerate(readable_forms(path)):
                blobs[f"{path.relative_to(target.root)}#{n}"] = form
        found = leaks(blobs, needles)
        ledger.secrets_found += len(found)
        assert not found, found


def test_plain_http_off_loopback_is_refused(tmp_path):
    values = {
        "CLINICAL_API_BASE_URL": "http://records.example.org/api",
        "CLINICAL_AUTH_URL": "https://auth.example.org",
        "CLINICAL_CLIENT_ID": "c",
        "CLINICAL_CLIENT_SECRET": "s3cret-value",
        "CLINICAL_API_KEY": "k3y-value",
        "CLINICAL_CUSTOMER": "demo",
    }
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(values, dotenv_path=None)
    assert refused.value.variable == "CLINICAL_API_BASE_URL"
    for host in ("http://127.0.0.1:9/api", "http://localhost:9/api"):
        Settings.from_env({**values, "CLINICAL_API_BASE_URL": host}, dotenv_path=None)
    with pytest.raises(ConfigError) as auth:
        Settings.from_env(
            {
                **values,
                "CLINICAL_API_BASE_URL": "https://records.example.org/api",
                "CLINICAL_AUTH_URL": "http://10.0.0.8",
            },
            dotenv_path=None,
        )
    assert auth.value.variable == "CLINICAL_AUTH_URL"
    assert "s3cret" not in str(refused.value) and "k3y" not in str(auth.value)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def private_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signed: (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (
        folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
            "-out", str(ca), "-days", "2", "-subj", "/CN=clinical-sync test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return ca, cert, key


def test_tls_with_a_private_ca_through_clinical_ca_bundle(tmp_path, ledger):
    ca, cert, key = private_ca(tmp_path)
    config = sandbox_config(seed=71)
    with SandboxServer(config, ssl_certfile=str(cert), ssl_keyfile=str(key)) as server:
        assert server.base_url.startswith("https://")
        target = Target(server, tmp_path / "target", extra_env={"CLINICAL_CA_BUNDLE": str(ca)})
        target.root.mkdir(parents=True)
        target.sync("--only", "Branches")
        assert_matches(compare(target, entities=[entity("Branches")]), ledger)

        # Without the CA the same server is not trusted: not a byte of data is read.
        env = {**target.env(), "CLINICAL_MAX_ATTEMPTS": "1"}
        env.pop("CLINICAL_CA_BUNDLE")
        served = server.stats().get("requests", 0)
        settings = Settings.from_env(env, dotenv_path=None)
        started = time.monotonic()
        with ClinicalClient(settings) as client, pytest.raises(UntrustedCertificate) as refused:
            client.count(entity("Branches"))
        assert "CLINICAL_CA_BUNDLE" in str(refused.value)
        assert time.monotonic() - started < 5  # refused at once: no retries against a bad cert
        assert server.stats().get("requests", 0) == served
