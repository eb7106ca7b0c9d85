"""The token service (OAuth 2.0 client credentials) and the checks on every API request."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping

from connectors.clinical_records.catalogue import SCOPE_PREFIX
from connectors.sandbox.config import SandboxConfig
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
    """Issues bearer tokens and checks them; tokens die `token_lifetime` seconds after issue."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._expiry: dict[str, float] = {}
        self.issued = 0

    def issue(self, form: Mapping[str, str]) -> dict[str, object]:
        if form.get("grant_type") != "client_credentials":
            raise OAuthError(400, "unsupported_grant_type", "grant_type must be client_credentials")
        if not (
            secrets.compare_digest(form.get("client_id", ""), self.config.client_id)
            and secrets.compare_digest(form.get("client_secret", ""), self.config.client_secret)
        ):
            raise OAuthError(401, "invalid_client", "Client authentication failed.")
        if form.get("scope") != f"{SCOPE_PREFIX}{self.config.customer}":
            raise OAuthError(400, "invalid_scope", "The requested scope is invalid or unknown.")
        now = time.monotonic()
        self._expiry = {t: exp for t, exp in self._expiry.items() if exp > now}
        token = secrets.token_urlsafe(32)
        self._expiry[token] = now + self.config.token_lifetime
        self.issued += 1
        return {
            "access_token": token,
            "expires_in": round(self.config.token_lifetime),
            "token_type": "Bearer",
        }

    def check(self, headers: Mapping[str, str]) -> None:
        """Spec 5: `Authorization: Bearer <token>` (case-sensitive) and `x-api-key`, else 401."""
        api_key = headers.get("x-api-key")
        if api_key is None or not secrets.compare_digest(api_key, self.config.api_key):
            raise unauthorized("The x-api-key header is missing or wrong.")
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            raise unauthorized("Authorization must be 'Bearer <access token>'.")
        expiry = self._expiry.get(token)
        if expiry is None:
            raise unauthorized("The access token is invalid.")
        if expiry <= time.monotonic():
            raise unauthorized("The access token has expired.")


def unauthorized(details: str) -> ODataError:
    return ODataError(401, "Unauthorized", "Missing, invalid or expired credentials.", details)
