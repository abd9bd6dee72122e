"""`splitserve k8s render`: the manifests (or Helm values) for a config and a target, as files.

    files = render(cfg, "llmisvc", name="llama")   # {"llminferenceservice.yaml": "<YAML>"}
    write(files, Path("deploy/"))

Targets: `kserve` (ServingRuntime + InferenceService v1beta1), `llmisvc` (LLMInferenceService
v1alpha1), `helm-values` (a values file for `helm/splitserve` embedding the config). A config
with preflight errors for the target is refused with `RenderError` listing them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml

from splitserve.config import SplitserveConfig
from splitserve.k8s import kserve
from splitserve.k8s.chart import helm_values, helm_values_yaml
from splitserve.k8s.layout import DEFAULT_IMAGE
from splitserve.k8s.preflight import errors, preflight

RenderTarget = Literal["kserve", "llmisvc", "helm-values"]
RENDER_TARGETS: tuple[RenderTarget, ...] = ("kserve", "llmisvc", "helm-values")


class RenderError(ValueError):
    """The config cannot be rendered for the target; the message lists each problem."""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a config embedded in an env var) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_manifests(objs: list[dict]) -> str:
    """Objects as one multi-document YAML stream."""
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, explicit_start=True)


def render(cfg: SplitserveConfig, target: RenderTarget, *, name: str = "splitserve",
           image: str = DEFAULT_IMAGE, namespace: str | None = None, cpu: str = "8",
           memory: str = "64Gi", source: str = "",
           pod: kserve.PodOptions | None = None) -> dict[str, str]:
    """File name -> content for `target` (`cpu`, `memory`: per KServe pod; `source`: the config
    file's name, noted in the output). Raises RenderError on preflight errors."""
    if target not in RENDER_TARGETS:
        raise RenderError(f"unknown target {target!r}; expected one of {RENDER_TARGETS}")
    check_target = "helm" if target == "helm-values" else target
    # Node size is unknown here (`k8s check --gpus-per-node` knows it): a node as large as the
    # largest request, so that only size-independent rules apply.
    biggest = max(p.replicas * p.ranks for p in cfg.deployed_pools().values())
    values = helm_values(cfg) if target == "helm-values" else None
    problems = errors(preflight(cfg, check_target, gpus_per_node=max(biggest, 1) * 2,
                                values=values))
    if problems:
        raise RenderError(
            f"cannot render {target}:\n" + "\n".join(f"  {p}" for p in problems)
        )
    if target == "helm-values":
        return {"values.yaml": helm_values_yaml(cfg, source)}
    if target == "kserve":
        runtime = kserve.serving_runtime(name=name, image=image, namespace=namespace)
        isvc = kserve.inference_service(cfg, name=name, runtime=name, namespace=namespace,
                                        cpu=cpu, memory=memory, pod=pod)
        return {
            "servingruntime.yaml": dump_manifests([runtime]),
            "inferenceservice.yaml": dump_manifests([isvc]),
        }
    llm = kserve.llm_inference_service(cfg, name=name, image=image, namespace=namespace,
                                       cpu=cpu, memory=memory, pod=pod)
    return {"llminferenceservice.yaml": dump_manifests([llm])}


def write(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write `files` into `out_dir` (created if missing); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, text in files.items():
        path = out_dir / fname
        path.write_text(text)
        paths.append(path)
    return paths
