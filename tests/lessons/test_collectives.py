"""distkit.lessons.collectives: real gloo processes report who they are; the measurements
behave as the notebooks say. (The collectives themselves are asserted in notebook 01's
cells, run by tests/notebooks/test_notebooks.py.)"""
from __future__ import annotations

import os

import pytest
import torch

from distkit.lessons import collectives
from distkit.errors import DistkitError
from distkit.launch.runner import run_per_rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_three_gloo_ranks_know_who_they_are_spawned_and_forked():
    # spawned (fresh interpreters: what scripts get), then forked, as notebooks do
    for start_method in (None, "fork"):
        info = run_per_rank(collectives.process_info, nproc_per_node=3, start_method=start_method)
        assert [(i["rank"], i["local_rank"], i["world_size"], i["backend"], i["device"]) for i in info] == \
            [(r, r, 3, "gloo", "cpu") for r in range(3)]
        assert len({i["pid"] for i in info}) == 3 and os.getpid() not in {i["pid"] for i in info}


def test_run_per_rank_refuses_nccl_without_gpus_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(DistkitError, match="needs CUDA GPUs"):
        run_per_rank(collectives.process_info, nproc_per_node=2, backend="nccl")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_processes_beyond_the_cores_take_turns():
    cores = len(os.sched_getaffinity(0))
    rows = collectives.oversubscription(process_counts=(1, 4 * cores), iters=40, repeats=2)
    assert [r["processes"] for r in rows] == [1, 4 * cores]
    assert rows[0]["slowdown"] == 1.0
    # Ideal: 4x. Other jobs on the machine blur it, never down to parity.
    assert rows[1]["slowdown"] > 1.5, rows


def test_copy_bandwidth_on_cpu_is_an_exact_round_trip_with_positive_rates():
    rows = collectives.copy_bandwidth("cpu", sizes_mb=(1, 4), repeats=2)
    assert [r["megabytes"] for r in rows] == [1, 4]
    for r in rows:
        assert r["device"] == "cpu" and r["pinned"] is False
        assert r["host_to_device_ms"] > 0 and r["device_to_host_GBps"] > 0
