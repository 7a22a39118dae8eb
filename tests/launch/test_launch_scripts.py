"""``distkit launch`` meets scripts as courses write them: a script that starts its own
processes is refused in one line (or run once), a collective that times out names
``--timeout`` as its bound, and a rank that never came to the collective (busy in its own
code) is named, not only the ranks that waited for it."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from support import subprocess_env, within_seconds

MP_SPAWN = '''
import torch.multiprocessing as mp

def work(i):
    print(f"own process {i}", flush=True)

if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
'''

IDIST_PARALLEL = '''
import ignite.distributed as idist

def work(local_rank):
    print(f"own process {idist.get_rank()}", flush=True)

if __name__ == "__main__":
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(work)
'''

SPINNER = '''
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    while True:  # never comes to the all-reduce
        sum(range(1000))
dist.all_reduce(torch.ones(1))
'''


def launch(folder, *args, timeout=None):
    env = {k: v for k, v in subprocess_env().items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "distkit", "launch", *map(str, args)], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=timeout or within_seconds(60) + 120)
    return out, time.monotonic() - start


def error_lines(out) -> list[str]:
    return [ln for ln in out.stderr.splitlines() if ln.startswith("distkit: ")]


@pytest.mark.slow
@pytest.mark.parametrize("source", [MP_SPAWN, IDIST_PARALLEL], ids=["mp.spawn", "idist.Parallel"])
def test_a_script_that_starts_its_own_processes_is_refused_in_one_line(tmp_path, source):
    (tmp_path / "own.py").write_text(source)
    out, seconds = launch(tmp_path, "--nproc-per-node", "2", "--backend", "gloo", "own.py")
    assert out.returncode == 1, out.stderr
    lines = error_lines(out)
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("distkit: error: own.py starts 2 processes of its own"), lines[0]
    assert "distkit launch --nproc-per-node 1 own.py" in lines[0]
    assert "own process" not in out.stdout
    assert seconds < within_seconds(30)


@pytest.mark.slow
def test_a_script_that_starts_its_own_processes_runs_once_on_one_rank(tmp_path):
    (tmp_path / "own.py").write_text(MP_SPAWN)
    out, _ = launch(tmp_path, "--nproc-per-node", "1", "--backend", "gloo", "own.py")
    assert out.returncode == 0, out.stderr
    assert sorted(ln for ln in out.stdout.splitlines() if ln.startswith("own process")) == \
        ["own process 0", "own process 1"]


@pytest.mark.slow
def test_the_rank_that_never_came_is_named_and_the_bound_is_the_timeout_flag(tmp_path):
    (tmp_path / "spin.py").write_text(SPINNER)
    out, _ = launch(tmp_path, "--nproc-per-node", "2", "--backend", "gloo", "--timeout", "5", "spin.py")
    assert out.returncode == 1, out.stderr
    lines = error_lines(out)
    assert lines[0].startswith("distkit: error: rank 0 (local rank 0) raised"), out.stderr
    assert lines[1] == ("distkit: rank 0 waited the bound of distkit launch's --timeout 5 s (raise "
                        "--timeout for waits that are longer); rank 1 was not waiting: still running "
                        "its own code then (busy, or spinning in a loop): look there first"), out.stderr


RANK0_LEAVES_FIRST = '''
import time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(3)  # rank 0 has ended by now
    store = dist.distributed_c10d._get_default_store()
    store.set("late", "still served")
    print("rank 1 read:", store.get("late").decode(), flush=True)
'''


RAISES = '''
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(1, 6):
    if dist.get_rank() == RANK and step == STEP:
        raise ValueError("the script broke")
    dist.all_reduce(torch.ones(1))
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_rendezvous_store_outlives_rank_0(tmp_path):
    """The launcher serves the ranks' store, as torchrun's agent does: a rank still using
    it after rank 0 ended (as a slower rank still in init_process_group does) is answered.
    Served by rank 0, the store ended with it: "Connection reset by peer", and torch's C++
    warning on stderr."""
    (tmp_path / "leaves.py").write_text(RANK0_LEAVES_FIRST)
    out, _ = launch(tmp_path, "--nproc-per-node", 2, "leaves.py")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 1 read: still served" in out.stdout
    assert "reset by peer" not in out.stderr and "TCPStore" not in out.stderr, out.stderr[-3000:]


def test_with_a_run_folder_the_traceback_goes_to_its_tracebacks(tmp_path):
    """``--trace`` makes the launch a run folder: a rank's traceback goes to
    ``<run>/tracebacks/rank<R>.txt`` with its record, as under ``distkit train`` (the
    rank and the step it raises at are drawn; printed)."""
    import json
    import random
    from pathlib import Path

    rank, step = random.randrange(2), random.randint(1, 5)
    print(f"rank {rank} raises at step {step}")
    (tmp_path / "raises.py").write_text(RAISES.replace("RANK", str(rank)).replace("STEP", str(step)))
    out, _ = launch(tmp_path, "--nproc-per-node", "2", "--backend", "gloo", "--trace",
                    "--output-dir", "runs", "raises.py")
    assert out.returncode == 1, out.stderr
    line = error_lines(out)[0]
    (run,) = (tmp_path / "runs").iterdir()
    traceback_file = run / "tracebacks" / f"rank{rank}.txt"
    assert f"full traceback in {traceback_file}" in line, (line, sorted(map(str, run.rglob("*"))))
    assert "ValueError: the script broke" in traceback_file.read_text()
    record = json.loads((run / "tracebacks" / f"rank{rank}.json").read_text())
    assert (record["rank"], record["kind"], record["traceback"]) == (rank, "raised", str(traceback_file))
    assert Path(record["traceback"]).is_file()
