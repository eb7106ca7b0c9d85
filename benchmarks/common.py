"""Shared by the benchmark scripts: a sandbox in its own process, and the results file."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def sandbox_process(*args: str) -> Iterator[dict[str, str]]:
    """`clinical-sync sandbox ARGS` in a child process; yields its CLINICAL_* settings."""
    cmd = [sys.executable, "-m", "pipelines.cli", "sandbox", "--port", str(free_port()), *args]
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
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def record(name: str, figures: dict[str, object]) -> None:
    """Merge one benchmark's figures into benchmarks/results.json."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[name] = {
        "figures": figures,
        "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
