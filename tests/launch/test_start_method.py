"""The same code behaves the same at any core count. The launcher forks its workers at
any number of threads per process (Linux, gloo), so a training function defined in
``python -c`` (or a notebook cell) trains on a 2-core VM and on a many-core laptop alike;
``threads_per_process=2`` does here what a bigger machine does. Where the launching
process has already started OpenMP's thread pool (which a forked child cannot use), the
workers run one thread each, and the launcher says so; where it must spawn, a function
that spawned processes cannot import is refused in one line before any process starts."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from support import subprocess_env

TRAINING = textwrap.dedent('''
    import torch
    import ignite.distributed as idist
    from distkit import launch_function

    def training(local_rank, steps):
        torch.manual_seed(0)
        model = idist.auto_model(torch.nn.Linear(512, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(idist.get_rank())
        for _ in range(steps):
            x = torch.randn(1024, 512, generator=g)  # large enough for OpenMP regions
            loss = model(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        w = model.module.weight if hasattr(model, "module") else model.weight
        if idist.get_rank() == 0:
            print(f"RESULT threads={torch.get_num_threads()} weight_sum={w.sum().item():.6f}", flush=True)
    ''')


def python_c(code, threads, timeout=150):
    return subprocess.run([sys.executable, "-c", code], env=subprocess_env(), text=True,
                          capture_output=True, timeout=timeout)


def result(out):
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert out.returncode == 0 and len(lines) == 1, out.stderr[-3000:]
    return dict(kv.split("=") for kv in lines[0].split()[1:])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_python_c_training_trains_alike_at_1_and_2_threads_per_process():
    results = {}
    for threads in (1, 2):
        code = TRAINING + (f"launch_function(training, 3, backend='gloo', nproc_per_node=2, "
                           f"threads_per_process={threads})\n")
        out = python_c(code, threads)
        results[threads] = result(out)
        assert "Can't get attribute" not in out.stderr
        assert results[threads]["threads"] == str(threads)
    assert results[1]["weight_sum"] == results[2]["weight_sum"] or \
        abs(float(results[1]["weight_sum"]) - float(results[2]["weight_sum"])) < 1e-4

    # the launching process ran a 2-thread OpenMP region first: the forked workers would
    # hang in theirs; they run 1 thread each, and the launcher says so in one line
    code = TRAINING + textwrap.dedent('''
        torch.set_num_threads(2)
        torch.ones(1 << 20).exp_()   # starts this process's OpenMP pool
        launch_function(training, 3, backend='gloo', nproc_per_node=2, threads_per_process=2)
        ''')
    out = python_c(code, 2)
    assert result(out)["threads"] == "1"
    assert "distkit: this process already runs OpenMP threads" in out.stderr


def test_a_function_spawned_processes_cannot_import_is_refused_before_start(monkeypatch):
    from distkit.errors import DistkitError
    from distkit.launch.entry import check_spawned_can_import

    def training(local_rank):
        pass

    training.__module__ = "__main__"
    monkeypatch.delattr(sys.modules["__main__"], "__file__", raising=False)
    with pytest.raises(DistkitError, match=r"defined in `python -c`, standard input or an "
                                           r"interactive session.*put it in a file"):
        check_spawned_can_import("the training function", (training, ()))
    check_spawned_can_import("the training function", (len, ()))  # importable: fine


@pytest.mark.timeout(300)
def test_after_the_kernel_touched_cuda_an_importable_function_is_spawned_and_a_cell_one_refused(monkeypatch):
    """A notebook on a GPU runtime that trained in its kernel (the kit's one-process path
    puts the model on cuda) has initialised CUDA, and a forked child cannot use it: the
    launch spawns instead when what it runs can be imported (notebook 07 on an H200 failed
    here before), and refuses in one line naming the function when it cannot. This VM has
    no CUDA, so the parent's CUDA state and the notebook kernel are stood in for; the
    processes are real. scripts/gpu_check.sh runs notebook 07 on a real GPU."""
    import distkit.launch.supervise as launch  # where the process-start core decides fork or spawn
    from distkit.errors import DistkitError
    from distkit.lessons.collectives import process_info
    from distkit.launch.runner import run_per_rank

    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch.torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(launch, "in_ipython", lambda: True)
    monkeypatch.delattr(sys.modules["__main__"], "__file__", raising=False)

    seen = run_per_rank(process_info, 2, "gloo")
    assert [r["rank"] for r in seen] == [0, 1] and all(r["world_size"] == 2 for r in seen)

    def cell_function(local_rank):
        return local_rank

    cell_function.__module__ = "__main__"
    with pytest.raises(DistkitError, match=r"CUDA is already initialised in this process.*"
                                           r"'.*cell_function' is defined in this session.*"
                                           r"put the function in a module"):
        run_per_rank(cell_function, 2, "gloo")
    with pytest.raises(DistkitError, match="CUDA is already initialised"):  # fork asked for: refused
        run_per_rank(process_info, 2, "gloo", start_method="fork")


def gpu_visibility(local_rank):
    """What a worker sees of the GPUs (module level: spawned workers import it)."""
    import os

    import torch
    return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            "cuda": torch.cuda.is_available()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_gloo_workers_see_no_gpu_and_the_launcher_keeps_its_own(start_method, monkeypatch):
    """ignite calls torch.cuda.set_device(local_rank) whenever CUDA is available, gloo
    included: on a 1-GPU machine local rank 1 failed with "invalid device ordinal" (12 of
    the 14 notebooks, on an H200). The kit's gloo workers are CPU processes; the launching
    process's own variables are back as they were when the launch ends."""
    from distkit.launch.runner import run_per_rank

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # what a user may have set: kept here
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    seen = run_per_rank(gpu_visibility, 2, "gloo", start_method=start_method)
    assert seen == [{"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "cuda": False}] * 2
    import os
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0" and "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ


JOINING = textwrap.dedent('''
    import os
    import torch
    import ignite.distributed as idist
    from distkit import launch_function

    def report(local_rank):  # one file per rank: two ranks' prints can interleave in one pipe
        with open(f"rank{idist.get_rank()}.txt", "w") as f:
            f.write(f"RANK {idist.get_rank()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} "
                    f"cuda={torch.cuda.is_available()} device={idist.device()}")

    if __name__ == "__main__":
        launch_function(report, backend="gloo")
    ''')


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gloo_ranks_joining_torchrun_see_no_gpu(tmp_path):
    """Under torchrun each worker is a rank: it hides the GPUs from itself before ignite's
    process group (and its set_device) comes up."""
    script = tmp_path / "joining.py"
    script.write_text(JOINING)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert lines == [f"RANK {r} CUDA_VISIBLE_DEVICES='' cuda=False device=cpu" for r in (0, 1)]
