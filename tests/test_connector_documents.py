"""Documents over real HTTP, and no secret, token or document id in any log or error text."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentError, DocumentsClient
from connectors.clinical_records.errors import AuthenticationError, NotFound, RetryExhausted
from connectors.clinical_records.query import F
from connectors.clinical_records.settings import Settings
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import settings_for

pytestmark = pytest.mark.integration

SECRET = "CLIENTSECRET-zq81xv"
API_KEY = "APIKEY-mm42kw"
PATIENT = "1003"


def test_document_lifecycle(tmp_path: Path) -> None:
    with (
        SandboxServer(SandboxConfig(seed=5, scale=0.05)) as srv,
        ClinicalClient(settings_for(srv, tmp_path)) as client,
    ):
        docs = DocumentsClient(client)
        source = tmp_path / "scan.png"
        content = bytes(range(256)) * 3000  # 768 kB
        source.write_bytes(content)
        meta = docs.upload(PATIENT, source, document_type="referral", description="knee")
        assert meta["file_size_bytes"] == len(content) and meta["content_type"] == "image/png"
        listed = docs.list(PATIENT, filter=F("document_type") == "referral")
        assert meta["id"] in {d["id"] for d in listed}
        assert docs.metadata(PATIENT, meta["id"])["description"] == "knee"
        assert docs.download(PATIENT, meta["id"], tmp_path / "a.png") == len(content)
        assert docs.download_direct(meta["id"], tmp_path / "b.png") == len(content)
        assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes() == content
        docs.delete(PATIENT, meta["id"])
        with pytest.raises(NotFound):
            docs.metadata(PATIENT, meta["id"])
        assert meta["id"] not in {d["id"] for d in docs.list(PATIENT)}


def test_type_and_size_checked_before_sending(tmp_path: Path) -> None:
    with (
        SandboxServer(SandboxConfig(seed=5, scale=0.05)) as srv,
        ClinicalClient(settings_for(srv, tmp_path)) as client,
    ):
        docs = DocumentsClient(client)
        text = tmp_path / "notes.txt"
        text.write_text("hello")
        with pytest.raises(DocumentError, match="not an accepted type"):
            docs.upload(PATIENT, text)
        big = tmp_path / "big.pdf"
        with big.open("wb") as out:
            out.truncate(cat.MAX_UPLOAD_BYTES + 1)
        with pytest.raises(DocumentError, match="limit"):
            docs.upload(PATIENT, big)
        assert client.stats.requests == 0
        with pytest.raises(NotFound) as missing:
            docs.upload("no-such-patient", _pdf(tmp_path))
        assert missing.value.code == "NotFound" and missing.value.entity == "Documents"


def _pdf(tmp_path: Path) -> Path:
    path = tmp_path / "small.pdf"
    path.write_bytes(b"%PDF-1.4 small")
    return path


def test_no_secret_token_or_document_id_in_logs_or_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    config = SandboxConfig(seed=5, scale=0.05, client_secret=SECRET, api_key=API_KEY)
    errors: list[BaseException] = []
    with SandboxServer(config) as srv:
        settings = settings_for(srv, tmp_path, CLINICAL_MAX_ATTEMPTS="3")
        with ClinicalClient(settings) as client:
            docs = DocumentsClient(client)
            source = tmp_path / "letter.pdf"
            source.write_bytes(b"%PDF-1.4 distinctive content 7d1c")
            document_id = docs.upload(PATIENT, source)["id"]
            srv.configure(drop_rate=1.0)  # every connection drops: retried, then given up
            with pytest.raises(RetryExhausted) as dropped:
                docs.metadata(PATIENT, document_id)
            errors.append(dropped.value)
            srv.configure(drop_rate=0.0)
            docs.metadata(PATIENT, document_id)
            docs.download(PATIENT, document_id, tmp_path / "copy.pdf")
            docs.download_direct(document_id, tmp_path / "copy2.pdf")
            list(client.iter_pages(cat.PATIENTS))
            docs.delete(PATIENT, document_id)
            for attempt in (
                lambda: docs.metadata(PATIENT, document_id),
                lambda: docs.download_direct(document_id, tmp_path / "gone.pdf"),
            ):
                try:
                    attempt()
                except NotFound as error:
                    errors.append(error)
            tokens = list(srv.sandbox.tokens._expiry)
        wrong = Settings.from_env(
            {**srv.env(), "CLINICAL_CLIENT_SECRET": SECRET + "-wrong"}, dotenv_path=None
        )
        with ClinicalClient(
            settings_for(srv, tmp_path, CLINICAL_CLIENT_SECRET=wrong.client_secret)
        ) as bad:
            with pytest.raises(AuthenticationError) as refused:
                bad.count(cat.PATIENTS)
            errors.append(refused.value)
    assert "CLINICAL_CLIENT_ID or CLINICAL_CLIENT_SECRET" in str(refused.value)
    assert len(errors) == 4 and tokens
    logging.getLogger().info("%r", settings)
    captured = capsys.readouterr()
    texts = [caplog.text, captured.out, captured.err]
    texts += ["".join(traceback.format_exception(error)) for error in errors]
    texts += [repr(error) for error in errors]
    forbidden = [SECRET, API_KEY, document_id, "distinctive content", "Bearer", *tokens]
    assert "GET Documents status=200" in caplog.text  # the safe line is there
    assert "attempt=3" in caplog.text  # and retries were logged as well
    for text in texts:
        for value in forbidden:
            assert value not in text
