"""OAuth 2.0 client-credentials tokens (spec 5): cached, refreshed early, one refresh at a time.

Many worker threads share one `TokenProvider`. A token is renewed at `REFRESH_AT` of its
lifetime; when a request gets 401, `invalidate(token)` forgets that token only if it is still
the current one, so a burst of 401s in flight costs one refresh, not one each.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from connectors.clinical_records.errors import (
    AUTH_HINTS,
    AuthenticationError,
    MalformedResponse,
    RetryExhausted,
    ServiceUnreachable,
    UntrustedCertificate,
    connect_failure,
    untrusted_certificate,
)
from connectors.clinical_records.settings import Settings

log = logging.getLogger("connectors.clinical_records.auth")

REFRESH_AT = 0.8  # renew at 80% of expires_in
TOKEN_ATTEMPTS = 5
# A refused connection is retried once (a service restarting), not for a minute: it is
# nearly always a wrong URL or a service that is down, and the operator should hear at once.
CONNECT_ATTEMPTS = 2
RETRIABLE_TOKEN_ERRORS = (httpx.TransportError,)


class Clock(Protocol):
    """What paces the client: a token's renewal, a retry's backoff and its jitter; and the
    wall time its looks are stamped with (`Wire.clock`). The jitter is the clock's too: a
    backoff drawn from the process's own random state would make a simulated run's timing,
    and so its token expiries and its requests, depend on what else that process drew."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def time(self) -> float: ...

    def uniform(self, low: float, high: float) -> float: ...


class _SystemClock:
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)
    time = staticmethod(time.time)
    uniform = staticmethod(random.uniform)


SYSTEM_CLOCK: Clock = _SystemClock()


class TokenProvider:
    """Hands out a valid bearer token; fetches a new one when due or after a 401."""

    def __init__(
        self,
        settings: Settings,
        http: httpx.Client,
        on_refresh: Callable[[], None] = lambda: None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._http = http
        self._on_refresh = on_refresh
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0

    def token(self) -> str:
        token = self._token
        if token is not None and self._clock.monotonic() < self._renew_at:
            return token
        with self._lock:
            if self._token is None or self._clock.monotonic() >= self._renew_at:
                self._fetch()
            assert self._token is not None
            return self._token

    def invalidate(self, token: str) -> None:
        """The service refused `token`: renew on next use, unless another thread already did."""
        with self._lock:
            if self._token == token:
                self._token = None

    def _fetch(self) -> None:
        s = self._settings
        form = {
            "grant_type": "client_credentials",
            "client_id": s.client_id,
            "client_secret": s.client_secret,
            "scope": s.scope,
        }
        for attempt in range(1, TOKEN_ATTEMPTS + 1):
            started = self._clock.monotonic()
            try:
                response = self._http.post(f"{s.auth_url}/oauth2/token", data=form)
            except RETRIABLE_TOKEN_ERRORS as error:
                if untrusted_certificate(error):
                    raise UntrustedCertificate("token service") from None
                if isinstance(error, httpx.ConnectError) and attempt >= CONNECT_ATTEMPTS:
                    where = address(s.auth_url)
                    raise ServiceUnreachable(
                        "token service", where, connect_failure(error)
                    ) from None
                log.warning("POST token failed attempt=%d error=%s", attempt, type(error).__name__)
                self._clock.sleep(min(2.0, 0.2 * 2**attempt))
                continue
            ms = (self._clock.monotonic() - started) * 1000
            log.info(
                "POST token status=%d duration_ms=%.0f attempt=%d",
                response.status_code,
                ms,
                attempt,
            )
            if response.status_code >= 500 or response.status_code == 429:
                self._clock.sleep(min(2.0, 0.2 * 2**attempt))
                continue
            body = _json(response)
            if response.status_code != 200:
                code = str(body.get("error") or f"http_{response.status_code}")
                hint = AUTH_HINTS.get(code, "the token service refused the request")
                raise AuthenticationError(code, hint)
            token, lifetime = body.get("access_token"), body.get("expires_in")
            if not isinstance(token, str) or not token:
                raise MalformedResponse("token response without access_token", "token")
            seconds = float(lifetime) if isinstance(lifetime, int | float) else 300.0
            self._token = token
            self._renew_at = started + max(0.1, seconds * REFRESH_AT)
            self._on_refresh()
            return
        raise RetryExhausted("token service unavailable", TOKEN_ATTEMPTS, "token", None)


def address(url: str) -> str:
    """`host:port` of a URL, the part of it an operator checks when nothing answers."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
