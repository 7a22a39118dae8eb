"""The exercises, checked both ways (as rustlings does): every untouched stub fails its
check for the right reason (``NotImplementedError``, not an import error), every
solution passes, and for every exercise plausible wrong answers are rejected with the
sentence a learner reads.

The checks run as ``pytest exercises`` subprocesses (they live under ``exercises/`` with
their own ``pytest.ini``), choosing the graded files with ``DISTKIT_EXERCISES``. A wrong
answer is the solution with a few lines substituted, or with a function redefined at its
end (a later ``def`` wins). The wrong answers are graded in rounds, one pytest subprocess
per round with one file per exercise, so each round's process launches serve up to nine
exercises; the checks themselves start real gloo processes.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support import REPO_ROOT, subprocess_env

EXERCISES = REPO_ROOT / "exercises"
SOLUTIONS = EXERCISES / "solutions"
STUBS = sorted(EXERCISES.glob("[0-9][0-9]_*.py"))
NUMBERS = [p.name[:2] for p in STUBS]
ALL = " or ".join(f"ex{n}" for n in NUMBERS)  # the -m marker that selects every exercise


def run_checks(tmp_path: Path, graded: str, *args: str, env=None) -> dict:
    """Run the exercise checks in a subprocess; return ``{test id: (outcome, message)}``
    with outcome ``passed``, ``failed``, ``error`` or ``skipped``."""
    junit = tmp_path / f"junit-{len(list(tmp_path.glob('junit-*')))}.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "exercises", "-p", "no:cacheprovider", "-q",
         f"--junitxml={junit}", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
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
    grouped = by_exercise(run_checks(tmp_path, "stubs", "-m", ALL))
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
    results = run_checks(tmp_path, "solutions", "-m", ALL)
    assert sorted(by_exercise(results)) == NUMBERS
    failed = {t: m[:2000] for t, (o, m) in results.items() if o != "passed"}
    assert not failed, failed


# --- plausible wrong answers ----------------------------------------------------------
# (exercise, what the learner did, the change to the solution, what the learner must read)
# A change is either code appended to the solution (a later ``def`` wins) or a list of
# (old, new) text substitutions, each of which must match the solution exactly once, so a
# wrong answer cannot silently stop being wrong when a solution is edited.
WRONG_ANSWERS = [
    # 01 collectives
    ("01", "reduce to rank 0 only", '''
def average_across_ranks(value):
    import torch, torch.distributed as dist
    t = torch.tensor(float(value))
    if dist.is_available() and dist.is_initialized():
        dist.reduce(t, dst=0)  # only rank 0 gets the sum
    return t.item() / idist.get_world_size()
''', r"rank 0 got the average 2\.5, but rank 1 returned .*the result must reach EVERY rank, "
     r"so use all_reduce, not reduce"),
    ("01", "the sum, not the mean", [("return total / idist.get_world_size()", "return total")],
     r"the SUM over the 2 ranks: divide by idist.get_world_size\(\)"),
    ("01", "a hard-coded divisor of 2", [("total / idist.get_world_size()", "total / 2")],
     r"with a single process .* divided by 2, but this run has 1 process: the divisor must be "
     r"the world size, idist.get_world_size\(\), not a fixed number"),
    ("01", "a tensor returned", [("idist.all_reduce(float(value))",
                                  "idist.all_reduce(torch.tensor(float(value)))"),
                                 ("import ignite.distributed as idist",
                                  "import ignite.distributed as idist\nimport torch")],
     r"returned a tensor \(tensor\(.*\)\), not a Python float: .*tensor.item\(\)"),
    ("01", "its own value, nothing combined",
     [("return total / idist.get_world_size()", "return float(value)")],
     r"rank 0 returned 1\.0, its own value: nothing was combined across ranks"),
    ("01", "divided by the processes of one node",
     [("total / idist.get_world_size()", "total / idist.get_nproc_per_node()")],
     r"on 2 nodes of 2 processes each \(world size 4\): rank 0 returned 8\.0, the sum 16\.0 "
     r"divided by 2, the processes of ONE node \(idist.get_nproc_per_node\(\)\)"),
    ("01", "only rank 0 divides", [("    return total / idist.get_world_size()",
                                   "    if idist.get_rank() == 0:\n"
                                   "        return total / idist.get_world_size()\n"
                                   "    return total")],
     r"rank 0 got the average 2\.5, but rank 1 returned 5\.0, the SUM: only some ranks divided"),
    ("01", "rank 0's value broadcast", [("idist.all_reduce(float(value))",
                                         "idist.broadcast(float(value), src=0)")],
     r"rank 0 returned 0\.5: a broadcast copies ONE rank's value to every rank; all_reduce sums "
     r"them"),
    ("01", "all_reduce with op MAX", [("idist.all_reduce(float(value))",
                                       'idist.all_reduce(float(value), op="MAX")')],
     r"every rank returned 2\.0, the LARGEST of the values \(4\.0\) divided by 2: the all_reduce "
     r"combined them with op='MAX'; an average needs their SUM"),
    ("01", "all_reduce with op MIN, not divided",
     [("idist.all_reduce(float(value))", 'idist.all_reduce(float(value), op="MIN")'),
      ("return total / idist.get_world_size()", "return total")],
     r"every rank returned 1\.0, the SMALLEST of the values \(1\.0\): the all_reduce combined "
     r"them with op='MIN'"),
    ("01", "only rank 0 runs the all_reduce",
     [("    total = idist.all_reduce(float(value))\n",
       "    if idist.get_rank() != 0:\n        return float(value)\n"
       "    total = idist.all_reduce(float(value))\n")],
     r"rank 0 was still waiting in a collective when rank 1 (and rank 2 and rank 3 )?had already "
     r"finished: every rank must call the same collectives.*File .*01_collectives.py\", line \d+, "
     r"in average_across_ranks"),
    # 02 training function
    ("02", "a plain DataLoader: every rank reads everything", [(
        'idist.auto_dataloader(\n        config["dataset"], batch_size=config["batch_size"], '
        'shuffle=True)',
        'torch.utils.data.DataLoader(\n        config["dataset"], '
        'batch_size=config["batch_size"] // idist.get_world_size(), shuffle=True)')],
     r"rank 0 and rank 1 both trained on sample \d+ in epoch 1 .*idist.auto_dataloader"),
    ("02", "no auto_model: the replicas drift apart",
     [("model = idist.auto_model(make_model())", "model = make_model()")],
     r"rank 0 and rank 1 hold different weights .* wrap it with idist.auto_model"),
    ("02", "no set_epoch: every epoch in the same order",
     [("            train_loader.sampler.set_epoch(engine.state.epoch - 1)\n",
       "            pass\n")],
     r"rank 0 read the same samples in the same order in epochs 1 and 2 .*ignite's Engine "
     r"never tells it the epoch.*calls the sampler's set_epoch with the epoch, counted from 0"),
    ("02", "the batch size divided by hand",
     [('batch_size=config["batch_size"], shuffle=True',
       'batch_size=config["batch_size"] // idist.get_world_size(), shuffle=True')],
     r"rank 0's loader takes 4 samples per step, but a GLOBAL batch of 16 over 2 processes is 8 "
     r"each: pass the global batch size to idist.auto_dataloader"),
    ("02", "no auto_optim", [(
        'idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))',
        'torch.optim.SGD(model.parameters(), lr=config["lr"])')],
     r"rank 0 never called idist.auto_optim"),
    ("02", "auto_optim's result dropped", [(
        'optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))',
        'optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])\n'
        '    idist.auto_optim(optimizer)')],
     r"on rank 0 the optimizer that stepped is the one you passed to idist.auto_optim, not the "
     r"one it returned"),
    ("02", "another optimizer given to the trainer", [(
        "        model, optimizer, nn.CrossEntropyLoss()",
        '        model, torch.optim.SGD(model.parameters(), lr=config["lr"]), nn.CrossEntropyLoss()')],
     r"on rank 0 the optimizer idist.auto_optim returned never stepped"),
    ("02", "a sampler that never shuffles", [(
        'batch_size=config["batch_size"], shuffle=True)',
        'batch_size=config["batch_size"], shuffle=False)')],
     r"rank 0 read the same samples in the same order in epochs 1 and 2 .*although set_epoch was "
     r"called: the sampler never shuffles. Pass shuffle=True"),
    ("02", "the batch size multiplied by the world size",
     [('batch_size=config["batch_size"], shuffle=True',
       'batch_size=config["batch_size"] * idist.get_world_size(), shuffle=True')],
     r"rank 0's loader takes 16 samples per step, but a GLOBAL batch of 16 over 2 processes is 8 "
     r"each"),
    ("02", "auto_optim applied after the trainer was built", [
        ('optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))',
         'optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])'),
        ("    trainer = create_supervised_trainer(\n        model, optimizer, nn.CrossEntropyLoss(), device=idist.device())\n",
         "    trainer = create_supervised_trainer(\n        model, optimizer, nn.CrossEntropyLoss(), device=idist.device())\n"
         "    optimizer = idist.auto_optim(optimizer)\n")],
     r"on rank 0 the optimizer that stepped is the one you passed to idist.auto_optim, not the "
     r"one it returned"),
    ("02", "auto_optim wraps a second optimizer", [(
        'optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))',
        'optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])\n'
        '    idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))')],
     r"on rank 0 the optimizer idist.auto_optim returned never stepped"),
    ("02", "the learning rate scaled by the world size (exercise 06's rule)",
     [('torch.optim.SGD(model.parameters(), lr=config["lr"])',
       'torch.optim.SGD(model.parameters(), lr=config["lr"] * idist.get_world_size())')],
     r"after ONE step of training on 2 processes .*rank 0's step is 2x the one plain SGD takes "
     r"on the whole batch in one process: you scaled the learning rate by the world size"),
    ("02", "the loss summed over the batch", [(
        "model, optimizer, nn.CrossEntropyLoss()", 'model, optimizer, nn.CrossEntropyLoss(reduction="sum")')],
     r"rank 0's step is 8x the one plain SGD takes on the whole batch in one process: the loss "
     r"is SUMMED over the 8 samples of each rank's batch"),
    ("02", "torch.distributed's barrier at the start (raises with no process group)",
     [('    model = idist.auto_model(make_model())', '    torch.distributed.barrier()\n    model = idist.auto_model(make_model())')],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    # 03 sharding
    ("03", "the same shuffled DataLoader on every rank", '''
def make_train_loader(dataset, global_batch_size, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=global_batch_size // idist.get_world_size(),
                      shuffle=True, generator=g)

def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"rank 0 and rank 1 both trained on sample \d+ in epoch 0"),
    ("03", "a DistributedSampler without set_epoch",
     [("    loader.sampler.set_epoch(epoch)\n", "")],
     r"same samples in the same order in epochs 0 and 1 .*call the sampler's set_epoch with the epoch before each epoch"),
    ("03", "a different seed on each rank",
     [("shuffle=True, seed=seed)", "shuffle=True, seed=seed + idist.get_rank())")],
     r"(both trained on sample|no rank trained on sample).*the same seed on every rank"),
    ("03", "the seed ignored", [("shuffle=True, seed=seed)", "shuffle=True, seed=0)")],
     r"seed=0\) and make_train_loader\(\.\.\., seed=1\) gave rank 0 the same order.*pass seed "
     r"to the DistributedSampler"),
    ("03", "the GLOBAL batch on every rank",
     [("batch_size=global_batch_size // world_size", "batch_size=global_batch_size")],
     r"rank 0 got batches of 4 samples, but a GLOBAL batch of 4 over 2 processes is 2"),
    ("03", "num_replicas from the processes of one node",
     [("num_replicas=world_size, rank", "num_replicas=idist.get_nproc_per_node(), rank")],
     r"on 2 nodes of 2 processes each .*rank 2's make_train_loader raised ValueError: .*"
     r"num_replicas = the WORLD size, idist.get_world_size\(\) \(4\), not the processes of one "
     r"node, idist.get_nproc_per_node\(\) \(2\)"),
    ("03", "the local rank for the shard", [("rank=idist.get_rank()", "rank=idist.get_local_rank()")],
     r"rank 0 \(node 0\) and rank 2 \(node 1\) read the same samples in epoch 0 .*both have local "
     r"rank 0: the shard must follow the GLOBAL rank, idist.get_rank\(\), not "
     r"idist.get_local_rank\(\)"),
    ("03", "the batch divided by the processes of one node",
     [("    world_size = idist.get_world_size()\n",
       "    world_size = idist.get_world_size()\n    per_node = idist.get_nproc_per_node()\n"),
      ("batch_size=global_batch_size // world_size", "batch_size=global_batch_size // per_node")],
     r"rank 0 got batches of 4 samples: the GLOBAL batch of 8 divided by 2, not by the world size 4 \(2 is "
     r"the number of processes of ONE node, idist.get_nproc_per_node\(\)"),
    ("03", "a fixed strided Subset, shuffled by the loader", '''
def make_train_loader(dataset, global_batch_size, seed=0):
    import torch
    world_size, rank = idist.get_world_size(), idist.get_rank()
    mine = torch.utils.data.Subset(dataset, list(range(rank, len(dataset), world_size)))
    g = torch.Generator().manual_seed(seed)
    return DataLoader(mine, batch_size=global_batch_size // world_size, shuffle=True, generator=g)

def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"rank 0 read the same SET of samples in every epoch \(only their order changed\): its "
     r"shard is fixed"),
    ("03", "a contiguous block per rank, shuffled by the loader", '''
def make_train_loader(dataset, global_batch_size, seed=0):
    import torch
    world_size, rank = idist.get_world_size(), idist.get_rank()
    per_rank = len(dataset) // world_size
    mine = torch.utils.data.Subset(dataset, list(range(rank * per_rank, (rank + 1) * per_rank)))
    g = torch.Generator().manual_seed(seed)
    return DataLoader(mine, batch_size=global_batch_size // world_size, shuffle=True, generator=g)

def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"rank 0 read the same SET of samples in every epoch \(only their order changed\)"),
    ("03", "one permutation dealt out once, reshuffled within each shard", '''
def make_train_loader(dataset, global_batch_size, seed=0):
    import torch
    world_size, rank = idist.get_world_size(), idist.get_rank()
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    sampler = torch.utils.data.SubsetRandomSampler(order[rank::world_size],
                                                   generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)

def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"rank 0 read the same SET of samples in every epoch \(only their order changed\): its "
     r"shard is fixed"),
    ("03", "a DistributedSampler's shard taken once, shuffled by the loader", '''
def make_train_loader(dataset, global_batch_size, seed=0):
    import torch
    world_size = idist.get_world_size()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=idist.get_rank(),
                                 shuffle=True, seed=seed)
    mine = torch.utils.data.Subset(dataset, list(sampler))  # epoch 0's shard, for good
    g = torch.Generator().manual_seed(seed)
    return DataLoader(mine, batch_size=global_batch_size // world_size, shuffle=True, generator=g)

def epoch_indices(loader, epoch):
    return [int(i) for _, _, index in loader for i in index]
''', r"rank 0 read the same SET of samples in every epoch \(only their order changed\): its "
     r"shard is fixed"),
    ("03", "a DistributedSampler that never shuffles",
     [("shuffle=True, seed=seed)", "shuffle=False, seed=seed)")],
     r"rank 0 read its samples in sorted order \(0, 2, 4, 6, 8 .*\): shuffle them "
     r"\(DistributedSampler\(\.\.\., shuffle=True, seed=seed\)\)"),
    # 03, layouts and a dataset that does not divide
    ("03", "DistributedSampler's defaults (raises with no process group)",
     [("DistributedSampler(dataset, num_replicas=world_size, rank=idist.get_rank(),\n", "DistributedSampler(dataset,\n")],
     r"on 1 process \(no process group\): rank 0 raised (ValueError|RuntimeError): Default process group has not "
     r"been initialized"),
    ("03", "the last samples dropped (drop_last=True)",
     [("shuffle=True, seed=seed)", "shuffle=True, seed=seed, drop_last=True)")],
     r"on 3 processes, rank 0, 22 samples \(not a multiple of the world size\): the indices read in epoch 0 should "
     r"have 8 items, got 7"),
    # 04 safe download
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
''', r"2 processes downloaded the dataset at the same time \(rank 0 and rank 1\)"
     r"|rank [01] read the dataset before the download had finished"),  # who wins varies
    ("04", "one_rank_first, but every process downloads in turn",
     [("        if not is_downloaded(root):\n            download(root)\n",
       "        download(root)\n")],
     r"rank 0 and then rank 1 downloaded the dataset, one after the other: .*only when "
     r"is_downloaded\(root\) is False"),
    ("04", "a download on every call", '''
def get_dataset(root):
    with idist.one_rank_first(local=True):
        if idist.get_local_rank() == 0:
            download(root)
    return load(root)
''', r"the second call downloaded the dataset again \(rank 0\)"),
    ("04", "a barrier that only the downloading rank reaches", '''
def get_dataset(root):
    if idist.get_local_rank() == 0:
        if not is_downloaded(root):
            download(root)
        idist.barrier()
    return load(root)
''', r"^(Failed: )?on 2 processes: rank 0 (was still waiting in a collective when rank 1 had already finished: "
     r"every rank must call the same collectives, in the same order. A barrier or all_reduce that only some "
     r"ranks reach|waited.* in a collective or a point-to-point transfer that no other rank matched).*File "
     r".*04_safe_download.py\", line \d+, in get_dataset\n\s+idist.barrier\(\)"),
    # 04, layouts: each node has its own folder on 2 x 2
    ("04", "one_rank_first for the whole run (right on one node, wrong with a disk per node)",
     [("with idist.one_rank_first(local=True):", "with idist.one_rank_first():")],
     r"on 2 nodes x 2 processes, node 1 \(ranks 2\.\.3, its own folder\): (2 processes downloaded the dataset at the "
     r"same time \(rank 2 and rank 3\).*idist.one_rank_first\(\) without local=True|rank [23] read the dataset)"),
    ("04", "only rank 0 of the whole run downloads (right on one node)",
     [("        if not is_downloaded(root):\n", "        if idist.get_rank() == 0 and not is_downloaded(root):\n")],
     r"on 2 nodes x 2 processes, node 1 \(ranks 2\.\.3, its own folder\): nobody downloaded the dataset into this "
     r"node's folder, and rank 2 found none .*once PER NODE"),
    ("04", "torch.distributed's barrier (raises with no process group)", """
