"""A client of the sandbox's test controls (`{origin}/_sandbox/<action>`, spec-external,
authorised by the API key): how tests and benchmarks read the ground truth and the request
counters, change the data between syncs, plant records and turn faults on, over HTTP like
any client of a running sandbox."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx


class SandboxControl:
    def __init__(self, origin: str, api_key: str, timeout: float = 120) -> None:
        self.origin = origin
        self._headers = {"x-api-key": api_key}
        self._timeout = timeout

    @classmethod
    def from_env(cls, env: Mapping[str, str], timeout: float = 120) -> SandboxControl:
        """From the CLINICAL_* settings the sandbox printed: the controls live at its origin,
        off the API's paths. `timeout`: seconds an action may take (a day of changes at
        scale 300 takes minutes)."""
        base = urlsplit(env["CLINICAL_API_BASE_URL"])
        return cls(f"{base.scheme}://{base.netloc}", env["CLINICAL_API_KEY"], timeout)

    def call(self, action: str, body: Mapping[str, Any] | None = None) -> Any:
        """GET `action`, or POST `body` to it; the decoded answer."""
        url = f"{self.origin}/_sandbox/{action}"
        if body is None:
            response = httpx.get(url, headers=self._headers, timeout=self._timeout)
        else:
            response = httpx.post(
                url, headers=self._headers, json=dict(body), timeout=self._timeout
            )
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, int]:
        return self.call("stats")

    def arrivals(self) -> list[float]:
        """When each request with this API key reached the service's limit, admitted or
        answered 429 (seconds on the server's monotonic clock): the rate the service saw."""
        return self.call("arrivals")

    def truth(self) -> dict[str, list[dict[str, Any]]]:
        return self.call("truth")

    def advance(self, **body: float) -> dict[str, dict[str, int]]:
        """Move the source's clock and change a share of the records (inserts, updates,
        deletes; `document_fraction` for patient documents): what happens at the source
        between two syncs."""
        return self.call("advance", body)

    def changes(self) -> list[dict[str, Any]]:
        """What drift changed so far (entity, kind, key, at), oldest first."""
        return self.call("changes")

    def faults(self, **values: Any) -> dict[str, Any]:
        """Change runtime settings (SandboxConfig.RUNTIME): faults, and the limits and token
        lifetime too (None: no rate limit, no expand cap)."""
        return self.call("faults", values)

    def plant(self, entity: str, record: Mapping[str, Any]) -> dict[str, Any]:
        """Serve `record` as sent, however malformed (a hostile source)."""
        return self.call("plant", {"entity": entity, "record": dict(record)})
