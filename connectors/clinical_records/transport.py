"""HTTP with the service's manners: rate limit, bearer token, bounded retries, safe logs.

Every attempt first takes a slot from the machine-wide limiter. 429, 500, 502, 503, 504,
connection errors, dropped connections, read timeouts and bodies that are not the promised
JSON are retried with exponential backoff and jitter (or the server's Retry-After), within
`max_attempts` and `retry_budget_seconds`. A 401 earns a token refresh and a retry (twice at
most in one call: its retries can outlive a fresh token). Other 4xx raise the typed errors of
`errors.py` at once.

A log line per attempt names the method, the entity set, the status, the duration, the
attempt and the query option *names*: never a URL, a key, a value, a token or a document id.
Those lines go to the Python logger `connectors.clinical_records` (the CLI's log file, a code
server's captured stderr); the logger a caller hands in (a Dagster run's, whose every line is
an event stored in the instance) gets a progress line every `PROGRESS_SECONDS` and each attempt
that failed, so a run's event log stays small while its operator still sees it move.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import logging
import os
import random
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from connectors.clinical_records.auth import (
    CONNECT_ATTEMPTS,
    SYSTEM_CLOCK,
    Clock,
    TokenProvider,
    address,
)
from connectors.clinical_records.decode import decode_json
from connectors.clinical_records.errors import (
    ApiError,
    MalformedResponse,
    RetryExhausted,
    ServiceUnreachable,
    UntrustedCertificate,
    api_error,
    connect_failure,
    is_retriable_status,
    untrusted_certificate,
)
from connectors.clinical_records.meter import Counters
from connectors.clinical_records.ratelimit import RequestLimiter
from connectors.clinical_records.settings import Settings

LOGGER_NAME = "connectors.clinical_records"

MIN_RETRY_AFTER = 0.5  # a Retry-After of 0 would hammer the service
MAX_RETRY_AFTER = 60.0  # an absurd Retry-After is bounded
BACKOFF_BASE = 0.25
BACKOFF_CAP = 15.0
CHUNK = 64 * 1024
PROGRESS_SECONDS = 10.0  # at most one progress line this often to the caller's logger

# Failures of the connection itself: the request may be retried as it stands.
RETRIABLE_TRANSPORT = (httpx.TransportError, httpx.DecodingError)


def path_key(value: object) -> str:
    """A key written bare inside parentheses (spec 4.2), percent-encoded for the path."""
    return quote(str(value), safe="")


def query_string(params: dict[str, str]) -> str:
    """`$name=value&...` with spaces as %20 (never '+', which OData could read as a plus)."""
    return "&".join(f"{quote(k, safe='$')}={quote(v, safe='')}" for k, v in params.items())


def retry_after_seconds(header: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or HTTP date), bounded; None when absent or bad."""
    if not header:
        return None
    text = header.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, seconds))


def backoff(attempt: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
    """Exponential backoff with jitter: uniform in [d/2, d], d = base * 2^(attempt-1), capped;
    `uniform` draws the jitter (the wire's clock's, so that a simulation replays)."""
    delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
    return uniform(delay / 2, delay)


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """The default verification (certificates and host names checked), with the CA bundle
    when one is set. Built once per process and bundle: loading the system's certificates
    costs CPU each time, and a run opens a client per extraction. A bundle rewritten in place
    (a rotated CA) gets a new context."""
    bundle = settings.ca_bundle
    if bundle is None:
        return _verifying_context(None, 0)
    return _verifying_context(str(bundle), os.stat(bundle).st_mtime_ns)


@functools.cache
def _verifying_context(ca_bundle: str | None, modified_ns: int) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_bundle is not None:
        context.load_verify_locations(cafile=ca_bundle)
    return context


def _threads(workers: int) -> Executor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="clinical-request")


@dataclass(frozen=True)
class Wire:
    """Where requests go and what paces them: by default the network, threads that keep
    several requests in flight, and the host's clock. The simulation (tests/simulation)
    hands in a service in process, a pool that runs tasks in an order its seed chooses and a
    clock of its own, so that a whole run replays from one seed, no socket and no sleep."""

    transport: httpx.BaseTransport | None = None  # None: the network
    pool: Callable[[int], Executor] = _threads  # an executor of that many workers
    clock: Clock = SYSTEM_CLOCK


