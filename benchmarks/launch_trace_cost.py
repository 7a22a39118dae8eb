"""What ``distkit launch --trace`` costs a plain-PyTorch script: a step's time, the launch's
time, and the files.

1. Per step (this file run by ``distkit launch`` on 2 gloo ranks): a hand-written DDP
   loop on the kit's MLP (global batch 64, as ``benchmarks/trace_cost.py``); in each
   round, interleaved, a block of steps with tracing off, a block with
   :class:`distkit.observe.script_tracing.ScriptTracer`'s hooks in place but the profiler not
   recording (the skipped steps), a block recorded (its first two steps, the warm-up
   and the clock sync, left out), and a block after the trace is written (every hook
   removed); each step timed alone, the median over every round, rank 0. The export
   (``finish``: ``export_chrome_trace``) is timed apart.
2. The same without DDP in one process, one thread (less noise from the other rank):
   off, hooks not recording, recorded, after the trace is written; 400-step blocks.
3. The launch: ``distkit launch [--trace] --nproc-per-node 2`` on the DDP-tutorial script
   (``tests/foreign``, 2 epochs), alternated, wall time of each; and the files of the
   traced launches.

    python benchmarks/launch_trace_cost.py [rounds] [steps per block] [launches]
"""
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def timed_steps(model, optimizer, loss, x, y, n: int) -> list[float]:
    """Seconds of each of ``n`` training steps on the batch ``(x, y)``."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def per_step(rounds: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distkit.builtin.models import MLP
    from distkit.observe.script_tracing import ScriptTracer

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.nn.CrossEntropyLoss()
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))  # the digits images

    block = functools.partial(timed_steps, model, optimizer, loss, x, y)

    folder = tempfile.mkdtemp(prefix="launch-trace-cost-")
    block(steps)  # warm-up
    off, hooks, on, export, size, after = [], [], [], [], [], []
    for _ in range(rounds):
        dist.barrier()
        off += block(steps)
        dist.barrier()
        tracer = ScriptTracer(folder, rank)
        tracer.wait, tracer.warmup, tracer.active = steps + 10, 0, 1  # never records
        tracer.start()
        hooks += block(steps)
        tracer.finish()
        dist.barrier()
        tracer = ScriptTracer(folder, rank)
        tracer.wait, tracer.warmup, tracer.active = 0, 1, steps + 10  # finished by hand below
        tracer.start()
        on += block(steps)[2:]  # step 0: warm-up, step 1: the clock sync
        start = time.perf_counter()
        tracer.finish()
        export.append(time.perf_counter() - start)
        after += block(steps)  # the hooks removed: the rest of a script runs untraced
        size.append(os.path.getsize(os.path.join(folder, f"rank{rank}.json")) / (steps - 1))
    shutil.rmtree(folder, ignore_errors=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"off_ms": 1e3 * statistics.median(off),
                       "hooks_not_recording_ms": 1e3 * statistics.median(hooks),
                       "recorded_ms": 1e3 * statistics.median(on),
                       "after_finish_ms": 1e3 * statistics.median(after),
                       "export_s": statistics.median(export),
                       "bytes_per_recorded_step": statistics.median(size),
                       "rounds": rounds, "steps": steps}, f)
    dist.barrier()
    dist.destroy_process_group()


def one_process(rounds: int) -> dict:
    import torch

    from distkit.builtin.models import MLP
    from distkit.observe.script_tracing import ScriptTracer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.nn.CrossEntropyLoss()
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))

    block = functools.partial(timed_steps, model, optimizer, loss, x, y)

    folder = tempfile.mkdtemp(prefix="launch-trace-cost-")
    block(200)
    got = {"off": [], "hooks_not_recording": [], "recorded": [], "after_finish": []}
    for _ in range(rounds):
        got["off"] += block(400)
        tracer = ScriptTracer(folder, 0)
        tracer.wait, tracer.warmup, tracer.active = 10 ** 6, 0, 1
        tracer.start()
        got["hooks_not_recording"] += block(400)
        tracer.finish()
        tracer = ScriptTracer(folder, 0)
        tracer.wait, tracer.warmup, tracer.active = 0, 1, 10 ** 6
        tracer.start()
        got["recorded"] += block(40)[2:]
        tracer.finish()
        got["after_finish"] += block(400)
    shutil.rmtree(folder, ignore_errors=True)
    return {f"{k}_us": round(1e6 * statistics.median(v), 1) for k, v in got.items()}


def launches(n: int) -> dict:
    folder = tempfile.mkdtemp(prefix="launch-trace-wall-")
    for name in ("multigpu_torchrun.py", "datautils.py"):
        shutil.copy(os.path.join(REPO, "tests", "foreign", name), folder)
    walls = {"plain": [], "trace": []}
    files = []
    for _ in range(n):
        for kind in ("plain", "trace"):
            if os.path.exists(os.path.join(folder, "snapshot.pt")):
                os.remove(os.path.join(folder, "snapshot.pt"))
            flags = ["--trace"] if kind == "trace" else []
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "distkit", "launch", *flags,
                                   "--nproc-per-node", "2", "multigpu_torchrun.py", "2", "1"],
                                  cwd=folder, capture_output=True, text=True)
            walls[kind].append(time.perf_counter() - start)
            assert done.returncode == 0, done.stderr[-2000:]
    for run in sorted(os.listdir(os.path.join(folder, "runs"))):
        trace = json.load(open(os.path.join(folder, "runs", run, "results.json")))["trace"]
        paths = trace["per_rank"] + [trace["merged"], trace["png"]]
        files.append({os.path.basename(p): os.path.getsize(os.path.join(folder, p)) for p in paths}
                     | {"clock_error_us": trace["clock"]["error_us"][1]})
    shutil.rmtree(folder, ignore_errors=True)
    return {"wall_s": {k: [round(v, 1) for v in vs] for k, vs in walls.items()},
            "median_wall_s": {k: round(statistics.median(vs), 1) for k, vs in walls.items()},
            "files": files}


if __name__ == "__main__":
    if "RANK" in os.environ:  # a rank of distkit launch
        per_step(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import torch

    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg(),
          os.cpu_count(), "cores, torch", torch.__version__)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cost.json")
        done = subprocess.run([sys.executable, "-m", "distkit", "launch", "--nproc-per-node", "2",
                               os.path.abspath(__file__), str(rounds), str(steps), out],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        print("per step (rank 0, median of every step):", open(out).read())
    print("one process, no DDP, one thread (median of every step):", json.dumps(one_process(rounds)))
    print("distkit launch of the DDP-tutorial script, 2 epochs, alternated:",
          json.dumps(launches(n), indent=1))
    print("load after", os.getloadavg())
