"""What the chart exposes and how it upgrades (issue 25 points 5-7), rendered by the real helm
binary and validated (RayService against KubeRay's CRD, NetworkPolicy with kubernetes-validate):
the API through KubeRay's serve Service only, the NetworkPolicy in front of the dashboard, the
metrics ports scraped by a PodMonitor, non-root security contexts, the upgrade strategy."""

from __future__ import annotations

import re

import pytest

from tests.k8s.conftest import CHART, REPO

CPU_DEV = CHART / "ci" / "cpu-dev-values.yaml"
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def cluster(docs: list[dict]) -> dict:
    return one(docs, "RayService")["spec"]["rayClusterConfig"]


def pods(docs: list[dict]) -> list[dict]:
    """The head's and every worker group's pod template."""
    c = cluster(docs)
    return [c["headGroupSpec"]["template"]] + [g["template"] for g in c["workerGroupSpecs"]]


def fails(helm, *args: str) -> str:
    r = helm("template", "t", str(CHART), "--namespace", "llm", *args)
    assert r.returncode != 0, "the render should have failed"
    return r.stderr


# --- the API through KubeRay's serve Service ---------------------------------------------------

def test_the_api_goes_through_kuberays_serve_service(render_chart) -> None:
    docs = render_chart()
    assert not [d for d in docs if d["kind"] == "Service"]  # no label-selected Service of ours
    svc = one(docs, "RayService")["spec"]["serveService"]
    assert svc["metadata"]["name"] == "t-splitserve-serve-svc"
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "serve", "port": 8000, "targetPort": "serve", "protocol": "TCP"}
    ]
    assert "selector" not in svc["spec"]  # KubeRay sets it: the ready cluster's serving pods
    head = cluster(docs)["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "serve", "containerPort": 8000} in head["ports"]


def test_service_values_shape_the_serve_service(render_chart) -> None:
    docs = render_chart(None, "--set", "service.type=LoadBalancer", "--set", "service.port=80",
                        "--set-string", "service.annotations.lb\\.example/internal=true")
    svc = one(docs, "RayService")["spec"]["serveService"]
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["port"] == 80
    assert svc["spec"]["ports"][0]["targetPort"] == "serve"
    assert svc["metadata"]["annotations"] == {"lb.example/internal": "true"}


def test_the_ingress_routes_to_the_serve_service(render_chart) -> None:
    docs = render_chart(CPU_DEV)
    backend = one(docs, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    name = one(docs, "RayService")["spec"]["serveService"]["metadata"]["name"]
    assert backend["service"] == {"name": name, "port": {"name": "serve"}}


# --- the network policy ------------------------------------------------------------------------

def allowed_peers(policy: dict, port: int) -> list[list[dict] | None]:
    """For each ingress rule that admits `port`: its peers (None: from anywhere)."""
    out = []
    for rule in policy["spec"]["ingress"]:
        ports = rule.get("ports")
        if ports is None or any(p["port"] == port for p in ports):
            out.append(rule.get("from"))
    return out


def test_ray_ports_are_open_only_to_the_release_and_the_operator(render_chart, validate) -> None:
    docs = render_chart()
    policy = one(docs, "NetworkPolicy")
    validate(policy)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for pod in pods(docs):  # the policy covers every Ray pod
        assert all(pod["metadata"]["labels"].get(k) == v for k, v in selector.items())
    release = [{"podSelector": {"matchLabels": selector}}]
    operator = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
                 "namespaceSelector": {}}]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert allowed_peers(policy, RAY_PORTS["dashboard"]) == [release, operator]
    for name in ("gcs-server", "client"):
        assert allowed_peers(policy, RAY_PORTS[name]) == [release]
    head_args = cluster(docs)["headGroupSpec"]["rayStartParams"]
    assert head_args["dashboard-host"] == "0.0.0.0"  # on the pod IP: KubeRay reads it
    # Clients reach the Serve port from anywhere; Prometheus the metrics ports in-cluster.
    assert None in allowed_peers(policy, 8000)
    for port in (8080, 9400):
        assert allowed_peers(policy, port)[-1] == [{"namespaceSelector": {}}]


def test_network_policy_values(render_chart, validate) -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    docs = render_chart(
        None, "--set", "networkPolicy.kuberayOperator.namespace=ray-system",
        "--set-json", "networkPolicy.metricsFrom=" + str([monitoring]).replace("'", '"'),
        "--set-json", 'networkPolicy.serveFrom=[{"ipBlock": {"cidr": "10.0.0.0/8"}}]',
    )
    policy = one(docs, "NetworkPolicy")
    validate(policy)
    operator = allowed_peers(policy, 8265)[1][0]
    assert operator["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "ray-system"}
    }
    assert allowed_peers(policy, 8080)[-1] == [monitoring]
    assert allowed_peers(policy, 8000)[-1] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    off = render_chart(None, "--set", "networkPolicy.enabled=false")
    assert not [d for d in off if d["kind"] == "NetworkPolicy"]


# --- metrics: off the API, scraped from the pods -----------------------------------------------

