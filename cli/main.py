"""`clinical-sync`: the operator's command line. Each command imports what it needs lazily."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

from cli import exit_codes
from cli.documents import add_parser as _add_documents

Command = Callable[[argparse.Namespace], int]
TENANTS_HINT = "CLINICAL_TENANTS_FILE={path} clinical-sync dev (or sync --all-tenants)"


def _sandbox(args: argparse.Namespace) -> int:
    from connectors.sandbox.config import SandboxConfig, customers
    from connectors.sandbox.server import SandboxServer

    served = []
    if args.customers > 1 or args.tenants_file:
        served = customers([f"clinic-{n}" for n in range(1, args.customers + 1)], args.seed)
    config = SandboxConfig(
        seed=args.seed,
        scale=args.scale,
        resolved_references=args.resolved_references,
        values=args.values,
        rate=args.rate or None,  # 0 turns the limit off
        burst=args.burst,
        latency=args.latency,
        jitter=args.jitter,
        error_rate=args.error_rate,
        drop_rate=args.drop_rate,
        token_lifetime=args.token_lifetime,
        drift_every=args.drift_every,
        drift_seed=args.drift_seed,
        expand_cap=args.expand_cap,
        refuse_document_expand=args.refuse_document_expand,
        refuse_filter_or=args.refuse_filter_or,
        dangling=args.dangling,
        client_secret=args.client_secret,
        api_key=args.api_key,
        customers=served,
    )
    print(
        f"generating sandbox data (seed {args.seed}, scale {args.scale:g}, "
        f"values {args.values})...",
        file=sys.stderr,
    )
    server = SandboxServer(config, port=args.port)
    for customer in server.customers:
        counts = server.store_of(customer.name).counts()
        print(
            f"records of {customer.name}: " + ", ".join(f"{k} {n:,}" for k, n in counts.items()),
            file=sys.stderr,
        )
    if args.tenants_file:  # written before the settings end: a reader may use it at once
        from cli.tenants import sandbox_tenants

        written = sandbox_tenants(server, Path(args.tenants_file))
        print(
            f"tenants file {written.path} ({len(written)} tenants; secrets beside it): "
            f"{TENANTS_HINT.format(path=written.path)}",
            file=sys.stderr,
        )
    for customer in server.customers:
        if len(server.customers) > 1:
            print(f"# customer {customer.name}")
        for name, value in server.env(customer.name).items():
            print(f"{name}={value}")
    print(flush=True)  # an empty line ends the settings, for programs that read them
    print(f"serving {server.base_url} (Ctrl-C to stop)", file=sys.stderr)
    server.serve_forever()
    return 0


def _add_sandbox(sub: argparse._SubParsersAction) -> None:
    from connectors.sandbox.config import VALUE_PROFILES  # light: the catalogue only

    p = sub.add_parser("sandbox", help="serve the sandbox and print its CLINICAL_* settings")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default: 8765)")
    p.add_argument("--seed", type=int, default=7, help="seed of the synthetic data (default: 7)")
    p.add_argument("--scale", type=float, default=1.0, help="data size (1: about 18k records)")
    p.add_argument(
        "--rate",
        type=float,
        default=5.0,
        help="requests/s per API key, as the spec's top plan (default 5; 0 turns it off)",
    )
    p.add_argument("--burst", type=int, default=10, help="requests allowed at once above the rate")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    p.add_argument("--jitter", type=float, default=0.0, help="random +- seconds on the latency")
    p.add_argument("--error-rate", type=float, default=0.0, help="share of 500/502/503 answers")
    p.add_argument("--drop-rate", type=float, default=0.0, help="share of dropped connections")
    p.add_argument(
        "--token-lifetime", type=float, default=300.0, help="seconds a token lives (default: 300)"
    )
    p.add_argument(
        "--drift-every",
        type=int,
        default=0,
        help="every N collection requests the set being read changes: a delete, an insert "
        "anywhere in key order, an update (default 0: off)",
    )
    p.add_argument(
        "--drift-seed", type=int, default=5, help="seed of where drift strikes (default: 5)"
    )
    p.add_argument(
        "--expand-cap",
        type=int,
        default=None,
        metavar="N",
        help="at most N items in any expanded collection; its @odata.count stays full "
        "(default: no cap)",
    )
    p.add_argument(
        "--refuse-document-expand",
        action="store_true",
        help="answer any $expand naming Documents with 400 InvalidQueryOption",
    )
    p.add_argument(
        "--refuse-filter-or",
        action="store_true",
        help="answer any $filter using 'or' with 400 InvalidFilter (the spec does not list it)",
    )
    p.add_argument(
        "--dangling",
        type=_share,
        default=0.0,
        metavar="SHARE",
        help="share of every riding child set's parent reference naming no record, spread "
        "through its keys (default 0: only 1%% of claims dangle)",
    )
    p.add_argument(
        "--resolved-references",
        action="store_true",
        help="every reference a navigation joins on is set and names a record that exists "
        "(default: some are null, 1%% of claims dangle, as the spec allows)",
    )
    p.add_argument(
        "--values",
        choices=VALUE_PROFILES,
        default="spec",
        help="spec: the values the catalogue chose (default); wide: every value each field's "
        "spec type allows (leading-zero ids, names as user ids, long decimals, every "
        "date-time form)",
    )
    p.add_argument(
        "--customers",
        type=_positive,
        default=1,
        metavar="N",
        help="serve N customers, clinic-1 .. clinic-N, each with its own credentials, data "
        "(seed, seed+1, ...) and rate limit; prints each one's settings (default: 1)",
    )
    p.add_argument(
        "--tenants-file",
        metavar="PATH",
        help="write a tenants file for the customers (secrets in files beside it)",
    )
    p.add_argument(
        "--client-secret", default=None, help="the one customer's fixed secret (default: random)"
    )
    p.add_argument(
        "--api-key", default=None, help="the one customer's fixed API key (default: random)"
    )
    p.set_defaults(func=_sandbox, validate=_check_sandbox)


def _check_sandbox(args: argparse.Namespace) -> str | None:
    """A fixed secret or key is the one customer's: several customers each draw their own."""
    fixed = [
        f for f, v in (("--client-secret", args.client_secret), ("--api-key", args.api_key)) if v
    ]
    if fixed and (args.customers > 1 or args.tenants_file):
        return (
            f"{' and '.join(fixed)} fix the one customer's credentials; with --customers or "
            "--tenants-file each customer gets its own (printed, and in the tenants file's folder)"
        )
    return None


