"""Everything a sandbox can be told: its data, its credentials, its limits and its faults."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from connectors.clinical_records.catalogue import BY_NAME, TOKEN_LIFETIME_SECONDS

PLACES = ("before", "between", "after")  # where a drift insert's key lands in key order


def _secret(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(18)}"


# What the data is drawn from: "spec", the default (values our catalogue chose, the data every
# recorded figure was measured on), or "wide": every value each field's spec type allows
# (connectors/sandbox/wide.py; docs/sandbox.md).
VALUE_PROFILES = ("spec", "wide")


def checked_values(name: object) -> str:
    """`name` when it names a values profile; otherwise the error says which do."""
    if name not in VALUE_PROFILES:
        raise ValueError(f"values must be one of {', '.join(VALUE_PROFILES)}; got {name!r}")
    return str(name)


def _count_like(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class ScriptedDrift:
    """A change aimed at one moment of a read: before the answer to the `request`-th
    collection request to `entity` (counted from when the script was set; a request a
    fault refused is not served, so not counted), `inserts` records whose keys land at
    `place` (None: anywhere), `updates` that move the change cursor, `deletes`."""

    entity: str
    request: int
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    place: str | None = None

    @classmethod
    def parse(cls, value: Mapping[str, Any]) -> ScriptedDrift:
        """One entry as JSON gives it; a clear error for anything else."""
        if not isinstance(value, Mapping):
            raise ValueError(f"a drift_script entry must be an object, got {value!r}")
        names = {f.name for f in fields(cls)}
        if unknown := set(value) - names:
            raise ValueError(f"drift_script: unknown {sorted(unknown)}; expected {sorted(names)}")
        entry = cls(**value)
        if entry.entity not in BY_NAME:
            raise ValueError(f"drift_script: unknown entity set {entry.entity!r}")
        counts = (entry.inserts, entry.updates, entry.deletes)
        if not (
            _count_like(entry.request) and entry.request >= 1 and all(map(_count_like, counts))
        ):
            raise ValueError(f"drift_script: request >= 1 and counts >= 0 expected, got {value!r}")
        if entry.place not in (None, *PLACES):
            raise ValueError(f"drift_script: place must be one of {PLACES} or null")
        return entry


@dataclass
class Customer:
    """One customer of a sandbox: its scope (`svc-customer-api/<name>`), credentials, data
    and rate limit. None takes the sandbox's value (which may change while it serves)."""

    name: str
    client_id: str = ""  # default: `<name>-client`
    client_secret: str = field(default_factory=lambda: _secret("secret"))
    api_key: str = field(default_factory=lambda: _secret("key"))
    seed: int | None = None
    scale: float | None = None
    rate: float | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        self.client_id = self.client_id or f"{self.name}-client"


def customers(names: Sequence[str], seed: int) -> list[Customer]:
    """Customers named `names`, their data drawn from seeds `seed`, `seed + 1`, ...: each
    customer's records differ from the others', so a mix would show."""
    return [Customer(name, seed=seed + number) for number, name in enumerate(names)]


ONE_CUSTOMER = ("customer", "client_id", "client_secret", "api_key")  # Customer's order


