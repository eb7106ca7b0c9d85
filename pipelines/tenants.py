"""The tenants file: the customers one deployment syncs, each with its own service, credentials,
rate limit, warehouse and lake (docs/operators/tenants.md).

TOML, because Python reads it with `tomllib` (no new library) and it holds comments. One
`[[tenant]]` table per customer, an optional `[defaults]` table with values every tenant takes
unless it sets its own:

    [defaults]
    auth_url = "https://auth.example.com"

    [[tenant]]
    name = "north"
    base_url = "https://api.example.com/v1"
    client_id = "north-client"
    client_secret = { env = "NORTH_CLIENT_SECRET" }
    api_key = { file = "secrets/north.api_key" }
    rate = 5

Secrets are never in the file: `client_secret` and `api_key` name an environment variable or
a secret file, read in the process that needs them (a run's step, `tenants check`), so they
never reach run config, Dagster's events or the UI. Relative paths (secret files, warehouse,
lake) are relative to the tenants file's folder; the warehouse defaults to
`data/<tenant>/warehouse.duckdb` and the lake to `data/<tenant>/lake` there.

Every problem of a file is reported at once, one line each naming the tenant
(`TenantsFileError`, a `ConfigError`: exit 2). No Dagster here: the CLI reads it too.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.settings import Settings
from warehouse.private import create_private, private_dir

TENANTS_VARIABLE = "CLINICAL_TENANTS_FILE"
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
NAME_RULE = "1 to 63 lowercase letters, digits, '-' or '_', starting with a letter or digit"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REFERENCE_RULE = '{ env = "VARIABLE" } or { file = "PATH" }, never the secret itself'

# A tenant's key -> the variable Settings validates it as, so that a tenant's rate or URL is
# checked by the same rules as CLINICAL_RATE_LIMIT or CLINICAL_API_BASE_URL.
SETTING_VARIABLES: dict[str, str] = {
    "base_url": "CLINICAL_API_BASE_URL",
    "auth_url": "CLINICAL_AUTH_URL",
    "client_id": "CLINICAL_CLIENT_ID",
    "client_secret": "CLINICAL_CLIENT_SECRET",
    "api_key": "CLINICAL_API_KEY",
    "customer": "CLINICAL_CUSTOMER",
    "rate": "CLINICAL_RATE_LIMIT",
    "burst": "CLINICAL_BURST",
}
SECRETS = ("client_secret", "api_key")
KEYS = ("name", *SETTING_VARIABLES, "warehouse", "lake")
REQUIRED = ("base_url", "auth_url", "client_id", *SECRETS)


class TenantsFileError(ConfigError):
    """Problems of a tenants file or of its tenants' credentials, one line each."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        ValueError.__init__(self, "\n".join(problems))
        self.problems = problems
        self.variable = TENANTS_VARIABLE
        self.expected = f"a valid tenants file ({path})"
        self.advice = (
            f"correct {path} or the variables and files it names (docs/operators/tenants.md)"
        )


@dataclass(frozen=True)
class Secret:
    """Where a credential is kept: an environment variable or a file; never its value."""

    env: str | None = None
    file: Path | None = None

    def __str__(self) -> str:
        return f"${self.env}" if self.env else f"file {self.file}"

    def read(self, environ: Mapping[str, str]) -> str:
        """The value; ValueError saying what to fix (never the value) when it cannot be read."""
        if self.env is not None:
            value = environ.get(self.env, "").strip()
            if not value:
                raise ValueError(f"environment variable {self.env} is not set")
            return value
        assert self.file is not None
        try:
            value = self.file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ValueError(f"secret file {self.file} cannot be read ({error.strerror})") from None
        except UnicodeDecodeError:
            raise ValueError(f"secret file {self.file} is not UTF-8 text") from None
        if not value:
            raise ValueError(f"secret file {self.file} is empty")
        return value


@dataclass(frozen=True)
class Tenant:
    """One customer: its service, where its credentials are kept, its limit and its data."""

    name: str
    file: Path  # the tenants file it comes from
    base_url: str
    auth_url: str
    customer: str
    client_id: str | Secret
    client_secret: Secret
    api_key: Secret
    rate: float
    burst: int
    warehouse: Path
    lake: Path

    def environment(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """`environ` with this tenant's CLINICAL_* variables in place of any there, its
        credentials read now from their variables or files: what `clinical-sync sync` reads
        for one customer. TenantsFileError names the tenant and every problem."""
        environ = os.environ if environ is None else environ
        values = {v: str(getattr(self, k)) for k, v in SETTING_VARIABLES.items()}
        problems: list[str] = []
        for key in ("client_id", *SECRETS):
            reference = getattr(self, key)
            if isinstance(reference, Secret):
                try:
                    values[SETTING_VARIABLES[key]] = reference.read(environ)
                except ValueError as error:
                    problems.append(f"tenant {self.name!r}: {key}: {error}")
        if problems:
            raise TenantsFileError(self.file, problems)
        others = {k: v for k, v in environ.items() if k not in SETTING_VARIABLES.values()}
        return {**others, **values}

    def settings(self, environ: Mapping[str, str] | None = None) -> Settings:
        """The connector's settings for this tenant (`environment`): the machine-wide tuning
        (CLINICAL_LIMITER_PATH, the CA bundle, timeouts) from `environ`."""
        return self.resolved(environ)[1]

    def resolved(self, environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], Settings]:
        """`environment` and the settings from it, the credentials read once."""
        values = self.environment(environ)
        try:
            return values, Settings.from_env(values, dotenv_path=None)
        except ConfigError as error:
            raise TenantsFileError(self.file, _problems(self.name, error)) from None


