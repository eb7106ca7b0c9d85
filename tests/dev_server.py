"""`clinical-sync dev` as an operator starts it, against its own sandbox, for the tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

CLI = str(Path(sys.executable).with_name("clinical-sync"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class DevServer:
    proc: subprocess.Popen
    url: str
    output: Path
    home: Path

    def text(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")


def wait_for(url: str, proc: subprocess.Popen, output: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dev exited early:\n{output.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no Dagster UI at {url}:\n{output.read_text()[-3000:]}")


@contextmanager
def dev_server(
    tmp_path: Path,
    timeout: float = 180.0,
    tenants_file: Path | None = None,
    extra: Mapping[str, str] | None = None,
) -> Iterator[DevServer]:
    """Start `clinical-sync dev` on free ports, wait until its UI answers; SIGTERM at the end.
    With `tenants_file`, for its tenants (their services, no sandbox of its own); `extra`:
    more settings (CLINICAL_DBT_PROJECT, say)."""
    ui_port, sandbox_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))}
    env.update(
        WAREHOUSE_PATH=str(tmp_path / "warehouse.duckdb"),
        LAKE_ROOT=str(tmp_path / "lake"),
        CLINICAL_LIMITER_PATH=str(tmp_path / "ratelimit.sqlite"),
    )
    if tenants_file is not None:
        env["CLINICAL_TENANTS_FILE"] = str(tenants_file)
    env.update(extra or {})
    output = tmp_path / "dev.out"
    cmd = [CLI, "dev", "--ui-port", str(ui_port), "--port", str(sandbox_port)]
    cmd += ["--scale", "0.05", "--rate", "1000"]
    with output.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    dagster_home = (tenants_file or tmp_path / "warehouse.duckdb").with_suffix(".dagster")
    server = DevServer(proc, f"http://127.0.0.1:{ui_port}", output, dagster_home)
    try:
        wait_for(server.url, proc, output, timeout)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
