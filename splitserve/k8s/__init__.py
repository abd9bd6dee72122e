"""Kubernetes: KServe manifests, Helm values, preflight checks for a splitserve config.

The Helm chart itself lives in `helm/splitserve`; `chart` mirrors its decisions in Python. The
controller scales the chart's pools through Serve (KubeRay's autoscaler adds their pods) and an
LLMInferenceService through `splitserve.controller.k8s_actuator`.
Importing this package needs neither a cluster nor the `kserve` SDK (loaded on first render).
"""

from splitserve.k8s.preflight import Finding, preflight
from splitserve.k8s.render import RenderError, render

__all__ = ["Finding", "RenderError", "preflight", "render"]
