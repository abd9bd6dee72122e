"""The `splitserve k8s` command group (registered by `splitserve.cli`).

    splitserve k8s render -c FILE --target kserve|llmisvc|helm-values [--out DIR] [--name N]
                          [--image IMAGE] [--namespace NS]
    splitserve k8s check  -c FILE [--target helm|kserve|llmisvc] [--gpus-per-node N]
                          [-f VALUES ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from splitserve.config import load_config
from splitserve.k8s.chart import chart_values, merge_values
from splitserve.k8s.layout import DEFAULT_IMAGE
from splitserve.k8s.preflight import DEFAULT_GPUS_PER_NODE, TARGETS, errors, preflight
from splitserve.k8s.render import RENDER_TARGETS, RenderError, render, write


def _cmd_render(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.plan_rate is not None:
        from splitserve.controller.planner import PlanError, apply_plan, plan_for_config

        try:
            cfg = apply_plan(cfg, plan_for_config(cfg, args.accelerator, rate=args.plan_rate))
        except PlanError as err:
            print(f"splitserve: {err}", file=sys.stderr)
            return 1
    try:
        files = render(cfg, args.target, name=args.name, image=args.image,
                       namespace=args.namespace, source=args.config or "")
    except RenderError as err:
        print(f"splitserve: {err}", file=sys.stderr)
        return 1
    if args.out is None:
        sys.stdout.write("".join(files.values()))
        return 0
    for path in write(files, Path(args.out)):
        print(f"wrote {path}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    values = chart_values()
    for path in args.values or []:  # like `helm install -f`: later files win
        values = merge_values(values, yaml.safe_load(Path(path).read_text()) or {})
    findings = preflight(cfg, args.target, gpus_per_node=args.gpus_per_node, values=values)
    for finding in findings:
        print(f"splitserve: {finding}", file=sys.stderr)
    bad = errors(findings)
    if bad:
        print(f"splitserve: {len(bad)} error(s): not deployable on {args.target}", file=sys.stderr)
        return 1
    print(f"splitserve: ok: {args.config or '<default config>'} is deployable on {args.target} "
          f"({args.gpus_per_node} GPUs per node)")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_k8s_commands(sub: argparse._SubParsersAction) -> None:
    """Add `k8s render` and `k8s check` to the top-level subcommands."""
    k8s = sub.add_parser("k8s", help="Kubernetes: render manifests, preflight checks")
    actions = k8s.add_subparsers(dest="action", required=True)

    rend = actions.add_parser("render", help="write KServe manifests or Helm values for a config")
    rend.add_argument("-c", "--config", help="deployment YAML (default: the embedded config)")
    rend.add_argument("--target", required=True, choices=RENDER_TARGETS)
    rend.add_argument("--out", help="directory to write into (default: print to stdout)")
    rend.add_argument("--name", default="splitserve", help="resource name (default: splitserve)")
    rend.add_argument("--image", default=DEFAULT_IMAGE, help=f"image (default: {DEFAULT_IMAGE})")
    rend.add_argument("--namespace", help="metadata.namespace (default: none)")
    rend.add_argument("--plan-rate", type=float, metavar="REQ_PER_S",
                      help="size the pools with `splitserve plan` for this request rate first")
    rend.add_argument("--accelerator", help="with --plan-rate: accelerator profile "
                      "(default: the config's accelerator section, else h100-80gb)")
    rend.set_defaults(func=_cmd_render)

    check = actions.add_parser("check", help="preflight: is the config deployable on the target?")
    check.add_argument("-c", "--config", help="deployment YAML (default: the embedded config)")
    check.add_argument("--target", default="helm", choices=TARGETS)
    check.add_argument("--gpus-per-node", type=_positive, default=DEFAULT_GPUS_PER_NODE,
                       help=f"GPUs of one node (default: {DEFAULT_GPUS_PER_NODE})")
    check.add_argument("-f", "--values", action="append", metavar="FILE",
                       help="the chart values file(s) you install with (helm install -f): "
                       "modelCache, extraVolumeMounts (default: the chart's values.yaml)")
    check.set_defaults(func=_cmd_check)