def get_dataset(root):
    import torch.distributed as dist
    if idist.get_local_rank() == 0 and not is_downloaded(root):
        download(root)
    dist.barrier()
    return load(root)
""", r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("04", "the bytes returned as a list", [("    return load(root)", "    return list(load(root))")],
     r"on 2 processes: rank 0 returned a list of 16384, not the dataset \(a uint8 tensor of shape \(16384,\)\): "
     r"return load\(root\)"),
    # 05 step timer
    ("05", "a Timer that also counts fetching the batch",
     [("resume=Events.ITERATION_STARTED", "resume=Events.GET_BATCH_STARTED")],
     r"your timer says .* it also counts fetching the batch"),
    ("05", "a total, not an average", [("Timer(average=True)", "Timer()")],
     r"your timer says .* looks like a total"),
    ("05", "a Timer paused only when the next batch is fetched",
     [("pause=Events.ITERATION_COMPLETED", "pause=Events.GET_BATCH_STARTED")],
     r"your timer says .* it also counts time outside the step, the other handlers'"),
    ("05", "each rank keeps its own time", [('return idist.all_reduce(float(seconds), op="MAX")',
                                            'return float(seconds)')],
     r"rank 1 returned 0\.25 \(its own time: nothing was combined across ranks, no collective ran"),
    ("05", "the sum of the times", [(', op="MAX")', ")")],
     r"rank 0 returned 1\.0 \(the SUM: all_reduce adds by default; ask for op='MAX'\)"),
    ("05", "a tensor returned", [('idist.all_reduce(float(seconds), op="MAX")',
                                 'idist.all_reduce(torch.tensor(float(seconds)), op="MAX")'),
                                ("import ignite.distributed as idist",
                                 "import ignite.distributed as idist\nimport torch")],
     r"rank 0 returned a tensor \(tensor\(0\.7500\)\), not a Python float: .*\.item\(\)"),
    ("05", "the old reference: a Timer that runs from EPOCH_STARTED",
     [("    trainer.add_event_handler(Events.EPOCH_STARTED, timer.pause)\n", "")],
     r"it also counts the first batch fetch of each epoch .*A Timer RUNS from its start event on"),
    ("05", "started once at STARTED and never paused", [
        ("start=Events.EPOCH_STARTED, resume", "start=Events.STARTED, resume"),
        ("    trainer.add_event_handler(Events.EPOCH_STARTED, timer.pause)\n", "")],
     r"it also counts the first batch fetch of the first epoch .*Pause it right after it starts"),
    ("05", "a timer that keeps only the last step", '''
def attach_step_timer(trainer):
    timer = Timer()
    timer.attach(trainer, start=Events.ITERATION_STARTED, pause=Events.ITERATION_COMPLETED)
    return timer
''', r"that is the LAST step's time, not the average over the steps"),
    ("05", "a reduce to rank 0", '''
def slowest_rank(seconds):
    import torch, torch.distributed as dist
    t = torch.tensor(float(seconds))
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    return t.item()
''', r"rank 1 returned 0\.25: reduce leaves the result on one rank only; use all_reduce"),
    ("05", "the smallest time", [('op="MAX"', 'op="MIN"')],
     r"rank 0 returned 0\.25, the SMALLEST time \(every rank got it\).*not 'MIN'"),
    ("05", "the mean of the times", [('return idist.all_reduce(float(seconds), op="MAX")',
                                     "return idist.all_reduce(float(seconds)) / idist.get_world_size()")],
     r"rank 0 returned 0\.5 \(the MEAN of the ranks' times"),
    ("05", "rank 0's time broadcast", [('return idist.all_reduce(float(seconds), op="MAX")',
                                       "return idist.broadcast(float(seconds), src=0)")],
     r"rank 0 returned 0\.25, the time of the rank that broadcast it: a broadcast copies ONE "
     r"rank's value"),
    ("05", "torch.distributed's all_reduce (raises with no process group)", [(
        'return idist.all_reduce(float(seconds), op="MAX")',
        'import torch\n    t = torch.tensor(float(seconds))\n    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)\n'
        '    return t.item()')],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("05", "the largest of the first two ranks only (right on 2 processes)", [(
        'return idist.all_reduce(float(seconds), op="MAX")',
        'values = idist.all_gather(float(seconds))\n    return max(values[:2])')],
     r"on 3 processes: rank \d got the largest time|on 3 processes: rank 0 returned [0-9.]+, but the ranks' step times are"),
    # 06 learning-rate scaling
    ("06", "no linear scaling", [("peak = base_lr * idist.get_world_size()", "peak = base_lr")],
     r"with 2 processes the highest learning rate is 0\.1, the unscaled base_lr"),
    ("06", "no warm-up", [("        (0, 0.0), ", "        (0, peak), ")],
     r"the first iteration already used lr 0\.\d+: warm up linearly from 0"),
    ("06", "the world size hard-coded", [("base_lr * idist.get_world_size()", "base_lr * 2")],
     r"with 1 process the highest learning rate is 0\.2, base_lr x 2: .*idist.get_world_size\(\)"),
    ("06", "no decay", [("(total_iters, 0.0),", "(total_iters, peak),")],
     r"the learning rate at step 5 is 0\.2, expected 0\.175 \(linear decay to 0 at step "
     r"total_iters\)"),
    ("06", "scaled by the processes of one node",
     [("peak = base_lr * idist.get_world_size()", "peak = base_lr * idist.get_nproc_per_node()")],
     r"on 2 nodes of 2 processes each \(world size 4\), rank 0's highest learning rate is 0\.2, "
     r"base_lr x 2: that counts the processes of ONE node \(idist.get_nproc_per_node\(\)\)"),
    ("06", "scaled by the number of nodes",
     [("peak = base_lr * idist.get_world_size()", "peak = base_lr * idist.get_nnodes()")],
     r"on 2 nodes of 2 processes each \(world size 4\), rank 0's highest learning rate is 0\.2, "
     r"base_lr x 2: .*or the nodes \(idist.get_nnodes\(\)\)"),
    # 07 checkpoints
    ("07", "only rank 0 loads the checkpoint", '''
def resume(trainer, model, optimizer, checkpoint_file):
    if idist.get_rank() == 0:
        Checkpoint.load_objects(_objects(trainer, model, optimizer),
                                read_checkpoint(checkpoint_file))
''', r"after resume rank 0 at iteration 7 .* rank 1 at iteration 0 .* EVERY rank must load"),
    ("07", "the optimizer is not saved", '''
def _objects(trainer, model, optimizer):
    return {"trainer": trainer, "model": model}
''', r"the optimizer has lost its momentum"),
    ("07", "how many files to keep ignored", [("        n_saved=2,\n", "")],
     r"1 checkpoint file in the folder after 7 iterations .*keep the last 2 \(n_saved=2\)"),
    ("07", "a folder that must be empty", [("require_empty=False, ", "")],
     r"attach_checkpointing raised .*already present.* the folder may already hold "
     r"checkpoints: DiskSaver\(dirname, require_empty=False\)"),
    ("07", "a checkpoint per epoch", [("Events.ITERATION_COMPLETED, checkpoint",
                                      "Events.EPOCH_COMPLETED, checkpoint")],
     r"resumed from iteration 4: save after EVERY iteration"),
    ("07", "only rank 0 creates the Checkpoint", '''
_attach = attach_checkpointing

def attach_checkpointing(trainer, model, optimizer, dirname):
    if idist.get_rank() == 0:
        return _attach(trainer, model, optimizer, dirname)
''', r"on rank 1 attach_checkpointing returned NoneType: create the ignite.handlers.Checkpoint "
     r"on EVERY rank"),
    ("07", "a global_step_transform with one argument",
     [("lambda engine, _: engine.state.iteration", "lambda engine: engine.state.iteration")],
     r"rank 0 raised TypeError: .*takes 1 positional argument but 2 were given\n"
     r"no line of your file was running: it was raised in ignite/handlers/checkpoint\.py:\d+"),
    ("07", "a checkpoint every 2 iterations",
     [("Events.ITERATION_COMPLETED, checkpoint", "Events.ITERATION_COMPLETED(every=2), checkpoint")],
     r"the run stopped after iteration 7, but its newest checkpoint holds iteration 6.*save "
     r"after EVERY iteration"),
    ("07", "a checkpoint when the iteration starts",
     [("Events.ITERATION_COMPLETED, checkpoint", "Events.ITERATION_STARTED, checkpoint")],
     r"the checkpoint that says iteration 7 holds the weights from BEFORE iteration 7's step "
     r"\(those after iteration 6\): it was saved when the iteration started"),
    ("07", "a checkpoint when the run completes",
     [("Events.ITERATION_COMPLETED, checkpoint", "Events.COMPLETED, checkpoint")],
     r"when iteration 7 ended there was no checkpoint yet: .*written only when the run ended "
     r"\(Events.COMPLETED or TERMINATE\), which a crash never reaches"),
    ("07", "every rank writes the checkpoint files",
     [("DiskSaver(dirname, require_empty=False, atomic=True)",
       "DiskSaver(dirname, require_empty=False, atomic=True, save_on_rank=idist.get_rank())")],
     r"rank [01] raised File(NotFound|Exists)Error while the Checkpoint saved or removed a file .*more than "
     r"one rank writes the same checkpoint files"),
    ("07", "only the model is loaded", '''
def resume(trainer, model, optimizer, checkpoint_file):
    Checkpoint.load_objects({"model": model}, read_checkpoint(checkpoint_file))
''', r"after resume the trainer starts again at iteration 0, but the run stopped after "
     r"iteration 7: save and load the trainer too"),
    ("07", "the state dicts loaded by hand into the DDP model", '''
def resume(trainer, model, optimizer, checkpoint_file):
    state = read_checkpoint(checkpoint_file)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    trainer.load_state_dict(state["trainer"])
''', r"rank [01] raised RuntimeError: Error\(s\) in loading state_dict for DistributedDataParallel:"
     r"\n\s+Missing key\(s\) in state_dict: \"module\.1\.weight\""),
    # 08 gradient accumulation
    ("08", "no no_sync: one exchange per micro-batch",
     [('        if last or not hasattr(model, "no_sync"):', "        if True:")],
     r"on 2 processes, rank 0, 4 micro-batches per process: DDP exchanged the gradients 4 times per call for 4 "
     r"micro-batches: run the forward and backward of all but the last micro-batch inside `with model.no_sync\(\):`"),
    ("08", "the micro-batch losses are not scaled",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x), y)")],
     r"The update is 4x too large: you did not divide each micro-batch's loss by the number of "
     r"micro-batches \(4\)"),
    ("08", "the loss divided by the world size too",
     [("loss = loss_fn(model(x), y) / n",
       "loss = loss_fn(model(x), y) / (n * idist.get_world_size())")],
     r"on 2 processes, .*too small by the number of processes \(2\): you divided the loss by the "
     r"world size too, but DDP already AVERAGES"),
    ("08", "a step after every micro-batch",
     [("            loss.backward()\n",
       "            loss.backward()\n            optimizer.step()\n")],
     r"optimizer.step\(\) ran 5 times in one call of accumulation_step"),
    ("08", "the gradients are never zeroed", [("    optimizer.zero_grad()\n", "")],
     r"The first step was right, the second .*the previous step's gradients were added in: "
     r"call optimizer.zero_grad\(\) at the start"),
    ("08", "no_sync on a plain model",
     [('if last or not hasattr(model, "no_sync"):', "if last:")],
     r"on 1 process \(no process group\): rank 0, with a plain model \(4 micro-batches\): it has no "
     r"no_sync\(\).*hasattr\(model, \"no_sync\"\)"),
    ("08", "every backward inside no_sync: never exchanged",
     [('        if last or not hasattr(model, "no_sync"):',
       '        if not hasattr(model, "no_sync"):')],
     r"on 2 processes, 4 micro-batches per process: after the steps, rank 1 and rank 0 hold different "
     r"weights .*the gradients were never exchanged"),
    ("08", "every backward inside no_sync, then an all_reduce per parameter", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    context = model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
    with context:
        for x, y in micro_batches:
            (loss_fn(model(x), y) / n).backward()
    for p in model.parameters():
        p.grad = idist.all_reduce(p.grad) / idist.get_world_size()
    optimizer.step()
''', r"made 2 torch.distributed call\(s\) of its own in one call of accumulation_step \(all_reduce\) on "
     r"gradient-shaped tensors \(4,\), \(4, 6\), beside DDP's 0 exchange\(s\).*Remove the manual all-reduce"),
    ("08", "torch.distributed.all_reduce per parameter after no_sync", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    import torch.distributed as dist
    optimizer.zero_grad()
    n = len(micro_batches)
    for x, y in micro_batches:
        context = model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
        with context:
            (loss_fn(model(x), y) / n).backward()
    if dist.is_available() and dist.is_initialized():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    optimizer.step()
''', r"made 2 torch.distributed call\(s\) of its own .*\(all_reduce\) on gradient-shaped tensors"),
    ("08", "DDP's exchange and a manual one on top",
     [("    optimizer.step()\n",
       "    for p in model.parameters():\n"
       "        p.grad = idist.all_reduce(p.grad) / idist.get_world_size()\n"
       "    optimizer.step()\n")],
     r"made 2 torch.distributed call\(s\) of its own .*beside DDP's 1 exchange\(s\)"),
    ("08", "one flat all_reduce by hand", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    context = model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
    with context:
        for x, y in micro_batches:
            (loss_fn(model(x), y) / n).backward()
    grads = [p.grad for p in model.parameters()]
    flat = idist.all_reduce(torch.cat([g.reshape(-1) for g in grads])) / idist.get_world_size()
    for g, new in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        g.copy_(new.reshape(g.shape))
    optimizer.step()
''', r"made 1 torch.distributed call\(s\) of its own .*gradient-shaped tensors \(28,\), beside DDP's 0 "
     r"exchange\(s\)"),
    ("08", "every forward first, one backward of the summed losses (right weights, all activations held)", """
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    losses = [loss_fn(model(x), y) / n for x, y in micro_batches]
    sum(losses).backward()
    optimizer.step()
