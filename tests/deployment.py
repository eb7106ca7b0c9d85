"""A deployment as operators run one, for the tests and benchmarks that need more than one
process: an instance home, code servers (`dagster api grpc`, one per worker, each with its own
environment and folders), a workspace naming them, the daemon and the webserver. Every process
listens on 127.0.0.1 on a free port and is stopped at the end of its `with` block.

    with postgres_server() as pg:
        home = instance_home(root / "home", pg.database())
        with code_server("worker1", env1, root / "w1") as one, \
             code_server("worker2", env2, root / "w2") as two:
            workspace = workspace_file(root / "workspace.yaml", [one, two])
            with daemon(home, workspace), webserver(home, workspace) as url:
                run_id = launch(url, "worker1", "nightly_sync")
                wait_for_runs(url, [run_id])
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.dev_server import free_port

BIN = Path(sys.executable).parent
MODULE = "pipelines.definitions"
REPOSITORY = "__repository__"
START_TIMEOUT = 180.0
ENDED = ("SUCCESS", "FAILURE", "CANCELED")


def base_env(**values: str) -> dict[str, str]:
    """This process's environment without our settings or Dagster's, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))}
    env.pop("WAREHOUSE_PATH", None)
    env.pop("LAKE_ROOT", None)
    return {**env, **values}


def instance_home(home: Path, postgres_url: str | None) -> Path:
    """A Dagster home laid out by `pipelines.home` (its dagster.yaml, on PostgreSQL when a URL
    is given) and the instance's storage created, as `clinical-sync` does before it runs."""
    env = base_env(DAGSTER_HOME=str(home))
    if postgres_url:
        env["DAGSTER_POSTGRES_URL"] = postgres_url
    script = "from pipelines import home\nhome.prepare_instance().dispose()\n"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return home


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL what is left after a grace period."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def _process(
    cmd: list[str], env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen]:
    """`cmd` in a process group of its own (so its children stop with it), output to `log`."""
    cwd.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        _stop(proc)


def _wait(ready, what: str, log: Path, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} not ready in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@dataclass(frozen=True)
class CodeServer:
    """One worker: a code server whose runs (DefaultRunLauncher) start in its environment."""

    name: str
    port: int
    folder: Path
    pid: int


@contextmanager
def code_server(name: str, env: Mapping[str, str], folder: Path) -> Iterator[CodeServer]:
    """`dagster api grpc` for our definitions, run in `folder` with `env`; ready when it
    answers Dagster's health check."""
    port = free_port()
    cmd = [str(BIN / "dagster"), "api", "grpc", "-m", MODULE, "-h", "127.0.0.1", "-p", str(port)]
    log = folder / "code-server.log"
    with _process(cmd, env, folder, log) as proc:

        def healthy() -> bool:
            check = [str(BIN / "dagster"), "api", "grpc-health-check", "-p", str(port)]
            return subprocess.run(check, capture_output=True, timeout=30).returncode == 0

        _wait(healthy, f"code server {name}", log)
        yield CodeServer(name, port, folder, proc.pid)


def workspace_file(path: Path, servers: Sequence[CodeServer]) -> Path:
    """A workspace.yaml with one gRPC location per code server, named after it."""
    lines = ["load_from:"]
    for server in servers:
        lines += [
            "  - grpc_server:",
            "      host: 127.0.0.1",
            f"      port: {server.port}",
            f"      location_name: {server.name}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextmanager
def daemon(home: Path, workspace: Path, env: Mapping[str, str] | None = None) -> Iterator[Path]:
    """`dagster-daemon run` on the instance in `home`: the run queue, schedules, sensors."""
    env = {**(env or base_env()), "DAGSTER_HOME": str(home)}
    cmd = [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)]
    log = home / "daemon.log"
    with _process(cmd, env, home, log):
        yield log


@contextmanager
def webserver(home: Path, workspace: Path, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`dagster-webserver` on the instance in `home`; yields its URL once it answers."""
    env = {**(env or base_env()), "DAGSTER_HOME": str(home)}
    port = free_port()
    cmd = [str(BIN / "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1"]
    cmd += ["-p", str(port)]
    url = f"http://127.0.0.1:{port}"
    log = home / "webserver.log"
    with _process(cmd, env, home, log):

        def answers() -> bool:
            try:
                return httpx.get(f"{url}/server_info", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(answers, "webserver", log)
        yield url


LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
STATUS = "query Status($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
TIMES = "query Times($id: ID!) { runOrError(runId: $id) { ... on Run { startTime endTime } } }"


def graphql(url: str, query: str, variables: Mapping[str, object]) -> dict:
    response = httpx.post(
        f"{url}/graphql", json={"query": query, "variables": dict(variables)}, timeout=60
    )
    assert response.status_code == 200, response.text[-3000:]
    return response.json()["data"]


def launch(
    url: str,
    location: str,
    job: str,
    run_config: Mapping[str, object] | None = None,
    tags: Mapping[str, str] | None = None,
) -> str:
    """Submit `job` of `location` through the webserver (the Launch button); its run id. The
    daemon dequeues it and the location's code server starts it."""
    params: dict[str, object] = {
        "selector": {
            "repositoryLocationName": location,
            "repositoryName": REPOSITORY,
            "jobName": job,
        },
        "runConfigData": dict(run_config or {}),
    }
    if tags:
        params["executionMetadata"] = {"tags": [{"key": k, "value": v} for k, v in tags.items()]}
    launched = graphql(url, LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


EVENTS = """
query Events($id: ID!) {
  runOrError(runId: $id) {
    ... on Run {
      eventConnection(afterCursor: null) {
        events {
          __typename
          ... on MessageEvent { message }
          ... on ErrorEvent { error { message } }
        }
      }
    }
  }
}"""


def run_span(url: str, run_id: str) -> tuple[float, float]:
    """When a run started and ended (Unix seconds), as the instance recorded it."""
    run = graphql(url, TIMES, {"id": run_id})["runOrError"]
    return run["startTime"], run["endTime"]


def run_errors(url: str, run_id: str) -> list[str]:
    """The messages and errors of a run's failure events, for an assertion's message."""
    run = graphql(url, EVENTS, {"id": run_id})["runOrError"]
    events = run.get("eventConnection", {}).get("events", [])
    return [
        f"{e['__typename']}: {e.get('message')} {(e.get('error') or {}).get('message', '')}"
        for e in events
        if "Failure" in e["__typename"] or e.get("error")
    ]


def wait_for_runs(url: str, run_ids: Sequence[str], timeout: float = 600.0) -> dict[str, str]:
    """Every run's final status (SUCCESS, FAILURE, CANCELED), or AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    ended: dict[str, str] = {}
    while time.monotonic() < deadline:
        for run_id in run_ids:
            if run_id not in ended:
                status = graphql(url, STATUS, {"id": run_id})["runOrError"]["status"]
                if status in ENDED:
                    ended[run_id] = status
        if len(ended) == len(run_ids):
            return ended
        time.sleep(1)
    raise AssertionError(f"runs not ended in {timeout:.0f} s: {set(run_ids) - set(ended)}")