def _lazy(module: str, name: str) -> Command:
    """A command whose module (and Dagster with it) is imported only when it runs."""

    def run(args: argparse.Namespace) -> int:
        from importlib import import_module

        return getattr(import_module(module), name)(args)

    return run


def _add_sync(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sync", help="one sync run through Dagster, with progress and a summary")
    p.add_argument("--full", action="store_true", help="snapshot every set (resets watermarks)")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="ENTITY",
        help="entity sets by spec name or table name (with --full: reset just these)",
    )
    p.add_argument(
        "--backfill-from",
        type=_day,
        metavar="YYYY-MM-DD",
        help="re-read the cursor sets from this date; the nightly watermark stays",
    )
    p.add_argument(
        "--backfill-to",
        type=_day,
        metavar="YYYY-MM-DD",
        help="... up to this date, exclusive (default: today); needs --backfill-from",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="adopt a new service or customer for this warehouse and lake (never by default)",
    )
    whose = p.add_mutually_exclusive_group()
    whose.add_argument("--tenant", metavar="NAME", help="one tenant of the tenants file")
    whose.add_argument(
        "--all-tenants",
        action="store_true",
        help="every tenant, each in its own process; exits with the worst tenant's status",
    )
    p.add_argument("--instance-prepared", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--read-rotation", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument(
        "--parallel",
        type=_positive,
        metavar="N",
        help="with --all-tenants, at most N at once (default: the run queue's maximum)",
    )
    p.set_defaults(func=_sync, validate=_check_sync)


def _sync(args: argparse.Namespace) -> int:
    """One run here, or with `--all-tenants` one per tenant, each in a process forked from
    this one that runs this command line's `main` as `sync --tenant NAME`."""
    if args.all_tenants:
        from cli.tenants import sync_all

        return sync_all(args, main)
    from cli.commands import sync

    return sync(args)


