"""A run stopped on one layout (world size, nodes, strategy) and resumed on another goes
on where it stopped: the same global batches as the run never stopped, weights within
the rounding that the layout changes (measured, stated in docs/resume.md), the same
validation accuracy within 0.01 and loss within 2 %. A resume on the same layout stays
bit-identical (also tests/checkpoint/test_resume.py, tests/train/test_preemption.py).

Why the global batches can be the same: the training loader shuffles with a
``DistributedSampler`` at every world size, whose epoch order is one permutation of the
data whatever the world size; rank r takes ``perm[r::W]`` in batches of B/W, so global
batch i is ``perm[i*B:(i+1)*B]`` (first test, no processes; then recorded per sample by
the course task of tests/layout_course.py in real runs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings, strategies as st
from torch.utils.data import BatchSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from support import REPO_ROOT, subprocess_env
from distkit.checkpoint.reshard import (check_task_state_reshards, named_optimizer_state,
                                        numbered_optimizer_state, parameter_names)
from distkit.errors import DistkitError
from distkit.host.facts import free_port

TESTS = Path(__file__).resolve().parents[1]


# --- the data position: one permutation, any world size (no processes) ---------------------

@settings(max_examples=200, deadline=None, print_blob=True)
@given(n=st.integers(1, 300), world=st.integers(1, 4), per_rank=st.integers(1, 16),
       epoch=st.integers(0, 5))
def test_global_batch_i_is_the_same_slice_of_one_permutation_at_any_world_size(n, world, per_rank, epoch):
    from distkit.builtin.data import same_order_at_any_world_size

    note(f"case: n={n} world={world} per_rank={per_rank} epoch={epoch}")
    data, batch = TensorDataset(torch.arange(n)), world * per_rank
    if world == 1:  # the kit's own one-process sampler
        samplers = [same_order_at_any_world_size(data)["sampler"]]
    else:  # what ignite's auto_dataloader inserts on each rank (seed 0, shuffled)
        samplers = [DistributedSampler(data, num_replicas=world, rank=r, shuffle=True)
                    for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)  # as the kit's reshuffle handler does at every epoch
    per_rank_batches = [list(BatchSampler(s, per_rank, drop_last=False)) for s in samplers]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()
    assert {len(b) for b in per_rank_batches} == {-(-n // batch)}, "another epoch length"
    for i in range(n // batch):  # every full global batch; the last one may be padded
        got = sorted(ix for rank in per_rank_batches for ix in rank[i])
        assert got == sorted(perm[i * batch:(i + 1) * batch]), f"global batch {i} differs"


def test_one_process_trains_in_the_order_of_the_distributed_sampler():
    from distkit.builtin.data import get_dataflow
    from distkit.config import Config

    pair = TensorDataset(torch.arange(100)), TensorDataset(torch.arange(10))
    train, _ = get_dataflow(Config(batch_size=10), pair)
    assert isinstance(train.sampler, DistributedSampler) and train.sampler.num_replicas == 1
    train.sampler.set_epoch(3)
    assert list(train.sampler) == torch.randperm(100, generator=torch.Generator().manual_seed(3)).tolist()


# --- the optimizer's state between ddp's numbering and fsdp's names -------------------------

def test_optimizer_state_is_named_as_torch_names_it_and_back():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from distkit.builtin.models import get_model

    torch.manual_seed(0)
    model = get_model("cnn")
    optimizer = torch.optim.AdamW([{"params": list(model.parameters())[:2], "lr": 0.1},
                                   {"params": list(model.parameters())[2:]}], lr=0.01)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    names = parameter_names({"model": model, "optimizer": optimizer})
    named = named_optimizer_state(optimizer.state_dict(), names)
    theirs = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    assert named["state"].keys() == theirs["state"].keys()
    for name, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(named["state"][name][key]), torch.as_tensor(value))
    assert [g["params"] for g in named["param_groups"]] == [g["params"] for g in theirs["param_groups"]]
    back = numbered_optimizer_state(named, names)
    assert back["param_groups"] == optimizer.state_dict()["param_groups"]
    assert back["state"].keys() == optimizer.state_dict()["state"].keys()


def test_a_task_state_kept_per_rank_is_refused_on_another_layout():
    class PerRank:
        reshardable = False

        def state_dict(self):
            return {}

    saved = {"world_size": 2, "nnodes": 1, "strategy": "fsdp"}
    with pytest.raises(DistkitError) as caught:
        check_task_state_reshards("ck.pt", {"task.count": PerRank(), "task.ema": object()}, saved)
    line = str(caught.value)
    assert "\n" not in line and "count" in line and "ema" not in line
    assert "resume on the checkpoint's 2 processes (1 node(s), --strategy fsdp)" in line
    check_task_state_reshards("ck.pt", {"task.ema": object(), "model": PerRank()}, saved)  # fine


# --- real runs: stopped on one layout, resumed on another ----------------------------------

# 16 iterations an epoch (1497 digits in batches of 96); the course task 8 (96 in batches
# of 12); both batches divide by 1, 2, 3 and 4. Stopped in the middle of epoch 2.
TASKS = {"default": ["--epochs", "3", "--batch-size", "96"],
         "course": ["--task", "layout_course:task", "--epochs", "4", "--batch-size", "12",
                    "--early-stopping-patience", "3"]}
STOP_AT = {"default": 20, "course": 12}
COMMON = ["--no-progress", "--timeout", "60"]
# How far a resume on another layout may end from the uninterrupted run: the largest
# difference of any weight (max |resumed - uninterrupted|), and the final validation
# accuracy and relative loss; measured in docs/resume.md. The default task (no dropout)
# differs by rounding and the epoch's padded last batch only: 5e-4 measured. The course
# task draws its dropout masks per rank, so another world size draws other masks and the
# run takes another path, on the same global batches: 0.21-0.30 measured, and one of its
# 48 validation samples (0.021) classified otherwise.
TOLERANCE = {"default": {"weights": 5e-3, "accuracy": 0.01, "loss": 0.02},
             "course": {"weights": 0.5, "accuracy": 2 / 48, "loss": 0.05}}


def nodes_of(layout: tuple) -> int:
    """A layout is (processes per node, strategy) on one node, or (processes per node,
    strategy, nodes)."""
    return layout[2] if len(layout) > 2 else 1


def train(out: Path, layout: tuple, task: str, *extra) -> dict:
    """``distkit train`` of ``task`` on ``layout`` into ``out``; its results.json (asserting
    exit 0). Several nodes are as many launches on 127.0.0.1 (``--nnodes``, ``--node-rank``),
    writing into the one folder ``out``, as nodes on a cluster's shared file system do."""
    nproc, strategy, nnodes = layout[0], layout[1], nodes_of(layout)
    path = os.pathsep.join([str(TESTS), str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    start = time.monotonic()
    cmd = [sys.executable, "-m", "distkit", "train", "--nproc-per-node", str(nproc), "--strategy", strategy,
           "--output-dir", str(out), *TASKS[task], *COMMON, *map(str, extra)]
    if nnodes > 1:
        port = free_port()
        cmd += ["--nnodes", str(nnodes), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    launches = [subprocess.Popen(cmd + (["--node-rank", str(node)] if nnodes > 1 else []), cwd=out.parent,
                                 env=subprocess_env(PYTHONPATH=path), text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE) for node in range(nnodes)]
    try:
        outputs = [launch.communicate(timeout=300 * nnodes) for launch in launches]
    finally:
        for launch in launches:
            launch.kill()
    for node, (launch, (stdout, stderr)) in enumerate(zip(launches, outputs)):
        assert launch.returncode == 0, f"node {node}: " + (stdout + stderr)[-3000:]
    found = sorted(out.glob("*/results.json"), key=lambda p: p.stat().st_mtime)
    results = json.loads(found[-1].read_text())
    print(f"  {task} on {nnodes} x {nproc} {strategy} {' '.join(map(str, extra))}: "
          f"{time.monotonic() - start:.1f} s", flush=True)
    return results


def weights(results: dict) -> dict:
    return torch.load(results["last_checkpoint"], map_location="cpu", weights_only=True)["model"]


class Runs:
    """Each (task, layout) trained once uninterrupted and once stopped at ``STOP_AT``,
    shared by the cases that resume from it."""

    def __init__(self, folder: Path):
        self.folder, self.done = folder, {}

    def fresh(self, name: str) -> Path:
        """A new folder (a case drawn twice resumes twice, each into its own)."""
        for n in range(100):
            out = self.folder / (name if n == 0 else f"{name}-{n}")
            if not out.exists():
                out.mkdir(parents=True)
                return out
        raise AssertionError(f"no fresh folder for {name}")

    def get(self, kind: str, task: str, layout: tuple) -> dict:
        key = (kind, task, layout)
        if key not in self.done:
            out = self.fresh(f"{kind}-{task}-" + "-".join(map(str, layout)))
            extra = ("--max-iters", STOP_AT[task]) if kind == "stopped" else ()
            self.done[key] = (out, train(out, layout, task, *extra))
        return self.done[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("layouts"))


def resume_and_compare(runs: Runs, task: str, before: tuple, after: tuple) -> dict:
    """Resume ``task`` stopped on ``before`` on ``after``; assert the invariant against the
    run never stopped; return what was measured."""
    whole_dir, whole = runs.get("whole", task, before)
    stopped_dir, stopped = runs.get("stopped", task, before)
    out = runs.fresh(f"resumed-{task}-{''.join(map(str, before))}-{''.join(map(str, after))}")
    resumed = train(out, after, task, "--resume-from", stopped["last_checkpoint"])

    assert (resumed["world_size"], resumed["nnodes"], resumed["strategy"]) == (
        after[0] * nodes_of(after), nodes_of(after), after[1]), "another layout than asked"
    assert resumed["resumed_from"] == {
        "checkpoint": stopped["last_checkpoint"], "iteration": STOP_AT[task],
        "world_size": before[0] * nodes_of(before), "nnodes": nodes_of(before), "strategy": before[1]}
    assert resumed["iterations"] == whole["iterations"]
    assert resumed["final"]["epoch"] == whole["final"]["epoch"], "early stopping at another epoch"
    if task == "course":  # every global batch after the resume is the uninterrupted run's
        from layout_course import global_batches

        want, got = global_batches(whole_dir), global_batches(out)
        after_stop = [it for it in want if it > STOP_AT[task]]
        assert sorted(got) == after_stop, "other iterations trained after the resume"
        for it in after_stop:
            assert got[it] == want[it], f"global batch of iteration {it} differs"
    a, b = weights(whole), weights(resumed)
    assert a.keys() == b.keys()
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    accuracy = abs(resumed["final"]["val_accuracy"] - whole["final"]["val_accuracy"])
    loss = abs(resumed["final"]["val_loss"] / whole["final"]["val_loss"] - 1)
    print(f"  {task} {before} -> {after}: max weight difference {diff:.2e}, validation "
          f"accuracy {accuracy:.4f} apart, loss {100 * loss:.2f} % apart", flush=True)
    if before == after:  # the same layout: nothing resharded, bit for bit
        assert diff == 0, "a resume on the same layout is no longer bit-identical"
    bound = TOLERANCE[task]
    assert diff <= bound["weights"], f"weights {diff:.2e} apart"
    assert accuracy <= bound["accuracy"] + 1e-9, f"validation accuracy {accuracy:.4f} apart"
    assert loss <= bound["loss"], f"validation loss {100 * loss:.2f} % apart"
    return {"weights": diff, "accuracy": accuracy, "loss": loss}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("after", [(1, "ddp"), (4, "ddp"), (2, "fsdp")], ids=str)
def test_two_ddp_processes_resumed_on_one_on_four_and_under_fsdp(runs, after):
    resume_and_compare(runs, "default", (2, "ddp"), after)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("task", ["course", "default"])
def test_two_nodes_of_two_processes_resumed_on_two_processes_of_one_node(runs, task):
    """A job preempted on 2 nodes x 2 comes back on one node of 2: the checkpoint records
    world size 4 on 2 nodes, and the resumed run trains the uninterrupted 2 x 2 run's global
    batches (the course task, sample for sample) to within the same bounds."""
    resume_and_compare(runs, task, (2, "ddp", 2), (2, "ddp"))


LAYOUTS = [(1, "ddp"), (2, "ddp"), (3, "ddp"), (4, "ddp"), (2, "fsdp")]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@settings(max_examples=4, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=st.sampled_from(["course", "default"]),
       before=st.sampled_from([(1, "ddp"), (2, "ddp"), (2, "fsdp")]),
       after=st.sampled_from(LAYOUTS))
def test_any_layout_resumes_any_other(runs, task, before, after):
    print(f"case: task={task!r} before={before} after={after}", flush=True)
    resume_and_compare(runs, task, before, after)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_course_task_with_state_per_rank_is_refused_on_another_layout_in_one_line(tmp_path):
    """tests/preemption_course.py counts tokens per rank (``reshardable = False``): its
    checkpoint of 2 processes resumed on 1 ends in one line naming the state and the layout
    to resume on, exit 1, and leaves no run folder behind."""
    path = os.pathsep.join([str(TESTS), str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    course = [sys.executable, "-m", "distkit", "train", "--task", "preemption_course:task", "--epochs",
              "2", "--batch-size", "16", *COMMON]
    first = subprocess.run([*course, "--nproc-per-node", "2", "--max-iters", "4", "--output-dir",
                            str(tmp_path / "runs")], cwd=tmp_path, env=subprocess_env(PYTHONPATH=path),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = sorted((tmp_path / "runs").glob("*/checkpoints/*.pt"))[-1]
    refused = subprocess.run([*course, "--nproc-per-node", "1", "--resume-from", str(checkpoint),
                              "--output-dir", str(tmp_path / "again")], cwd=tmp_path,
                             env=subprocess_env(PYTHONPATH=path), capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 1
    lines = [line for line in refused.stderr.splitlines() if line.startswith("distkit:")]
    assert len(lines) == 1, refused.stderr[-3000:]
    assert "tokens_seen is kept per rank" in lines[0]
    assert "resume on the checkpoint's 2 processes (1 node(s), --strategy ddp)" in lines[0]
    assert not any((tmp_path / "again").glob("*/")), "a run folder was left behind"
