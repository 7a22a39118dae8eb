"""What ``--trace`` costs: the time of a recorded step against a plain one, and the size
of the files a traced run writes.

1. Per step: 2 gloo ranks train the kit's MLP under DDP (global batch 64) with the
   kit's step (``distkit.train.training.create_trainer``); in each round, a block of steps with
   tracing off, then a block inside ``torch.profiler.profile`` with the kit's ranges
   (``Config(trace=True)``), interleaved; the median over the rounds of each block's
   time per step, rank 0. Exporting the trace (after the recorded steps) is timed apart.
2. Sizes: ``distkit train --trace`` on 2 ranks for the default CNN, the MLP under fsdp
   and the GPT; the bytes of each file under ``trace/``.

    python benchmarks/trace_cost.py [rounds] [steps per block]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def per_step(local_rank, rounds, steps):
    import ignite.distributed as idist
    import torch
    from torch.profiler import ProfilerActivity, profile

    from distkit import Config
    from distkit.builtin.models import MLP
    from distkit.train.training import create_trainer

    torch.manual_seed(0)
    model = idist.auto_model(MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.nn.CrossEntropyLoss()
    batch = (torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))  # the digits images
    data = [batch] * steps
    plain = create_trainer(model, optimizer, loss, Config())
    traced = create_trainer(model, optimizer, loss, Config(trace=True))
    plain.run(data, max_epochs=1)  # warm-up
    off, on, export = [], [], []
    for _ in range(rounds):
        idist.barrier()
        start = time.perf_counter()
        plain.run(data, max_epochs=1)
        off.append((time.perf_counter() - start) / steps)
        idist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            traced.run(data, max_epochs=1)
            on.append((time.perf_counter() - start) / steps)
        start = time.perf_counter()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            size = os.path.getsize(f.name)
        export.append(time.perf_counter() - start)
    return {"off_ms": 1e3 * statistics.median(off), "on_ms": 1e3 * statistics.median(on),
            "export_s": statistics.median(export), "export_bytes_per_step": size / steps,
            "rounds": rounds, "steps": steps}


def sizes():
    runs = {"cnn (default)": [],
            "mlp fsdp": ["--model", "mlp", "--strategy", "fsdp"],
            "gpt": ["--dataset", "text", "--model", "gpt"]}
    out = {}
    for name, args in runs.items():
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run([sys.executable, "-m", "distkit", "train", "--trace", "--max-iters", "8",
                                   "--nproc-per-node", "2", "--no-progress", "--output-dir", folder, *args],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
            (run,) = os.listdir(folder)
            trace = json.load(open(os.path.join(folder, run, "results.json")))["trace"]
            files = trace["per_rank"] + [trace["merged"], trace["png"]]
            out[name] = {os.path.basename(p): os.path.getsize(p) for p in files}
            out[name]["clock_error_us"] = trace["clock"]["error_us"][1]
    return out


if __name__ == "__main__":
    from distkit.launch.runner import run_per_rank

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg(), os.cpu_count(), "cores")
    cost = run_per_rank(per_step, 2, "gloo", rounds, steps, start_method="spawn")[0]
    print("per step (rank 0, median of rounds):", json.dumps(cost))
    print("files of distkit train --trace (3 recorded steps, 2 ranks):", json.dumps(sizes(), indent=1))
