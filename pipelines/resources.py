"""Thin Dagster resources around the connector, the lake and the warehouse.

The layers below import no Dagster; these classes only carry configuration. Each role (the
API, the lake, the warehouse) has one interface and two implementations: one customer from
the environment (credentials bound as `dagster.EnvVar` in `definitions.py`, so the UI shows
variable names, never values), or every tenant of the tenants file, looked up by the run's
partition key (`tenant`), credentials read from their variables or files in the step itself.
"""

from __future__ import annotations

import os
import secrets
import weakref
from datetime import date, timedelta
from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field as ConfigField
from pydantic import PrivateAttr

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import Settings
from pipelines import postgres, tenants
from pipelines.tenants import TENANTS_VARIABLE, Tenant
from sync.strategy import Options
from warehouse.lake import Lake

DEFAULT_WAREHOUSE_PATH = "data/warehouse.duckdb"
DEFAULT_LAKE_ROOT = "data/lake"

# ClinicalApiResource's tuning fields -> the variables they stand for (Settings' names).
TUNING = {
    "rate_limit": "CLINICAL_RATE_LIMIT",
    "burst": "CLINICAL_BURST",
    "limiter_path": "CLINICAL_LIMITER_PATH",
    "ca_bundle": "CLINICAL_CA_BUNDLE",
    "connect_timeout": "CLINICAL_CONNECT_TIMEOUT",
    "read_timeout": "CLINICAL_READ_TIMEOUT",
    "max_in_flight": "CLINICAL_MAX_IN_FLIGHT",
    "max_attempts": "CLINICAL_MAX_ATTEMPTS",
    "retry_budget_seconds": "CLINICAL_RETRY_BUDGET",
}


class ApiAccess(ConfigurableResource):
    """The Clinical Records API for a run: the settings of its tenant (None: one customer)."""

    def settings(self, tenant: str | None = None) -> Settings:
        raise NotImplementedError


class LakeAccess(ConfigurableResource):
    """The Parquet lake of a run's tenant: extraction writes here, loads and rebuilds read."""

    def root_of(self, tenant: str | None = None) -> str:
        raise NotImplementedError

    def lake(self, tenant: str | None = None) -> Lake:
        return Lake(Path(self.root_of(tenant)))


class WarehouseAccess(ConfigurableResource):
    """The published warehouse of a run's tenant, which analysts read, and the working copy
    beside it that the sync writes, one step at a time; see warehouse/publish.py."""

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """The process running a step of ours keeps its PostgreSQL connections to the
        instance (`postgres.hold_connections`). A run the daemon launched runs in a worker
        Dagster starts and opens the instance in; a resource every step of ours requires is
        where our code first sees that instance."""
        if context.instance is not None:
            postgres.hold_connections(context.instance)

    def published(self, tenant: str | None = None) -> str:
        raise NotImplementedError

    def working(self, tenant: str | None = None) -> str:
        """The working copy every step that reads or writes sync state opens."""
        from sync.state import LOCK_WAIT_SECONDS
        from warehouse.publish import working_copy

        return str(working_copy(self.published(tenant), wait=LOCK_WAIT_SECONDS))


