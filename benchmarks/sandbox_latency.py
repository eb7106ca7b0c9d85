"""How fast the sandbox serves a 100-record page at scale 10, so it is never the bottleneck;
and a one-record answer on a reused connection, which Nagle's algorithm and the client's
delayed ACK held for ~40 ms until the sandbox set TCP_NODELAY.

Run: .venv/bin/python benchmarks/sandbox_latency.py [--scale 10] [--pages 300]
Target: median under 10 ms for both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_record_option, record, sandbox_process
from connectors.clinical_records.auth import TokenProvider
from connectors.clinical_records.settings import Settings


def token(env: dict[str, str]) -> str:
    """A bearer token the way the connector gets one."""
    with httpx.Client() as http:
        return TokenProvider(Settings.from_env(env, dotenv_path=None), http).token()


def timed_pages(client: httpx.Client, pages: int, keyset: bool) -> list[float]:
    """Page through Appointments by keyset (`id gt last`) or by `$skip`; seconds per page."""
    times: list[float] = []
    last: str | None = None
    for n in range(pages):
        params = {"$top": "100", "$orderby": "id asc"}
        if keyset and last is not None:
            params["$filter"] = f"id gt '{last}'"
        if not keyset:
            params["$skip"] = str(n * 100)
        started = time.perf_counter()
        response = client.get("Appointments", params=params)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
        last = response.json()["value"][-1]["id"]
    return times


def timed_small(client: httpx.Client, requests: int) -> list[float]:
    """One-record answers on the same connection; seconds each."""
    times: list[float] = []
    for _ in range(requests):
        started = time.perf_counter()
        client.get("Branches", params={"$top": "1"}).raise_for_status()
        times.append(time.perf_counter() - started)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=10)
    parser.add_argument("--pages", type=int, default=300)
    add_record_option(parser)
    args = parser.parse_args()
    started = time.perf_counter()
    with sandbox_process("--scale", str(args.scale)) as env:
        startup = time.perf_counter() - started
        headers = {"Authorization": f"Bearer {token(env)}", "x-api-key": env["CLINICAL_API_KEY"]}
        with httpx.Client(base_url=env["CLINICAL_API_BASE_URL"] + "/", headers=headers) as client:
            timed_pages(client, 20, keyset=True)  # warm up caches and the connection
            figures = {
                "scale": args.scale,
                "startup_s": round(startup, 2),
                "keyset": summary(timed_pages(client, args.pages, keyset=True)),
                "skip": summary(timed_pages(client, args.pages, keyset=False)),
                "one_record": summary(timed_small(client, args.pages)),
            }
    print(f"sandbox at scale {args.scale:g}: started in {figures['startup_s']} s")
    for mode, what in (
        ("keyset", "100-record page (keyset)"),
        ("skip", "100-record page (skip)"),
        ("one_record", "one-record answer"),
    ):
        f = figures[mode]
        print(f"  {what}: median {f['median_ms']} ms, p99 {f['p99_ms']} ms")
    print("  target: median under 10 ms")
    if args.record:
        record("sandbox_latency", figures)


if __name__ == "__main__":
    main()