def _problems(name: str, error: ConfigError) -> list[str]:
    """`CLINICAL_RATE_LIMIT: expected ...` as the tenant's `rate: expected ...`, per problem."""
    keys = {variable: key for key, variable in SETTING_VARIABLES.items()}
    return [
        f"tenant {name!r}: {keys.get(p.variable, p.variable)}: expected {p.expected}"
        for p in getattr(error, "problems", [error])
    ]


@dataclass(frozen=True)
class Tenants:
    """The tenants of one file, in the file's order."""

    path: Path
    tenants: tuple[Tenant, ...]

    def __iter__(self) -> Iterator[Tenant]:
        return iter(self.tenants)

    def __len__(self) -> int:
        return len(self.tenants)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tenants]

    def get(self, name: str | None) -> Tenant:
        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        known = ", ".join(self.names) or "none"
        raise TenantsFileError(self.path, [f"no tenant {name!r} in {self.path} (tenants: {known})"])


def configured(environ: Mapping[str, str] | None = None) -> Path | None:
    """CLINICAL_TENANTS_FILE as an absolute path, or None: one customer from the environment."""
    text = ((os.environ if environ is None else environ).get(TENANTS_VARIABLE) or "").strip()
    return Path(text).expanduser().resolve() if text else None


def load(path: str | os.PathLike[str]) -> Tenants:
    """Read and check a tenants file: structure, names, URLs, numbers; not the credentials,
    which are read where a tenant's settings are needed. Parsed once per process while the
    file stays the same (its inode, size and time): a run asks for its tenant at every step,
    and an edit is still seen by the next question."""
    path = Path(path).expanduser().resolve()
    try:
        status = path.stat()
        version = (status.st_ino, status.st_size, status.st_mtime_ns)
        known = _parsed.get(path)
        if known is not None and known[0] == version:
            return known[1]
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TenantsFileError(path, [f"{path}: cannot be read ({error.strerror})"]) from None
    found = parse(text, path)
    _parsed[path] = (version, found)
    return found


_parsed: dict[Path, tuple[tuple[int, int, int], Tenants]] = {}  # load's, by path


