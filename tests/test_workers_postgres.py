"""Workers that share nothing but PostgreSQL and the data volume: two code servers, each with
its own home, temporary folder, Dagster home and limiter file (and one with its clock minutes
ahead), run one run each at the same moment for the same API key, launched through the
webserver and the daemon's run queue. The service must see that key within its rate and
burst over every window, and both warehouses must equal the source."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.clinical_records.catalogue import ENTITY_SETS
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.ratelimit import most_in_window
from connectors.sandbox.server import SandboxServer
from tests.deployment import (
    base_env,
    code_server,
    daemon,
    instance_home,
    launch,
    run_errors,
    run_span,
    wait_for_runs,
    webserver,
    workspace_file,
)
from tests.truth import canonical, live_rows

RATE, BURST = 6.0, 3
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}  # one process per run: a short test


def worker_env(server: SandboxServer, postgres_url: str, folder: Path, data: Path) -> dict:
    """A worker's environment: the key, the instance, its own folders; its warehouse and lake
    on the shared data volume."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    return base_env(
        **{
            **server.env(),
            "CLINICAL_RATE_LIMIT": str(RATE),
            "CLINICAL_BURST": str(BURST),
            "CLINICAL_LIMITER_PATH": str(folder / "ratelimit.sqlite"),
            "DAGSTER_POSTGRES_URL": postgres_url,
            "DAGSTER_HOME": str(instance_home(folder / "dagster", postgres_url)),
            "HOME": str(folder),
            "TMPDIR": str(folder / "tmp"),
            "WAREHOUSE_PATH": str(data / folder.name / "warehouse.duckdb"),
            "LAKE_ROOT": str(data / folder.name / "lake"),
        }
    )


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_workers_share_one_keys_limit_and_both_runs_end_exact(postgres, tmp_path):
    url = postgres.database()
    data = tmp_path / "volume"  # what every worker mounts
    config = SandboxConfig(seed=7, scale=0.03, rate=RATE, burst=BURST)
    with SandboxServer(config) as sandbox:
        envs = {n: worker_env(sandbox, url, tmp_path / n, data) for n in ("w1", "w2")}
        home = instance_home(tmp_path / "instance", url)
        with (
            code_server("w1", envs["w1"], tmp_path / "w1") as one,
            code_server("w2", envs["w2"], tmp_path / "w2") as two,
        ):
            workspace = workspace_file(tmp_path / "workspace.yaml", [one, two])
            env = base_env(DAGSTER_POSTGRES_URL=url)
            with daemon(home, workspace, env), webserver(home, workspace, env) as ui:
                runs = [launch(ui, n, "nightly_sync", IN_PROCESS) for n in ("w1", "w2")]
                ended = wait_for_runs(ui, runs)
                errors = [line for run in runs for line in run_errors(ui, run)]
                spans = [run_span(ui, run) for run in runs]
        arrivals = SandboxControl.from_env(sandbox.env()).arrivals()
        stats = sandbox.control().stats()
        truth = sandbox.store.ground_truth()

    assert list(ended.values()) == ["SUCCESS", "SUCCESS"], "\n".join(errors)[-4000:]
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # side by side
    assert stats.get("status_429", 0) == 0
    for window in (0.5, 1, 2, 4, 8, 16):
        assert most_in_window(arrivals, window) <= RATE * window + BURST, window
    for name in ("w1", "w2"):
        warehouse = data / name / "warehouse.duckdb"
        for entity in ENTITY_SETS:
            assert live_rows(warehouse, entity) == canonical(entity, truth[entity.name]), (
                name,
                entity.name,
            )
