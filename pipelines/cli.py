"""`clinical-sync`: the operator's command line. Each command imports what it needs lazily."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Command = Callable[[argparse.Namespace], int]


def _sandbox(args: argparse.Namespace) -> int:
    from connectors.sandbox.config import SandboxConfig
    from connectors.sandbox.server import SandboxServer

    config = SandboxConfig(
        seed=args.seed,
        scale=args.scale,
        rate=args.rate,
        burst=args.burst,
        latency=args.latency,
        jitter=args.jitter,
        error_rate=args.error_rate,
        drop_rate=args.drop_rate,
        token_lifetime=args.token_lifetime,
    )
    if args.client_secret:
        config.client_secret = args.client_secret
    if args.api_key:
        config.api_key = args.api_key
    print(f"generating sandbox data (seed {args.seed}, scale {args.scale:g})...", file=sys.stderr)
    server = SandboxServer(config, port=args.port)
    counts = server.store.counts()
    print(
        "records: " + ", ".join(f"{name} {n:,}" for name, n in counts.items()),
        file=sys.stderr,
    )
    for name, value in server.env().items():
        print(f"{name}={value}")
    print(flush=True)  # an empty line ends the settings, for programs that read them
    print(f"serving {server.base_url} (Ctrl-C to stop)", file=sys.stderr)
    server.serve_forever()
    return 0


def _add_sandbox(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="serve the sandbox and print its CLINICAL_* settings")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--rate", type=float, default=None, help="requests/s per API key (default: off)")
    p.add_argument("--burst", type=int, default=10)
    p.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    p.add_argument("--jitter", type=float, default=0.0)
    p.add_argument("--error-rate", type=float, default=0.0, help="share of 500/502/503 answers")
    p.add_argument("--drop-rate", type=float, default=0.0, help="share of dropped connections")
    p.add_argument("--token-lifetime", type=float, default=300.0)
    p.add_argument("--client-secret", default=None, help="fixed secret (default: random)")
    p.add_argument("--api-key", default=None, help="fixed API key (default: random)")
    p.set_defaults(func=_sandbox)


PARSERS: list[Callable[[argparse._SubParsersAction], None]] = [_add_sandbox]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clinical-sync",
        description="Sync the Clinical Records API into a DuckDB warehouse.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in PARSERS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
