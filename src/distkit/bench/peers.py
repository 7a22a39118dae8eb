"""6. Peers: whole commands side by side, as a learner runs them.

Each contender trains the same task (the kit's default: digits, the kit's CNN, 2 gloo
processes, cores / processes threads each, see :mod:`.contenders.common`) as one
command, started fresh in every round; the contenders take turns in a rotated order,
round by round. From every run: the command's wall time, the time from the command's
start to the end of its first optimizer step, the training throughput (samples per
second over the epochs after the first, validation excluded), and the peak resident
memory of its largest process (``os.wait4``'s ``ru_maxrss``, which covers every process
of the command that was waited for).

Contenders: ``distkit train`` under its own launch (``idist.Parallel`` spawn) and under
torchrun; a hand-written ``torch.distributed`` loop under torchrun (the baseline of the
ratios); plain ignite (``idist.Parallel``); and, when installed (in this interpreter or
in the one ``DISTKIT_PEERS_PYTHON`` names, default ``~/.cache/distkit/peers-venv``), HF
accelerate (``accelerate launch --multi_gpu --num_processes 2``: on a CPU machine that
is what starts 2 gloo processes) and Lightning Fabric (``strategy="ddp"``, 2 CPU
devices). A contender that is not installed is reported as skipped.

Two batch sizes: the default (64 global) and tiny steps (8 samples per process), where
a launcher's own cost per step shows most.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

from distkit.host.facts import free_port

CONTENDERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "contenders")
BASELINE = "hand-written (torchrun)"
COMMAND_TIMEOUT_S = 600


def peers_python() -> str | None:
    """An interpreter that can import accelerate and lightning, or None."""
    if all(importlib.util.find_spec(m) for m in ("accelerate", "lightning")):
        return sys.executable
    candidate = os.environ.get("DISTKIT_PEERS_PYTHON",
                               os.path.expanduser("~/.cache/distkit/peers-venv/bin/python"))
    if os.path.exists(candidate):
        probe = subprocess.run([candidate, "-c", "import accelerate, lightning"],
                               capture_output=True, timeout=120)
        if probe.returncode == 0:
            return candidate
    return None


def _script(name):
    return os.path.join(CONTENDERS_DIR, name)


def contenders(batch_size: int, epochs: int, names=None) -> dict:
    """name -> (argv builder taking (out_dir, port), reader of the run's record), or a
    string saying why the contender is skipped."""
    py = sys.executable
    common = ["--batch-size", str(batch_size), "--epochs", str(epochs)]
    kit = ["train", "--no-progress", "--dataset", "digits", "--model", "cnn", *common]
    torchrun = [py, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    peers = peers_python()
    out = {
        "distkit": (lambda d, port: [py, "-m", "distkit", *kit, "--output-dir", d], _read_kit),
        "distkit (torchrun)": (lambda d, port: [*torchrun, "--master-port", str(port), "-m", "distkit",
                                                *kit, "--output-dir", d], _read_kit),
        BASELINE: (lambda d, port: [*torchrun, "--master-port", str(port), _script("handwritten.py"),
                                    *common, "--out", os.path.join(d, "rank0.json")], _read_record),
        "ignite (idist.Parallel)": (lambda d, port: [py, _script("ignite_plain.py"), *common, "--out",
                                                     os.path.join(d, "rank0.json")], _read_record),
    }
    if peers is None:
        why = ("not installed: pip install accelerate lightning (or point DISTKIT_PEERS_PYTHON at "
               "an interpreter that has them)")
        out["accelerate"] = out["lightning fabric"] = why
    else:
        out["accelerate"] = (lambda d, port: [
            peers, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port), _script("accelerate_loop.py"), *common, "--out",
            os.path.join(d, "rank0.json")], _read_record)
        out["lightning fabric"] = (lambda d, port: [peers, _script("fabric_loop.py"), *common, "--out",
                                                    os.path.join(d, "rank0.json")], _read_record)
    return {k: v for k, v in out.items() if names is None or k in names}


def _read_record(folder) -> dict:
    with open(os.path.join(folder, "rank0.json")) as f:
        return json.load(f)


def _read_kit(folder) -> dict:
    (path,) = glob.glob(os.path.join(folder, "*", "results.json"))
    with open(path) as f:
        r = json.load(f)
    return {"first_step_unix_s": r.get("first_step_unix_s"),
            "epoch_times_s": [h["epoch_time_s"] for h in r["history"]],
            "samples_per_epoch": r["samples_trained"] / max(1, r["epochs_completed"]),
            "final_val_accuracy": r["final"]["val_accuracy"], "world_size": r["world_size"]}


# Started between this process and the command: a small Python that starts the command
# and reports its wait4 rusage. Why not wait4 here: a child forked from this process (which
# holds torch) inherits this process's resident-memory high-water mark until its exec, so
# ru_maxrss would never read less than this process's own size.
_WAIT4 = """import json, os, subprocess, sys, time
start_unix, start = time.time(), time.perf_counter()
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], "wb"))
_, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"start_unix_s": start_unix, "wall_s": time.perf_counter() - start,
                  "returncode": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss}))
