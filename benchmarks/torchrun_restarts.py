"""torchrun restarts, many in a row (issue 30): ``torchrun --max-restarts=2`` with a worker
SIGKILLed twice per run (rank 1 once a checkpoint exists, then rank 0 once the restarted
group has written a newer one), ``--rounds`` runs in a row. Each run must end with exit 0,
say at each restart which checkpoint it continues from (the newest one when the worker
was killed), and end bit-identical to a run never interrupted; none may hang (a run
gets ``--limit`` seconds). Too long for CI (about a minute a run on 2 cores); the test
suite keeps one restart (tests/train/test_preemption.py).

    python benchmarks/torchrun_restarts.py --rounds 10                 # torchrun's default store
    python benchmarks/torchrun_restarts.py --rounds 10 --no-shared-store   # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

Writes ``benchmarks/results/torchrun-restarts-<store>.json``: every run's outcome, the
machine, the load average before and after, the versions and the date.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the invariant's helpers and the course task

from test_preemption import COMMON, COURSE, assert_same, env, newest_results, outcome  # noqa: E402

from distkit.lessons.failure import worker_pids  # noqa: E402

STEP_SLEEP = ["--set", "step_sleep=0.1"]  # steps long enough for two kills in one run


def newest_iteration(runs: Path) -> tuple[int, str | None]:
    best = (-1, None)
    for path in runs.glob("*/checkpoints/training_checkpoint_*.pt"):
        if not Path(str(path) + ".sha256").exists():  # not finished yet
            continue
        m = re.search(r"_(\d+)\.pt$", path.name)
        if m and int(m.group(1)) > best[0]:
            best = (int(m.group(1)), str(path))
    return best


def wait_until(check, proc, deadline, what):
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within the limit")
        time.sleep(0.05)


def one_run(folder: Path, shared_store: bool, limit: float) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--max-restarts", "2", "-m", "distkit", "train", *COURSE, *STEP_SLEEP,
           "--output-dir", "runs", *COMMON]
    run_env = env()
    if not shared_store:
        run_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    runs = folder / "runs"
    started = time.monotonic()
    deadline = started + limit
    proc = subprocess.Popen(cmd, cwd=folder, env=run_env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    out, kills = "", []
    try:
        for victim in (1, 0):
            wait_until(lambda: newest_iteration(runs)[0] > (kills[-1]["iteration"] if kills else 0),
                       proc, deadline, f"checkpoint before kill {len(kills) + 1}")
            pids = {}
            wait_until(lambda: len(pids.update(worker_pids(proc.pid)) or pids) >= 2 and
                       all(p not in [k["pid"] for k in kills] for p in pids.values()),
                       proc, deadline, "restarted workers")
            iteration, path = newest_iteration(runs)
            os.kill(pids[victim], signal.SIGKILL)
            kills.append({"rank": victim, "pid": pids[victim], "iteration": iteration,
                          "newest": os.path.relpath(path, folder), "at_s": time.monotonic() - started})
            pids.clear()
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        hung = False
    except (subprocess.TimeoutExpired, TimeoutError) as e:
        hung, out = True, f"{out}\n{e}"
    except RuntimeError as e:  # it ended early: keep what it said
        hung, out = False, f"{e}\n" + (proc.communicate()[0] or "")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            out += proc.communicate()[0] or ""
    result = {"exit": proc.returncode, "hung": hung, "seconds": round(time.monotonic() - started, 1),
              "kills": kills}
    said = [ln for ln in out.splitlines() if "TORCHELASTIC_RESTART_COUNT=" in ln]
    result["restart_lines"] = said
    def resumed_at(line):  # the iteration of the checkpoint the restart names
        m = re.search(r"training_checkpoint_(\d+)\.pt", line)
        return int(m.group(1)) if m else -1

    # the newest when the worker was killed, or one written after it (the killed rank's
    # peer may finish a save in between)
    result["continued_from_newest"] = len(said) == len(kills) and all(
        f"TORCHELASTIC_RESTART_COUNT={n + 1})" in line and resumed_at(line) >= kill["iteration"]
        for n, (kill, line) in enumerate(zip(kills, said)))
    try:
        assert_same(outcome(newest_results(runs)), REFERENCE)
        result["bit_identical"] = True
    except (AssertionError, Exception) as e:  # noqa: BLE001 (no results.json is a failure too)
        result["bit_identical"] = False
        result["why_not"] = f"{type(e).__name__}: {e}"[:300]
    result["ok"] = (result["exit"] == 0 and not hung and result["bit_identical"]
                    and result["continued_from_newest"])
    if not result["ok"]:
        result["output_tail"] = out[-3000:]
    return result


REFERENCE: dict = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--limit", type=float, default=300, help="seconds a run may take")
    parser.add_argument("--no-shared-store", action="store_true",
                        help="launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    parser.add_argument("--note", default="")
    parser.add_argument("--output")
    args = parser.parse_args()
    store = "own-store-per-attempt" if args.no_shared_store else "shared-store"
    output = Path(args.output or HERE / "results" / f"torchrun-restarts-{store}.json")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="distkit-restarts-") as tmp:
        whole = Path(tmp) / "whole"
        whole.mkdir()
        done = subprocess.run([sys.executable, "-m", "distkit", "train", "--nproc-per-node", "2",
                               *COURSE, "--output-dir", "runs", *COMMON], cwd=whole, env=env(),
                              text=True, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        REFERENCE.update(outcome(newest_results(whole / "runs")))
        runs = []
        for n in range(args.rounds):
            folder = Path(tmp) / f"run{n}"
            folder.mkdir()
            result = one_run(folder, not args.no_shared_store, args.limit)
            runs.append(result)
            print(f"run {n + 1}/{args.rounds}: {'ok' if result['ok'] else 'FAILED'} "
                  f"(exit {result['exit']}, {result['seconds']} s, kills at iterations "
                  f"{[k['iteration'] for k in result['kills']]}, bit-identical "
                  f"{result['bit_identical']})", flush=True)
    import ignite
    import torch

    record = {
        "what": "torchrun --standalone --nproc_per_node 2 --max-restarts 2 -m distkit train "
                "(tests/preemption_course.py, step_sleep=0.1); rank 1 SIGKILLed after a "
                "checkpoint, then rank 0 after a newer one; compared with an uninterrupted spawn run",
        "store": store, "rounds": args.rounds, "passed": sum(r["ok"] for r in runs),
        "in_a_row": next((i for i, r in enumerate(runs) if not r["ok"]), len(runs)),
        "runs": runs, "note": args.note,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cores": os.cpu_count(),
                    "load_before": load_before, "load_after": os.getloadavg()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "ignite": ignite.__version__},
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{record['passed']}/{args.rounds} passed ({record['in_a_row']} in a row); {output}")
    sys.exit(0 if record["passed"] == args.rounds else 1)


if __name__ == "__main__":
    main()
