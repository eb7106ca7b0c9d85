"""Measuring one tool's run from outside: wall time, peak RSS and CPU seconds of the whole
process tree, and what the sandbox saw (requests, 429s, retries) by diffing its counters.

Both tools are run the same way (a child process each), so neither is measured in-process
and neither gets the other's memory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from connectors.clinical_records.catalogue import ENTITY_SETS, PAGE_SIZE

MIB = 1024 * 1024
SAMPLE_SECONDS = 0.05


@dataclass
class ProcessFigures:
    """What one child process (and its descendants) cost."""

    seconds: float
    peak_rss_mib: float  # highest sampled sum over the tree
    largest_rss_mib: float  # highest sampled RSS of any one process of the tree
    cpu_seconds: float  # user + system of the tree, from the kernel's child accounting
    returncode: int
    stdout: str
    stderr: str
    load_average: float  # the machine's 1-minute load when the run ended: others' work shows


class _TreeSampler(threading.Thread):
    """Samples the summed RSS of a process and its descendants until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.peak = 0
        self.largest = 0
        self.done = threading.Event()

    def _tree_rss(self) -> list[int]:
        sizes = []
        for proc in [self.root, *self.root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # exited between listing and reading
                sizes.append(proc.memory_info().rss)
        return sizes

    def run(self) -> None:
        while not self.done.is_set():
            try:
                sizes = self._tree_rss()
            except psutil.Error:
                return
            self.peak = max(self.peak, sum(sizes))
            self.largest = max(self.largest, *sizes, 0)
            self.done.wait(SAMPLE_SECONDS)


def run_measured(
    cmd: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float = 3600
) -> ProcessFigures:
    """Run `cmd` to completion; its wall time, peak tree RSS and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = _TreeSampler(proc.pid)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        sampler.done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    seconds = time.perf_counter() - started
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ProcessFigures(
        seconds=round(seconds, 2),
        peak_rss_mib=round(sampler.peak / MIB, 1),
        largest_rss_mib=round(sampler.largest / MIB, 1),
        cpu_seconds=round(cpu, 2),
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        load_average=round(os.getloadavg()[0], 1),
    )


@dataclass
class ServerFigures:
    """What the sandbox counted for one run: the difference of two `stats` readings."""

    requests: int
    ok: int
    http_429: int
    token_requests: int
    other: dict[str, int] = field(default_factory=dict)

    @property
    def retries(self) -> int:
        """Every answer that was not a 200 made the client ask again (or give up)."""
        return self.requests - self.ok


def server_figures(before: Mapping[str, int], after: Mapping[str, int]) -> ServerFigures:
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return ServerFigures(
        requests=diff.get("requests", 0),
        ok=diff.get("status_200", 0),
        http_429=diff.get("status_429", 0),
        token_requests=diff.get("token_requests", 0),
        other={
            k: v for k, v in diff.items() if v and k.startswith("status_") and k != "status_200"
        },
    )


def minimum_pages(counts: Mapping[str, int]) -> int:
    """The fewest requests that can read every record: ceil(count / page size) per set."""
    return sum(math.ceil(counts.get(e.name, 0) / PAGE_SIZE) for e in ENTITY_SETS)


def record_counts(truth: Mapping[str, Sequence[object]]) -> dict[str, int]:
    return {e.name: len(truth.get(e.name, ())) for e in ENTITY_SETS}


def console_script(name: str) -> str:
    """A console script installed next to this interpreter (as the operator runs it)."""
    script = Path(sys.executable).parent / name
    return str(script) if script.exists() else name


def last_json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON summary line in the output")


def sync_env(sandbox: Mapping[str, str], root: Path, rate: float, burst: int) -> dict[str, str]:
    """`clinical-sync sync` in a child process against `sandbox`: its warehouse, lake, Dagster
    home and limiter file under `root`, the client limited to `rate` and `burst`."""
    return child_env(
        {
            **sandbox,
            "WAREHOUSE_PATH": str(root / "warehouse.duckdb"),
            "LAKE_ROOT": str(root / "lake"),
            "DAGSTER_HOME": str(root / "dagster"),
            "CLINICAL_RATE_LIMIT": f"{rate:g}",
            "CLINICAL_BURST": str(burst),
            "CLINICAL_LIMITER_PATH": str(root / "limiter.sqlite"),
        }
    )


def failure(what: str, run: ProcessFigures, lines: int = 15) -> SystemExit:
    """Stop the benchmark: `what` failed; the last lines of its stderr say why."""
    tail = "\n".join(run.stderr.strip().splitlines()[-lines:])
    return SystemExit(f"{what} failed (exit {run.returncode}):\n{tail}")


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment without any CLINICAL_* or warehouse settings, plus `extra`."""
    ours = ("CLINICAL_", "WAREHOUSE_PATH", "LAKE_ROOT", "DAGSTER_HOME")
    base = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    return {**base, **extra}
