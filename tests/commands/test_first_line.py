"""``distkit train``'s first minute: it says what it is starting (what it trains, on how
many processes, where the output goes) within 3 s of its start, before torch's import
(which alone takes seconds), then trains as before."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from hypothesis import given, note, settings
from hypothesis import strategies as st

from support import subprocess_env, within_seconds
from distkit.commands import train
from distkit.config import Config

QUIET_S = 3.0


def test_the_first_line_arrives_within_3_s_before_torch_is_imported(tmp_path):
    """Timed from the process's start to its first line on stdout; on a machine with a
    load average under 1 the bound is 3 s itself, on a loaded one it is stretched by
    conftest's within_seconds (the line still comes before torch's import)."""
    load = os.getloadavg()[0]
    bound = QUIET_S if load < 1 else within_seconds(QUIET_S)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "distkit", "train", "--epochs", "1",
                             "--no-progress", "--output-dir", str(tmp_path / "runs")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env(), start_new_session=True)
    try:
        first = proc.stdout.readline()
        took = time.monotonic() - start
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run itself is not what is tested here
        proc.communicate(timeout=60)
    print(f"first line after {took:.2f} s (bound {bound:.1f} s, load average {load:.1f})")
    assert first.startswith("distkit train: cnn on digits, 1 epoch(s), on "), first
    assert f"output in a new folder under {tmp_path / 'runs'}/" in first
    assert took <= bound, f"{took:.2f} s > {bound:.1f} s at load {load:.1f}: {first!r}"
    assert first.strip().endswith("(loading torch...)")


def test_the_line_is_said_before_torch_is_imported():
    code = ("import sys; from distkit.commands import train; from distkit.config import Config; "
            "train.announce(Config()); print('TORCH LOADED', 'torch' in sys.modules)")
    env = {k: v for k, v in subprocess_env().items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=within_seconds(30), env=env)
    assert out.stdout.splitlines()[-1] == "TORCH LOADED False", out.stdout + out.stderr
    assert out.stdout.startswith("distkit train: ")


def test_its_cpu_count_is_the_launchers():
    from distkit.launch.checks import CPU_DEFAULT_NPROC

    assert train.CPU_PROCESSES == CPU_DEFAULT_NPROC


@settings(max_examples=50, deadline=None)
@given(nproc=st.one_of(st.none(), st.integers(1, 8)), nnodes=st.integers(1, 3),
       backend=st.sampled_from(["auto", "gloo", "none"]),
       launch=st.sampled_from(["spawn", "torchrun", "slurm"]), rank=st.integers(0, 3),
       task=st.sampled_from([None, "course:task"]), output=st.sampled_from(["runs", "out/here"]))
def test_the_line_names_what_how_many_and_where(nproc, nnodes, backend, launch, rank, task, output):
    note(f"nproc={nproc} nnodes={nnodes} backend={backend} launch={launch} rank={rank} task={task!r} "
         f"output={output}")
    config = Config(nproc_per_node=nproc, nnodes=nnodes, backend=backend, task=task, output_dir=output,
                    **({"node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29500} if nnodes > 1 else {}))
    # what torchrun / srun set for rank `rank` of 2 nodes x 2 (read by distkit.host.layout)
    environ = {"torchrun": {"WORLD_SIZE": "4", "RANK": str(rank), "LOCAL_RANK": str(rank % 2),
                            "LOCAL_WORLD_SIZE": "2"},
               "slurm": {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                         "SLURM_LOCALID": str(rank % 2), "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
                         "SLURM_NODEID": str(rank // 2), "SLURM_TASKS_PER_NODE": "2(x2)"}}.get(launch, {})
    line = train.first_line(config, environ)
    assert line.startswith("distkit train: ") and f"output in a new folder under {output}/" in line
    assert (f"the task {task}" if task else "cnn on digits") in line
    if launch == "torchrun":
        assert f"rank {rank} of 4 processes started by torchrun" in line
    elif launch == "slurm":
        assert f"rank {rank} of 4 processes started by SLURM" in line
    elif nproc:
        assert f"on {nproc} process(es)" in line
    elif backend == "none":
        assert "on 1 process" in line
    else:
        assert f"on {train.CPU_PROCESSES} processes on the CPU" in line or "one per GPU" in line
    assert (f" x {nnodes} nodes" in line) == (nnodes > 1)
