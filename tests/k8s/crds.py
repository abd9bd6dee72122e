"""Validate manifests against upstream CustomResourceDefinitions (../shared/crds) with jsonschema.

A CRD's `openAPIV3Schema` is a Kubernetes *structural* schema; the API server prunes unknown
fields, which would hide mistakes, so the conversion here makes them errors instead:
- an object schema gets `additionalProperties: false` unless it says
  `x-kubernetes-preserve-unknown-fields: true` or already constrains additionalProperties;
- `x-kubernetes-int-or-string: true` becomes `anyOf: [integer, string]`;
- `nullable: true` adds "null" to the type;
- the root `metadata` is ObjectMeta (validated by the API server, not the CRD): left open.
CEL rules (`x-kubernetes-validations`) are not checked. Parsing the YAML is slow (seconds per
file even with yaml.CSafeLoader), so converted schemas are cached as JSON by file hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CONVERTER_VERSION = "1"  # bump when `convert` changes: invalidates the cache

CRD_FILES = {
    ("ray.io", "RayService"): "ray.io_rayservices.yaml",
    ("serving.kserve.io", "InferenceService"): "serving.kserve.io_inferenceservices.yaml",
    ("serving.kserve.io", "ServingRuntime"): "serving.kserve.io_servingruntimes.yaml",
    ("serving.kserve.io", "LLMInferenceService"): "serving.kserve.io_llminferenceservices.yaml",
}


def convert(node: Any) -> Any:
    """A structural-schema node as a strict JSON schema (recursively; returns a new node)."""
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: convert(v) for k, v in node.items()
           if k not in ("properties", "x-kubernetes-validations", "description")}
    if "properties" in node:
        out["properties"] = {k: convert(v) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    is_object = node.get("type") == "object" or "properties" in node
    if (is_object and not node.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in node):
        out["additionalProperties"] = False
    return out


def root_schema(crd_schema: dict) -> dict:
    """The converted schema of a whole object (root `metadata` left open)."""
    schema = convert(crd_schema)
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return schema


class CRDValidator:
    """jsonschema validators by (group, kind, version), loaded lazily from a CRD directory."""

    def __init__(self, crd_dir: Path, cache_dir: Path):
        self._crd_dir = crd_dir
        self._cache_dir = cache_dir
        self._validators: dict[tuple[str, str, str], jsonschema.protocols.Validator] = {}

    def handles(self, obj: dict) -> bool:
        """True when `obj`'s kind has a CRD here."""
        group = obj.get("apiVersion", "").rpartition("/")[0]
        return (group, obj.get("kind")) in CRD_FILES

    def _schemas(self, fname: str) -> dict[str, dict]:
        path = self._crd_dir / fname
        raw = path.read_bytes()
        key = hashlib.sha256(raw + CONVERTER_VERSION.encode()).hexdigest()[:16]
        cached = self._cache_dir / f"{fname}.{key}.json"
        if cached.exists():
            return json.loads(cached.read_text())
        crd = yaml.load(raw, Loader=yaml.CSafeLoader)
        schemas = {v["name"]: root_schema(v["schema"]["openAPIV3Schema"])
                   for v in crd["spec"]["versions"]}
        cached.write_text(json.dumps(schemas))
        return schemas

    def validator(self, api_version: str, kind: str) -> jsonschema.protocols.Validator:
        """The validator of one served version of a kind."""
        group, _, version = api_version.rpartition("/")
        key = (group, kind, version)
        if key not in self._validators:
            schemas = self._schemas(CRD_FILES[(group, kind)])
            if version not in schemas:
                raise AssertionError(f"{kind}: version {version} not in the CRD ({list(schemas)})")
            cls = jsonschema.validators.validator_for(schemas[version], jsonschema.Draft7Validator)
            self._validators[key] = cls(schemas[version])
        return self._validators[key]

    def errors(self, obj: dict) -> list[str]:
        """Every schema violation of `obj`, as 'path: message' lines (empty when valid)."""
        v = self.validator(obj["apiVersion"], obj["kind"])
        return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                for e in sorted(v.iter_errors(obj), key=lambda e: list(map(str, e.path)))]
