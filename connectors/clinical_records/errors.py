"""One error taxonomy for the connector; retriable versus fatal is decided here, once.

Messages never hold a token, secret, API key, document id or a URL: they name the entity
set, the page and the service's own error code, message and details.
"""

from __future__ import annotations

import ssl
from typing import Any


class ClinicalApiError(Exception):
    """Base of every error the connector raises on purpose."""


def _where(preposition: str, entity: str | None, page: int | None) -> str:
    """Where in a sync an error happened, e.g. ' on Claims page 3' (names no record)."""
    where = f" {preposition} {entity}" if entity else ""
    return where + (f" page {page}" if page is not None else "")


class ConfigError(ClinicalApiError, ValueError):
    """A CLINICAL_* variable is missing or malformed."""

    def __init__(self, variable: str, expected: str) -> None:
        super().__init__(f"{variable}: expected {expected}")
        self.variable = variable
        self.expected = expected

    @staticmethod
    def combine(problems: list[ConfigError]) -> ConfigError:
        """One error for every problem found, so an operator fixes them all in one go."""
        return problems[0] if len(problems) == 1 else ConfigErrors(problems)


class ConfigErrors(ConfigError):
    """Several variables are missing or malformed: one line each."""

    def __init__(self, problems: list[ConfigError]) -> None:
        ValueError.__init__(self, "\n".join(str(p) for p in problems))
        self.problems = problems
        self.variable = ", ".join(p.variable for p in problems)
        self.expected = "; ".join(p.expected for p in problems)


class QueryError(ClinicalApiError, ValueError):
    """A query names a field, navigation or option the catalogue does not know."""


class ApiError(ClinicalApiError):
    """The service refused a request: HTTP status plus the spec's error.code/message/details."""

    def __init__(
        self,
        status: int,
        code: str = "",
        message: str = "",
        details: str = "",
        entity: str | None = None,
        page: int | None = None,
    ) -> None:
        where = _where("on", entity, page)
        text = f"HTTP {status}{where}: {code or 'error'}: {message}"
        super().__init__(text + (f" ({details})" if details else ""))
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.entity = entity
        self.page = page


class BadRequest(ApiError):
    """400: invalid query syntax, or an upload with a missing field or unsupported type."""


class Forbidden(ApiError):
    """403: the credentials lack permission."""


class NotFound(ApiError):
    """404: no such resource, patient or document."""


class PayloadTooLarge(ApiError):
    """413: the upload exceeds 25 MB."""


class Unauthorized(ApiError):
    """401 even after one token refresh: credentials or API key are wrong."""


class AuthenticationError(ClinicalApiError):
    """The token service refused the credentials; not retried."""

    def __init__(self, code: str, hint: str) -> None:
        super().__init__(f"token request refused ({code}): {hint}")
        self.code = code


class UntrustedCertificate(ClinicalApiError):
    """The server's TLS certificate does not verify: retrying cannot help, a CA file can."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the TLS certificate of the {what} is not trusted; if it is signed by a private "
            "CA, set CLINICAL_CA_BUNDLE to that CA's PEM file"
        )


class ServiceUnreachable(ClinicalApiError):
    """No connection could be made (refused, unknown host): waiting longer rarely helps."""

    def __init__(self, what: str, address: str, reason: str) -> None:
        super().__init__(f"cannot connect to the {what} at {address}: {reason}")
        self.address = address
        self.reason = reason


def connect_failure(error: BaseException) -> str:
    """A connection error's cause in words ('connection refused'), never a URL."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    text = str(error).lower()
    return "connection refused" if "refused" in text else (text.split("] ")[-1] or "no connection")


def untrusted_certificate(error: BaseException) -> bool:
    """True when an httpx error was caused by certificate verification (not a flaky link)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RetryExhausted(ClinicalApiError):
    """A retriable failure persisted past the attempt or time budget."""

    def __init__(self, reason: str, attempts: int, entity: str | None, page: int | None) -> None:
        where = _where("on", entity, page)
        super().__init__(f"gave up{where} after {attempts} attempts: {reason}")
        self.reason = reason
        self.attempts = attempts
        self.entity = entity
        self.page = page


class MalformedResponse(ClinicalApiError):
    """A body that is not the JSON the spec promises (truncated, not JSON, wrong shape)."""

    def __init__(self, reason: str, entity: str | None = None, page: int | None = None) -> None:
        where = _where("from", entity, page)
        super().__init__(f"malformed response{where}: {reason}")
        self.reason = reason
        self.entity = entity
        self.page = page


class PagingError(ClinicalApiError):
    """The pages did not join up (a repeated page), so the result cannot be trusted."""


# Status -> fatal error class; statuses here are never retried.
FATAL_STATUSES: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: BadRequest,
    413: PayloadTooLarge,
}
RETRIABLE_STATUSES: frozenset[int] = frozenset({429, 500, 502, 503, 504})

# Token-endpoint error codes (spec 5, rules 3 and 4) -> what is probably wrong.
AUTH_HINTS: dict[str, str] = {
    "invalid_client": (
        "wrong CLINICAL_CLIENT_ID or CLINICAL_CLIENT_SECRET, or credentials for another "
        "environment than CLINICAL_AUTH_URL"
    ),
    "invalid_scope": (
        "wrong CLINICAL_CUSTOMER (the scope is svc-customer-api/<customer>) or wrong scope format"
    ),
}


def is_retriable_status(status: int) -> bool:
    return status in RETRIABLE_STATUSES


def api_error(
    status: int, body: Any, entity: str | None = None, page: int | None = None
) -> ApiError:
    """The typed error for a refused request, from the spec's error body when there is one."""
    error = body.get("error") if isinstance(body, dict) else None
    fields = error if isinstance(error, dict) else {}
    cls = FATAL_STATUSES.get(status, ApiError)
    return cls(
        status,
        str(fields.get("code") or ""),
        str(fields.get("message") or ""),
        str(fields.get("details") or ""),
        entity,
        page,
    )
