"""The ``distkit`` command line: ``distkit train``, ``distkit doctor`` and friends.

Each sub-command lives in its own module, which provides ``add_arguments(parser)`` and
``main(args) -> int``; this file only wires them up and turns a ``DistkitError`` into one
line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from distkit.errors import DistkitError

# name -> (module, one-line help)
COMMANDS = {
    "train": ("distkit.commands.train", "train a model, spawning processes or joining torchrun/SLURM"),
    "doctor": ("distkit.commands.doctor", "report versions, cores, GPUs, TPU, backends and the launch to use"),
    "bench": ("distkit.commands.bench", "measure what the kit costs vs hand-written loops, scaling, data loading"),
    "shard-check": ("distkit.commands.shard_check", "check which process sees which sample: overlap, coverage, padding"),
    "check": ("distkit.commands.check", "check your exercise files (exercises/), or show a hint or a solution"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``distkit: error: ...``), exit code 2."""

    def error(self, message):
        sys.stderr.write(f"distkit: error: {self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="distkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = importlib.import_module(args._module).main(args)
    except DistkitError as e:
        sys.stderr.write(f"distkit: error: {e}\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.stderr.write("distkit: interrupted\n")
        sys.exit(130)
    sys.exit(code or 0)
