"""Shared by the benchmark scripts: a sandbox in its own process, and the results file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from connectors.sandbox.config import VALUE_PROFILES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def sandbox_process(*args: str) -> Iterator[dict[str, str]]:
    """`clinical-sync sandbox ARGS` in a child process; yields its CLINICAL_* settings.
    Unlimited unless ARGS give `--rate` (the command's own default is the spec's 5/s)."""
    with sandbox_server(*args) as (env, _):
        yield env


@contextmanager
def sandbox_server(*args: str) -> Iterator[tuple[dict[str, str], psutil.Process]]:
    """`sandbox_process`, with the server's process: the CPU it spends serving a benchmark
    shares the machine with the runs measured."""
    cmd = [
        *(sys.executable, "-m", "cli.main", "sandbox", "--port", str(free_port())),
        *("--rate", "0", *args),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        env: dict[str, str] = {}
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.strip():  # an empty line ends the settings
                break
            name, _, value = line.strip().partition("=")
            env[name] = value
        if "CLINICAL_CUSTOMER" not in env:
            raise RuntimeError(f"sandbox exited early: {' '.join(cmd)}")
        yield env, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def add_sandbox_options(
    parser: argparse.ArgumentParser, *, scale: float, rate: float = 5.0, latency: float = 0.0
) -> None:
    """The options of a benchmark that runs one rate-limited sandbox."""
    parser.add_argument("--scale", type=float, default=scale)
    parser.add_argument("--rate", type=float, default=rate)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--latency", type=float, default=latency)
    parser.add_argument(
        "--resolved-references",
        action="store_true",
        help="the sandbox's switch under which every navigation reference resolves",
    )
    parser.add_argument(
        "--values",
        choices=VALUE_PROFILES,
        default="spec",
        help="the sandbox's values profile (wide: every value each spec type allows)",
    )


def sandbox_args(args: argparse.Namespace) -> list[str]:
    """`clinical-sync sandbox` arguments for the options of `add_sandbox_options`."""
    resolved = getattr(args, "resolved_references", False)
    return [
        *("--scale", f"{args.scale:g}", "--rate", f"{args.rate:g}"),
        *("--burst", str(args.burst), "--latency", f"{args.latency:g}"),
        *(["--resolved-references"] if resolved else []),
        *("--values", getattr(args, "values", "spec")),
    ]


@contextmanager
def limited_sandbox(args: argparse.Namespace) -> Iterator[tuple[dict[str, str], Path]]:
    """A sandbox process at `args`' rate and latency, the client env configured at that same
    limit with its own limiter file, and a temporary folder for the run."""
    with sandbox_process(*sandbox_args(args)) as env, tempfile.TemporaryDirectory() as tmp:
        yield (
            env
            | {
                "CLINICAL_LIMITER_PATH": str(Path(tmp) / "ratelimit.sqlite"),
                "CLINICAL_RATE_LIMIT": str(args.rate),
                "CLINICAL_BURST": str(args.burst),
            },
            Path(tmp),
        )


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def add_record_option(parser: argparse.ArgumentParser) -> None:
    """`--record`: a script prints its figures; only when asked does it keep them (run_all.py
    asks), so a trial run or a test leaves the recorded figures as they were."""
    parser.add_argument(
        "--record", action="store_true", help="merge the figures into benchmarks/results.json"
    )


def record(name: str, figures: dict[str, object]) -> None:
    """Merge one benchmark's figures into benchmarks/results.json (with `--record` only)."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[name] = {
        "figures": figures,
        "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