""", r"accumulation_step held the activations of 4 micro-batches at once .*run each micro-batch's backward right "
     r"after its forward"),
    # 09 pipeline
    ("09", "the micro-batch losses are not scaled",
     [("out = F.cross_entropy(out, targets[k]) / n_microbatches", "out = F.cross_entropy(out, targets[k])")],
     r"on 2 processes \(2 stages, one per rank\), 4 micro-batches: stage 0 \(the first stage, rank 0\)'s "
     r"gradients.* They are 4x too large: you did not divide each micro-batch's loss"),
    ("09", "the gradient sent back divided by the micro-batches again",
     [("outputs[k].backward(grad)", "outputs[k].backward(grad / n_microbatches)")],
     r"stage 0 \(the first stage, rank 0\)'s gradients.* They are 1/4 of them: the gradients were "
     r"divided by the number of micro-batches twice"),
    ("09", "stage 0 never backpropagates", [("            outputs[k].backward(grad)\n", "")],
     r"after pipeline_step stage 0 \(the first stage, rank 0\)'s parameters have no gradient: every stage "
     r"but the last calls output.backward\(grad\)"),
    ("09", "no micro-batches: the whole batch at once", """
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    whole = (activation_shape[0] * n_microbatches, *activation_shape[1:])
    if rank == 0:
        x = torch.cat(inputs)
    else:
        x = torch.empty(whole)
        dist.recv(x, src=rank - 1)
        x.requires_grad_()
    out = stage(x)
    if rank == world_size - 1:
        loss = F.cross_entropy(out, torch.cat(targets))
        loss.backward()
    else:
        dist.send(out.detach(), dst=rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, src=rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, dst=rank - 1)
    return loss.item() if rank == world_size - 1 else None
