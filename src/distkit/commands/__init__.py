"""The distkit command line: distkit train, distkit doctor and friends.

Each sub-command lives in its own module, which provides ``add_arguments(parser)`` and
``main(args) -> int``; this file only wires them up and turns a ``DistkitError`` into one
line on stderr and a non-zero exit.

The sub-command modules are imported here, as modules, so a missing one fails at once;
they must stay light: torch, ignite and the rest of the core are imported inside their
``main``, so ``distkit --help`` answers in a fraction of a second (tests/commands/test_cli.py
checks that building the parser imports no torch).
"""
from __future__ import annotations

import argparse
import re
import sys

from distkit import __version__
from distkit.commands import bench, check, doctor, grade, launch_script, plot, shard_check, train
from distkit.errors import DistkitError

# name -> (module, one-line help)
COMMANDS = {
    "train": (train, "train a model, spawning processes or joining torchrun/SLURM"),
    "launch": (launch_script, "run any script that makes its own process group on N ranks, "
                              "as torchrun does, with the kit's supervision"),
    "doctor": (doctor, "report versions, cores, GPUs, TPU, backends and the launch to use"),
    "bench": (bench, "measure what the kit costs vs hand-written loops, scaling, data loading"),
    "shard-check": (shard_check, "check which process sees which sample: overlap, coverage, padding"),
    "check": (check, "check your exercise files (exercises/), or show a hint or a solution"),
    "grade": (grade, "grade a class's exercise files, each in a sandbox: a gradebook CSV and reports"),
    "plot": (plot, "redraw a run's learning curves from its results.json"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``distkit: error: ...``), exit code 2."""

    def error(self, message):
        sys.stderr.write(f"distkit: error: {self.prog}: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def plain(text):
    """Help is read in a terminal: docstrings' RST markup (``code``, :class:`X`) becomes plain text."""
    if not text:
        return text
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")


def tidy_help(parser: argparse.ArgumentParser) -> None:
    """One rule for every sub-command's help: an option with a default shows it as
    "(default: X)", once; on/off flags (``--amp``, ``--no-progress``) show none, since
    "default: True" on a flag that turns something off misleads; a default of None means
    "decided at run time" and the option's own help says how; an empty one is not shown."""
    parser.formatter_class = argparse.HelpFormatter  # the rule below, not argparse's own
    parser.description = plain(parser.description)
    for action in parser._actions:
        action.help = plain(action.help)
        if (action.help == argparse.SUPPRESS or action.nargs == 0 or action.default in (None, "")
                or action.default == argparse.SUPPRESS or "default" in (action.help or "")):
            continue
        shown = str(action.default).replace("%", "%%")
        action.help = f"{action.help} (default: {shown})" if action.help else f"default: {shown}"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="distkit", description=plain(__doc__.splitlines()[0]),
                           epilog="distkit COMMAND --help shows a command's options.")
    parser.add_argument("--version", action="version", version=f"distkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        tidy_help(p)
        p.set_defaults(_module=module)
    return parser


def report_error(error: DistkitError) -> None:
    """One line on stderr. Under torchrun every rank runs the same checks before training
    starts: only rank 0 prints what failed (the others exit 1 quietly), and every rank
    leaves the line in torchrun's error file, so the summary torchrun prints names it as
    the root cause, whichever rank exited first (torchrun's own summary block cannot be
    silenced from inside a worker)."""
    from distkit.host.layout import claimed_rank, elastic, in_slurm_step

    line = f"distkit: error: {error}"
    torchrun = elastic()
    under_torchrun = torchrun.run_id is not None
    # under torchrun or srun every rank refuses alike: one line per run, from rank 0
    if not ((under_torchrun or in_slurm_step()) and getattr(error, "every_rank", False)
            and claimed_rank() != "0"):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    path = torchrun.error_file
    if under_torchrun and path:
        import json
        import time

        try:  # the format torch.distributed.elastic's ErrorHandler.record_exception writes
            with open(path, "w") as f:
                json.dump({"message": {"message": line, "extraInfo": {
                    "py_callstack": line, "timestamp": str(int(time.time()))}}}, f)
        except OSError:
            pass


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `distkit`: say what there is, as --help does
        parser.print_help()
        sys.exit(0)
    from distkit.train import signals

    signals.install_for_slurm_step()  # a task of an srun step never ends by the signal itself
    try:
        code = _exit_code(args, signals)
    finally:  # the code is decided: the interpreter's exit must not end by a signal instead
        signals.leaving()
    signals.exit_now_in_slurm_step(code)
    sys.exit(code)


def _exit_code(args, signals) -> int:
    """Run the sub-command; what it ended with, as one line and an exit status: 0, 128 +
    signal for a stop, ``signals.failure_exit_code()`` for a failure, 130 for Ctrl-C."""
    try:
        return args._module.main(args) or 0
    except signals.StoppedStarting as e:
        sys.stderr.write(f"distkit: {e.line()}\n")
        return e.exit_code
    except signals.Preempted as e:  # stopped by a signal with a checkpoint: "terminated", 128 + signal
        if not e.reported:  # a torchrun / srun rank said so itself, once per node
            sys.stderr.write(f"distkit: {e}\n")
            sys.stderr.flush()
        return e.exit_code
    except DistkitError as e:
        signals.begin()  # the failure decides the exit: a stop signal now is only noted
        if not getattr(e, "reported", False):  # a torchrun worker's failure says so itself
            report_error(e)
        return signals.failure_exit_code()  # 200 in an srun step: it outranks a stop
    except KeyboardInterrupt as e:  # the launcher says what it stopped and what is left
        sys.stderr.write(f"distkit: interrupted{f': {e}' if str(e) else ''}\n")
        return 130
