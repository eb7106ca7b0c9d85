"""Injected misbehaviour: latency, server errors, dropped connections, throttling, drift."""

from __future__ import annotations

import random
from collections import Counter

from connectors.sandbox.config import SandboxConfig, ScriptedDrift

ERROR_STATUSES: dict[int, tuple[str, str]] = {
    500: ("InternalServerError", "An unexpected error occurred."),
    502: ("BadGateway", "The upstream service did not answer properly."),
    503: ("ServiceUnavailable", "The service is temporarily unavailable."),
}


GARBLED_BODIES: tuple[bytes, ...] = (
    b'{"@odata.context":"$metadata#X","value":[{"id":1,"name":"cut her',
    b"<html><body>502 Bad Gateway</body></html>",
    b"",
)


class FaultInjector:
    """Decides, per API request, which fault (if any) it suffers; counts what it injected."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.rng = random.Random(config.fault_seed)
        self.drift_rng = random.Random(config.drift_seed)  # apart, so faults stay reproducible
        self.injected: Counter[str] = Counter()
        self._collection_requests = 0
        self._scripted_requests: Counter[str] = Counter()  # per set, since the script was set
        self.script_rng = random.Random(config.drift_seed)  # its own: a script replays alike

    def delay(self) -> float:
        c = self.config
        if c.latency <= 0 and c.jitter <= 0:
            return 0.0
        return max(0.0, c.latency + self.rng.uniform(-c.jitter, c.jitter))

    def pick(self) -> str | None:
        """One of "error", "drop", "throttle", "garble" or None, with the configured odds."""
        c = self.config
        roll = self.rng.random()
        for kind, share in (
            ("error", c.error_rate),
            ("drop", c.drop_rate),
            ("throttle", c.throttle_rate),
            ("garble", c.garble_rate),
        ):
            if roll < share:
                self.injected[kind] += 1
                return kind
            roll -= share
        return None

    def error_status(self) -> int:
        status = self.rng.choice(sorted(ERROR_STATUSES))
        self.injected[f"http_{status}"] += 1
        return status

    def garbled_body(self) -> bytes:
        """A 200 body a client must not trust: cut mid-record, or not JSON at all."""
        return self.rng.choice(GARBLED_BODIES)

    def with_retry_after(self) -> bool:
        return self.rng.random() < self.config.retry_after_fraction

    def should_drift(self) -> bool:
        """True on every `drift_every`-th collection request."""
        self._collection_requests += 1
        every = self.config.drift_every
        if every and self._collection_requests % every == 0:
            self.injected["drift"] += 1
            return True
        return False

    def restart_script(self) -> None:
        """A new `drift_script` counts each set's requests from here."""
        self._scripted_requests.clear()
        self.script_rng = random.Random(self.config.drift_seed)

    def scripted(self, entity: str) -> list[ScriptedDrift]:
        """The scripted changes due before answering this collection request to `entity`."""
        self._scripted_requests[entity] += 1
        number = self._scripted_requests[entity]
        due = [s for s in self.config.drift_script if s.entity == entity and s.request == number]
        self.injected["drift"] += len(due)
        return due
