"""The Grafana dashboard the Helm chart ships (helm/splitserve/files/grafana-dashboard.json):
valid against a model of the Grafana dashboard fields it uses, and every query names metrics
(and labels) that an exporter really exports: the router's registry (RouterMetrics, tenancy
usage, pool state), the controller's, and the engines' vLLM metrics (`engine.metrics`).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Literal

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from splitserve.config import parse_config
from splitserve.controller.metrics import ControllerMetrics
from splitserve.engine.metrics import ENGINE_METRICS, exported_sample_names

from router_fakes import DECODE_OK, PREFILL_OK, Pool, build_router

DASHBOARD = Path(__file__).resolve().parents[2] / "helm/splitserve/files/grafana-dashboard.json"
# Labels Prometheus adds when it scrapes (the Operator's ServiceMonitor adds `namespace`).
SCRAPE_LABELS = {"namespace", "pod", "instance", "job", "service", "container", "endpoint"}
ENGINE_LABELS = {"ReplicaId", "model_name", "engine", "le"}
GRID_WIDTH = 24


# ---- a model of the Grafana dashboard JSON (the fields this dashboard uses) ---------------

class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Datasource(_Model):
    type: Literal["prometheus"]
    uid: str


class Target(_Model):
    refId: str = Field(pattern=r"^[A-Z]$")
    expr: str = Field(min_length=1)
    legendFormat: str


class GridPos(_Model):
    x: int = Field(ge=0, lt=GRID_WIDTH)
    y: int = Field(ge=0)
    w: int = Field(ge=1, le=GRID_WIDTH)
    h: int = Field(ge=1)

    @model_validator(mode="after")
    def _fits(self) -> GridPos:
        if self.x + self.w > GRID_WIDTH:
            raise ValueError(f"panel wider than the grid: x={self.x} w={self.w}")
        return self


class FieldDefaults(_Model):
    unit: str


class FieldConfig(_Model):
    defaults: FieldDefaults
    overrides: list[dict]


class Panel(_Model):
    id: int = Field(ge=1)
    type: Literal["row", "timeseries", "stat", "gauge", "table"]
    title: str = Field(min_length=1)
    gridPos: GridPos
    description: str | None = None
    datasource: Datasource | None = None
    fieldConfig: FieldConfig | None = None
    targets: list[Target] = []
    collapsed: bool | None = None
    panels: list[dict] | None = None

    @model_validator(mode="after")
    def _queries(self) -> Panel:
        if self.type == "row":
            if self.targets or self.datasource:
                raise ValueError(f"row {self.title!r} has queries")
        else:
            if not self.targets or self.datasource is None or self.fieldConfig is None:
                raise ValueError(f"panel {self.title!r} needs a datasource, queries and units")
            ref_ids = [t.refId for t in self.targets]
            if len(ref_ids) != len(set(ref_ids)):
                raise ValueError(f"panel {self.title!r}: duplicate refIds {ref_ids}")
        return self


class Variable(_Model):
    name: str
    type: Literal["datasource", "query"]
    query: str
    label: str | None = None
    datasource: Datasource | None = None
    refresh: int | None = None


class Templating(_Model):
    list_: list[Variable] = Field(alias="list")


class TimeRange(_Model):
    from_: str = Field(alias="from")
    to: str


class Dashboard(_Model):
    title: str
    uid: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,40}$")
    schemaVersion: int = Field(ge=30)
    version: int
    editable: bool
    tags: list[str]
    time: TimeRange
    refresh: str
    templating: Templating
    panels: list[Panel] = Field(min_length=1)

    @field_validator("panels")
    @classmethod
    def _layout(cls, panels: list[Panel]) -> list[Panel]:
        ids = [p.id for p in panels]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate panel ids: {ids}")
        cells: dict[tuple[int, int], str] = {}
        for p in panels:
            g = p.gridPos
            for x in range(g.x, g.x + g.w):
                for y in range(g.y, g.y + g.h):
                    if (x, y) in cells:
                        raise ValueError(f"{p.title!r} overlaps {cells[(x, y)]!r}")
                    cells[(x, y)] = p.title
        return panels


# ---- PromQL: the metric and label names of an expression --------------------------------

_FUNCTIONS_AND_KEYWORDS = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile",
    "label_values", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "topk", "bottomk", "clamp_min", "clamp_max", "abs",
}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression refers to: label names from `{...}` matchers
    and `by (...)` groupings; metric names: every other identifier not a function or keyword."""
    labels: set[str] = set()

    def _label_values(m: re.Match) -> str:  # a variable query: label_values(metric, label)
        labels.add(m.group(2))
        return m.group(1)

    expr = re.sub(r"label_values\(\s*([^,()]+?)\s*,\s*(\w+)\s*\)", _label_values, expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors ([$__rate_interval], [5m])
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    expr = re.sub(r"\{[^}]*\}", "", expr)
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in grouping.split(",") if g.strip()}
    expr = re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", expr)
    idents = set(re.findall(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return idents - _FUNCTIONS_AND_KEYWORDS, labels


def test_promql_names():
    metrics, labels = promql_names(
        'histogram_quantile(0.9, sum by (le, pool) (rate(a_bucket{namespace="$x",o!~"ok"}[5m])))'
        " / sum(rate(b_total[$__rate_interval]))"
    )
    assert metrics == {"a_bucket", "b_total"}
    assert labels == {"le", "pool", "namespace", "o"}
    assert promql_names("label_values(c_total, namespace)") == ({"c_total"}, {"namespace"})


# ---- what the exporters export -------------------------------------------------------------

def _sample_names(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Every sample name the registry can export, with the label names its series carry."""
    out: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    for collector in list(registry._collector_to_names):  # internal: label names
        labelnames = set(getattr(collector, "_labelnames", ()))
        for family in collector.collect():
            labels = labelnames | {k for s in family.samples for k in s.labels}
            for suffix in suffixes[family.type]:
                extra = {"le"} if suffix == "_bucket" else set()
                out.setdefault(family.name + suffix, set()).update(labels | extra)
    return out


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    cfg = parse_config({"mode": "disaggregated", "tenants": [{"name": "acme"}]})
    router = build_router(cfg, Pool(PREFILL_OK), Pool(DECODE_OK))
    names = _sample_names(router.metrics.registry)
    for name, labels in _sample_names(ControllerMetrics().registry).items():
        names.setdefault(name, set()).update(labels)
    for name in exported_sample_names():
        names[name] = set(ENGINE_LABELS)
    return names


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_is_valid_grafana_json():
    dash = Dashboard.model_validate(_dashboard())
    assert len([p for p in dash.panels if p.type != "row"]) >= 20
    titles = " ".join(p.title.lower() for p in dash.panels)
    for need in ("outcome", "first token", "output token", "queue", "replicas", "tenant",
                 "kv", "prefix cache", "controller", "where prefill ran"):
        assert need in titles, need


def test_every_query_names_exported_metrics_and_labels(exported):
    dash = Dashboard.model_validate(_dashboard())
    queries = [(p.title, t.expr) for p in dash.panels for t in p.targets]
    queries += [("variable " + v.name, v.query) for v in dash.templating.list_
                if v.type == "query"]
    problems = []
    for title, expr in queries:
        metrics, labels = promql_names(expr)
        if not metrics:
            problems.append(f"{title}: no metric in {expr!r}")
        unknown = sorted(m for m in metrics if m not in exported)
        if unknown:
            problems.append(f"{title}: not exported: {unknown}")
            continue
        known_labels = set().union(*(exported[m] for m in metrics)) | SCRAPE_LABELS
        if labels - known_labels:
            problems.append(f"{title}: unknown labels {sorted(labels - known_labels)}")
    assert not problems, "\n".join(problems)


def test_the_engine_metrics_the_dashboard_uses_are_vllms():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    source = "".join(p.read_text() for p in (
        root / "v1/metrics/loggers.py",
        root / "distributed/kv_transfer/kv_connector/v1/nixl/stats.py",
    ) if p.exists())
    for name, kind in ENGINE_METRICS.items():
        found = re.search(rf"_{kind}_cls\(\s*name=\"{re.escape(name)}\"", source)
        assert found, f"{name} is not a vLLM {kind}"
