"""The document content store: hashed, verified, atomic, private, written once."""

from __future__ import annotations

import hashlib
import stat

import pytest

from warehouse.content_store import ContentMismatch, ContentStore


def chunks(data: bytes, size: int = 7):
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_stores_by_hash_privately_and_once(tmp_path):
    store = ContentStore(tmp_path / "documents")
    data = b"%PDF-1.4 a scanned prescription\n" * 100
    first = store.put(chunks(data), expected_size=len(data))
    assert first.sha256 == hashlib.sha256(data).hexdigest()
    assert first.path.read_bytes() == data
    assert first.written and store.holds(first.sha256) and store.verify(first.sha256)
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    again = store.put(chunks(data), expected_size=len(data))
    assert not again.written and again.path == first.path
    assert list((tmp_path / "documents" / "_tmp").iterdir()) == []


def test_a_short_download_keeps_nothing(tmp_path):
    store = ContentStore(tmp_path)
    with pytest.raises(ContentMismatch, match="received 5 bytes where the metadata states 9"):
        store.put(chunks(b"12345"), expected_size=9)
    assert not (tmp_path / "sha256").exists()
    assert list((tmp_path / "_tmp").iterdir()) == []


def test_a_broken_stream_leaves_no_partial_file(tmp_path):
    store = ContentStore(tmp_path)

    def failing():
        yield b"part of a file"
        raise ConnectionError("dropped")

    with pytest.raises(ConnectionError):
        store.put(failing(), expected_size=100)
    assert list((tmp_path / "_tmp").iterdir()) == []
    assert not (tmp_path / "sha256").exists()


def test_verify_finds_a_tampered_file(tmp_path):
    store = ContentStore(tmp_path)
    held = store.put([b"original"], expected_size=None)
    held.path.chmod(0o600)
    held.path.write_bytes(b"changed!")
    assert not store.verify(held.sha256)