def _day(text: str) -> date:
    """A YYYY-MM-DD argument; argparse names the flag when this raises."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date YYYY-MM-DD, got {text!r}") from None


def _check_sync(args: argparse.Namespace) -> str | None:
    """Flag combinations that cannot run: refused before any run starts."""
    start, end = args.backfill_from, args.backfill_to
    if end is not None and start is None:
        return "--backfill-to needs --backfill-from (the range's first day)"
    if start is not None and end is not None and end <= start:
        return "--backfill-to must be a later date than --backfill-from"
    if start is not None and args.full:
        return "--full and --backfill-from exclude each other (a backfill re-reads a range)"
    if args.parallel is not None and not args.all_tenants:
        return "--parallel applies to --all-tenants"
    return None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to below 1, got {text!r}")
    return value


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="per entity set: rows, rejects, watermark, last run and whether it ended exact",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object for scripts (docs/operators/running.md)",
    )
    p.add_argument(
        "--tenant",
        metavar="NAME",
        action="append",
        help="a tenant's warehouse (repeatable; with a tenants file, default: every tenant's)",
    )
    p.set_defaults(func=_lazy("cli.commands", "status"))


def _add_sql(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sql",
        help="query the published warehouse read-only (a shell, or one query with -c)",
        description="Read-only SQL on WAREHOUSE_PATH, the copy the last successful sync "
        "published; it never blocks a sync. Statements come from -c, else from stdin.",
    )
    p.add_argument("-c", dest="command_text", metavar="SQL", help="run these and print the table")
    p.set_defaults(func=_lazy("cli.sql", "sql"))


def _add_rebuild(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rebuild", help="rebuild the DuckDB warehouse from the Parquet lake")
    p.set_defaults(func=_lazy("cli.commands", "rebuild"))


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from cli.demo import add_parser

    add_parser(sub)


def _add_tenants(sub: argparse._SubParsersAction) -> None:
    from cli.tenants import add_parser

    add_parser(sub)


def _add_dev(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dev", help="the Dagster UI, against a sandbox unless configured")
    p.add_argument("--sandbox", action="store_true", help="a sandbox even if CLINICAL_* is set")
    p.add_argument("--port", type=int, default=8765, help="sandbox port (default: 8765)")
    p.add_argument("--scale", type=float, default=1.0, help="sandbox data size (1: ~18k records)")
    p.add_argument("--rate", type=float, default=5.0, help="sandbox requests/s (default: 5)")
    p.add_argument("--ui-port", type=int, default=3000, help="Dagster UI port (default: 3000)")
    p.set_defaults(func=_lazy("cli.commands", "dev"))


PARSERS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_sandbox,
    _add_sync,
    _add_status,
    _add_sql,
    _add_demo,
    _add_rebuild,
    _add_dev,
    _add_documents,
    _add_tenants,
]


def _operator_errors() -> tuple[type[BaseException], ...]:
    """Errors an operator fixes in the configuration or the environment: message, exit 2.
    Imported here, not at the top: `clinical-sync --help` stays fast."""
    from connectors.clinical_records.errors import ConfigError
    from pipelines.postgres import PostgresUnreachable
    from warehouse.errors import SourceMismatch, WarehouseLocked

    return (ConfigError, WarehouseLocked, SourceMismatch, PostgresUnreachable)


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    """`--verbose` on every command: the full trace inline instead of only in the log file."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        parser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            help="print Dagster's events and full traces here, not only to the log file",
        )
    for action in subcommands:
        for child in dict.fromkeys(action.choices.values()):
            _add_verbose(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clinical-sync",
        description="Sync the Clinical Records API into a DuckDB warehouse.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in PARSERS:
        add(sub)
    _add_verbose(parser)
    return parser


def _config_lines(error: BaseException) -> list[str]:
    """A configuration error: one line per problem, then what to do."""
    problems = str(error).splitlines()
    advice = getattr(error, "advice", None)  # a tenants file says where to fix it
    if len(problems) == 1 and advice is None:
        return [f"clinical-sync: {problems[0]}"]
    return [
        f"clinical-sync: {len(problems)} settings are missing or wrong:",
        *(f"  {line}" for line in problems),
        "  do:   "
        + (advice or "set them in the environment or in .env (docs/operators/configuration.md)")
        + ", then run again",
    ]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, then refuse impossible flag combinations as argparse does (usage, exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    validate = getattr(args, "validate", None)
    problem = validate(args) if validate else None
    if problem:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(problem)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from warehouse.private import private_umask

    private_umask()  # the warehouse, lake and Dagster home hold PHI: owner-only files
    args = _parse(argv)
    try:
        return int(args.func(args) or 0)
    except _operator_errors() as error:
        print("\n".join(_config_lines(error)), file=sys.stderr)
        return exit_codes.CONFIG
    except Exception as error:  # anything else: a few lines here, the trace in a log file
        if getattr(args, "verbose", False):
            raise
        from cli import log as cli_log

        log = cli_log.log_file(args.command)
        cli_log.write_traceback(error, log)
        what = f"{args.command} failed"
        lines = cli_log.explain(what, f"{type(error).__name__}: {error}", None, log)
        print("\n".join(lines), file=sys.stderr)
        return exit_codes.FAILED


if __name__ == "__main__":
    sys.exit(main())
