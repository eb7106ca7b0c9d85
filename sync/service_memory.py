"""What the extraction learnt about the service and keeps across runs: whether it refuses
to expand Documents (spec 4.2 allows `$expand` but says nothing of contained collections),
and whether it refuses `or` in `$filter` (spec 4.2 lists eq, gt, ge, lt, le, and as the
operators seen; sync/orphans.py).

Learnt once and remembered in the lake (`_service.json`, owner-only), so that a service that
refuses costs one failed request per `retry_after`, not one per run; after that it is tried
again, because a service may start to allow it.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from warehouse.private import create_private, private_dir

MEMORY_FILE = "_service.json"
DOCUMENTS_REFUSED = "documents_expand_refused_at"
FILTER_OR_REFUSED = "filter_or_refused_at"


class ServiceMemory:
    def __init__(self, root: str | os.PathLike[str], retry_after: timedelta) -> None:
        self.path = Path(root) / MEMORY_FILE
        self.retry_after = retry_after

    def _read(self) -> dict[str, str]:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}

    def _write(self, values: dict[str, str]) -> None:
        private_dir(self.path.parent)
        tmp = self.path.with_name(f".{MEMORY_FILE}.{uuid.uuid4().hex}")
        with os.fdopen(create_private(tmp), "w", encoding="utf-8") as out:
            out.write(json.dumps(values))
        os.replace(tmp, self.path)

    def refuses(self, what: str, now: datetime | None = None) -> bool:
        """`what` (DOCUMENTS_REFUSED, FILTER_OR_REFUSED) was refused within `retry_after`:
        take the fallback without asking again."""
        refused = self._read().get(what)
        if refused is None:
            return False
        return (now or datetime.now(UTC)) - datetime.fromisoformat(refused) < self.retry_after

    def refuse(self, what: str) -> None:
        self._write({**self._read(), what: datetime.now(UTC).isoformat()})

    def accepted(self, what: str) -> None:
        values = self._read()
        if values.pop(what, None) is not None:
            self._write(values)
