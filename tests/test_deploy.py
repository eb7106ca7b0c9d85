"""The way to production, on paper and checked: deploy/compose.yaml (one host) and
deploy/helm-values.yaml (Dagster's chart) parsed and held to what the code expects. No network,
no Docker engine, no helm: structure and our invariants (image, variables of our contract,
volumes, the run launcher, the instance's PostgreSQL and run queue)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from connectors.clinical_records.settings import Settings
from pipelines import home
from pipelines.keys import API_POOL, WAREHOUSE_POOL

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DATA = "/data"
APP_SERVICES = ("instance", "code", "webserver", "daemon")
# Top-level keys of Dagster's chart values (helm/dagster/schema/.../values.py): a typo in ours
# would be ignored by helm, silently.
CHART_KEYS = {
    "dagsterWebserver",
    "dagster-user-deployments",
    "postgresql",
    "generatePostgresqlPasswordSecret",
    "generateCeleryConfigSecret",
    "rabbitmq",
    "redis",
    "flower",
    "ingress",
    "imagePullSecrets",
    "computeLogManager",
    "scheduler",
    "runLauncher",
    "pythonLogs",
    "dagsterDaemon",
    "busybox",
    "migrate",
    "telemetry",
    "serviceAccount",
    "global",
    "retention",
    "additionalInstanceConfig",
    "concurrency",
}
SECRET_VARIABLES = {"CLINICAL_CLIENT_SECRET", "CLINICAL_API_KEY", "DAGSTER_POSTGRES_URL"}


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))


def env_lines(name: str) -> dict[str, str]:
    lines = (DEPLOY / name).read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def required_variables() -> set[str]:
    """The CLINICAL_* variables Settings refuses to run without."""
    with pytest.raises(Exception) as missing:
        Settings.from_env({}, dotenv_path=None)
    return set(re.findall(r"CLINICAL_[A-Z_]+", str(missing.value)))


def test_compose_runs_our_image_with_its_secrets_from_env_files_only():
    services = load("compose.yaml")["services"]
    assert set(services) == {"postgres", *APP_SERVICES}
    for name in APP_SERVICES:
        service = services[name]
        assert service["image"].startswith("clinical-records-sync:")
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert "instance.env" in service["env_file"]
        assert not SECRET_VARIABLES & set(service.get("environment", {}))
        assert service["environment"]["DAGSTER_HOME"] == "/opt/dagster/home"
    credentials = env_lines("clinical.env.example")
    assert required_variables() <= set(credentials)
    assert "clinical.env" in services["code"]["env_file"]  # runs start in the code server
    for name in ("webserver", "daemon", "instance"):
        assert "clinical.env" not in services[name]["env_file"]  # they never call the API
    instance = env_lines("instance.env.example")
    assert {"DAGSTER_POSTGRES_URL", "POSTGRES_PASSWORD"} <= set(instance)
    assert "@postgres:5432/" in instance["DAGSTER_POSTGRES_URL"]  # the postgres service
    assert "instance.env" in services["postgres"]["env_file"]


def test_compose_mounts_the_data_volume_where_runs_write_and_starts_in_order():
    compose = load("compose.yaml")
    services = compose["services"]
    code = services["code"]
    assert f"data:{DATA}" in code["volumes"] and "data" in compose["volumes"]
    for variable in ("WAREHOUSE_PATH", "LAKE_ROOT"):
        assert code["environment"][variable].startswith(DATA + "/")
    assert code["command"][:5] == ["dagster", "api", "grpc", "-m", "pipelines.definitions"]
    port = code["command"][code["command"].index("-p") + 1]
    (location,) = load("workspace.yaml")["load_from"]
    assert location["grpc_server"]["host"] == "code"
    assert str(location["grpc_server"]["port"]) == port
    for name in ("webserver", "daemon"):
        assert "/app/deploy/workspace.yaml" in services[name]["command"]
        assert services[name]["depends_on"]["instance"] == {
            "condition": "service_completed_successfully"
        }
    assert services["instance"]["command"] == ["python", "-m", "pipelines.home"]
    assert services["instance"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    published = services["webserver"]["ports"]
    assert all(p.startswith("127.0.0.1:") for p in published)  # the UI on loopback only


def test_the_dockerfile_installs_this_project_where_home_finds_its_settings():
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert "pip install --no-cache-dir -e ." in text  # home.py reads dagster.yaml beside it
    assert "COPY deploy deploy" in text and "dagster.yaml" in text
    assert "dagster-k8s" in text  # a run pod loads the chart's K8sRunLauncher instance
    assert re.search(r"^USER \w+", text, re.M)  # not root


def test_helm_values_use_the_chart_keys_kubernetes_runs_and_an_external_postgres():
    values = load("helm-values.yaml")
    assert set(values) <= CHART_KEYS
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is False and values["postgresql"]["postgresqlHost"]
    assert "postgresqlPassword" not in values["postgresql"]  # from the secret, never here
    assert values["generatePostgresqlPasswordSecret"] is False
    assert values["global"]["postgresqlSecretName"]
    assert values["telemetry"]["enabled"] is False
    assert values["additionalInstanceConfig"]["nux"]["enabled"] is False  # as dagster.yaml
    assert values["migrate"]["enabled"] is True
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    runner = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert not {"maxConcurrentRuns", "tagConcurrencyLimits"} & set(runner)  # the chart refuses both


def test_helm_user_code_and_run_pods_get_the_image_secrets_and_data_volume():
    values = load("helm-values.yaml")
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "pipelines.definitions"]
    assert deployment["image"]["repository"].endswith("/clinical-records-sync")
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
    assert not SECRET_VARIABLES & set(deployment["env"])  # secrets by reference only
    for variable in ("WAREHOUSE_PATH", "LAKE_ROOT"):
        assert deployment["env"][variable].startswith(DATA + "/")
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    for pod in (deployment, launcher):
        (mount,) = pod["volumeMounts"]
        assert mount["mountPath"] == DATA
        (volume,) = pod["volumes"]
        assert volume["name"] == mount["name"]
        assert volume["persistentVolumeClaim"]["claimName"]
        assert {s["name"] for s in pod["envSecrets"]} == {
            "clinical-sync-credentials",
            "clinical-sync-instance",
        }


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _camel_keys(value: object) -> object:
    if isinstance(value, dict):
        keys = {k: k if k == "applyLimitPerUniqueValue" else _camel(k) for k in value}
        return {keys[k]: _camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel_keys(v) for v in value]
    return value


def test_helm_concurrency_is_the_postgres_instances_own(monkeypatch):
    """The chart's run queue, pools and log level equal what pipelines/home.py writes for an
    instance on PostgreSQL: one source, two renderings that must not drift apart."""
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", "postgresql://u:p@db:5432/dagster")
    ours = yaml.safe_load(home.instance_settings())
    chart = load("helm-values.yaml")["concurrency"]
    assert chart.pop("enabled") is True
    assert chart == _camel_keys(ours["concurrency"])
    assert load("helm-values.yaml")["pythonLogs"] == _camel_keys(ours["python_logs"])
    assert ours["storage"] == {"postgres": {"postgres_url": {"env": "DAGSTER_POSTGRES_URL"}}}
    assert {API_POOL, WAREHOUSE_POOL} <= set(
        (DEPLOY / "helm-values.yaml").read_text(encoding="utf-8").split()
    )