"""


def run_command(argv, env, timeout_s=COMMAND_TIMEOUT_S) -> dict:
    """Run one command to its end: wall time, start time, return code, peak RSS (MiB) of
    its largest process (every process of the command that was waited for), the tail of
    its stderr. The clock starts just before the command's own process starts."""
    with tempfile.NamedTemporaryFile(suffix=".stderr") as err:
        proc = subprocess.Popen([sys.executable, "-c", _WAIT4, err.name, *argv], env=env,
                                stdout=subprocess.PIPE, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the whole command: launcher and workers
            out, _ = proc.communicate()
        with open(err.name, "rb") as f:
            tail = f.read()[-2000:].decode(errors="replace")
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"wall_s": None, "start_unix_s": None, "returncode": -9, "peak_rss_mib": None,
                "stderr_tail": tail or "killed after the timeout"}
    return {"wall_s": report["wall_s"], "start_unix_s": report["start_unix_s"],
            "returncode": report["returncode"], "peak_rss_mib": report["maxrss_kib"] / 1024,
            "stderr_tail": tail}


def _env():
    import distkit

    env = dict(os.environ)
    # every launcher with its own default threads (the kit and torchrun set 1 per process)
    env.pop("OMP_NUM_THREADS", None)
    src = os.path.dirname(os.path.dirname(os.path.abspath(distkit.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _failure(run, attempt) -> dict:
    """What a failed attempt leaves in the results: its exit (a signal by name: a
    contender that aborts at exit shows as SIGABRT) and its last lines of stderr."""
    code = run["returncode"]
    exit_ = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 and -code in \
        signal.valid_signals() else f"exit {code}"
    lines = [line for line in run["stderr_tail"].splitlines() if line.strip(" =-")]
    return {"attempt": attempt, "exit": exit_, "returncode": code, "stderr_last_lines": lines[-3:]}


def _one_run(name, build, read, env, attempts=2):
    """One run of one contender, tried up to ``attempts`` times: a failed start is tried
    again on a new port (the free port can be taken by another job between ``free_port``
    and the bind), and so is a run that crashes (a gloo process can abort at exit). Every
    failed attempt is returned in ``failures``; when none succeeded the run's numbers are
    None and the round is left out of that contender's medians and ratios, never the end
    of the benchmark."""
    failures = []
    for attempt in range(1, attempts + 1):
        folder = tempfile.mkdtemp(prefix="distkit-peer-")
        try:
            port = free_port()
            run = run_command(build(folder, port), {**env, "MASTER_PORT": str(port)})
            if run["returncode"] == 0:
                try:
                    record = read(folder)
                    break
                except (OSError, ValueError, KeyError) as e:  # exited 0 without its record
                    run = {**run, "returncode": 0, "stderr_tail": f"{run['stderr_tail']}\nno record: {e!r}"}
            failures.append(_failure(run, attempt))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        return {key: None for key in RUN_KEYS} | {"attempts": attempts, "failures": failures}
    epochs = record["epoch_times_s"]
    steady = epochs[1:] if len(epochs) > 1 else epochs
    first = record.get("first_step_unix_s")
    return {"wall_s": run["wall_s"], "peak_rss_mib": run["peak_rss_mib"],
            "first_step_s": first - run["start_unix_s"] if first else None,
            "samples_per_s": record["samples_per_epoch"] / statistics.median(steady),
            "final_val_accuracy": record["final_val_accuracy"], "attempts": attempt,
            "failures": failures}


RUN_KEYS = ("wall_s", "peak_rss_mib", "first_step_s", "samples_per_s", "final_val_accuracy")


def compare_commands(batch_size: int, epochs: int, rounds: int, warmup: int = 1, names=None,
                     log=print, extra=None) -> dict:
    """Every contender once per round, in a rotated order; ``warmup`` rounds first
    (discarded: the first start of anything pays for cold file caches). ``extra``: more
    contenders, name -> (argv builder, reader, environment overrides), e.g. an older
    version of the kit on its own ``PYTHONPATH``.

    A contender whose every attempt in a round failed has None for that round's numbers
    and the round in its ``failed_rounds``; its medians and its paired ratios and deltas
    come from the rounds where it and the baseline both ran (``rounds_counted``)."""
    table = contenders(batch_size, epochs, names)
    table.update({name: (build, read) for name, (build, read, _) in (extra or {}).items()})
    overrides = {name: env for name, (_, _, env) in (extra or {}).items()}
    runnable = {k: v for k, v in table.items() if not isinstance(v, str)}
    order = list(runnable)
    env = _env()
    runs = {name: [] for name in order}
    failures = {name: [] for name in order}
    for r in range(warmup + rounds):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            result = _one_run(name, *runnable[name], {**env, **overrides.get(name, {})})
            for f in result.pop("failures"):
                failures[name].append({"round": r + 1, "warm_up": r < warmup, **f})
                log(f"    {name}: round {r + 1}, attempt {f['attempt']} failed ({f['exit']}): "
                    f"{' / '.join(f['stderr_last_lines'])}")
            if r >= warmup:
                runs[name].append(result)
        log(f"    round {r + 1}/{warmup + rounds} done"
            + (" (warm-up)" if r < warmup else ""))
    out = {"batch_size": batch_size, "per_process_batch": batch_size // 2, "epochs": epochs,
           "rounds": rounds, "baseline": BASELINE if BASELINE in runs else None,
           "skipped": {k: v for k, v in table.items() if isinstance(v, str)}, "contenders": {}}
    for name, rs in runs.items():
        entry = {key: [x[key] for x in rs] for key in (*RUN_KEYS, "attempts")}
        entry["median"] = {key: statistics.median(v for v in entry[key] if v is not None)
                           for key in RUN_KEYS if any(v is not None for v in entry[key])}
        entry["failures"] = failures[name]
        entry["failed_rounds"] = [i + 1 for i, x in enumerate(rs) if x["samples_per_s"] is None]
        out["contenders"][name] = entry
    base = out["baseline"]
    if base:
        b = runs[base]
        for name, rs in runs.items():
            c = out["contenders"][name]
            # paired, round by round: the two commands of a round ran back to back
            both = [(x, y) for x, y in zip(rs, b) if x["samples_per_s"] and y["samples_per_s"]]
            c["rounds_counted"] = len(both)
            c["throughput_ratio"] = statistics.median(
                x["samples_per_s"] / y["samples_per_s"] for x, y in both) if both else None
            c["first_step_delta_s"] = _paired_delta(both, "first_step_s")
            c["wall_delta_s"] = _paired_delta(both, "wall_s")
    return out


def _paired_delta(both, key):
    pairs = [x[key] - y[key] for x, y in both if x[key] is not None and y[key] is not None]
    return statistics.median(pairs) if pairs else None


def measure_peers(settings, log=print) -> dict:
    """The default batch with every contender (unless ``settings.peer_default_batch`` is
    False: quick mode); tiny steps (8 samples per process) with the kit under its own
    launch and under torchrun, and plain ignite and the hand-written loop."""
    from distkit.bench.method import load_average

    before = load_average()
    results = {}
    if settings.peer_default_batch:
        results["default_batch"] = compare_commands(64, settings.peer_epochs, settings.peer_rounds,
                                                    settings.peer_warmup, names=settings.peer_names,
                                                    log=log)
    tiny_names = settings.peer_tiny_names or ("distkit", "distkit (torchrun)", BASELINE,
                                              "ignite (idist.Parallel)")
    tiny = compare_commands(16, settings.peer_epochs, settings.peer_rounds, settings.peer_warmup,
                            names=tiny_names, log=log)
    if "distkit (torchrun)" in tiny["contenders"]:  # not in quick mode
        own, torchrun = (tiny["contenders"][k]["samples_per_s"] for k in ("distkit", "distkit (torchrun)"))
        paired = [a / b for a, b in zip(own, torchrun) if a and b]
        tiny["default_launch_vs_torchrun"] = statistics.median(paired) if paired else None
    return {**results, "tiny_steps": tiny,
            "load_average": {"start": before, "end": load_average()},
            "note": "commands started fresh every round; the machine's other jobs share its cores"}
