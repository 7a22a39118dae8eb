"""The exercises, checked both ways (as rustlings does): every untouched stub fails its
check for the right reason (``NotImplementedError``, not an import error), every
solution passes, and for every exercise plausible wrong answers are rejected with the
sentence a learner reads.

The checks run as ``pytest exercises`` subprocesses (they live under ``exercises/`` with
their own ``pytest.ini``), choosing the graded files with ``DISTKIT_EXERCISES``. A wrong
answer is a solution file with one function redefined at its end (a later ``def`` wins).
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO_ROOT, subprocess_env

EXERCISES = REPO_ROOT / "exercises"
SOLUTIONS = EXERCISES / "solutions"
STUBS = sorted(EXERCISES.glob("[0-9][0-9]_*.py"))
NUMBERS = [p.name[:2] for p in STUBS]


def run_checks(tmp_path: Path, graded: str, *args: str, env=None) -> dict:
    """Run the exercise checks in a subprocess; return ``{test id: (outcome, message)}``
    with outcome ``passed``, ``failed``, ``error`` or ``skipped``."""
    junit = tmp_path / f"junit-{len(list(tmp_path.glob('junit-*')))}.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "exercises", "-p", "no:cacheprovider", "-q",
         f"--junitxml={junit}", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=400,
        env=subprocess_env(DISTKIT_EXERCISES=graded, PYTHONDONTWRITEBYTECODE=1, **(env or {})))
    assert junit.exists(), f"the checks did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = tag if tag != "failure" else "failed"
                message = f"{node.get('message', '')}\n{node.text or ''}"
                break
        results[test_id] = (outcome, message)
    assert results, f"no checks collected:\n{proc.stdout[-3000:]}"
    return results


def exercise_of(test_id: str) -> str:
    return re.search(r"test_(\d\d)_", test_id).group(1)


def by_exercise(results: dict) -> dict:
    grouped = {}
    for test_id, result in results.items():
        grouped.setdefault(exercise_of(test_id), []).append((test_id, *result))
    return grouped


# --- the files themselves -------------------------------------------------------------

def public_functions(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    return {node.name: [a.arg for a in node.args.args] for node in tree.body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")}


def test_every_exercise_has_a_task_a_todo_a_hint_a_solution_and_a_marker():
    assert len(STUBS) >= 8, f"expected at least 8 exercises, found {[p.name for p in STUBS]}"
    assert NUMBERS == [f"{i:02d}" for i in range(1, len(NUMBERS) + 1)], NUMBERS
    hints = (EXERCISES / "hints.md").read_text()
    ini = (EXERCISES / "pytest.ini").read_text()
    for stub in STUBS:
        n, text = stub.name[:2], stub.read_text()
        doc = ast.get_docstring(ast.parse(text))
        assert doc and "Task" in doc and f"-m ex{n}" in doc, \
            f"{stub.name}: the docstring must state the task and how to check it"
        assert "# TODO" in text and "raise NotImplementedError" in text, stub.name
        solution = SOLUTIONS / stub.name
        assert solution.exists(), f"{stub.name} has no solution"
        answer = solution.read_text()
        assert "NotImplementedError" not in answer and "TODO" not in answer, solution.name
        # The solution mirrors the stub: same public functions, same arguments.
        assert public_functions(solution) == public_functions(stub), stub.name
        assert re.search(rf"^## {n}\b", hints, flags=re.M), f"hints.md has no section for {n}"
        checks = list((EXERCISES / "checks").glob(f"test_{n}_*.py"))
        assert len(checks) == 1 and f"pytest.mark.ex{n}" in checks[0].read_text(), n
        assert re.search(rf"^\s+ex{n}:", ini, flags=re.M), f"marker ex{n} not registered"


def given_parts(path: Path) -> dict:
    """What a stub hands the learner ready-made: functions whose docstring starts with
    "Given:", classes, and module-level constants, each as source text."""
    text = path.read_text()
    tree = ast.parse(text)
    parts = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (ast.get_docstring(node) or "").startswith("Given:"):
            parts[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.ClassDef):
            parts[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            parts[",".join(t.id for t in node.targets)] = ast.get_source_segment(text, node)
    return parts


@pytest.mark.parametrize("stub", STUBS, ids=lambda p: p.stem)
def test_solution_keeps_the_stubs_given_code_unchanged(stub):
    # The solution mirrors the stub file; what the stub gives ("Do not change it") must
    # not drift between the two, or the solution would pass against other helpers.
    given = given_parts(stub)
    in_solution = given_parts(SOLUTIONS / stub.name)
    for name, source in given.items():
        assert in_solution.get(name) == source, f"{stub.name}: {name} differs in the solution"


# --- both sides -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_untouched_stubs_fail_every_check_with_not_implemented(tmp_path):
    grouped = by_exercise(run_checks(tmp_path, "stubs"))
    assert sorted(grouped) == NUMBERS, f"exercises without a check: {set(NUMBERS) - set(grouped)}"
    for n, tests in grouped.items():
        for test_id, outcome, message in tests:
            assert outcome == "failed", f"{test_id}: {outcome} with the stub\n{message[:2000]}"
            assert f"exercise {n} is not solved yet" in message, \
                f"{test_id} failed for another reason than the TODO:\n{message[:2000]}"
            assert "NotImplementedError" in message, message[:2000]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_solutions_pass_every_check(tmp_path):
    results = run_checks(tmp_path, "solutions")
    assert sorted(by_exercise(results)) == NUMBERS
    failed = {t: m[:2000] for t, (o, m) in results.items() if o != "passed"}
    assert not failed, failed


# --- plausible wrong answers ----------------------------------------------------------
# (exercise, what is wrong, code appended to the solution, what the learner must read)
WRONG_ANSWERS = [
    ("01", "rank-0-only reduce", '''
def average_across_ranks(value):
    import torch, torch.distributed as dist
    t = torch.tensor(float(value))
    dist.reduce(t, dst=0)  # only rank 0 gets the sum
    return t.item() / idist.get_world_size()
''', r"rank 1 returned .* average is 2\.5, and every rank must get it"),
    ("01", "sum instead of mean", '''
def average_across_ranks(value):
    return idist.all_reduce(float(value))
''', r"the SUM over the 2 ranks: divide by idist.get_world_size\(\)"),
    ("02", "plain DataLoader: every rank reads everything", '''
def training(local_rank, config):
    loader = torch.utils.data.DataLoader(
        config["dataset"], batch_size=config["batch_size"] // idist.get_world_size(), shuffle=True)
    model = idist.auto_model(make_model())
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))
    trainer = create_supervised_trainer(model, optimizer, nn.CrossEntropyLoss())
    trainer.run(loader, max_epochs=config["epochs"])
    return model, loader
''', r"rank 0 and rank 1 both trained on sample \d+ in epoch 1"),
    ("02", "no auto_model: replicas drift apart", '''
def training(local_rank, config):
    loader = idist.auto_dataloader(config["dataset"], batch_size=config["batch_size"], shuffle=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    trainer = create_supervised_trainer(model, optimizer, nn.CrossEntropyLoss())
    trainer.run(loader, max_epochs=config["epochs"])
    return model, loader
''', r"rank 0 and rank 1 hold different weights .* wrap it with idist.auto_model"),
    ("03", "the same shuffled DataLoader on every rank", '''
def make_train_loader(dataset, global_batch_size, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=global_batch_size // idist.get_world_size(),
                      shuffle=True, generator=g)

def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"rank 0 and rank 1 both trained on sample \d+ in epoch 0"),
    ("03", "a DistributedSampler without set_epoch", '''
def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"same samples in the same order in epochs 0 and 1 .*set_epoch\(epoch\)"),
    ("04", "rank 0 downloads, the others do not wait", '''
def get_dataset(root):
    if idist.get_local_rank() == 0 and not is_downloaded(root):
        download(root)
    return load(root)
''', r"rank 1 read the dataset before the download had finished .*one_rank_first"),
    ("04", "every process downloads", '''
def get_dataset(root):
    if not is_downloaded(root):
        download(root)
    return load(root)
''', r"2 processes downloaded the dataset \(rank 0 and rank 1\)"
     r"|rank [01] read the dataset before the download had finished"),  # who wins varies
    ("05", "a Timer that also counts data loading", '''
def attach_step_timer(trainer):
    timer = Timer(average=True)
    timer.attach(trainer, start=Events.EPOCH_STARTED, step=Events.ITERATION_COMPLETED)
    return timer
''', r"your timer says .* (it also counts fetching the batch|looks like a total)"),
    ("05", "each rank keeps its own time", '''
def slowest_rank(seconds):
    return seconds
''', r"rank 0 returned 0\.25 \(its own time.* the largest, 0\.75"),
    ("06", "no linear scaling", '''
def create_lr_scheduler(optimizer, base_lr, warmup_iters, total_iters):
    return PiecewiseLinear(optimizer, "lr", [(0, 0.0), (warmup_iters, base_lr), (total_iters, 0.0)])
''', r"with 2 processes the highest learning rate is 0\.1, the unscaled base_lr"),
    ("06", "no warm-up", '''
def create_lr_scheduler(optimizer, base_lr, warmup_iters, total_iters):
    peak = base_lr * idist.get_world_size()
    return PiecewiseLinear(optimizer, "lr", [(0, peak), (total_iters, 0.0)])
''', r"the first iteration already used lr 0\.\d+: warm up linearly from 0"),
    ("07", "only rank 0 loads the checkpoint", '''
def resume(trainer, model, optimizer, checkpoint_file):
    if idist.get_rank() == 0:
        Checkpoint.load_objects({"trainer": trainer, "model": model, "optimizer": optimizer},
                                read_checkpoint(checkpoint_file))
''', r"after resume rank 0 at iteration 6 .* rank 1 at iteration 0 .* EVERY rank must load"),
    ("07", "the optimizer is not saved", '''
def attach_checkpointing(trainer, model, optimizer, dirname):
    checkpoint = Checkpoint({"trainer": trainer, "model": model},
                            DiskSaver(dirname, require_empty=False), n_saved=2)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, checkpoint)
    return checkpoint

def resume(trainer, model, optimizer, checkpoint_file):
    Checkpoint.load_objects({"trainer": trainer, "model": model}, read_checkpoint(checkpoint_file))
''', r"the optimizer has lost its momentum"),
    ("08", "no no_sync: one exchange per micro-batch", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()
''', r"DDP exchanged the gradients 4 times per step for 4 micro-batches"),
    ("08", "the micro-batch losses are not scaled", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            loss_fn(model(x), y).backward()
    optimizer.step()
''', r"The update is 4\.0x too large: divide each micro-batch's loss by the number of "
     r"micro-batches \(4\)"),
    ("09", "the micro-batch losses are not scaled", None,  # built from the solution below
     r"They are 4\.00x too large: divide each micro-batch's loss"),
    ("09", "stage 0 never backpropagates", None,
     r"stage 0's parameters have no gradient: rank 0 must call out.backward\(grad\)"),
]


def wrong_source(number: str, name: str, code: str | None) -> str:
    solution = next(SOLUTIONS.glob(f"{number}_*.py")).read_text()
    if code is not None:
        return solution + "\n\n# --- a plausible wrong answer: " + name + "\n" + code
    # For the pipeline, edit one line of the solution (and insist that the line exists).
    edits = {"the micro-batch losses are not scaled": (
                 "loss = F.cross_entropy(stage(a), y) / n", "loss = F.cross_entropy(stage(a), y)"),
             "stage 0 never backpropagates": ("            out.backward(grad)\n", "")}
    old, new = edits[name]
    assert solution.count(old) == 1, \
        f"the solution of {number} changed: update the wrong answer {name!r}"
    return solution.replace(old, new)


@pytest.fixture(scope="module")
def wrong_answer_results(tmp_path_factory):
    """Grade the wrong answers in rounds (one file per exercise and round), one pytest
    subprocess per round; returns ``{(number, name): [(test id, outcome, message)]}``."""
    rounds, seen = {}, {}
    for number, name, code, _ in WRONG_ANSWERS:
        index = seen.get(number, 0)  # the k-th wrong answer of an exercise goes to round k
        seen[number] = index + 1
        rounds.setdefault(index, []).append((number, name))
        folder = tmp_path_factory.getbasetemp() / f"wrong-round-{index}"
        folder.mkdir(exist_ok=True)
        filename = next(SOLUTIONS.glob(f"{number}_*.py")).name
        (folder / filename).write_text(wrong_source(number, name, code))
    graded = {}
    for index, members in rounds.items():
        folder = tmp_path_factory.getbasetemp() / f"wrong-round-{index}"
        numbers = sorted({n for n, _ in members})
        marker = " or ".join(f"ex{n}" for n in numbers)
        grouped = by_exercise(run_checks(folder, str(folder), "-m", marker))
        for number, name in members:
            graded[(number, name)] = grouped.get(number, [])
    return graded


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("number,name,expected", [(n, w, e) for n, w, _, e in WRONG_ANSWERS],
                         ids=[f"{n}-{w}" for n, w, _, _ in WRONG_ANSWERS])
def test_wrong_answer_is_rejected_with_the_learners_message(wrong_answer_results, number, name,
                                                            expected):
    tests = wrong_answer_results[(number, name)]
    assert tests, f"exercise {number}: no check ran for the wrong answer {name!r}"
    failures = [message for _, outcome, message in tests if outcome == "failed"]
    assert failures, f"exercise {number}: the wrong answer {name!r} passed every check"
    assert any(re.search(expected, m, flags=re.S) for m in failures), \
        f"exercise {number}, {name!r}: expected /{expected}/, the learner read:\n" \
        + "\n---\n".join(failures)
    assert not any("not solved yet" in m for m in failures)


def test_every_exercise_has_wrong_answers():
    assert sorted({n for n, *_ in WRONG_ANSWERS}) == NUMBERS


# --- one command per exercise, and distkit check ----------------------------------------

def distkit(capfd, *args) -> tuple:
    """``distkit ARGS`` through the real CLI entry point; returns (exit code, out, err)."""
    from distkit.commands import main

    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_distkit_check_runs_one_exercise_and_shows_hints(capfd, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    code, out, _ = distkit(capfd, "check", "06", "--solutions")  # = pytest exercises -m ex06
    assert code == 0 and re.search(r"2 passed, \d+ deselected", out), out[-3000:]
    code, out, _ = distkit(capfd, "check", "6")
    assert code == 1 and "exercise 06 is not solved yet" in out and "2 failed" in out, out[-3000:]
    code, out, _ = distkit(capfd, "check", "06", "--hint")
    assert code == 0 and out.startswith("## 06") and "## 07" not in out
    code, out, _ = distkit(capfd, "check", "06", "--solution")
    assert code == 0 and "def create_lr_scheduler" in out and "NotImplementedError" not in out
    code, out, err = distkit(capfd, "check", "42")
    assert code == 1 and err.count("\n") == 1 and "no exercise '42': choose one of 01" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_checks_also_run_with_spawn(tmp_path):
    """macOS and Windows start processes with spawn: every function a rank runs must be
    importable there."""
    results = run_checks(tmp_path, "solutions", "-m", "ex01", env={"DISTKIT_START_METHOD": "spawn"})
    assert results and all(o == "passed" for o, _ in results.values()), results
