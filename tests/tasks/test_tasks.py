"""distkit.Task and resolve_task: the contract, the built-in registry, and every wrong task
refused in one line before any process starts. Fast: nothing here trains."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from distkit import Config, DistkitError, Task, resolve_task, run
from distkit.tasks import BUILTIN_TASKS

from support import within_seconds

COURSE = '''
import torch
import torch.nn as nn
from ignite.metrics import MeanSquaredError
from torch.utils.data import TensorDataset
from distkit import Task

def make_datasets(config):
    x = torch.randn(64, 8)
    return TensorDataset(x[:48], x[:48, :1]), TensorDataset(x[48:], x[48:, :1])

def make_model(config):
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

def make_metrics():
    return {"mse": MeanSquaredError()}

task = Task(datasets=make_datasets, model=make_model, loss=nn.MSELoss,
            metrics=make_metrics, score=("mse", "min"))
not_a_task = 42
bad_score = Task(datasets=make_datasets, model=make_model, loss=nn.MSELoss,
                 metrics=make_metrics, score=("r2", "max"))
'''


@pytest.fixture
def course(tmp_path, monkeypatch):
    (tmp_path / "course_mod.py").write_text(COURSE)
    monkeypatch.chdir(tmp_path)
    yield tmp_path / "course_mod.py"
    sys.modules.pop("course_mod", None)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_the_issue_contract_call_works_and_defaults_are_classification():
    def make_datasets(config):
        return [], []

    def make_model(config):
        return nn.Linear(2, 1)

    task = Task(datasets=make_datasets, model=make_model, loss=nn.MSELoss,
                metrics=lambda: {"mse": __import__("ignite.metrics").metrics.MeanSquaredError()},
                score=("mse", "min"))
    assert task.metric_names() == ["mse", "loss"]
    assert task.sign() == -1.0
    plain = Task(datasets=make_datasets, model=make_model)
    assert isinstance(plain.loss(), nn.CrossEntropyLoss)
    assert list(plain.metrics()) == ["accuracy"] and plain.score == ("loss", "min")
    assert isinstance(plain.optimizer(make_model(None).parameters(), Config()), torch.optim.SGD)


@pytest.mark.parametrize("kwargs, words", [
    (dict(score=("mse", "lowest")), "'min' or 'max'"),
    (dict(score="mse"), "(metric name, 'min' or 'max')"),
    (dict(loss=nn.MSELoss()), "Task(loss=nn.MSELoss) (no parentheses)"),
    (dict(metrics={"mse": None}), "Task(metrics=...) must be a function"),
])
def test_a_malformed_task_is_refused_in_one_line(kwargs, words):
    with pytest.raises(DistkitError) as e:
        Task(datasets=lambda c: ([], []), model=lambda c: nn.Linear(1, 1), **kwargs)
    assert words in one_line(e)


def test_builtin_registry_covers_every_dataset_and_model_and_builds_the_same_model():
    from distkit.config import DATASETS, MODELS
    from distkit.builtin.models import get_model

    images = {(d, m) for d in DATASETS for m in MODELS if "text" != d and "gpt" != m}
    assert set(BUILTIN_TASKS) == images | {("text", "gpt")}
    assert {d for d, _ in BUILTIN_TASKS} == set(DATASETS) and {m for _, m in BUILTIN_TASKS} == set(MODELS)
    task = resolve_task(Config(dataset="synthetic", model="mlp"))
    assert task is BUILTIN_TASKS[("synthetic", "mlp")] and task.name == "synthetic/mlp"
    built = task.model(Config())
    assert [p.shape for p in built.parameters()] == [p.shape for p in get_model("mlp").parameters()]
    train, val = task.datasets(Config(dataset="digits", seed=0))  # the task, not the config, picks
    assert len(train) == 2048 and len(val) == 360  # synthetic (digits would give 1437)


def test_task_by_module_and_by_file_path(course, tmp_path):
    by_module = resolve_task("course_mod:task")
    assert by_module.name == "course_mod:task" and by_module.score == ("mse", "min")
    assert resolve_task(Config(task="course_mod:task")).model is by_module.model
    by_path = resolve_task(f"{course}:task")
    assert by_path.model is by_module.model  # the same module, imported once


@pytest.mark.parametrize("spec, words", [
    ("course_mod", "is not module:attr"),
    ("no_such_course:task", "no module 'no_such_course' importable from"),
    ("course_mod:nothing", "has no attribute 'nothing'"),
    ("course_mod:not_a_task", "is a int, not a distkit.Task"),
    ("missing/dir/course.py:task", "no such file"),
])
def test_a_wrong_task_spec_is_refused_in_one_line(course, spec, words):
    with pytest.raises(DistkitError) as e:
        resolve_task(spec)
    assert words in one_line(e)


def test_a_broken_course_module_and_a_clashing_file_name_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_course.py").write_text("import torch\nraise ValueError('oops')\n")
    with pytest.raises(DistkitError) as e:
        resolve_task("broken_course:task")
    assert "raised ValueError: oops: fix that module" in one_line(e)
    (tmp_path / "json.py").write_text(COURSE)  # the name of a module already imported
    with pytest.raises(DistkitError) as e:
        resolve_task(f"{tmp_path / 'json.py'}:task")
    assert "already taken" in one_line(e) and "rename the file" in str(e.value)
    # refused specs leave nothing on sys.path: json.py there would shadow the standard
    # module in every process started later (spawned children import json early)
    assert str(tmp_path) not in sys.path and str(tmp_path.resolve()) not in sys.path


def test_a_score_that_names_no_metric_fails_before_any_process(course, tmp_path):
    with pytest.raises(DistkitError) as e:
        run(Config(task="course_mod:bad_score", nproc_per_node=2, output_dir=str(tmp_path / "runs")))
    assert "score 'r2' is not one of its metrics (mse, loss)" in one_line(e)
    assert not (tmp_path / "runs").exists()


def test_a_task_that_cannot_pickle_is_refused_before_spawning(tmp_path):
    task = Task(datasets=lambda config: ([0] * 64, [0] * 8), model=lambda config: nn.Linear(64, 10))
    with pytest.raises(DistkitError) as e:
        run(Config(nproc_per_node=2, output_dir=str(tmp_path / "runs")), task=task)
    assert "the task cannot be sent to spawned processes" in one_line(e)
    assert "not as lambdas" in str(e.value)
    assert not (tmp_path / "runs").exists(), "nothing half-written"


def test_launch_function_refuses_an_unpicklable_function_and_a_bad_backend():
    from distkit import launch_function

    with pytest.raises(DistkitError) as e:
        launch_function(lambda local_rank: None, backend="gloo", nproc_per_node=2)
    assert "the training function and its arguments cannot be sent" in one_line(e)
    with pytest.raises(DistkitError) as e:
        launch_function(print, backend="mpi-ish", nproc_per_node=2)
    assert "unknown backend='mpi-ish'" in one_line(e)  # its parameter, not distkit train's flag


def _checkpoint(path, model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.save({"trainer": {"iteration": 3, "epoch_length": 8, "max_epochs": 2},
                "model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": {}}, path)
    from distkit.checkpoint.saver import write_checksum

    write_checksum(path, 3)
    return path


def test_a_checkpoint_of_another_task_is_refused_in_one_line(course, tmp_path, run_cli):
    from distkit.builtin.models import get_model

    cnn = _checkpoint(tmp_path / "cnn.pt", get_model("cnn"))
    out = run_cli("train", "--task", "course_mod:task", "--resume-from", cnn,
                  "--output-dir", tmp_path / "runs", timeout=within_seconds(60))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
    assert "holds weights for another model than the task 'course_mod:task'" in lines[0]
    assert "--task course_mod:task" in lines[0]
    # and the other way round, in process: the built-in task refuses the course's weights
    from distkit.checkpoint.saver import check_checkpoint_fits

    mlp = _checkpoint(tmp_path / "course.pt", resolve_task("course_mod:task").model(Config()))
    with pytest.raises(DistkitError) as e:
        check_checkpoint_fits(str(mlp), Config())
    assert "another model than the task 'digits/cnn' (--model cnn --dataset digits)" in one_line(e)
    assert not (tmp_path / "runs").exists()


def test_cli_wrong_task_is_one_line(tmp_path, run_cli):
    out = run_cli("train", "--task", "nowhere:task", "--output-dir", tmp_path / "runs", timeout=within_seconds(60))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"distkit: error: --task 'nowhere:task': no module 'nowhere' importable from "
        f"'{tmp_path}': run from the folder that holds nowhere.py, or pass --task "
        "path/to/nowhere.py:attr"]


def test_import_distkit_is_light_and_every_public_name_resolves():
    code = ("import sys, distkit; light = 'torch' not in sys.modules; "
            "[getattr(distkit, n) for n in distkit.__all__]; print(light, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
