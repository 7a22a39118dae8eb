"""One run, one set of settings (issue 31): every setting that can differ between nodes,
generated from the Config dataclass (a new flag is covered when it is added), is compared
with rank 0's before the first step, and a difference stops every rank in one line naming
it and both values. Function level: every field in one real 2-process gloo group.
End to end: two nodes on loopback through the CLI for a few flags and a task file."""
from __future__ import annotations

import re
import dataclasses
import time
import typing

import pytest

from support import two_nodes
from distkit.train.agreement import PER_NODE, setting_label
from distkit.config import BACKENDS, DATASETS, LOGGERS, MODELS, STRATEGIES, Config

CHOICES = {"backend": BACKENDS, "dataset": DATASETS, "model": MODELS, "logger": LOGGERS,
           "strategy": STRATEGIES}


def other_value(field: dataclasses.Field):
    """A value of ``field``'s type other than its default (validity does not matter: the
    comparison comes before anything uses it)."""
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if field.name in CHOICES:
        return next(c for c in CHOICES[field.name] if c != default)
    kind = typing.get_type_hints(Config)[field.name]
    if typing.get_origin(kind) is typing.Union:  # Optional[x]
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is bool:
        return not default
    if kind is int:
        return (default or 0) + 3
    if kind is float:
        return (default or 0.0) + 0.5
    if kind is str:
        return f"{default or 'x'}-other"
    if kind is dict:
        return {"hidden": 7}
    raise AssertionError(f"Config.{field.name}: no other value for type {kind!r}; add one here")


FIELDS = [f for f in dataclasses.fields(Config)]


def compare_every_field(local_rank):
    """In each rank of a 2-process group: for every Config field, rank 1 changes it and
    both ranks compare; returns {field: the DistkitError's message or None}."""
    import ignite.distributed as idist

    from distkit.train.agreement import check_same_settings
    from distkit.errors import DistkitError
    from distkit.tasks import resolve_task

    base = Config()
    task = resolve_task(base)
    out = {"(none)": None}
    try:
        check_same_settings(base, task)
    except DistkitError as e:
        out["(none)"] = str(e)
    for field in FIELDS:
        value = other_value(field)
        config = base.replace(**{field.name: value}) if idist.get_rank() == 1 else base
        if field.name == "resume_from" and idist.get_rank() == 1:
            config = base.replace(resume_from=None if value is None else "/nowhere/x.pt")
        try:
            check_same_settings(config, task)
            out[field.name] = None
        except DistkitError as e:
            out[field.name] = str(e)
    # another task, and a task of the same name from other source
    other = resolve_task(Config(dataset="digits", model="mlp")) if idist.get_rank() == 1 else task
    try:
        check_same_settings(base, other)
        out["(other task)"] = None
    except DistkitError as e:
        out["(other task)"] = str(e)
    return out


