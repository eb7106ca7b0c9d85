"""A content-addressed store for patient document files, under the lake.

A file is streamed to a private temporary name while its sha256 is computed, checked against
the size the service's metadata states, then linked into place under its hash: a file
already held is never written twice, a partial download is never mistaken for a file, and
nobody but the owner can read one. Paths hold hashes only, never a document id.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from warehouse.private import PRIVATE_DIR, PRIVATE_FILE, private_dir

__all__ = ["PRIVATE_DIR", "PRIVATE_FILE", "ContentMismatch", "ContentStore", "StoredContent"]


class ContentMismatch(ValueError):
    """The bytes received are not the document the metadata describes."""


@dataclass(frozen=True)
class StoredContent:
    sha256: str
    size: int
    path: Path
    written: bool  # False when the same bytes were already held


class ContentStore:
    """Files by sha256 under `<root>/sha256/<2 hex>/<64 hex>`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def holds(self, sha256: str | None) -> bool:
        return bool(sha256) and self.path_for(sha256).is_file()

    def put(self, chunks: Iterable[bytes], *, expected_size: int | None) -> StoredContent:
        """Stream `chunks` in; raise ContentMismatch (and keep nothing) if the size is wrong."""
        tmp_dir = self.root / "_tmp"
        private_dir(tmp_dir)
        tmp = tmp_dir / f"{uuid.uuid4().hex}.part"
        digest = hashlib.sha256()
        size = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if expected_size is not None and size != expected_size:
                raise ContentMismatch(
                    f"received {size} bytes where the metadata states {expected_size}"
                )
            sha256 = digest.hexdigest()
            final = self.path_for(sha256)
            private_dir(final.parent)
            try:
                os.link(tmp, final)  # atomic, and refuses to replace a file already held
                written = True
            except FileExistsError:
                written = False
            return StoredContent(sha256, size, final, written)
        finally:
            tmp.unlink(missing_ok=True)

    def scratch(self) -> Path:
        """A fresh name in the store's private `_tmp/` for a download in progress: the
        connector streams there, then `put_file` adopts it (nobody else can read it meanwhile)."""
        tmp_dir = private_dir(self.root / "_tmp")
        return tmp_dir / f"{uuid.uuid4().hex}.download"

    def put_file(self, path: Path, *, expected_size: int | None) -> StoredContent:
        """Store a downloaded file by its hash (as `put`), then remove the download."""
        try:
            with path.open("rb") as held:
                return self.put(iter(lambda: held.read(1 << 20), b""), expected_size=expected_size)
        finally:
            path.unlink(missing_ok=True)

    def verify(self, sha256: str) -> bool:
        """Re-hash a held file: true when its bytes still match its name."""
        digest = hashlib.sha256()
        with self.path_for(sha256).open("rb") as held:
            for block in iter(lambda: held.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest() == sha256
