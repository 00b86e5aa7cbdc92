"""The `megdet` command line.

Each subcommand lives with the component that owns it and registers itself through a
``register(subparsers)`` function. Registration must not import torch, so that `megdet plan`
and the controller work in an install without the ``[train]`` extra; heavy imports happen inside
the command handlers.

Exit codes: 0 success, 1 the command ran and failed, 2 bad input (argparse's convention).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from megdet import __version__

#: Modules that contribute subcommands, in the order `megdet --help` lists them.
COMMAND_MODULES = (
    "megdet.plan_cli",
    "megdet.trainer.cli",
    "megdet.trainer.report_cli",
    "megdet.image.cli",
    "megdet.api.cli",
    "megdet.controller.daemon",
)


def whole_number(minimum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for whole-number flags, optionally with a lower bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


class UsageError(Exception):
    """Bad input discovered after argument parsing; printed as `megdet: error: ...`, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megdet",
        description="MegDet-style large-batch detection training, from a laptop to Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"megdet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            # A component that is not part of this checkout or install; its commands are absent.
            if err.name and (err.name == name or name.startswith(err.name + ".")):
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UsageError as err:
        parser.exit(2, f"megdet {args.command}: error: {err}\n")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `megdet plan --json | head`: the reader went away; not an error of ours.
        sys.stderr.close()
        return 0
    return 0  # unreachable; parser.exit raises SystemExit


if __name__ == "__main__":
    sys.exit(main())
