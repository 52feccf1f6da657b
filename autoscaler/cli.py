"""Command-line entry point: ``autoscaler COMMAND ...``.

Each command lives in ``autoscaler/commands/<name>.py`` and exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (called with the parsed namespace, returns the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Order here is the order in ``autoscaler --help``.
COMMAND_MODULES: tuple[str, ...] = (
    "autoscaler.commands.simulate",
    "autoscaler.commands.trace",
    "autoscaler.commands.observe",
    "autoscaler.commands.run",
    "autoscaler.commands.plan",
    "autoscaler.commands.import_hpa",
    "autoscaler.commands.backtest",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autoscaler",
        description="Metrics-driven GPU autoscaler and rebalancer for Kubernetes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
