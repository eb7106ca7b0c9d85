"""The token service (OAuth 2.0 client credentials) and the checks on every API request."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping

from connectors.clinical_records.catalogue import SCOPE_PREFIX
from connectors.sandbox.config import Customer, SandboxConfig
from connectors.sandbox.errors import ODataError


class OAuthError(Exception):
    """An RFC 6749 token-endpoint error: `{"error": code, "error_description": ...}`."""

    def __init__(self, status: int, code: str, description: str) -> None:
        super().__init__(code)
        self.status = status
        self.code = code
        self.description = description

    def body(self) -> dict[str, str]:
        return {"error": self.code, "error_description": self.description}


class TokenService:
    """Issues bearer tokens to the customers' clients and checks them; a token belongs to the
    customer it was issued to and dies `token_lifetime` seconds after issue."""

    def __init__(self, config: SandboxConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock  # the simulation's own (tests/simulation): expiry without waiting
        self.customers = config.served()
        self._expiry: dict[str, tuple[Customer, float]] = {}
        self.issued = 0

    def issue(self, form: Mapping[str, str]) -> dict[str, object]:
        if form.get("grant_type") != "client_credentials":
            raise OAuthError(400, "unsupported_grant_type", "grant_type must be client_credentials")
        customer = self._customer(
            lambda c: (
                _same(form.get("client_id"), c.client_id)
                and _same(form.get("client_secret"), c.client_secret)
            )
        )
        if customer is None:
            raise OAuthError(401, "invalid_client", "Client authentication failed.")
        if form.get("scope") != f"{SCOPE_PREFIX}{customer.name}":
            raise OAuthError(400, "invalid_scope", "The requested scope is invalid or unknown.")
        now = self.clock()
        self._expiry = {t: held for t, held in self._expiry.items() if held[1] > now}
        token = secrets.token_urlsafe(32)
        self._expiry[token] = (customer, now + self.config.token_lifetime)
        self.issued += 1
        return {
            "access_token": token,
            "expires_in": round(self.config.token_lifetime),
            "token_type": "Bearer",
        }

    def check(self, headers: Mapping[str, str]) -> Customer:
        """Spec 5: `Authorization: Bearer <token>` (case-sensitive) and `x-api-key`, else 401.
        Returns the customer both belong to: a token of another customer's client is refused."""
        customer = self.by_api_key(headers.get("x-api-key"))
        if customer is None:
            raise unauthorized("The x-api-key header is missing or wrong.")
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            raise unauthorized("Authorization must be 'Bearer <access token>'.")
        owner, expiry = self._expiry.get(token, (None, 0.0))
        if owner is None:
            raise unauthorized("The access token is invalid.")
        if owner is not customer:
            raise unauthorized("The access token was issued to another customer's client.")
        if expiry <= self.clock():
            raise unauthorized("The access token has expired.")
        return customer

    def by_api_key(self, api_key: str | None) -> Customer | None:
        return self._customer(lambda c: _same(api_key, c.api_key))

    def _customer(self, matches: Callable[[Customer], bool]) -> Customer | None:
        """The customer whose credentials match; every customer is compared (no early exit),
        so the time taken says nothing about which one matched."""
        found = [c for c in self.customers if matches(c)]
        return found[0] if found else None


def _same(given: str | None, expected: str) -> bool:
    return secrets.compare_digest((given or "").encode(), expected.encode())


def unauthorized(details: str) -> ODataError:
    return ODataError(401, "Unauthorized", "Missing, invalid or expired credentials.", details)
