"""What stopping costs (issue 30): the time from SIGTERM to every process ended, and what
the machinery of a resumable stop adds to a run.

    python benchmarks/stop_cost.py --rounds 5 --note "quiet"   # writes benchmarks/results/stop-cost.json

1. ``sigterm_to_gone_s``: ``distkit train`` with its default task (digits x cnn, 2 gloo
   processes) and with the GPT (``--dataset text --model gpt``, keys ending ``_gpt``), SIGTERM sent to the launcher once its first checkpoint exists; the time
   until the launcher and both workers have ended (the workers stop within 10
   iterations, agree, write the checkpoint and exit). Also under torchrun (SIGTERM to
   torchrun; its agent passes it on). Medians over ``--rounds`` fresh runs.
2. ``checkpoint_per_rank_ms``: one save of the default task's resumable checkpoint on 2
   ranks (every rank's RNG state all-gathered, rank 0 writes), per rank, median over 20
   saves after 3 warm-ups; and the RNG gather alone.
3. ``stop_check_us``: the stop flag's agreement per iteration (2 ranks), in a loop whose
   step is a ~1 ms matmul: none; an all-reduce at every step, overlapped (started at one
   step, read at the next) or blocking; the kit's (blocking, every 10th step)
   (``--only stop-check`` reruns this part alone).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent

from distkit.host.facts import process_alive as alive, process_tree as descendants  # noqa: E402


TASKS = {"default": [], "gpt": ["--dataset", "text", "--model", "gpt"]}  # the kit's GPT on text


def sigterm_to_gone(launcher: str, folder: str, task: str = "default") -> dict:
    runs = os.path.join(folder, "runs")
    args = [*TASKS[task], "--epochs", "30", "--no-progress", "--output-dir", runs,
            "--checkpoint-every", "5"]
    cmd = ([sys.executable, "-m", "distkit", "train", "--nproc-per-node", "2", *args]
           if launcher == "spawn" else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "distkit", "train", *args])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not glob.glob(f"{runs}/*/checkpoints/*.pt"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run ended or never checkpointed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    everyone = [proc.pid, *descendants(proc.pid)]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    while any(alive(p) for p in everyone):
        time.sleep(0.005)
    took = time.monotonic() - sent
    _, err = proc.communicate()
    line = [ln for ln in err.splitlines() if ln.startswith("distkit: stopped by")]
    return {"seconds": took, "exit": proc.returncode, "line": line[0] if line else None,
            "processes": len(everyone)}


def checkpoint_cost(local_rank, saves=20, warmup=3):
    """In each of 2 ranks: the default task's trainer and checkpoint, saved ``saves``
    times; this rank's milliseconds per save and per RNG gather."""
    import ignite.distributed as idist
    from ignite.handlers import Checkpoint

    from distkit import Config
    from distkit.checkpoint.saver import checkpoint_saver, to_save
    from distkit.train.training import create_trainer, gather_rng_states, initialize

    config = Config(progress_bar=False)
    model, optimizer, criterion = initialize(config)
    trainer = create_trainer(model, optimizer, criterion, config)
    trainer.state.iteration, trainer.state.epoch_length, trainer.state.max_epochs = 1, 23, 10
    folder = idist.broadcast(tempfile.mkdtemp() if idist.get_rank() == 0 else "", src=0, safe_mode=True)
    saver = Checkpoint(to_save(trainer, model, optimizer, _Empty()), checkpoint_saver(folder),
                       n_saved=1, global_step_transform=lambda engine, _: engine.state.iteration)
    times, gathers = [], []
    for i in range(warmup + saves):
        trainer.state.iteration = i + 1
        idist.barrier()
        start = time.perf_counter()
        saver(trainer)
        took = time.perf_counter() - start
        start = time.perf_counter()
        gather_rng_states()
        gathered = time.perf_counter() - start
        if i >= warmup:
            times.append(took)
            gathers.append(gathered)
    (saved,) = [n for n in os.listdir(folder) if n.endswith(".pt")] if idist.get_rank() == 0 else [None]
    size = os.path.getsize(os.path.join(folder, saved)) if saved else None  # not its .sha256
    return {"save_ms": 1e3 * statistics.median(times), "rng_gather_ms": 1e3 * statistics.median(gathers),
            "file_bytes": size}


