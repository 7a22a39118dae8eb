"""What the hang doctor's sources cost: torch's Flight Recorder and
``TORCH_DISTRIBUTED_DEBUG=DETAIL``, per collective and per training step, 2 gloo ranks.

- The Flight Recorder is set once per process (``TORCH_FR_BUFFER_SIZE``; torch 2.15
  records 2000 entries when it is unset, 0 turns it off).
- DETAIL is set per process too (``TORCH_DISTRIBUTED_DEBUG``; a DDP model on a DETAIL
  group made by ``dist.set_debug_level`` in a plain process crashes torch 2.15): four
  configurations, none / recorder / DETAIL / both, each round in a rotated order.
- Per collective: all_reduce of float32[1000] (4 KB) and float32[1_000_000] (4 MB).
- Per step: the kit's MLP under DDP with the kit's step
  (``distkit.train.training.create_trainer``), global batch 64. DDP's constructor crashes
  (SIGSEGV) under DETAIL in torch 2.15 (gloo, CPU), so under DETAIL the step is the same
  MLP with its gradients all-reduced one tensor at a time (``step_manual``, measured in
  every configuration) is the step DETAIL is compared on.
- One torch thread per rank; warm-up first; medians over rounds, rank 0.
- The kit's watcher thread (:func:`distkit.observe.hang_records.arm`) runs in the
  recorder-on processes, as in every rank the kit starts.

    python benchmarks/hang_doctor_cost.py [rounds] [calls per block] [steps per block]
"""
import json
import os
import statistics
import sys
import tempfile
import time


def _time(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def _manual_step(model, optimizer, batch):
    """One step with the gradients all-reduced one tensor at a time (no DDP)."""
    import torch
    import torch.distributed as dist

    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()


def measure(local_rank, calls, steps):
    import ignite.distributed as idist
    import torch
    import torch.distributed as dist

    from distkit import Config
    from distkit.builtin.models import MLP
    from distkit.observe.hang_records import arm
    from distkit.train.training import create_trainer

    torch.set_num_threads(1)
    if os.environ.get("TORCH_FR_BUFFER_SIZE") != "0":
        arm(tempfile.mkdtemp(), idist.get_rank())
    small, big = torch.ones(1000), torch.ones(1_000_000)
    torch.manual_seed(0)
    detail = os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    mlp = MLP()
    model = mlp if detail else idist.auto_model(mlp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))] * steps
    sides = {"small": (lambda: dist.all_reduce(small), calls),
             "big": (lambda: dist.all_reduce(big), max(1, calls // 20)),
             "step_manual": (lambda: _manual_step(mlp, optimizer, data[0]), steps)}
    if not detail:  # DDP's constructor crashes (SIGSEGV) under DETAIL in torch 2.15
        trainer = create_trainer(model, optimizer, torch.nn.CrossEntropyLoss(), Config())
        sides["step"] = (lambda: trainer.run(data, max_epochs=1), 1)
    for fn, _ in sides.values():  # warm-up
        fn()
    times = {name: [] for name in sides}
    for _ in range(3):
        for name, (fn, n) in sides.items():
            dist.barrier()
            times[name].append(_time(fn, n) / (steps if name == "step" else 1))
    return {name: statistics.median(t) for name, t in times.items()}


CONFIGS = {"none": {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_DISTRIBUTED_DEBUG": "OFF"},
           "recorder": {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_DISTRIBUTED_DEBUG": "OFF"},
           "detail": {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
           "both": {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}}


def main():
    from distkit.launch.runner import run_per_rank

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    os.environ["OMP_NUM_THREADS"] = "1"
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg(),
          os.cpu_count(), "cores", flush=True)
    rows = []
    names = list(CONFIGS)
    for r in range(rounds):
        for name in names[r % 4:] + names[:r % 4]:  # rotated: drift hits every side alike
            os.environ.update(CONFIGS[name])
            got = run_per_rank(measure, 2, "gloo", calls, steps, start_method="spawn")[0]
            rows.append({"config": name, **got})
            print(json.dumps(rows[-1]), flush=True)

    def median(name, what):
        return statistics.median(x[what] for x in rows if x["config"] == name)

    summary = {what: {"none_us": 1e6 * median("none", what),
                      **{f"{n}_pct": 100 * (median(n, what) / median("none", what) - 1)
                         for n in names[1:] if all(what in x for x in rows if x["config"] == n)}}
               for what in ("small", "big", "step_manual", "step")}
    print("summary:", json.dumps(summary, indent=1))
    print("load after", os.getloadavg())


if __name__ == "__main__":
    main()
