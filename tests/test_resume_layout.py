"""A run stopped on one layout (world size, nodes, strategy) and resumed on another goes
on where it stopped: the same global batches as the run never stopped, weights within
the rounding that the layout changes (measured, stated in docs/resume.md), the same
validation accuracy within 0.01 and loss within 2 %. A resume on the same layout stays
bit-identical (also tests/test_resume.py, tests/test_preemption.py).

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

from conftest import REPO_ROOT, subprocess_env
from distkit.checkpoint.reshard import (check_task_state_reshards, named_optimizer_state,
                                        numbered_optimizer_state, parameter_names)
from distkit.errors import DistkitError

TESTS = Path(__file__).resolve().parent


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

    with pytest.raises(DistkitError) as caught:
        check_task_state_reshards("ck.pt", {"task.count": PerRank(), "task.ema": object()})
    line = str(caught.value)
    assert "\n" not in line and "count" in line and "ema" not in line
    assert "resume with the world size, nodes and --strategy" in line
    check_task_state_reshards("ck.pt", {"task.ema": object(), "model": PerRank()})  # fine