def http_client(settings: Settings, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    if transport is not None:
        return httpx.Client(transport=transport, follow_redirects=False)
    return httpx.Client(
        verify=ssl_context(settings),
        timeout=httpx.Timeout(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            write=settings.read_timeout,
            pool=None,  # waiting for a pooled connection is bounded by the limiter instead
        ),
        limits=httpx.Limits(
            max_connections=settings.max_in_flight + 2,
            max_keepalive_connections=settings.max_in_flight + 2,
        ),
        follow_redirects=False,
    )


class HideRequestUrls(logging.Filter):
    """httpx logs every request's full URL at INFO; URLs can hold document ids, so drop those
    lines (the transport writes its own safe line per request instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("HTTP Request:")


logging.getLogger("httpx").addFilter(HideRequestUrls())


class _Retry(Exception):
    """An attempt failed in a way worth retrying; `wait` overrides the backoff."""

    def __init__(self, reason: str, wait: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait = wait


@dataclass(frozen=True)
class Call:
    """One logical request; `label` is what the log and errors may name (an entity set)."""

    method: str
    path: str
    label: str
    params: dict[str, str] = field(default_factory=dict)
    page: int | None = None
    idempotent: bool = True
    shows: frozenset[str] = frozenset()  # the entity sets its answer shows (`Query.shows`)


class Transport:
    """Sends calls to `{base_url}` with limiter, token, retries, counters and safe logging."""

    def __init__(
        self,
        settings: Settings,
        limiter: RequestLimiter,
        counters: Counters,
        logger: logging.Logger | None = None,
        wire: Wire | None = None,
    ) -> None:
        wire = wire or Wire()
        self.settings = settings
        self.clock = wire.clock
        self.limiter = limiter
        self.counters = counters
        self.log = logging.getLogger(LOGGER_NAME)
        self.progress_log = logger
        self._progress_lock = threading.Lock()
        self._progress_at = time.monotonic()
        self.http = http_client(settings, wire.transport)
        self.tokens = TokenProvider(
            settings,
            self.http,
            on_refresh=lambda: counters.add(token_refreshes=1),
            clock=wire.clock,
        )

    def close(self) -> None:
        self.http.close()

    def url(self, call: Call) -> str:
        url = f"{self.settings.base_url}/{call.path}"
        return f"{url}?{query_string(call.params)}" if call.params else url

    def headers(self, token: str) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {token}",
            "x-api-key": self.settings.api_key,
            "Accept": "application/json",
        }

    # -- JSON calls ---------------------------------------------------------------------------

    def json(
        self,
        call: Call,
        *,
        validate: Callable[[Any], None] | None = None,
        body: Callable[[], dict[str, Any]] | None = None,
    ) -> Any:
        """The decoded JSON body of `call` (None for 204); `validate` may raise MalformedResponse."""

        def attempt(response: httpx.Response) -> Any:
            content = response.read()
            self.counters.add(bytes=len(content))
            if response.status_code == 204 or not content:
                if response.status_code == 204:
                    return None
                raise _Retry("empty body")
            try:
                decoded = decode_json(content)
            except ValueError:
                raise _Retry("body is not JSON (truncated, garbled or nested too deeply)") from None
            if validate is not None:
                try:
                    validate(decoded)
                except MalformedResponse as error:
                    raise _Retry(error.reason) from None
            return decoded

        return self._send(call, attempt, body)

    # -- streamed downloads -------------------------------------------------------------------

    def download(self, call: Call, destination: Path) -> int:
        """Stream the body of `call` into `destination` (atomically); returns the byte count."""
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".part")

        def attempt(response: httpx.Response) -> int:
            written = 0
            try:
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes(CHUNK):
                        out.write(chunk)
                        written += len(chunk)
            finally:
                self.counters.add(bytes=written)
            declared = response.headers.get("content-length")
            encoded = "content-encoding" in response.headers  # Content-Length counts gzip bytes
            if declared and declared.isdigit() and not encoded and int(declared) != written:
                raise _Retry("download shorter than its Content-Length")
            os.replace(partial, destination)
            return written

        try:
            return self._send(call, attempt, None)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()

    # -- the retry loop -----------------------------------------------------------------------

    def _send(
        self,
        call: Call,
        handle: Callable[[httpx.Response], Any],
        body: Callable[[], dict[str, Any]] | None,
    ) -> Any:
        deadline = self.clock.monotonic() + self.settings.retry_budget_seconds
        # A refresh per token refused, two at most: a 401 again after a call's retries have
        # outlived the fresh token is its expiry again (a 1.5 s token, simulation seed 1298);
        # a third means the credentials are wrong.
        tokens_refused: list[str] = []
        reason = ""
        attempt = 0
        refused = 0  # attempts in a row that found no connection at all
        while attempt < self.settings.max_attempts:
            attempt += 1
            with self.counters.waiting():
                self.limiter.acquire()
            self.counters.add(requests=1)
            token = self.tokens.token()
            started = time.monotonic()
            sent = self.clock.time()
            status: int | str = "-"
            try:
                request = self.http.build_request(
                    call.method,
                    self.url(call),
                    headers=self.headers(token),
                    **(body() if body else {}),
                )
                response = self.http.send(request, stream=True)
                status = response.status_code
                try:
                    if status == 401 and token not in tokens_refused and len(tokens_refused) < 2:
                        tokens_refused.append(token)
                        self.tokens.invalidate(token)
                        reason = "401 unauthorized"
                        self.counters.add(retries=1)
                        continue
                    if status == 429:
                        self.counters.add(throttled=1)
                        told = retry_after_seconds(response.headers.get("retry-after"))
                        pause = told if told is not None else backoff(attempt, self.clock.uniform)
                        self.limiter.throttled(pause)
                        raise _Retry("429 too many requests", pause)
                    if is_retriable_status(status) and (call.idempotent or status == 503):
                        raise _Retry(f"HTTP {status}")
                    if status >= 400:
                        raise self._refusal(call, response)
                    result = handle(response)
                finally:
                    response.close()
                    self._log(call, status, started, attempt)
            except _Retry as retry:
                reason, wait, refused = retry.reason, retry.wait, 0
            except RETRIABLE_TRANSPORT as error:
                if untrusted_certificate(error):
                    raise UntrustedCertificate("API server") from None
                refused = refused + 1 if isinstance(error, httpx.ConnectError) else 0
                if refused >= CONNECT_ATTEMPTS:
                    where = address(self.settings.base_url)
                    raise ServiceUnreachable("API server", where, connect_failure(error)) from None
                reason, wait = type(error).__name__, None
                if status == "-":  # failed before a status line, so not logged yet
                    self._log(call, reason, started, attempt)
                if not call.idempotent and not isinstance(error, httpx.ConnectError):
                    # the service may have acted on it: sending it again could duplicate it
                    raise RetryExhausted(reason, attempt, call.label, call.page) from None
            else:
                self.limiter.succeeded()
                if call.shows:
                    self.counters.look(call.shows, sent, self.clock.time())
                return result
            delay = backoff(attempt, self.clock.uniform) if wait is None else wait
            if attempt >= self.settings.max_attempts or self.clock.monotonic() + delay > deadline:
                break
            self.counters.add(retries=1)
            with self.counters.waiting():
                self.clock.sleep(delay)
        raise RetryExhausted(reason, attempt, call.label, call.page)

    def _refusal(self, call: Call, response: httpx.Response) -> ApiError:
        content = response.read()
        self.counters.add(bytes=len(content))
        try:
            body = decode_json(content) if content else None
        except ValueError:
            body = None
        return api_error(response.status_code, body, call.label, call.page)

    def _log(self, call: Call, status: int | str, started: float, attempt: int) -> None:
        """The attempt's line to the Python logger; to the caller's, a failed attempt's line
        and, at most every PROGRESS_SECONDS, how many requests so far."""
        line = "%s %s status=%s duration_ms=%.0f attempt=%d options=%s"
        shown = (
            *(call.method, call.label, status, (time.monotonic() - started) * 1000, attempt),
            ",".join(call.params) or "-",
        )
        self.log.info(line, *shown)
        if self.progress_log is None:
            return
        if not (isinstance(status, int) and status < 400):
            self.progress_log.warning(line % shown)
            return
        now = time.monotonic()
        with self._progress_lock:
            due = now - self._progress_at >= PROGRESS_SECONDS
            if due:
                self._progress_at = now
        if due:
            figures = self.counters.as_dict()
            self.progress_log.info(
                f"{figures['requests']:,} requests so far in this extraction (now "
                f"{call.label}): {figures['throttled']} throttled (429), "
                f"{figures['retries']} retried, {figures['wait_seconds']:.1f} s waiting"
            )
