"""The Helm chart's values.schema.json: chart keys written by hand, `config` from pydantic.

`helm/splitserve/values.schema.json` validates the chart's values. Its `config` property refers
to `#/$defs/SplitserveConfig`, and `$defs` is generated from `splitserve.config.SplitserveConfig`,
the model `splitserve serve` validates the same YAML with: an unknown key or a wrong type in
`config` fails `helm install`/`helm template` just as it fails `splitserve serve`. When the
config model changes, regenerate (a test fails until the file is in sync):

    python -m splitserve.k8s.schema --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from splitserve.config import SplitserveConfig

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "helm" / "splitserve" / "values.schema.json"
ROOT_DEF = "SplitserveConfig"


def config_defs() -> dict:
    """JSON-schema definitions of the config, the root model under `ROOT_DEF`."""
    schema = SplitserveConfig.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.pop("$defs", {})
    defs[ROOT_DEF] = schema
    return dict(sorted(defs.items()))


def synced(schema: dict) -> dict:
    """`schema` (the chart's values schema) with its config definitions regenerated."""
    out = dict(schema)
    out["$defs"] = config_defs()
    out.setdefault("properties", {})["config"] = {"$ref": f"#/$defs/{ROOT_DEF}"}
    return out


def dumps(schema: dict) -> str:
    """The file's canonical text."""
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Check (default) or rewrite (--write) the chart's values.schema.json."""
    p = argparse.ArgumentParser(prog="python -m splitserve.k8s.schema", description=__doc__)
    p.add_argument("--write", action="store_true", help="rewrite the file in place")
    p.add_argument("--path", type=Path, default=SCHEMA_PATH)
    args = p.parse_args(argv)
    current = args.path.read_text()
    wanted = dumps(synced(json.loads(current)))
    if args.write:
        args.path.write_text(wanted)
        return 0
    if current != wanted:
        print(f"{args.path} is out of date: run python -m splitserve.k8s.schema --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
