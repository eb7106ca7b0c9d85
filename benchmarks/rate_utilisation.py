"""How much of the allowed request rate the connector uses against a slow server.

The sandbox (its own process) allows 5 requests/s per API key and answers each request in
800 ms; the connector reads all Appointments (20,000 records at scale 2.5) through
`ClinicalClient.iter_pages`. A sequential client would reach about 1/0.8 = 1.25 requests/s,
0.25 of the limit.

Run: .venv/bin/python benchmarks/rate_utilisation.py [--scale 2.5] [--rate 5] [--latency 0.8]
Target: utilisation >= 0.95 and no 429.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_record_option, add_sandbox_options, limited_sandbox, record
from connectors.clinical_records.catalogue import APPOINTMENTS
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.settings import Settings
from connectors.sandbox.control import SandboxControl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sandbox_options(parser, scale=2.5, latency=0.8)
    add_record_option(parser)
    args = parser.parse_args()
    with limited_sandbox(args) as (env, _):
        settings = Settings.from_env(env, dotenv_path=None)
        started = time.monotonic()
        with ClinicalClient(settings) as client:
            records = sum(len(page.records) for page in client.iter_pages(APPOINTMENTS))
            elapsed = time.monotonic() - started
            stats = client.stats.as_dict()
        server = SandboxControl.from_env(env).stats()
    requests = stats["requests"]
    achieved = requests / elapsed
    figures = {
        "records": records,
        "requests": requests,
        "seconds": round(elapsed, 2),
        "requests_per_second": round(achieved, 3),
        "limit": args.rate,
        "utilisation": round(achieved / args.rate, 3),
        "burst_allowance": args.burst,  # requests the server allows at once, on top of the rate
        "http_429_client": stats["throttled"],
        "http_429_server": server.get("status_429_sent", 0),
        "latency_seconds": args.latency,
    }
    for name, value in figures.items():
        print(f"{name:28} {value}")
    if args.record:
        record("rate_utilisation", figures)


if __name__ == "__main__":
    main()