@dataclass
class SandboxConfig:
    """Data, credentials and behaviour of one sandbox. Faults are all off by default."""

    seed: int = 7
    scale: float = 1.0
    # Every reference a catalogue navigation joins on is set and names a record that exists,
    # through advance and drift too (store.Store); off: the spec's nulls and dangling claims.
    resolved_references: bool = False
    values: str = "spec"  # a name of VALUE_PROFILES
    # Share of every riding child set's parent reference that names no record, drawn
    # uniformly through its keys (generator.dangle); 0: only the spec's dangling claims.
    dangling: float = 0.0
    # The one customer's name and credentials (secrets fresh per instance unless given), when
    # `customers` is empty. With `customers`, each Customer carries its own and these stay
    # None: a value given for both would be served to nobody, so it is refused.
    client_id: str | None = None
    client_secret: str | None = None
    api_key: str | None = None
    customer: str | None = None
    token_lifetime: float = float(TOKEN_LIFETIME_SECONDS)
    # Server-side rate limit per API key (requests/s and burst); None = unlimited.
    rate: float | None = None
    burst: int = 10
    # Faults, changeable at runtime through SandboxServer.configure or POST /_sandbox/faults.
    latency: float = 0.0  # seconds added to every API request
    jitter: float = 0.0  # +/- uniform seconds around latency
    error_rate: float = 0.0  # share of API requests answered 500, 502 or 503
    drop_rate: float = 0.0  # share of API requests whose connection drops mid-response
    throttle_rate: float = 0.0  # share of API requests answered 429 although within the limit
    retry_after_fraction: float = 1.0  # share of 429 answers that carry Retry-After
    garble_rate: float = 0.0  # share of API requests answered 200 with a non-JSON or cut body
    # Drift: every `drift_every` collection requests the set being read changes before the
    # answer: inserts whose keys land anywhere in key order, updates that move its change
    # cursor, hard deletes. The worst the spec allows (4.2: records may shift between pages).
    # A request that lists documents (a patient's, or Patients with $expand=Documents) also
    # drifts them: `drift_inserts` uploads to random patients, `drift_deletes` deletes.
    drift_every: int = 0
    drift_inserts: int = 1
    drift_updates: int = 1
    drift_deletes: int = 1
    drift_seed: int = 5
    # Changes aimed at the Nth request to a set (ScriptedDrift), beside `drift_every`: a
    # test reproduces a change at one exact moment of a read. Setting it restarts the count.
    drift_script: tuple[ScriptedDrift, ...] = ()
    fault_seed: int = 1
    # Expansion (spec 4.2): at most `expand_cap` items in any expanded collection, harsher
    # than the service but plausible server-driven limiting (its `@odata.count` still tells
    # the full number); None = no cap. `refuse_document_expand` answers any `$expand` that
    # names Documents with the spec's 400, so a client's fallback to per-patient listing runs.
    expand_cap: int | None = None
    refuse_document_expand: bool = False
    # `or` in `$filter` (the spec lists eq, gt, ge, lt, le and `and` as the operators seen):
    # refused with the spec's 400 InvalidFilter when set, so a client's probe and its
    # fallback to one request per key run; `in` is refused always (not parsed).
    refuse_filter_or: bool = False
    # Several customers on one server, each with its own credentials, data and limit (its
    # seed, scale, rate and burst default to the sandbox's above); empty: the one customer
    # above (`customer`, `client_id`, `client_secret`, `api_key`).
    customers: list[Customer] = field(default_factory=list)

    RUNTIME: ClassVar[tuple[str, ...]] = (
        "token_lifetime",
        "rate",
        "burst",
        "latency",
        "jitter",
        "error_rate",
        "drop_rate",
        "throttle_rate",
        "retry_after_fraction",
        "garble_rate",
        "drift_every",
        "drift_inserts",
        "drift_updates",
        "drift_deletes",
        "drift_script",
        "expand_cap",
        "refuse_document_expand",
        "refuse_filter_or",
    )

    def __post_init__(self) -> None:
        checked_values(self.values)
        if not 0 <= self.dangling < 1:
            raise ValueError(f"dangling must be a share from 0 to below 1, got {self.dangling!r}")
        self.update(drift_script=self.drift_script)
        if not self.customers:
            self.customer = self.customer or "demo-clinic"
            self.client_id = self.client_id or "sandbox-client"
            self.client_secret = self.client_secret or _secret("secret")
            self.api_key = self.api_key or _secret("key")
        self.served()

    def served(self) -> list[Customer]:
        """The customers this sandbox serves, the first one the default. ValueError when the
        one customer's settings are given beside `customers` (each customer has its own), or
        two customers share a name, client id or API key (a request would not say whose data
        it reads)."""
        if self.customers:
            given = [name for name in ONE_CUSTOMER if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: the one customer's, unused with `customers`; give "
                    "each Customer its own"
                )
            served = self.customers
        else:
            served = [Customer(*(str(getattr(self, name)) for name in ONE_CUSTOMER))]
        for name in ("name", "client_id", "api_key"):
            values = [getattr(c, name) for c in served]
            if len(set(values)) < len(values):
                raise ValueError(f"two sandbox customers share a {name}")
        return served

    def update(self, **changes: object) -> None:
        """Change runtime settings; an unknown or data-shaping name is refused."""
        unknown = set(changes) - set(self.RUNTIME)
        if unknown:
            raise ValueError(
                f"cannot change {sorted(unknown)} at runtime; changeable: {list(self.RUNTIME)}"
            )
        kinds = {f.name: f.type for f in fields(self)}
        for name, value in changes.items():
            kind = kinds[name]
            if name == "drift_script":
                if not isinstance(value, list | tuple):
                    raise ValueError(f"drift_script must be a list, got {value!r}")
                value = tuple(
                    v if isinstance(v, ScriptedDrift) else ScriptedDrift.parse(v) for v in value
                )
            elif kind == "bool":  # a switch: JSON true/false, or 0/1 like the numeric settings
                if value not in (0, 1) or not isinstance(value, int):
                    raise ValueError(f"{name} must be true, false, 0 or 1, got {value!r}")
                value = bool(value)
            elif value is not None and not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r} ({kind})")
            elif kind == "int | None" and value is not None and not _count_like(value):
                raise ValueError(f"{name} must be a whole number >= 0 or null, got {value!r}")
            setattr(self, name, value)