def parse(text: str, path: Path) -> Tenants:
    """A tenants file's text, checked as `load` checks it; relative paths from `path`'s folder."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TenantsFileError(path, [f"{path}: not valid TOML ({error})"]) from None
    problems: list[str] = []
    for table in sorted(set(document) - {"defaults", "tenant"}):
        problems.append(f"{path}: unknown table {table!r} (tables: defaults, tenant)")
    defaults = document.get("defaults", {})
    entries = document.get("tenant", [])
    if not isinstance(defaults, dict):
        problems.append(f"{path}: defaults must be a table ([defaults])")
        defaults = {}
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        problems.append(f"{path}: each tenant must be a [[tenant]] table")
        entries = []
    for key in sorted(set(defaults) - set(KEYS[1:])):
        problems.append(
            f"{path}: defaults: {key!r} cannot be a default (keys: {', '.join(KEYS[1:])})"
        )
        del defaults[key]
    tenants: list[Tenant] = []
    seen: dict[str, int] = {}
    for number, entry in enumerate(entries, start=1):
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            problems.append(f"tenant {number}: name: expected {NAME_RULE}, got {name!r}")
        elif name in seen:
            problems.append(f"tenant {name!r}: named twice (tenants {seen[name]} and {number})")
        else:
            seen[name] = number
            tenant = _tenant(path, name, {**defaults, **entry}, problems)
            tenants += [tenant] if tenant is not None else []
    if problems:
        raise TenantsFileError(path, problems)
    return Tenants(path, tuple(tenants))


def _tenant(path: Path, name: str, entry: dict, problems: list[str]) -> Tenant | None:
    """One `[[tenant]]` table (defaults merged in), checked as Settings checks its variables;
    None, with its problems appended, when it is not usable."""
    label = f"tenant {name!r}"
    found = [
        f"{label}: unknown key {k!r} (keys: {', '.join(KEYS)})"
        for k in sorted(set(entry) - set(KEYS))
    ]
    reported = {key for key in REQUIRED if key not in entry}
    found += [f"{label}: {key}: missing" for key in REQUIRED if key in reported]
    plain = {"CLINICAL_CUSTOMER": name}
    secrets: dict[str, Secret] = {}
    for key in SETTING_VARIABLES:
        value = entry.get(key)
        if value is None:
            continue
        if key in SECRETS or (key == "client_id" and isinstance(value, dict)):
            secrets[key] = _secret(path, label, key, value, found)
        elif isinstance(value, str) or (
            isinstance(value, int | float) and not isinstance(value, bool)
        ):
            plain[SETTING_VARIABLES[key]] = str(value)
        else:
            found.append(f"{label}: {key}: expected a number or a string, got {value!r}")
            reported.add(key)
    unread = {SETTING_VARIABLES[k]: "unread" for k in ("client_id", *SECRETS)}
    try:  # credentials are read where they are needed: placeholders here
        checked = Settings.from_env({**unread, **plain}, dotenv_path=None)
    except ConfigError as error:
        checked = None
        found += [p for p in _problems(name, error) if p.split(": ")[1] not in reported]
    data = path.parent / "data" / name
    places = {
        "warehouse": _path(
            path, label, "warehouse", entry.get("warehouse"), data / "warehouse.duckdb", found
        ),
        "lake": _path(path, label, "lake", entry.get("lake"), data / "lake", found),
    }
    problems += found
    if found or checked is None:
        return None
    return Tenant(
        name=name,
        file=path,
        base_url=checked.base_url,
        auth_url=checked.auth_url,
        customer=checked.customer,
        client_id=secrets.get("client_id", checked.client_id),
        client_secret=secrets["client_secret"],
        api_key=secrets["api_key"],
        rate=checked.rate_limit,
        burst=checked.burst,
        **places,
    )


def _secret(path: Path, label: str, key: str, value: object, problems: list[str]) -> Secret:
    """`{ env = "NAME" }` or `{ file = "PATH" }`; anything else is a problem."""
    if isinstance(value, dict) and len(value) == 1:
        ((kind, where),) = value.items()
        if kind == "env" and isinstance(where, str) and ENV_NAME.fullmatch(where):
            return Secret(env=where)
        if kind == "file" and isinstance(where, str) and where.strip():
            return Secret(file=(path.parent / Path(where).expanduser()).resolve())
    problems.append(f"{label}: {key}: expected {REFERENCE_RULE}")
    return Secret(env="UNSET")


def _path(
    path: Path, label: str, key: str, value: object, default: Path, problems: list[str]
) -> Path:
    """A warehouse or lake location, relative to the tenants file's folder."""
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{label}: {key}: expected a path, got {value!r}")
        return default
    return (path.parent / Path(value).expanduser()).resolve()


HEADER = """\
# Tenants of clinical-records-sync (CLINICAL_TENANTS_FILE; docs/operators/tenants.md).
# Secrets are never written here: client_secret and api_key name an environment variable,
# { env = "NAME" }, or a file, { file = "PATH" } (relative paths from this file's folder).
"""


def add(path: str | os.PathLike[str], entry: Mapping[str, object]) -> Tenants:
    """Append one `[[tenant]]` table to the file (created owner-only when missing). The file is
    replaced, atomically, only when the result loads; else TenantsFileError, file unchanged."""
    path = Path(path).expanduser().resolve()
    before = path.read_text(encoding="utf-8") if path.exists() else HEADER
    return _replace(path, f"{before.rstrip()}\n\n{table(entry)}")


def write(path: str | os.PathLike[str], entries: Sequence[Mapping[str, object]]) -> Tenants:
    """A new tenants file holding `entries` (replacing any), owner-only, checked first."""
    path = Path(path).expanduser().resolve()
    return _replace(path, "\n".join([HEADER, *(table(e) for e in entries)]))


def _replace(path: Path, text: str) -> Tenants:
    found = parse(text, path)
    private_dir(path.parent)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(create_private(partial), "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(partial, path)
    return found


def table(entry: Mapping[str, object]) -> str:
    """One `[[tenant]]` table in TOML; a Secret as its reference, never a value."""
    lines = ["[[tenant]]"]
    for key, value in entry.items():
        if value is None:
            continue
        if isinstance(value, Secret):
            where = ("env", value.env) if value.env else ("file", str(value.file))
            shown = f"{{ {where[0]} = {_string(where[1])} }}"
        elif isinstance(value, bool) or not isinstance(value, int | float):
            shown = _string(str(value))
        else:
            shown = repr(value)
        lines.append(f"{key} = {shown}")
    return "\n".join(lines) + "\n"


def _string(text: str) -> str:
    """A TOML basic string: JSON's escapes are a subset of TOML's."""
    return json.dumps(text, ensure_ascii=False)