class ClinicalApiResource(ApiAccess):
    """One customer's API: credentials and limits, validated by the connector's Settings."""

    base_url: str = ConfigField(description="CLINICAL_API_BASE_URL")
    auth_url: str = ConfigField(description="CLINICAL_AUTH_URL")
    client_id: str = ConfigField(description="CLINICAL_CLIENT_ID")
    client_secret: str = ConfigField(description="CLINICAL_CLIENT_SECRET")
    api_key: str = ConfigField(description="CLINICAL_API_KEY")
    customer: str = ConfigField(description="CLINICAL_CUSTOMER")
    rate_limit: float | None = ConfigField(
        default=None, description="Requests per second for all processes (CLINICAL_RATE_LIMIT)"
    )
    burst: int | None = ConfigField(default=None, description="Burst size (CLINICAL_BURST)")
    limiter_path: str | None = ConfigField(
        default=None, description="Token bucket file shared by processes (CLINICAL_LIMITER_PATH)"
    )
    ca_bundle: str | None = ConfigField(default=None, description="CLINICAL_CA_BUNDLE")
    connect_timeout: float | None = ConfigField(
        default=None, description="CLINICAL_CONNECT_TIMEOUT"
    )
    read_timeout: float | None = ConfigField(default=None, description="CLINICAL_READ_TIMEOUT")
    max_in_flight: int | None = ConfigField(default=None, description="CLINICAL_MAX_IN_FLIGHT")
    max_attempts: int | None = ConfigField(default=None, description="CLINICAL_MAX_ATTEMPTS")
    retry_budget_seconds: float | None = ConfigField(
        default=None, description="CLINICAL_RETRY_BUDGET"
    )

    def settings(self, tenant: str | None = None) -> Settings:
        """Settings from these fields; a tuning value left unset comes from the environment.
        One customer: the assets are not partitioned, so there is no tenant."""
        limits = {
            variable: str(getattr(self, name))
            for name, variable in TUNING.items()
            if getattr(self, name) is not None
        }
        env = {
            **os.environ,
            **limits,
            "CLINICAL_API_BASE_URL": self.base_url,
            "CLINICAL_AUTH_URL": self.auth_url,
            "CLINICAL_CLIENT_ID": self.client_id,
            "CLINICAL_CLIENT_SECRET": self.client_secret,
            "CLINICAL_API_KEY": self.api_key,
            "CLINICAL_CUSTOMER": self.customer,
        }
        return Settings.from_env(env)


class LakeResource(LakeAccess):
    """One customer's lake (LAKE_ROOT)."""

    root: str = DEFAULT_LAKE_ROOT

    def root_of(self, tenant: str | None = None) -> str:
        return self.root


class WarehouseResource(WarehouseAccess):
    """One customer's warehouse (WAREHOUSE_PATH)."""

    path: str = DEFAULT_WAREHOUSE_PATH

    def published(self, tenant: str | None = None) -> str:
        return self.path


class SettledApiResource(ApiAccess):
    """An in-process run's API (the CLI, tests, benchmarks): the settings its caller checked
    and resolved before the run (`runner.check_configuration`: a tenant's credentials read
    once), handed to the run in this process under `handle`. Dagster stores a resource's
    field values with the run's job snapshot in the instance, so the credentials are never
    one: the instance holds the handle alone."""

    handle: str = ConfigField(description="the run's settings, held by the process running it")
    _held: Settings | None = PrivateAttr(default=None)

    @classmethod
    def holding(cls, settings: Settings) -> SettledApiResource:
        """A resource for `settings`, which stay in this process while it is referenced."""
        handle = secrets.token_hex(16)
        _SETTLED[handle] = settings
        resource = cls(handle=handle)
        resource._held = settings  # Dagster runs copies of it: this one keeps the entry alive
        return resource

    def settings(self, tenant: str | None = None) -> Settings:
        settings = _SETTLED.get(self.handle)
        if settings is None:
            raise ConfigError("clinical_api.handle", "settings held by the process of this run")
        return settings


# SettledApiResource's settings, by handle, while the resource that holds them lives.
_SETTLED: weakref.WeakValueDictionary[str, Settings] = weakref.WeakValueDictionary()


def _tenant(tenants_file: str, name: str | None, found: dict[str, Tenant]) -> Tenant:
    """The run's tenant, read from the file the first time a resource of the run asks (kept in
    `found`, the resource's own: Dagster builds a run's resources once in each of its
    processes, so an edit of the file is seen by the next run)."""
    if name is None:
        raise ConfigError(TENANTS_VARIABLE, "a run for one tenant (a partition of the assets)")
    if name not in found:
        found[name] = tenants.load(tenants_file).get(name)
    return found[name]


