"""Record ``distkit bench``'s peers measurement, with the kit as it was before issue 16
as one more contender, so that before and after are measured side by side, round by
round, on the same machine state.

    git archive 9e2d02a | tar -x -C /tmp/before   # the kit before issue 16
    # (its training.py patched to record the first step's time, as the kit now does)
    python benchmarks/record_peers.py --before-src /tmp/before/src --rounds 3 \\
        --out benchmarks/results/peers.json

Prints the table and writes the JSON (load average at start and end beside the numbers).
"""
import argparse
import json
import os
import sys
import time

from distkit.bench.method import load_average, machine
from distkit.bench.peers import BASELINE, _read_kit, compare_commands
from distkit.bench.report import _peers_lines
from distkit.observe.reporting import versions


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before-src", help="src/ folder of the kit before issue 16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--names", help="comma-separated contenders of the default batch (default: all)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    extra = {}
    if args.before_src:
        def before_argv(batch):
            def build(folder, port):
                return [sys.executable, "-m", "distkit", "train", "--no-progress", "--dataset", "digits",
                        "--model", "cnn", "--batch-size", str(batch), "--epochs", str(args.epochs),
                        "--output-dir", folder]
            return build
        env = {"PYTHONPATH": os.path.abspath(args.before_src)}
        extra = lambda batch: {"distkit (before issue 16)": (before_argv(batch), _read_kit, env)}  # noqa: E731
    else:
        extra = lambda batch: {}  # noqa: E731
    start, t0 = load_average(), time.perf_counter()
    log = lambda line: print(line, flush=True)  # noqa: E731
    names = tuple(args.names.split(",")) if args.names else None
    default = compare_commands(64, args.epochs, args.rounds, args.warmup, log=log, extra=extra(64),
                               names=names)
    with open(args.out + ".default-batch.tmp", "w") as f:  # kept if the tiny steps fail
        json.dump(default, f, indent=2, default=str)
    tiny = compare_commands(16, args.epochs, args.rounds, args.warmup, log=log, extra=extra(16),
                            names=("distkit", "distkit (torchrun)", BASELINE))
    own, torchrun = (tiny["contenders"][k]["samples_per_s"] for k in ("distkit", "distkit (torchrun)"))
    import statistics

    tiny["default_launch_vs_torchrun"] = statistics.median(a / b for a, b in zip(own, torchrun))
    results = {"default_batch": default, "tiny_steps": tiny,
               "load_average": {"start": start, "end": load_average()},
               "machine": machine(), "versions": versions(), "duration_s": time.perf_counter() - t0,
               "note": ("2-core development VM shared with 7 other engineers' jobs (tests, notebooks, "
                        "benchmarks) during the whole run: commands started fresh every round, the "
                        "contenders interleaved round by round, so the load hits all of them")}
    print("\n".join(_peers_lines(results)))
    with open(args.out + ".tmp", "w") as f:
        json.dump(results, f, indent=2, default=str)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
