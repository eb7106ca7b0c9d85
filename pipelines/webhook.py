"""CLINICAL_ALERT_WEBHOOK: where alerts go, and one delivery that never fails a run.

The URL is a secret (a Slack or Teams webhook URL carries its own token): it is read from the
environment where it is used, never put in run config, and never logged; a log line names the
host alone. HTTPS is required, plain http only for loopback, as for the service itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import is_secure, read_dotenv

WEBHOOK_VARIABLE = "CLINICAL_ALERT_WEBHOOK"
EXPECTED = "an https:// URL of an incoming webhook (http:// only for 127.0.0.0/8, ::1 or localhost)"
ATTEMPTS = 3  # a message, then two retries after BACKOFF_SECONDS and twice that
BACKOFF_SECONDS = 1.0
TIMEOUT_SECONDS = 5.0  # per attempt: a sensor's tick and a CLI run wait at most ~20 s


@dataclass(frozen=True)
class Delivery:
    """What became of one message: said in one line, without the URL."""

    sent: bool
    host: str
    attempts: int
    problem: str = ""

    def __str__(self) -> str:
        if self.sent:
            return f"sent to {self.host}"
        return f"not delivered to {self.host}: {self.problem} after {self.attempts} attempts"


@dataclass(frozen=True)
class Webhook:
    """An incoming webhook (Slack, Mattermost, a Teams workflow) that takes a JSON POST."""

    url: str = field(repr=False)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "?"

    def post(self, payload: Mapping[str, Any], log: Any = None) -> Delivery:
        """POST `payload`, retried with backoff on 429, 5xx and transport errors. Never
        raises: a message that cannot be delivered is one warning on `log`."""
        log = log or logging.getLogger(__name__)
        problem = ""
        for attempt in range(1, ATTEMPTS + 1):
            if attempt > 1:
                time.sleep(BACKOFF_SECONDS * 2 ** (attempt - 2))
            try:
                response = httpx.post(self.url, json=dict(payload), timeout=TIMEOUT_SECONDS)
            except httpx.HTTPError as error:
                problem = type(error).__name__  # its text may hold the URL: the class only
                continue
            except Exception as error:  # an alert never fails the run it reports on
                problem = type(error).__name__
                break
            if response.is_success:
                return Delivery(True, self.host, attempt)
            problem = f"HTTP {response.status_code}"
            if response.status_code != 429 and response.status_code < 500:
                break  # refused (a wrong or revoked URL): retrying changes nothing
        delivery = Delivery(False, self.host, attempt, problem)
        log.warning(f"alert {delivery}; the run is unaffected")
        return delivery


def webhook_from_env(env: Mapping[str, str], dotenv: Path | None = Path(".env")) -> Webhook | None:
    """CLINICAL_ALERT_WEBHOOK from `env` (a .env file fills in); None when unset.
    ConfigError, naming the variable and never its value, when it is not a usable URL."""
    values = {**(read_dotenv(dotenv) if dotenv else {}), **env}
    text = (values.get(WEBHOOK_VARIABLE) or "").strip()
    if not text:
        return None
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
    except ValueError:
        raise ConfigError(WEBHOOK_VARIABLE, EXPECTED) from None
    if not is_secure(parts.scheme, host):
        raise ConfigError(WEBHOOK_VARIABLE, EXPECTED)
    return Webhook(text)