@pytest.fixture(scope="module")
def compared():
    from distkit.launch.entry import launch_function

    return launch_function(compare_every_field, backend="gloo", nproc_per_node=2,
                           threads_per_process=1, all_ranks=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_every_config_field_must_agree_across_ranks(compared, field):
    rank0, rank1 = compared
    assert rank0 == rank1, "both ranks must stop with the same line"
    message = rank0[field.name]
    if field.name in PER_NODE:
        assert message is None, f"{field.name} may differ between nodes ({PER_NODE[field.name]})"
        return
    assert message is not None, f"--{field.name} differed between the ranks and was not refused"
    assert "\n" not in message
    label = setting_label(f"config.{field.name}")
    assert message.startswith(f"settings differ between ranks: {label} is "), message
    assert "on rank 1 (node 0)" in message and "on rank 0 (node 0)" in message, message
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if field.name != "resume_from":
        assert f"{other_value(field)!r} on rank 1" in message and f"{default!r} on rank 0" in message


@pytest.mark.slow
def test_the_same_settings_pass_and_another_task_is_refused(compared):
    rank0, _ = compared
    assert rank0["(none)"] is None
    assert "the task (--task, or --dataset/--model) is 'digits/mlp' on rank 1" in rank0["(other task)"]


def test_per_node_fields_are_config_fields():
    names = {f.name for f in FIELDS}
    assert set(PER_NODE) <= names, set(PER_NODE) - names


# --- end to end: two nodes on loopback --------------------------------------------------

TASK = '''
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset
from distkit import Task

HIDDEN = {hidden}


def data(config):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    y = (x.sum(1) > 0).long()
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])


def model(config):
    return nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))


task = Task(datasets=data, model=model, name="two-file-task", score=("accuracy", "max"))
'''


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("flag, a, b", [
    ("--lr", "0.05", "0.1"), ("--seed", "0", "1"), ("--batch-size", "64", "32"),
    ("--epochs", "1", "2"), ("--dataset", "digits", "synthetic"), ("--task", "a", "b"),
])
def test_two_nodes_with_another_setting_stop_before_the_first_step(tmp_path, flag, a, b):
    if flag == "--task":  # the same name and path on each node, other source
        for node, hidden in (("a", 16), ("b", 32)):
            (tmp_path / node).mkdir()
            (tmp_path / node / "course.py").write_text(TASK.format(hidden=hidden))
        a, b = str(tmp_path / "a" / "course.py") + ":task", str(tmp_path / "b" / "course.py") + ":task"
        words = ["the task's source (a SHA-256 of its module files) is "]
    else:
        words = [f"{flag} is "]
    started = time.monotonic()
    nodes = two_nodes(tmp_path, [flag, a], [flag, b])
    took = time.monotonic() - started
    assert took < 60 + 10 + 30, took
    for node, (code, out, err) in enumerate(nodes):
        # node 1 may say once that it waits for the master (it can start before node 0)
        lines = [ln for ln in err.splitlines() if ln.strip() and "waiting up to --timeout" not in ln]
        assert code != 0, f"node {node} exited 0:\n{err[-2000:]}"
        assert len(lines) == 1 and lines[0].startswith("distkit: error: "), f"node {node}:\n{err[-3000:]}"
        assert "settings differ between ranks: " in lines[0] and "nothing was trained" in lines[0]
        for word in words:
            assert word in lines[0], lines[0]
        assert "on rank 1 (node 1)" in lines[0] and "on rank 0 (node 0)" in lines[0], lines[0]
        assert not re.search(r"^epoch ", out, re.M), out  # no epoch line: nothing trained
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.*")), \
        list((tmp_path / "runs").rglob("*"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_nodes_with_another_nproc_per_node_stop_in_one_line_naming_it(tmp_path):
    """Another --nproc-per-node gives each node another world size: the processes would never
    form a group, so the ranks' comparison above is never reached. The launchers compare
    their layouts at node 0's store first (distkit.launch.rendezvous.host_master_store): one line
    per node naming the flag and both values, no C++ frames, nothing started."""
    started = time.monotonic()
    nodes = two_nodes(tmp_path, ["--nproc-per-node", "2"], ["--nproc-per-node", "1"])
    took = time.monotonic() - started
    assert took < 60 + 10 + 30, took
    for node, (code, out, err) in enumerate(nodes):
        lines = [ln for ln in err.splitlines() if ln.strip() and "waiting up to --timeout" not in ln]
        assert code != 0, f"node {node} exited 0:\n{err[-2000:]}"
        assert len(lines) == 1, f"node {node}:\n{err[-3000:]}"
        assert lines[0].startswith(f"distkit: error: node {node}: --nproc-per-node is 1 on node 1 "
                                   "and 2 on node 0;"), lines[0]
        assert "nothing was trained" in lines[0] and "same --nproc-per-node" in lines[0], lines[0]
        assert "frame #" not in err and "Traceback" not in err, err
        assert not re.search(r"^epoch ", out, re.M), out  # no epoch line: nothing trained
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.*")), \
        list((tmp_path / "runs").rglob("*"))