class _Empty:
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def stop_check_cost(local_rank, iterations=1000):
    """Microseconds per iteration of a loop whose "step" is a 192x192 matmul (about the
    default task's step on this VM, ~1 ms), with no stop check, with the kit's overlapped
    agreement, and with a plain blocking all-reduce; rounds interleaved, best of 3."""
    import ignite.distributed as idist
    import torch
    import torch.distributed as dist

    from distkit.train.stopping import StopAgreement

    torch.set_num_threads(1)
    x = torch.randn(192, 192)
    out = {}
    for kind in ("none", "overlapped", "blocking", "every_10") * 3:
        agreement = StopAgreement(every=10)
        in_flight = None
        flag = torch.zeros(1, dtype=torch.int32)
        idist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            x.matmul(x)
            if kind == "overlapped":  # started here, read at the next step
                if in_flight is not None:
                    in_flight.wait()
                in_flight = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            elif kind == "blocking":
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            elif kind == "every_10":  # what distkit.train.stopping does
                agreement.poll(_ + 1)
        if in_flight is not None:
            in_flight.wait()
        out.setdefault(kind, []).append(1e6 * (time.perf_counter() - start) / iterations)
    best = {k: min(v) for k, v in out.items()}
    return {**{f"{k}_us": v for k, v in best.items()},
            "overlapped_extra_us": best["overlapped"] - best["none"],
            "blocking_extra_us": best["blocking"] - best["none"],
            "every_10_extra_us": best["every_10"] - best["none"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--note", default="", help="the machine's load, in words")
    parser.add_argument("--output", default=str(HERE / "results" / "stop-cost.json"))
    parser.add_argument("--only", choices=["stop-check"], help="only this part, added to --output")
    args = parser.parse_args()
    if args.only == "stop-check":
        from distkit import launch_function

        result = json.loads(Path(args.output).read_text())
        result["stop_check_us_per_iteration"] = launch_function(
            stop_check_cost, backend="gloo", nproc_per_node=2, all_ranks=True)
        result["stop_check_loadavg"] = os.getloadavg()
        print("stop check per iteration (us):", result["stop_check_us_per_iteration"])
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        return

    from distkit import launch_function

    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "cores": len(os.sched_getaffinity(0)),
                          "loadavg_before": os.getloadavg()}, "note": args.note}
    import torch

    result["versions"] = {"python": platform.python_version(), "torch": torch.__version__}
    for task in TASKS:
        for launcher in ("spawn", "torchrun"):
            rounds = []
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory() as folder:
                    rounds.append(sigterm_to_gone(launcher, folder, task))
            key = f"sigterm_to_gone_{launcher}" + ("" if task == "default" else f"_{task}")
            result[key] = {"median_s": statistics.median(r["seconds"] for r in rounds),
                           "rounds": rounds}
            print(task, launcher, "SIGTERM to every process ended, median s:",
                  round(result[key]["median_s"], 2), flush=True)
    result["checkpoint_per_rank"] = launch_function(checkpoint_cost, backend="gloo", nproc_per_node=2,
                                                    all_ranks=True)
    print("checkpoint per rank:", result["checkpoint_per_rank"], flush=True)
    result["stop_check_us_per_iteration"] = launch_function(stop_check_cost, backend="gloo",
                                                            nproc_per_node=2, all_ranks=True)
    print("stop check per iteration (us):", result["stop_check_us_per_iteration"], flush=True)
    result["machine"]["loadavg_after"] = os.getloadavg()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.output)


if __name__ == "__main__":
    main()
