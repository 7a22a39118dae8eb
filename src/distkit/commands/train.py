"""``distkit train``: one flag per field of :class:`distkit.config.Config`, made from the
field (its name, type, default, docstring as help, and its ``cli`` metadata), so the
command line and the dataclass cannot drift apart.

``--task module:attr`` trains a course's own :class:`distkit.Task` (see
``distkit.tasks``); without it, ``--dataset`` and ``--model`` pick a built-in task."""
from __future__ import annotations

import argparse
import dataclasses
import os

from distkit.config import DATASET_DEFAULTS, Config, _flag, cli_spec, field_docs
from distkit.host.layout import claimed_rank, world_layout

DEFAULTS = Config()
# How a field's type annotation reads on the command line (Optional[...] included).
_TYPES = (("int", int), ("float", float))


def _default(field: str) -> str:
    """Help text for a flag whose default depends on --dataset."""
    per_dataset = ", ".join(f"{d}: {v[field]}" for d, v in DATASET_DEFAULTS.items() if field in v)
    return f"default: {getattr(DEFAULTS, field)}" + (f" ({per_dataset})" if per_dataset else "")


def flag_options(field) -> tuple[list, dict] | None:
    """``(option strings, add_argument keywords)`` of ``field`` (a dataclass field of
    :class:`Config`): its flag, help from its docstring, type and default from the field,
    the rest from its ``cli`` metadata. None: the field has no flag."""
    spec = cli_spec(field.name)
    flag = _flag(field.name)
    if flag is None:
        return None
    names = [f"--{flag}"] + ([spec["alias"]] if "alias" in spec else [])
    help_text = field_docs().get(field.name, "")
    kw = {"dest": field.name, "help": help_text}
    if field.type == "bool":
        kw["action"] = spec.get("action", "store_true")
        return names, kw
    if spec.get("action") == "append":
        kw.update(action="append", default=[], metavar=spec.get("metavar"))
        return names, kw
    kw["type"] = next((t for name, t in _TYPES if name in field.type), str)
    kw["default"] = getattr(DEFAULTS, field.name)
    for key in ("choices", "metavar"):
        if key in spec:
            kw[key] = spec[key]
    if any(field.name in v for v in DATASET_DEFAULTS.values()):
        # given or not must stay visible: None until config_from_args fills the dataset's
        kw["default"] = None
        kw["help"] = f"{help_text.rstrip('.')}; {_default(field.name)}"
    return names, kw


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`Config` (but those without one: ``momentum``,
    ``weight_decay``), made from the field by :func:`flag_options`, in the field's order,
    in the help sections its ``cli`` metadata opens."""
    group = p
    for field in dataclasses.fields(Config):
        spec = cli_spec(field.name)
        if "group" in spec:
            group = p.add_argument_group(spec["group"])
        made = flag_options(field)
        if made is not None:
            group.add_argument(*made[0], **made[1])


def flag_table() -> str:
    """docs/cli.md's table of ``distkit train``'s flags, made as the flags are."""
    rows = ["| flag | default | what it sets |", "| --- | --- | --- |"]
    for field in dataclasses.fields(Config):
        made = flag_options(field)
        if made is None:
            continue
        names, kw = made
        default = kw.get("default")
        shown = "" if default in (None, "", []) or kw.get("action") else f"`{default}`"
        text = " ".join(kw["help"].split()).replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{' / '.join(names)}` | {shown} | {text} |")
    return "\n".join(rows) + "\n"


def config_from_args(args) -> Config:
    """The Config of these flags; a flag not given takes its dataset's default
    (``DATASET_DEFAULTS``), else Config's."""
    fields = Config.__dataclass_fields__
    given = {k: v for k, v in vars(args).items() if k in fields}
    given["task_settings"] = parse_settings(given.get("task_settings") or [])
    for k, v in DATASET_DEFAULTS.get(given.get("dataset"), {}).items():
        if given.get(k) is None:
            given[k] = v
    return Config(**{k: v for k, v in given.items()
                     if v is not None or fields[k].default is None})


def parse_settings(pairs) -> dict:
    """``["hidden=64", "max_norm=1.0"]`` -> ``{"hidden": "64", "max_norm": "1.0"}`` (the task
    converts each to its default's type before any process starts)."""
    from distkit.errors import DistkitError

    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise DistkitError(f"--set {pair!r} is not NAME=VALUE: give e.g. --set hidden=64")
        settings[name] = value
    return settings


# distkit.launch.checks.CPU_DEFAULT_NPROC, read here without importing torch (which
# checks imports); tests/commands/test_first_line.py keeps the two equal.
CPU_PROCESSES = 2


def visible_gpus() -> int:
    """NVIDIA GPUs the driver lists, found without importing torch (0 without a driver)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def first_line(config: Config, environ=os.environ) -> str:
    """What ``distkit train`` is starting, said before torch's import (several seconds):
    what it trains, on how many processes, where its output goes."""
    what = (f"the task {config.task}" if config.task else f"{config.model} on {config.dataset}")
    what += f", {config.epochs} epoch(s)" if config.epochs else ""
    layout = world_layout(environ)  # a launcher variable no launcher sets: its one line, now
    if layout.launcher != "none":
        by = "torchrun" if layout.launcher == "torchrun" else "SLURM"
        where = f"rank {layout.rank} of {layout.world_size} processes started by {by}"
    elif config.nproc_per_node:
        where = f"{config.nproc_per_node} process(es) on this machine"
    elif config.backend == "none":
        where = "1 process, no process group"
    elif visible_gpus() and config.backend in ("auto", "nccl"):
        where = f"{visible_gpus()} processes, one per GPU"
    else:
        where = f"{CPU_PROCESSES} processes on the CPU (gloo)"
    nodes = f" x {config.nnodes} nodes" if config.nnodes > 1 else ""
    return (f"distkit train: {what}, on {where}{nodes}; output in a new folder under "
            f"{config.output_dir}/ (loading torch...)")


def announce(config: Config, environ=os.environ) -> None:
    """Print :func:`first_line` once per run: from the launching process, or rank 0 of a
    torchrun / SLURM launch."""
    if claimed_rank(environ) == "0":
        print(first_line(config, environ), flush=True)


def main(args) -> int:
    config = config_from_args(args)
    announce(config)  # before torch: its import alone takes seconds

    import torch

    from distkit.launch.entry import run
    from distkit.host.layout import world_layout
    from distkit.observe.reporting import run_summary

    # This process only launches (or, joined to torchrun, trains and sets its own count):
    # on one thread it never starts an OpenMP pool, so its workers fork safely at any count.
    torch.set_num_threads(1)
    results = run(config)
    # under torchrun / SLURM every rank gets rank 0's results: one summary, from rank 0
    if results is not None and world_layout().rank == 0:
        if results.get("profile"):
            from distkit.observe.profiling import write_csv

            write_csv(results["profile"], f"{results['run_dir']}/profile.csv")
        print(run_summary(results))
    return 0