""", r"on 2 processes: stage 0 \(the first stage, rank 0\) with 4 micro-batches sent a tensor of shape \(12, 8\) "
     r"to rank 1, but each micro-batch's activations, and their gradients, have activation_shape \(3, 8\)"),
    ("09", "one micro-batch at a time: the stages never overlap", """
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    total = 0.0
    for k in range(n_microbatches):
        if rank == 0:
            x = inputs[k]
        else:
            x = torch.empty(activation_shape)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        out = stage(x)
        if rank == world_size - 1:
            loss = F.cross_entropy(out, targets[k]) / n_microbatches
            loss.backward()
            total += loss.item()
        else:
            dist.send(out.detach(), dst=rank + 1)
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if rank > 0:
            dist.send(x.grad, dst=rank - 1)
    return total if rank == world_size - 1 else None
""", r"stage 0 \(the first stage, rank 0\) waited for the gradient of micro-batch 1 before it sent micro-batch 2"),
    ("09", "a tensor returned", [("total += out.item()", "total = total + out.detach()")],
     r"stage 1 \(the last stage, rank 1\) returned a float32 tensor of shape \(\), not a Python float: return a "
     r"Python float \(loss.item\(\)\)"),
    ("09", "the gradients paired with the wrong micro-batches", """
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    last = rank == world_size - 1
    received, outputs, sends, total = [], [], [], 0.0
    for k in range(n_microbatches):
        if rank == 0:
            x = inputs[k]
        else:
            x = torch.empty(activation_shape)
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        out = stage(x)
        if last:  # the last stage: forward and backward at once, the gradient straight back
            loss = F.cross_entropy(out, targets[k]) / n_microbatches
            loss.backward()
            total += loss.item()
            if rank > 0:
                sends.append(dist.isend(x.grad, dst=rank - 1))
        else:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
            received.append(x)
            outputs.append(out)
    if not last:  # the backward pass goes the other way: the last micro-batch first
        for x, out in zip(reversed(received), reversed(outputs)):
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
            if rank > 0:
                sends.append(dist.isend(x.grad, dst=rank - 1))
    for request in sends:
        request.wait()
    return total if last else None
