"""The one place that decides whether a run may start (distkit.launch.checks), and the
command line made from Config: the checks' names and order, invalid settings drawn by
Hypothesis refused in one line naming the flag, every flag of ``distkit train`` made
from a field, docs/cli.md's flag table made from the same source."""
from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from distkit.config import BACKENDS, Config, _label
from distkit.errors import DistkitError
from distkit.launch.checks import CHECKS, check_run

# One seed decides every drawn case; printed, so a failure reproduces in one line.
SEED = int(os.environ.get("DISTKIT_TEST_SEED") or random.randrange(2**32))
print(f"tests/config/test_checks.py: Hypothesis seed {SEED} (reproduce: DISTKIT_TEST_SEED={SEED} "
      "python -m pytest tests/config/test_checks.py)", file=sys.stderr)
DRAWN = settings(max_examples=60, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


def test_the_checks_run_in_one_order_under_their_names():
    assert [(c.name, c.scope) for c in CHECKS] == [
        ("process_settings", "processes"), ("launch", "processes"),
        ("training_settings", "training"), ("task", "training"),
        ("flags_reach_task", "training"), ("strategy_on_backend", "training"),
        ("synthetic_memory", "training"), ("checkpoint_fits", "training"),
        ("max_iters_after_resume", "training"), ("download", "training"),
        ("sizes", "training"), ("output_dir", "training"), ("agreement", "ranks")]


def test_the_order_decides_which_refusal_is_said():
    """Two wrong settings: the earlier check speaks."""
    with pytest.raises(DistkitError) as e:  # a backend this machine lacks, before a NaN lr
        check_run(Config(lr=float("nan"), backend="nccl"), spawning=True)
    assert e.value.check == "launch" and "--backend nccl" in str(e.value)
    with pytest.raises(DistkitError) as e:  # a NaN lr, before a setting the task lacks
        check_run(Config(lr=float("nan"), task_settings={"nope": "1"}), spawning=True)
    assert e.value.check == "training_settings" and "--lr" in str(e.value)
    with pytest.raises(DistkitError) as e:
        check_run(Config(task_settings={"nope": "1"}), spawning=True)
    assert e.value.check == "task" and "--set nope" in str(e.value)


NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
# field -> values that are wrong for it
WRONG = {
    "lr": st.one_of(NOT_FINITE, st.floats(max_value=0.0, allow_nan=False)),
    "timeout_s": st.one_of(NOT_FINITE, st.floats(max_value=0.0, allow_nan=False),
                           st.floats(min_value=86400.5, allow_infinity=False)),
    "momentum": st.one_of(NOT_FINITE, st.floats(min_value=1.0, allow_infinity=False),
                          st.floats(max_value=-1e-9, allow_infinity=False)),
    "weight_decay": st.one_of(NOT_FINITE, st.floats(max_value=-1e-9, allow_infinity=False)),
    "warmup_epochs": st.one_of(NOT_FINITE, st.floats(max_value=-1e-9, allow_infinity=False)),
    "early_stopping_min_delta": st.one_of(NOT_FINITE, st.floats(max_value=-1e-9, allow_infinity=False)),
    "batch_size": st.integers(max_value=0),
    "epochs": st.integers(max_value=0),
    "dataset_size": st.integers(max_value=0),
    "num_workers": st.integers(max_value=-1),
    "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)),
    "nproc_per_node": st.integers(max_value=0),
    "nnodes": st.integers(max_value=0),
    "master_port": st.one_of(st.integers(max_value=0), st.integers(min_value=65536)),
    "threads_per_process": st.integers(max_value=0),
    "max_iters": st.integers(max_value=0),
    "checkpoint_every": st.integers(max_value=-1),
    "early_stopping_patience": st.integers(max_value=-1),
    "backend": st.text(min_size=1, max_size=12).filter(lambda s: s not in BACKENDS),
    "dataset": st.sampled_from(["imagenet", "MNIST", "", "digits "]),
    "model": st.sampled_from(["vit", "CNN", "gpt2"]),
    "logger": st.sampled_from(["wandb", "tensorboardX"]),
    "strategy": st.sampled_from(["zero", "FSDP", "tp"]),
}


@st.composite
def one_wrong_setting(draw):
    """(field, Config with that one field wrong): a number out of range, NaN or inf, or a
    choice that is none of the choices; or a global batch that does not divide by the
    processes asked for."""
    if draw(st.booleans()):
        nproc = draw(st.integers(2, 8))
        batch = draw(st.integers(1, 512).filter(lambda b: b % nproc))
        return "batch_size", Config(backend="gloo", nproc_per_node=nproc, batch_size=batch)
    field = draw(st.sampled_from(sorted(WRONG)))
    return field, Config(**{field: draw(WRONG[field])})


@seed(SEED)
@DRAWN
@given(one_wrong_setting())
def test_a_wrong_setting_is_refused_in_one_line_naming_it(case):
    field, config = case
    with pytest.raises(DistkitError) as e:
        check_run(config, spawning=True)
    message = str(e.value)
    assert "\n" not in message, message
    assert e.value.check in ("process_settings", "training_settings"), (e.value.check, message)
    label = _label(field)
    assert re.search(rf"{re.escape(label)}\b", message), (label, message)


# ---------------------------------------------------------------------------------------
# The command line, made from Config
# ---------------------------------------------------------------------------------------

# The flags distkit train listed before they were made from Config (torchrun's spellings
# included): none may go missing.
FLAGS_BEFORE = {
    "--amp", "--backend", "--batch-size", "--checkpoint-every", "--data-dir", "--dataset",
    "--dataset-size", "--early-stopping-min-delta", "--early-stopping-patience", "--epochs",
    "--logger", "--lr", "--master-addr", "--master-port", "--master_addr", "--master_port",
    "--max-iters", "--model", "--nnodes", "--no-progress", "--node-rank", "--node_rank",
    "--nproc-per-node", "--nproc_per_node", "--num-workers", "--output-dir", "--peak-flops",
    "--profile", "--resume-from", "--scale-lr", "--seed", "--set", "--strategy", "--task",
    "--threads-per-process", "--timeout", "--trace", "--verbose", "--warmup-epochs"}


def _train_parser():
    from distkit.commands import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["train"]


def test_every_field_has_its_flag_and_every_flag_a_field():
    parser = _train_parser()
    by_dest = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(Config)}
    assert set(by_dest) == fields - {"momentum", "weight_decay"}  # no flag: set from Python
    listed = {s for a in by_dest.values() for s in a.option_strings}
    assert FLAGS_BEFORE <= listed, sorted(FLAGS_BEFORE - listed)
    for name, action in by_dest.items():
        assert action.help, f"--{name} has no help (give Config.{name} a docstring)"


def test_train_help_says_the_batch_is_global():
    help_text = " ".join(_train_parser().format_help().split())
    assert re.search(r"--batch-size B GLOBAL batch size", help_text), help_text


def test_flags_parse_to_the_config_they_name():
    from distkit.commands.train import config_from_args

    args = _train_parser().parse_args(
        ["--timeout", "5", "--no-progress", "--set", "hidden=3", "--nproc_per_node", "3",
         "--lr", "0.5", "--amp", "--backend", "gloo"])
    cfg = config_from_args(args)
    assert (cfg.timeout_s, cfg.progress_bar, cfg.task_settings, cfg.nproc_per_node, cfg.lr,
            cfg.amp, cfg.backend) == (5.0, False, {"hidden": "3"}, 3, 0.5, True, "gloo")


def test_docs_cli_flag_table_is_made_from_config():
    """docs/cli.md holds the table flag_table() makes; a field added or reworded fails
    here until the page is remade: python -c "from distkit.commands.train import
    flag_table; print(flag_table())"."""
    from pathlib import Path

    from distkit.commands.train import flag_table

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    start = text.index("| flag | default | what it sets |")
    end = text.index("\n\n", start)
    assert text[start:end + 1] == flag_table()
