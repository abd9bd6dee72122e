"""The `splitserve` command line.

    splitserve serve [-c FILE] [--host H] [--port P] [--mode disaggregated|colocated]
    splitserve model init [--out DIR] [--force]
    splitserve config show [-c FILE] [--mode ...]
    splitserve k8s render -c FILE --target kserve|llmisvc|helm-values [--out DIR]
    splitserve k8s check -c FILE [--gpus-per-node N]
    splitserve bench [--base-url URL] [--rate R] ...  (see splitserve.bench.cli)
    splitserve top [--url URL ...] [--interval S] [--once]  (live pool state, splitserve.top)
    splitserve plan [-c FILE] [--rate R] [--accelerator h100-80gb|h200-141gb|a100-80gb|cpu]
    splitserve simulate --trace bursty|diurnal|steady [--policy ours|queue|fixed-peak|all]
                        [--mode disaggregated|colocated]  (see splitserve.controller.sim.command)
"""

from __future__ import annotations

import argparse
import sys

from splitserve.config import ConfigError, SplitserveConfig, dump_config, load_config


def _load(args: argparse.Namespace) -> SplitserveConfig:
    cfg = load_config(args.config)
    return cfg.with_overrides(
        **{
            "mode": getattr(args, "mode", None),
            "router.host": getattr(args, "host", None),
            "router.port": getattr(args, "port", None),
        }
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    from splitserve.launcher import serve_forever

    return serve_forever(_load(args), verbose=args.verbose)


def _cmd_model_init(args: argparse.Namespace) -> int:
    from splitserve.models import build_tiny_model

    print(build_tiny_model(args.out, force=args.force))
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    sys.stdout.write(dump_config(_load(args)))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from splitserve.bench.cli import run

    return run(args)


def _cmd_top(args: argparse.Namespace) -> int:
    from splitserve.top import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    p = argparse.ArgumentParser(prog="splitserve", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def add_config_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-c", "--config", help="deployment YAML (default: the embedded config)")
        sp.add_argument("--mode", choices=["disaggregated", "colocated"], help="override `mode`")

    serve = sub.add_parser("serve", help="start the OpenAI API server")
    add_config_args(serve)
    serve.add_argument("--host", help="bind address (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default from config: 8000)")
    serve.add_argument("-v", "--verbose", action="store_true", help="show worker logs")
    serve.set_defaults(func=_cmd_serve)

    model = sub.add_parser("model", help="model helpers").add_subparsers(dest="action", required=True)
    init = model.add_parser("init", help="build the deterministic tiny model")
    init.add_argument("--out", help="output directory (default: the user cache)")
    init.add_argument("--force", action="store_true", help="rebuild even if present")
    init.set_defaults(func=_cmd_model_init)

    config = sub.add_parser("config", help="config helpers").add_subparsers(dest="action", required=True)
    show = config.add_parser("show", help="print the effective config")
    add_config_args(show)
    show.set_defaults(func=_cmd_config_show)

    from splitserve.k8s.cli import add_k8s_commands

    add_k8s_commands(sub)  # splitserve k8s render|check

    from splitserve.bench.cli import add_arguments as add_bench_arguments

    bench = sub.add_parser("bench", help="benchmark an OpenAI-compatible endpoint")
    add_bench_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    from splitserve.top import add_arguments as add_top_arguments

    top = sub.add_parser("top", help="live pool state from the routers' /metrics")
    add_top_arguments(top)
    top.set_defaults(func=_cmd_top)

    from splitserve.controller.sim.command import add_controller_commands

    add_controller_commands(sub, add_config_args, _load)  # splitserve plan|simulate
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `splitserve` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"splitserve: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