""", r"stage 0 \(the first stage, rank 0\)'s gradients.*when micro-batch k's output is backpropagated with "
     r"another micro-batch's gradient"),
    ("09", "rank 1 receives every micro-batch before computing any (right gradients, no overlap)", """
def pipeline_step(stage, inputs, targets, activation_shape, n_microbatches):
    rank, world_size = idist.get_rank(), idist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    if first:
        received = list(inputs)
    else:
        received = []
        for _ in range(n_microbatches):
            x = torch.empty(activation_shape)
            dist.recv(x, src=rank - 1)
            received.append(x.requires_grad_())
    outputs, sends, total = [], [], 0.0
    for k, x in enumerate(received):
        out = stage(x)
        if last:
            out = F.cross_entropy(out, targets[k]) / n_microbatches
            total += out.item()
        else:
            sends.append(dist.isend(out.detach(), dst=rank + 1))
        outputs.append(out)
    for k, out in enumerate(outputs):
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if not first:
            sends.append(dist.isend(received[k].grad, dst=rank - 1))
    for request in sends:
        request.wait()
    return total if last else None
""", r"stage 1 \(the last stage, rank 1\) received all 4 micro-batches before computing on the first: the "
     r"gradients are right, but the stages never work at the same time"),
    # 10 sharded memory
    ("10", "FSDP predicted like DDP", [('shards = world_size if strategy == "fsdp" else 1', "shards = 1")],
     r"under FSDP with 2 ranks you predicted \d+ bytes of params .*that is what DDP keeps; under "
     r"FSDP each of the 2 ranks keeps 1/2"),
    ("10", "DDP divided by the world size too",
     [('shards = world_size if strategy == "fsdp" else 1', "shards = world_size")],
     r"under DDP with 2 ranks .*under DDP every rank keeps the WHOLE model: do not divide"),
    ("10", "one Adam moment", [('"optimizer": 2 * FP32_BYTES', '"optimizer": FP32_BYTES')],
     r"bytes of optimizer per rank.*Adam keeps TWO moments per parameter"),
    ("10", "values, not bytes", '''
def predict_bytes_per_rank(num_params, world_size, strategy):
    shards = world_size if strategy == "fsdp" else 1
    return {"params": num_params // shards, "grads": num_params // shards,
            "optimizer": 2 * num_params // shards}
''', r"you counted values, not bytes: an fp32 value takes 4 bytes"),
    ("10", "FSDP predicted like DDP on 2 ranks only (right on 3 and 4)",
     [('shards = world_size if strategy == "fsdp" else 1',
       'shards = world_size if strategy == "fsdp" and world_size != 2 else 1')],
     r"under FSDP with 2 ranks you predicted \d+ bytes of params .*: params and grads take 4 bytes per "
     r"parameter each"),
    ("10", "a fixed 2 for the world size",
     [('shards = world_size if strategy == "fsdp" else 1', 'shards = 2 if strategy == "fsdp" else 1')],
     r"with 4 ranks under FSDP you predicted .*divide by world_size, not by a fixed number"),
    ("10", "only the root sharded",
     [("            fully_shard(layer)  # one unit per layer: only one layer's full weight at a time\n",
       "            pass\n")],
     r"only 0 of the 3 nn.Linear layers are FSDP units of their own"),
    ("10", "the root sharded before its layers",
     [("    for layer in model.modules():", "    fully_shard(model)\n    for layer in model.modules():"),
      ("    fully_shard(model)  # the root\n", "")],
     r"raised TypeError: Invariant encountered: value was None.*\n\(raised inside FSDP's forward: "
     r"fully_shard the inner modules first and the model itself \(the root\) last"),
    ("10", "the root left out", [("    fully_shard(model)  # the root\n", "")],
     r"the model itself is not sharded: .*fully_shard\(model\)"),
    ("10", "the model not returned", [("    fully_shard(model)  # the root\n    return model",
                                       "    fully_shard(model)  # the root")],
     r"shard\(model\) returned NoneType, not the model"),
    ("10", "layers kept whole after their forward",
     [("fully_shard(layer)  #", "fully_shard(layer, reshard_after_forward=False)  #")],
     r"while the model ran its forward, rank 0 held 3 layers' whole weights at once \(\d+ bytes; "
     r"the largest layer alone is \d+\).*reshard_after_forward=False"),
    ("10", "layers and root kept whole after their forward",
     [("fully_shard(layer)  #", "fully_shard(layer, reshard_after_forward=False)  #"),
      ("    fully_shard(model)  # the root", "    fully_shard(model, reshard_after_forward=False)")],
     r"rank 0 held 3 layers' whole weights at once"),
    ("10", "only the first layer resharded after its forward", '''
def shard(model):
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(layers):
        fully_shard(layer, reshard_after_forward=(i == 0))
    fully_shard(model)
    return model
''', r"rank 0 held 2 layers' whole weights at once"),
    ("10", "one partial with reshard_after_forward=False for every unit", '''
def shard(model):
    import functools
    shard_unit = functools.partial(fully_shard, reshard_after_forward=False)
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            shard_unit(layer)
    return shard_unit(model)
''', r"rank 0 held 3 layers' whole weights at once"),
    # 11 pipeline bubble
    ("11", "(p-1)/m", [("return (stages - 1) / (microbatches + stages - 1)", "return (stages - 1) / microbatches")],
     r"you predicted a bubble of 0\.5 for 2 stages and 2 micro-batches; measured: .*\(p-1\)/m leaves "
     r"out the slots"),
    ("11", "(p-1)/m on 2 stages only, the right formula otherwise",
     [("return (stages - 1) / (microbatches + stages - 1)",
       "return (stages - 1) / microbatches if stages == 2 else (stages - 1) / (microbatches + stages - 1)")],
     r"you predicted a bubble of 0\.5 for 2 stages and 2 micro-batches; .*: count the slots of a step"),
    ("11", "a formula for 2 stages only",
     [("return (stages - 1) / (microbatches + stages - 1)", "return 1 / (microbatches + 1)")],
     r"bubble_fraction\(4, 8\) returned 0\.111.*fits 2 stages but not 4"),
    ("11", "n_microbatches ignored",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "ScheduleGPipe(stage, n_microbatches=num_stages,")],
     r"with n_microbatches=4 and a batch of 16, rank 0 sent 2 activation tensor\(s\) of shape \(8, 8\)"),
    ("11", "the sum of the losses",
     [("return torch.stack(losses).mean().item()", "return torch.stack(losses).sum().item()")],
     r"4x the batch's loss .*SUM of the 4 micro-batch losses; return their mean"),
    ("11", "the mean loss divided by the number of micro-batches again",
     [("return torch.stack(losses).mean().item()",
       "return torch.stack(losses).mean().item() / n_microbatches")],
     r"the last stage returned \d\.\d+, 1/4 of the batch's loss .*already one micro-batch's MEAN.*"
     r"do not divide it by n_microbatches again"),
    ("11", "a tensor returned",
     [("return torch.stack(losses).mean().item()", "return torch.stack(losses).mean()")],
     r"the last stage returned a float32 tensor of shape \(\): return the mean of the micro-batch losses as a "
     r"Python float"),
    ("11", "a hard-coded 4 micro-batches",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "ScheduleGPipe(stage, n_microbatches=4,")],
     r"in the timed step with n_microbatches=2, rank 0 sent 4 activation tensor\(s\) of shape "
     r"\(8, 8\), not 2: .*not a fixed number"),
    ("11", "micro-batches of 4 samples, whatever n_microbatches says",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,",
       "ScheduleGPipe(stage, n_microbatches=(inputs if inputs is not None else targets).shape[0] // 4,")],
     r"in the timed step with n_microbatches=2, rank 0 sent 8 activation tensor\(s\)"),
    ("11", "the rule of thumb m = 2p instead of n_microbatches",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "ScheduleGPipe(stage, n_microbatches=2 * num_stages,")],
     r"in the timed step with n_microbatches=2, rank 0 sent 4 activation tensor\(s\) of shape "
     r"\(8, 8\), not 2: .*not a fixed number"),
    ("11", "the loss divided by the number of micro-batches",
     [("loss_fn=F.mse_loss", "loss_fn=lambda out, y: F.mse_loss(out, y) / n_microbatches")],
     r"stage 0's gradients are 1/4 of the whole model's on the whole batch: ScheduleGPipe already "
     r"scales each micro-batch's backward by 1/n_microbatches"),
    ("11", "the micro-batch gradients summed",
     [("loss_fn=F.mse_loss", "loss_fn=F.mse_loss, scale_grads=False")],
     r"stage 0's gradients are 4x those of the whole model on the whole batch: the micro-batches' "
     r"gradients were summed"),
]


def wrong_source(number: str, name: str, change) -> str:
    solution = next(SOLUTIONS.glob(f"{number}_*.py")).read_text()
    if isinstance(change, str):
        return solution + "\n\n# --- a plausible wrong answer: " + name + "\n" + change
    for old, new in change:
        assert solution.count(old) == 1, \
            f"the solution of {number} changed: update the wrong answer {name!r} ({old!r})"
        solution = solution.replace(old, new)
    return solution


def test_every_wrong_answer_still_applies_to_its_solution():
    for number, name, change, _ in WRONG_ANSWERS:
        compile(wrong_source(number, name, change), f"{number}: {name}", "exec")


def test_every_exercise_has_three_wrong_answers():
    # exercise 15's and 16's are graded apart, in their own test files (15's on the hand-built
    # trace only: the real 3-process run of its check would cost a round of minutes here)
    from wrong_answer_families import all_answers

    counts = {n: sum(1 for m, *_ in all_answers() if m == n) for n in NUMBERS}
    assert all(c >= 3 for c in counts.values()), counts


# exercises 12-14 (the transformer track): their wrong answers live in files of their own
from wrong_answers_parallel import WRONG_ANSWERS_12_13  # noqa: E402

WRONG_ANSWERS += WRONG_ANSWERS_12_13
from wrong_answers_flops import WRONG_ANSWERS_14  # noqa: E402

WRONG_ANSWERS += WRONG_ANSWERS_14
# 01, 06, 07, 10, 11: answers that only the layouts, the inputs or the structure now catch
from wrong_answers_layouts import WRONG_ANSWERS_LAYOUTS  # noqa: E402

WRONG_ANSWERS += WRONG_ANSWERS_LAYOUTS
# the newer ones, a module per exercise or group: tests/wrong_answers_ex*.py's WRONG_ANSWERS
for _module in sorted(Path(__file__).resolve().parents[1].glob("wrong_answers_ex*.py")):
    WRONG_ANSWERS += __import__(_module.stem).WRONG_ANSWERS


def test_every_family_of_wrong_answers_that_applies_has_six_of_its_own():
    # issue 35: every answer has a family; for every exercise each of the five families
    # either applies (then at least 6 answers of it) or is said not to, with the reason
    from wrong_answer_families import MINIMUM, all_answers, shortfalls

    assert MINIMUM == 6
    assert shortfalls(all_answers(), NUMBERS) == []


@pytest.fixture(scope="module")
def wrong_answer_results(tmp_path_factory, request):
    """Grade the wrong answers in rounds (one file per exercise and round), one pytest
    subprocess per round; returns ``{(number, name): [(test id, outcome, message)]}``.
    Only the wrong answers whose tests were selected are graded: ``-k 08`` grades
    exercise 08's, in minutes rather than the whole set's quarter of an hour."""
    selected = {(item.callspec.params["number"], item.callspec.params["name"])
                for item in request.session.items  # this file's (test_exercise15.py has its own)
                if getattr(item, "module", None) is request.module
                and getattr(item, "originalname", "") == "test_wrong_answer_is_rejected_with_the_learners_message"}
    rounds, seen = {}, {}
    for number, name, change, _ in WRONG_ANSWERS:
        if (number, name) not in selected:
            continue
        index = seen.get(number, 0)  # the k-th wrong answer of an exercise goes to round k
        seen[number] = index + 1
        rounds.setdefault(index, []).append((number, name))
        folder = tmp_path_factory.getbasetemp() / f"wrong-round-{index}"
        folder.mkdir(exist_ok=True)
        filename = next(SOLUTIONS.glob(f"{number}_*.py")).name
        (folder / filename).write_text(wrong_source(number, name, change))
    def grade(index):
        folder = tmp_path_factory.getbasetemp() / f"wrong-round-{index}"
        numbers = sorted({n for n, _ in rounds[index]})
        marker = " or ".join(f"ex{n}" for n in numbers)
        return index, by_exercise(run_checks(folder, str(folder), "-m", marker))

    # Two rounds at a time: a round's checks spend much of their time starting processes
    # and waiting in collectives, so two share 2 cores well (DISTKIT_WRONG_ROUNDS=1: one).
    from concurrent.futures import ThreadPoolExecutor

    graded = {}
    with ThreadPoolExecutor(max_workers=int(os.environ.get("DISTKIT_WRONG_ROUNDS", "2"))) as pool:
        for index, grouped in pool.map(grade, sorted(rounds)):
            for number, name in rounds[index]:
                graded[(number, name)] = grouped.get(number, [])
    return graded


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the first test also grades every wrong answer (the fixture), a round per k-th answer
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
    # a message that prints a line of the solution hands the learner the answer
    from mutants import leaked_lines

    answer = wrong_source(number, name, next(c for n, w, c, _ in WRONG_ANSWERS if (n, w) == (number, name)))
    leaks = sorted({line for m in failures for line in leaked_lines(number, m, answer)})
    assert not leaks, f"exercise {number}, {name!r}: the message prints the solution's {leaks}"


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
    assert code == 0 and re.search(r"4 passed, \d+ deselected", out), out[-3000:]
    code, out, _ = distkit(capfd, "check", "6")
    assert code == 1 and "exercise 06 is not solved yet" in out and "4 failed" in out, out[-3000:]
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