class TenantApiResource(ApiAccess):
    """Each tenant's API: its URLs, customer and limit from the tenants file, its credentials
    from the variables or files the file names, read in the run (never in run config), once:
    Dagster initializes a run's resources once for all its steps in its one process."""

    tenants_file: str = ConfigField(description=TENANTS_VARIABLE)
    _found: dict[str, Tenant] = PrivateAttr(default_factory=dict)
    _read: dict[str, Settings] = PrivateAttr(default_factory=dict)

    def settings(self, tenant: str | None = None) -> Settings:
        found = _tenant(self.tenants_file, tenant, self._found)
        if found.name not in self._read:
            self._read[found.name] = found.settings()
        return self._read[found.name]


class TenantLakeResource(LakeAccess):
    """Each tenant's own lake, from the tenants file."""

    tenants_file: str = ConfigField(description=TENANTS_VARIABLE)
    _found: dict[str, Tenant] = PrivateAttr(default_factory=dict)

    def root_of(self, tenant: str | None = None) -> str:
        return str(_tenant(self.tenants_file, tenant, self._found).lake)


class TenantWarehouseResource(WarehouseAccess):
    """Each tenant's own warehouse (and working copy), from the tenants file."""

    tenants_file: str = ConfigField(description=TENANTS_VARIABLE)
    _found: dict[str, Tenant] = PrivateAttr(default_factory=dict)

    def published(self, tenant: str | None = None) -> str:
        return str(_tenant(self.tenants_file, tenant, self._found).warehouse)


def tenant_resources(tenants_file: str | Path) -> dict[str, ConfigurableResource]:
    """The API, lake and warehouse of the run's tenant, for tenant-partitioned assets."""
    return {
        "clinical_api": TenantApiResource(tenants_file=str(tenants_file)),
        "lake": TenantLakeResource(tenants_file=str(tenants_file)),
        "warehouse": TenantWarehouseResource(tenants_file=str(tenants_file)),
    }


def _day(name: str, text: str | None) -> date | None:
    if not text:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"sync_options.{name}", "a date YYYY-MM-DD") from None


class SyncOptionsResource(ConfigurableResource):
    """How this run syncs; set per run in the launchpad (`resources: sync_options: config:`)."""

    full: bool = ConfigField(
        default=False, description="Full snapshot of every selected entity set (a reset)"
    )
    lookback_minutes: float = ConfigField(
        default=60.0, description="Cursor sets re-read this far behind the watermark"
    )
    snapshot_every_days: float = ConfigField(
        default=7.0, description="Cadence of the full snapshot of Patients, Prescriptions, ..."
    )
    exact: bool = ConfigField(
        default=True,
        description=(
            "Read the sets without updated_at (Patients, Prescriptions, ...) whole every run, "
            "so that every run ends equal to the source; off, they wait for the snapshot cadence"
        ),
    )
    nightly_budget: str | None = ConfigField(
        default=None,
        description=(
            "Requests (1500) or minutes at the rate (30m) a nightly run may spend; the sets "
            "without updated_at are then read whole stalest first (CLINICAL_NIGHTLY_BUDGET)"
        ),
    )
    staleness_warn_hours: float = ConfigField(
        default=26.0,
        description="Warn when a set without updated_at was last read whole longer ago",
    )
    force_source: bool = ConfigField(
        default=False,
        description="Adopt a new service or customer for this warehouse and lake (sync --force)",
    )
    backfill_from: str | None = ConfigField(
        default=None, description="Re-sync cursor rows from this date (YYYY-MM-DD), inclusive"
    )
    backfill_to: str | None = ConfigField(
        default=None, description="... to this date, exclusive (default: today)"
    )

    def options(self) -> Options:
        start = _day("backfill_from", self.backfill_from)
        end = _day("backfill_to", self.backfill_to)
        if end is not None and start is None:
            raise ConfigError("sync_options.backfill_from", "a date when backfill_to is given")
        if start is not None and end is not None and end <= start:
            raise ConfigError("sync_options.backfill_to", "a date after backfill_from")
        return Options(
            full=self.full,
            lookback=timedelta(minutes=self.lookback_minutes),
            snapshot_every=timedelta(days=self.snapshot_every_days),
            exact=self.exact,
            backfill_from=start,
            backfill_to=end,
        )
