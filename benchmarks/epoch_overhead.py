"""What ``distkit train`` does per epoch and per run that the hand-written loop does not,
timed with and without it (issue 22).

    python benchmarks/epoch_overhead.py --rounds 5        # writes benchmarks/results/epoch-overhead.*

The kit's default task at 8 samples per process (global batch 16), 2 gloo processes, 3
epochs, started as ``distkit train`` starts it (``distkit.launch.entry.run``), each run in a fresh
Python process. Variants, rotated round by round:

- ``as shipped``;
- ``no checkpoints``: neither the resumable checkpoint (trainer, model, optimizer, lr
  schedule, settings; atomically written every epoch, 2 kept) nor the best-model save;
- ``no digests``: no SHA-256 of every parameter, all-gathered over the ranks, at the start
  and the end (``replicas_identical`` in results.json);
- ``no plot``: no learning-curve PNG at the end (matplotlib, rank 0);
- ``none of the three``.

Per run: samples/s over the steady epochs (the epochs after the first, handlers at the
epoch's end excluded, as ``distkit bench``'s peers count it), the run's wall time from the
launch to its return, and that wall time less the epochs' training time (start-up,
validation, the epoch-end handlers, the end of the run). The switches are made by replacing
the kit's functions in the launching process before it forks its workers (one thread per
process: the launcher forks), so the kit's code is unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("as shipped", "no checkpoints", "no digests", "no plot", "none of the three")


def _switch_off(variant: str) -> None:
    import ignite.distributed as idist

    from distkit.train import training

    if variant in ("no checkpoints", "none of the three"):
        class NoCheckpoint:  # what training() reads of a Checkpoint, doing nothing
            last_checkpoint = None

            def __init__(self, *args, **kwargs):
                pass

            def __call__(self, engine):
                pass

        training.Checkpoint = NoCheckpoint
    if variant in ("no digests", "none of the three"):
        training.replica_digests = lambda model: ["-"] * idist.get_world_size()
    if variant in ("no plot", "none of the three"):
        import distkit.observe.plots
        from matplotlib.figure import Figure

        class NoFigure(Figure):  # drawn and saved by nobody (pyplot is still imported)
            def savefig(self, *args, **kwargs):
                pass

        distkit.observe.plots.learning_curves = lambda runs: NoFigure()


def one_run(variant: str, out: str) -> dict:
    """In this process: switch off what ``variant`` says, train, return the timings."""
    _switch_off(variant)
    from distkit.config import Config
    from distkit.launch.entry import run

    config = Config(dataset="digits", model="cnn", batch_size=16, epochs=3, nproc_per_node=2,
                    backend="gloo", progress_bar=False, output_dir=out, threads_per_process=1)
    start = time.perf_counter()
    results = run(config)
    wall = time.perf_counter() - start
    history = results["history"]
    steady = [h["epoch_time_s"] for h in history[1:]]
    per_epoch = results["samples_trained"] / len(history)
    return {"samples_per_s": per_epoch / statistics.median(steady), "wall_s": wall,
            "train_time_s": results["train_time_s"],
            "outside_epochs_s": wall - results["train_time_s"],
            "val_accuracy": results["final"]["val_accuracy"]}


def cpu_parts(repeats: int = 20) -> dict:
    """CPU milliseconds (this process's ``time.process_time``, which moves far less than wall
    time when other jobs share the cores) of each piece on its own, in one process: the
    resumable checkpoint of one epoch and the best-model save (``torch.save`` through the
    kit's atomic saver), one parameter digest, the learning-curve figure (drawn and saved;
    importing pyplot timed apart, in a fresh interpreter), and one steady epoch of training
    at 8 samples per process for scale."""
    import torch

    from distkit.checkpoint.saver import checkpoint_saver
    from distkit.config import Config
    from distkit.observe.plots import learning_curves
    from distkit.train.training import param_digest, training

    def cpu_ms(fn, n=repeats):
        start = time.process_time()
        for _ in range(n):
            fn()
        return 1000 * (time.process_time() - start) / n

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(dataset="digits", model="cnn", batch_size=8, epochs=2, backend="none",
                        progress_bar=False, output_dir=tmp, threads_per_process=1)
        start = time.process_time()
        results = training(0, config)
        run_ms = 1000 * (time.process_time() - start)
        from distkit.train.training import initialize

        model, optimizer, _ = initialize(config)
        saver = checkpoint_saver(os.path.join(tmp, "c"))
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        i = iter(range(10**6))
        checkpoint = cpu_ms(lambda: saver(state, f"checkpoint_{next(i)}.pt"))
        best = cpu_ms(lambda: saver({"model": model.state_dict()}, f"best_{next(i)}.pt"))
        digest = cpu_ms(lambda: param_digest(model))
        figure = cpu_ms(lambda: learning_curves([results]).savefig(os.path.join(tmp, "c.png"), dpi=100), 5)
    pyplot = subprocess.run([sys.executable, "-c", "import time; t = time.process_time(); "
                             "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot; "
                             "print(1000 * (time.process_time() - t))"], capture_output=True, text=True)
    epoch = results["history"][-1]
    return {"checkpoint_ms": checkpoint, "best_model_ms": best, "digest_ms": digest,
            "figure_ms": figure, "import_pyplot_ms": float(pyplot.stdout.strip() or "nan"),
            "one_process_run_ms": run_ms, "epoch_wall_s_one_process": epoch["epoch_time_s"],
            "iterations_per_epoch": results["iterations"] / results["epochs_completed"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--note", default="")
    p.add_argument("--out", default=os.path.join(HERE, "results", "epoch-overhead"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: a single run
    p.add_argument("--parts", action="store_true", help="only the CPU cost of each piece")
    args = p.parse_args(argv)
    if args.parts:
        print(json.dumps(cpu_parts(), indent=1))
        return 0
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(one_run(args.one, tmp)), flush=True)
        return 0

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {v: [] for v in VARIANTS}
    for r in range(args.warmup + args.rounds):
        k = r % len(VARIANTS)
        for variant in VARIANTS[k:] + VARIANTS[:k]:
            done = subprocess.run([sys.executable, __file__, "--one", variant], env=env,
                                  capture_output=True, text=True, timeout=900)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                print(f"round {r + 1} {variant}: failed: {done.stderr[-500:]}", flush=True)
                continue
            if r >= args.warmup:
                runs[variant].append(json.loads(lines[-1][7:]))
        print(f"round {r + 1}/{args.warmup + args.rounds} done", flush=True)

    def med(variant, key):
        return statistics.median(x[key] for x in runs[variant])

    base = "as shipped"
    table = {v: {key: med(v, key) for key in ("samples_per_s", "wall_s", "outside_epochs_s")}
             for v in VARIANTS if runs[v]}
    for v in table:  # paired with the shipped run of the same round
        pairs = list(zip(runs[v], runs[base]))
        table[v]["samples_per_s_vs_shipped"] = statistics.median(a["samples_per_s"] / b["samples_per_s"]
                                                                 for a, b in pairs)
        table[v]["wall_s_vs_shipped"] = statistics.median(a["wall_s"] - b["wall_s"] for a, b in pairs)
    from distkit.bench.method import load_average, machine

    record = {"when": datetime.now().isoformat(timespec="seconds"), "note": args.note,
              "machine": machine(), "load_average_end": load_average(), "rounds": args.rounds,
              "warmup": args.warmup, "task": "digits, cnn, global batch 16 (8 per process), 2 gloo "
              "processes, 3 epochs, distkit.launch.entry.run", "medians": table, "runs": runs}
    lines = [f"epoch overhead, {record['when']}, {record['machine']['cpu']}, "
             f"{record['machine']['cores']} cores, load average {record['machine']['load_average']} -> "
             f"{record['load_average_end']}; {args.rounds} rounds after {args.warmup} warm-up; {args.note}",
             f"{'variant':<20} {'samples/s':>10} {'vs shipped':>11} {'wall s':>8} {'(delta)':>8} "
             f"{'outside epochs s':>17}"]
    for v, m in table.items():
        lines.append(f"{v:<20} {m['samples_per_s']:>10.0f} {m['samples_per_s_vs_shipped']:>11.3f} "
                     f"{m['wall_s']:>8.2f} {m['wall_s_vs_shipped']:>+8.2f} {m['outside_epochs_s']:>17.2f}")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(record, f, indent=2)
    with open(args.out + ".txt", "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
