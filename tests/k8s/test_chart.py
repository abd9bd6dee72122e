"""The Helm chart, with the real helm binary: lint, template, schema checks, and every rendered
manifest validated (CRD kinds against the upstream CRDs, core kinds with kubernetes-validate)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from splitserve.config import parse_config
from splitserve.k8s import schema
from splitserve.k8s.chart import chart_values, effective_config, merge_values
from splitserve.k8s.layout import worker_group_size
from tests.k8s.conftest import CHART, REPO, VALUES_FILES

ALL_VALUES = [None, *VALUES_FILES]
IDS = ["default", *(p.stem for p in VALUES_FILES)]


def user_values(path: Path | None) -> dict:
    return yaml.safe_load(path.read_text()) if path else {}


def merged(path: Path | None) -> dict:
    return merge_values(chart_values(), user_values(path))


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_there_are_enough_example_values_files() -> None:
    names = {p.stem for p in VALUES_FILES}
    assert {"cpu-dev-values", "gpu-8-tp4-values", "multinode-values"} <= names


@pytest.mark.parametrize("values", ALL_VALUES, ids=IDS)
def test_helm_lint(helm, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    r = helm(*args)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("values", ALL_VALUES, ids=IDS)
def test_rendered_manifests_validate(render_chart, validate, values: Path | None) -> None:
    docs = render_chart(values)
    assert docs
    for doc in docs:
        validate(doc)


def test_all_optional_kinds_render(render_chart) -> None:
    kinds = {d["kind"] for d in render_chart(CHART / "ci" / "cpu-dev-values.yaml")}
    assert kinds == {"RayService", "NetworkPolicy", "Ingress", "Secret", "PodMonitor", "ConfigMap"}
    # No Service of the chart's own: KubeRay makes the serve Service (spec.serveService).
    assert {d["kind"] for d in render_chart()} == {"RayService", "NetworkPolicy"}


@pytest.mark.parametrize("values", ALL_VALUES, ids=IDS)
def test_worker_groups_follow_the_config(render_chart, values: Path | None) -> None:
    vals = merged(values)
    cfg = effective_config(vals)
    for rs in by_kind(render_chart(values), "RayService"):
        groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
        assert set(groups) == set(cfg.deployed_pools())
        cuda = cfg.device != "cpu"
        for role, pool in cfg.deployed_pools().items():
            g, wanted = groups[role], vals["workers"][role]
            size = worker_group_size(cfg, role)
            assert (g["replicas"], g["minReplicas"], g["maxReplicas"]) == (
                size.replicas, size.min_replicas, size.max_replicas)
            if cfg.autoscaling is None:
                assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] == pool.replicas
            pin = g["rayStartParams"]["resources"]  # KubeRay's quoting: '"{\"name\": 1}"'
            assert pin.startswith('"') and pin.endswith('"')
            assert json.loads(pin[1:-1].replace('\\"', '"')) == {f"splitserve-{role}": 1}
            pod = g["template"]["spec"]
            limits = pod["containers"][0]["resources"]["limits"]
            if cuda:
                assert limits["nvidia.com/gpu"] == str(pool.ranks)
            else:
                assert "nvidia.com/gpu" not in limits and limits["cpu"] == str(pool.ranks)
            assert pod.get("nodeSelector", {}) == wanted["nodeSelector"]
            assert pod.get("tolerations", []) == wanted["tolerations"]
            assert pod.get("affinity", {}) == wanted["affinity"]
        head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]
        assert head["rayStartParams"]["num-gpus"] == "0"
        ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
        assert ports["serve"] == cfg.router.port


def test_api_key_secret_is_mounted_where_the_config_points(render_chart) -> None:
    values = CHART / "ci" / "cpu-dev-values.yaml"
    docs = render_chart(values)
    secret = by_kind(docs, "Secret")[0]
    tenants = yaml.safe_load(secret["stringData"]["tenants.yaml"])["tenants"]
    assert tenants == user_values(values)["apiKeys"]["tenants"]
    cfg = effective_config(merged(values))
    assert cfg.tenancy.tenants_file == "/etc/splitserve/api-keys/tenants.yaml"
    rs = by_kind(docs, "RayService")[0]["spec"]["rayClusterConfig"]
    pods = [rs["headGroupSpec"]["template"]] + [g["template"] for g in rs["workerGroupSpecs"]]
    for pod in pods:
        vols = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert vols["api-keys"]["secret"]["secretName"] == secret["metadata"]["name"]
        mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        assert mounts["api-keys"] == "/etc/splitserve/api-keys"


def test_ingress_and_monitor_point_at_the_serve_service_and_the_pods(render_chart) -> None:
    # More on the serve Service, the monitor and the network policy: tests/k8s/test_exposure.py.
    docs = render_chart(CHART / "ci" / "cpu-dev-values.yaml")
    rs = by_kind(docs, "RayService")[0]
    serve_svc = rs["spec"]["serveService"]
    ingress = by_kind(docs, "Ingress")[0]
    monitor = by_kind(docs, "PodMonitor")[0]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": serve_svc["metadata"]["name"], "port": {"name": "serve"}}
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    head_ports = {p["name"] for p in head["spec"]["containers"][0]["ports"]}
    assert {ep["port"] for ep in monitor["spec"]["podMetricsEndpoints"]} <= head_ports
    for pod in [head] + [g["template"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]]:
        labels = pod["metadata"]["labels"]
        assert all(labels.get(k) == v
                   for k, v in monitor["spec"]["selector"]["matchLabels"].items())


def test_grafana_dashboard_configmap_is_the_dashboard_file(render_chart) -> None:
    # Its panels and queries are checked against the exporters in tests/unit/test_dashboard.py.
    cm = by_kind(render_chart(CHART / "ci" / "cpu-dev-values.yaml"), "ConfigMap")[0]
    shipped = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    assert json.loads(cm["data"]["splitserve.json"]) == shipped


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("config:\n  pools:\n    decode:\n      replicas: two\n", "config.pools.decode.replicas"),
        ("config:\n  pools:\n    decode:\n      replica: 2\n", "replica"),
        ("config:\n  mode: sideways\n", "config.mode"),
        ("service:\n  port: '8000'\n", "service.port"),
        ("autoscaler:\n  idleTimeoutSeconds: soon\n", "autoscaler.idleTimeoutSeconds"),
        ("workers:\n  decode:\n    maxReplicas: 4\n", "maxReplicas"),
    ],
    ids=["wrong-type", "unknown-key", "bad-enum", "port-as-string", "chart-key-type",
         "retired-group-bound"],
)
def test_schema_rejects_bad_values(helm, tmp_path: Path, override: str, key: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(override)
    for cmd in ("lint", "template"):
        r = helm(cmd, *(["t"] if cmd == "template" else []), str(CHART), "-f", str(bad))
        assert r.returncode != 0, f"helm {cmd} accepted {override!r}"
        assert key in r.stdout + r.stderr


def test_loopback_router_host_fails_the_render(helm) -> None:
    r = helm("template", "t", str(CHART), "--set", "config.router.host=127.0.0.1")
    assert r.returncode != 0 and "config.router.host" in r.stderr


def test_values_schema_in_sync_with_config_model() -> None:
    text = schema.SCHEMA_PATH.read_text()
    assert text == schema.dumps(schema.synced(json.loads(text))), (
        "helm/splitserve/values.schema.json is stale: python -m splitserve.k8s.schema --write")


def test_values_config_is_a_valid_splitserve_config() -> None:
    cfg = parse_config(chart_values()["config"], "values.yaml")
    assert cfg.router.host == "0.0.0.0"
    for path in VALUES_FILES:
        effective_config(merged(path))  # raises ConfigError naming the key


def test_values_yaml_documents_every_top_level_key() -> None:
    text = (CHART / "values.yaml").read_text()
    props = json.loads(schema.SCHEMA_PATH.read_text())["properties"]
    for key in set(props) - {"global"}:
        block = text.split(f"\n{key}:")[0].rsplit("\n\n", 1)[-1]
        assert f"\n{key}:" in text and "#" in block, f"values.yaml: {key} is not documented"


def test_ray_version_is_the_same_everywhere() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    (pinned,) = re.findall(r'"ray\[serve\]==([0-9.]+)"', pyproject)
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f'"ray[serve]=={pinned}"' in dockerfile
    assert chart_values()["rayVersion"] == pinned
