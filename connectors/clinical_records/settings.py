"""Connector configuration from the CLINICAL_* environment variables, validated up front.

A missing or malformed value raises `ConfigError` naming the variable and what was expected,
before any request is sent. Secrets never appear in `repr()`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from connectors.clinical_records.catalogue import SCOPE_PREFIX
from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.postgres import POSTGRES_VARIABLE, URL_FORM, place

T = TypeVar("T", int, float)

LIMITER_FILE = Path("clinical-records-sync") / "ratelimit.sqlite"
DEFAULT_LIMITER_PATH = Path("~/.cache") / LIMITER_FILE
LOOPBACK_NAMES = frozenset({"localhost"})


@dataclass(frozen=True)
class Settings:
    """Everything the connector needs to reach the service; built by `from_env`."""

    base_url: str
    auth_url: str
    client_id: str
    client_secret: str = field(repr=False)
    api_key: str = field(repr=False)
    customer: str
    rate_limit: float = 2.0
    burst: int = 4
    ca_bundle: Path | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    limiter_path: Path = DEFAULT_LIMITER_PATH
    # The instance's PostgreSQL (DAGSTER_POSTGRES_URL): when set, the rate limit's state lives
    # there, shared by every host; it holds a password, so it is never shown.
    limiter_url: str | None = field(default=None, repr=False)
    max_in_flight: int = 8
    max_attempts: int = 8
    retry_budget_seconds: float = 300.0

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in self.__dataclass_fields__
            if name not in SECRET_FIELDS
        )
        return f"Settings({shown}, client_secret=***, api_key=***, limiter_url=***)"

    __str__ = __repr__

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, dotenv_path: str | Path | None = ".env"
    ) -> Settings:
        """Read and validate the CLINICAL_* variables; a `.env` file fills in, `env` wins."""
        values: dict[str, str] = read_dotenv(Path(dotenv_path)) if dotenv_path else {}
        values.update(os.environ if env is None else env)
        problems: list[ConfigError] = []

        def read(parse: Callable[..., object], *args: object) -> object:
            try:
                return parse(values, *args)
            except ConfigError as error:
                problems.append(error)
                return None

        fields = {
            "base_url": read(_url, "CLINICAL_API_BASE_URL"),
            "auth_url": read(_url, "CLINICAL_AUTH_URL"),
            "client_id": read(_required, "CLINICAL_CLIENT_ID"),
            "client_secret": read(_required, "CLINICAL_CLIENT_SECRET"),
            "api_key": read(_required, "CLINICAL_API_KEY"),
            "customer": read(_customer),
            "rate_limit": read(_number, "CLINICAL_RATE_LIMIT", 2.0, float, 0.01),
            "burst": read(_number, "CLINICAL_BURST", 4, int, 1),
            "ca_bundle": read(_ca_bundle),
            "connect_timeout": read(_number, "CLINICAL_CONNECT_TIMEOUT", 10.0, float, 0.1),
            "read_timeout": read(_number, "CLINICAL_READ_TIMEOUT", 60.0, float, 0.1),
            "limiter_path": read(_limiter_path),
            "limiter_url": read(_limiter_url),
            "max_in_flight": read(_number, "CLINICAL_MAX_IN_FLIGHT", 8, int, 1),
            "max_attempts": read(_number, "CLINICAL_MAX_ATTEMPTS", 8, int, 1),
            "retry_budget_seconds": read(_number, "CLINICAL_RETRY_BUDGET", 300.0, float, 1.0),
        }
        if problems:  # every problem at once: configuring from scratch takes one try
            raise ConfigError.combine(problems)
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def scope(self) -> str:
        return f"{SCOPE_PREFIX}{self.customer}"


SECRET_FIELDS = frozenset({"client_secret", "api_key", "limiter_url"})


def read_dotenv(path: Path) -> dict[str, str]:
    """`NAME=value` lines of a .env file; comments, blanks and `export ` prefixes ignored."""
    if not path.is_file():
        return {}
    values: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip().removeprefix("export ").strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def _required(values: Mapping[str, str], name: str) -> str:
    value = (values.get(name) or "").strip()
    if not value:
        raise ConfigError(name, "a non-empty value")
    return value


def _customer(values: Mapping[str, str]) -> str:
    customer = _required(values, "CLINICAL_CUSTOMER")
    if "/" in customer or any(c.isspace() for c in customer):
        raise ConfigError("CLINICAL_CUSTOMER", "a customer name without '/' or spaces")
    return customer


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_secure(scheme: str, host: str) -> bool:
    """HTTPS, or plain http to a loopback host (the sandbox): every URL we call follows it."""
    return bool(host) and (scheme == "https" or (scheme == "http" and is_loopback(host)))


def _url(values: Mapping[str, str], name: str) -> str:
    """HTTPS only; plain http for loopback hosts alone (the sandbox)."""
    expected = "an https:// URL (http:// only for 127.0.0.0/8, ::1 or localhost)"
    text = _required(values, name)
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
    except ValueError:
        raise ConfigError(name, expected) from None
    if not is_secure(parts.scheme, host) or parts.query or parts.fragment:
        raise ConfigError(name, expected)
    return text.rstrip("/")


def _number(
    values: Mapping[str, str], name: str, default: T, kind: Callable[[str], T], minimum: float
) -> T:
    text = (values.get(name) or "").strip()
    if not text:
        return default
    word = "an integer" if kind is int else "a number"
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(name, f"{word} >= {minimum:g}") from None
    if not value >= minimum or value == float("inf"):
        raise ConfigError(name, f"{word} >= {minimum:g}")
    return value


def _limiter_path(values: Mapping[str, str]) -> Path:
    """CLINICAL_LIMITER_PATH, else the user cache dir: one file for every process of the user."""
    explicit = (values.get("CLINICAL_LIMITER_PATH") or "").strip()
    if explicit:
        return Path(explicit).expanduser()
    cache = (values.get("XDG_CACHE_HOME") or "").strip()
    return (Path(cache) / LIMITER_FILE) if cache else DEFAULT_LIMITER_PATH.expanduser()


def _limiter_url(values: Mapping[str, str]) -> str | None:
    """DAGSTER_POSTGRES_URL, the instance's PostgreSQL, which also holds the shared limit."""
    text = (values.get(POSTGRES_VARIABLE) or "").strip()
    if not text:
        return None
    try:
        place(text)
    except ValueError:
        raise ConfigError(POSTGRES_VARIABLE, URL_FORM) from None
    return text


def _ca_bundle(values: Mapping[str, str]) -> Path | None:
    text = (values.get("CLINICAL_CA_BUNDLE") or "").strip()
    if not text:
        return None
    path = Path(text).expanduser()
    if not path.is_file():
        raise ConfigError(
            "CLINICAL_CA_BUNDLE", "the path of a readable PEM file of CA certificates"
        )
    return path
