"""Run every benchmark script, then write BENCHMARKS.md: the machine, the commands, the figures.

Each script runs alone in its own process (`python benchmarks/<name>.py --record`), prints
its figures and, asked by `--record`, records them in benchmarks/results.json; this collects
what they printed and what they recorded. A failing script is reported and the others still run.

Run: .venv/bin/python benchmarks/run_all.py [--quick] [--only NAME ...] [--report-only]
(`make bench` runs it with the bench extra installed.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, ROOT

HERE = ROOT / "benchmarks"
REPORT = ROOT / "BENCHMARKS.md"
OUTPUTS = HERE / "outputs.json"  # what each script printed last time run_all ran it
# Modules here that are not benchmarks: shared helpers and the dlt configuration.
HELPERS = {"__init__", "common", "measure", "truth", "dlt_source", "run_all"}
# The short versions for a development run (`--quick`).
QUICK_ARGS: dict[str, list[str]] = {
    "e2e_vs_dlt": ["--quick"],
    "scaling": ["--scales", "1", "10"],
    "publish_cost": ["--scales", "10"],
    "expansion_cost": ["--scale", "1"],
    "reconcile_cost": ["--scale", "1", "--drift-every", "20", "--drift-seeds", "1", "2"],
    "worker_sizing": ["--scale", "0.2"],
    "tenants_parallel": ["--tenants", "3", "--scale", "0.2"],
    "biggest_customer": ["--scales", "1", "--repeat", "1"],
    "year_of_nights": ["--scale", "0.5", "--days", "10"],
}


@dataclass
class ScriptRun:
    name: str
    command: str
    seconds: float
    returncode: int
    output: str


def scripts() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem not in HELPERS)


def run_script(name: str, quick: bool) -> ScriptRun:
    args = [*(QUICK_ARGS.get(name, []) if quick else []), "--record"]
    cmd = [sys.executable, str(HERE / f"{name}.py"), *args]
    shown = " ".join([".venv/bin/python", f"benchmarks/{name}.py", *args])
    print(f"\n=== {shown}", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # echoed as it comes: a long benchmark shows it is alive
        print(line, end="", flush=True)
        lines.append(line)
    proc.wait()
    seconds = round(time.perf_counter() - started, 1)
    return ScriptRun(name, shown, seconds, proc.returncode, "".join(lines))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> list[tuple[str, str]]:
    return [
        ("CPU", cpu_model()),
        ("cores", f"{psutil.cpu_count(logical=False)} physical, {os.cpu_count()} logical"),
        ("RAM", f"{psutil.virtual_memory().total / 1024**3:.1f} GiB"),
        ("Python", platform.python_version()),
        ("OS", platform.platform()),
        (
            "load average (1, 5, 15 min) when written",
            ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        ),
    ]


def figure_lines(value: Any, depth: int = 0) -> list[str]:
    """Nested figures as an indented list."""
    pad = "  " * depth
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}- {key}:")
                lines.extend(figure_lines(item, depth + 1))
            else:
                lines.append(f"{pad}- {key}: {item}")
        return lines
    if isinstance(value, list):
        return [line for item in value for line in figure_lines(item, depth)]
    return [f"{pad}- {value}"]


def section(name: str, recorded: dict[str, Any] | None, run: ScriptRun | None) -> list[str]:
    doc = (HERE / f"{name}.py").read_text().split('"""')[1].strip().splitlines()[0]
    lines = [f"## {name}", "", doc, ""]
    if recorded is not None:
        lines += [f"Command: `{recorded.get('command', '')}`, at {recorded.get('at', '')}.", ""]
    if run is not None and run.returncode != 0:
        lines += [f"**Failed** (exit {run.returncode}) after {run.seconds} s.", ""]
    if run is not None and run.output.strip():
        lines += ["```", run.output.strip(), "```", ""]
    if recorded is not None:
        lines += ["<details><summary>figures (results.json)</summary>", ""]
        lines += [*figure_lines(recorded.get("figures", {})), "", "</details>", ""]
    elif run is None:
        lines += ["Not run yet.", ""]
    return lines


def remembered(runs: dict[str, ScriptRun]) -> dict[str, ScriptRun]:
    """This invocation's runs merged over the ones kept from earlier invocations (--only)."""
    kept = json.loads(OUTPUTS.read_text()) if OUTPUTS.exists() else {}
    merged = {name: ScriptRun(**run) for name, run in kept.items()} | runs
    OUTPUTS.write_text(
        json.dumps({n: asdict(r) for n, r in merged.items()}, indent=2, sort_keys=True) + "\n"
    )
    return merged


def write_report(names: list[str], runs: dict[str, ScriptRun], command: str) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    runs = remembered(runs)
    lines = [
        "# Benchmarks",
        "",
        "Written by `benchmarks/run_all.py` (`make bench`); machine-readable figures are in",
        "`benchmarks/results.json`. Each script can also be run alone; its docstring says how",
        "and what it targets, and it adds its figures to results.json only with `--record`.",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: `{command}`.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in machine()],
        "",
    ]
    for name in names:
        lines += section(name, results.get(name), runs.get(name))
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    print(f"\nwrote {REPORT.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short version of each script")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="just these scripts")
    parser.add_argument(
        "--report-only", action="store_true", help="write BENCHMARKS.md from results.json"
    )
    args = parser.parse_args(argv)
    names = scripts()
    chosen = [n for n in names if not args.only or n in args.only]
    runs = {} if args.report_only else {n: run_script(n, args.quick) for n in chosen}
    command = " ".join([".venv/bin/python", "benchmarks/run_all.py", *(argv or sys.argv[1:])])
    write_report(names, runs, command)
    failed = [r.name for r in runs.values() if r.returncode != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