def test_router_metrics_have_their_own_port_on_the_head(render_chart) -> None:
    docs = render_chart(CPU_DEV)
    app_cfg = one(docs, "RayService")["spec"]["serveConfigV2"]
    assert "router_metrics_port: 9400" in app_cfg
    head, *workers = pods(docs)
    assert {"name": "router-metrics", "containerPort": 9400} in head["spec"]["containers"][0][
        "ports"]
    for pod in workers:  # Ray's metrics agent everywhere, the routers' port nowhere else
        assert [p["name"] for p in pod["spec"]["containers"][0]["ports"]] == ["metrics"]
    monitor = one(docs, "PodMonitor")
    assert [ep["port"] for ep in monitor["spec"]["podMetricsEndpoints"]] == [
        "metrics", "router-metrics"
    ]
    # The serve Service carries the Serve port alone.
    ports = one(docs, "RayService")["spec"]["serveService"]["spec"]["ports"]
    assert [p["name"] for p in ports] == ["serve"]


def test_without_the_router_port_only_rays_metrics_are_scraped(render_chart) -> None:
    docs = render_chart(CPU_DEV, "--set", "config.observability.router_metrics_port=null")
    monitor = one(docs, "PodMonitor")
    assert [ep["port"] for ep in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    head = pods(docs)[0]["spec"]["containers"][0]
    assert "router-metrics" not in {p["name"] for p in head["ports"]}


# --- security contexts -------------------------------------------------------------------------

def test_every_ray_container_runs_as_the_images_non_root_user(render_chart) -> None:
    uid = int(re.search(r"useradd .*--uid (\d+)", (REPO / "Dockerfile").read_text())[1])
    for values in (None, CPU_DEV, CHART / "ci" / "gpu-8-tp4-values.yaml"):
        docs = render_chart(values)
        for pod in pods(docs):
            ctx = pod["spec"]["securityContext"]
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == uid
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
            for container in pod["spec"]["containers"]:
                c = container["securityContext"]
                assert c["allowPrivilegeEscalation"] is False
                assert c["capabilities"]["drop"] == ["ALL"]
    autoscaled = render_chart(CHART / "ci" / "multinode-values.yaml")
    options = cluster(autoscaled).get("autoscalerOptions")
    if options is not None:  # the autoscaler sidecar in the head pod
        assert options["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_added_capabilities_keep_the_drop(render_chart) -> None:
    docs = render_chart(None, "--set-json", 'securityContext.capabilities.add=["SYS_PTRACE"]')
    for pod in pods(docs):
        caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert caps == {"add": ["SYS_PTRACE"], "drop": ["ALL"]}


# --- upgrades ----------------------------------------------------------------------------------

def test_upgrade_strategy_defaults_to_a_new_cluster(render_chart) -> None:
    spec = one(render_chart(), "RayService")["spec"]
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    assert "rayClusterDeletionDelaySeconds" not in spec


def test_upgrade_strategy_none_and_deletion_delay(render_chart, validate) -> None:
    docs = render_chart(None, "--set", "upgradeStrategy.type=None",
                        "--set", "rayClusterDeletionDelaySeconds=300")
    rs = one(docs, "RayService")
    validate(rs)
    assert rs["spec"]["upgradeStrategy"] == {"type": "None"}
    assert rs["spec"]["rayClusterDeletionDelaySeconds"] == 300


INCREMENTAL = ["--set", "upgradeStrategy.type=NewClusterWithIncrementalUpgrade",
               "--set", "upgradeStrategy.clusterUpgradeOptions.gatewayClassName=istio",
               "--set", "upgradeStrategy.clusterUpgradeOptions.stepSizePercent=25",
               "--set", "upgradeStrategy.clusterUpgradeOptions.intervalSeconds=60"]


def test_incremental_upgrade_renders_with_its_options(render_chart, validate) -> None:
    docs = render_chart(CHART / "ci" / "multinode-values.yaml", *INCREMENTAL)
    rs = one(docs, "RayService")
    validate(rs)
    assert rs["spec"]["upgradeStrategy"] == {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {"gatewayClassName": "istio", "stepSizePercent": 25,
                                  "intervalSeconds": 60},
    }


def test_incremental_upgrade_refuses_what_kuberay_would(helm) -> None:
    multinode = ["-f", str(CHART / "ci" / "multinode-values.yaml")]
    assert "needs KubeRay's autoscaler" in fails(helm, *INCREMENTAL)
    assert "needs clusterUpgradeOptions" in fails(
        helm, *multinode, "--set", "upgradeStrategy.type=NewClusterWithIncrementalUpgrade")
    assert "not an Ingress" in fails(helm, *multinode, *INCREMENTAL,
                                     "--set", "ingress.enabled=true")
    assert "upgradeStrategy" in fails(helm, "--set", "upgradeStrategy.type=Recreate")


@pytest.mark.parametrize("values", ["kserve-isvc-values.yaml", "kserve-llmisvc-values.yaml"])
def test_kserve_modes_render_none_of_it(render_chart, values: str) -> None:
    kinds = {d["kind"] for d in render_chart(CHART / "ci" / values, "--set", "ingress.enabled=true",
                                              "--set", "metrics.podMonitor.enabled=true")}
    assert not kinds & {"RayService", "NetworkPolicy", "PodMonitor", "Ingress"}
