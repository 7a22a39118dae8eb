"""7. The hang records: what the hang doctor keeps on in every run the kit starts costs
per step. Two parts: torch's Flight Recorder (torch's own default, which the kit leaves
on) and the kit's watcher thread (:func:`distkit.observe.hang_records.arm`, one per
rank, a ``stat`` every 0.1 s). 2 gloo ranks, 1 torch thread each, the kit's MLP and step
(``create_trainer``, DDP), 32 samples per rank.

- **The Flight Recorder** cannot be turned off for one group only: gloo records into the
  process's one recorder, whose size ``TORCH_FR_BUFFER_SIZE`` sets when the first group
  is made (0: off); a second group made with the variable at 0 still records every
  collective. So each round starts the ranks twice, recorder off and on, in rotated
  order (off on, on off, ...), and a whole-step cost is the median over rounds of the
  round's paired difference.
- **The watcher** is measured inside each process: blocks with one MORE watcher armed
  (stopped after the block, outside the timing) alternate with blocks without it
  (plain, watcher, watcher, plain, ...), so its cost is a paired difference in the same
  process.
- Whole steps on a loaded machine move by more than either effect, so the verdict is
  built from the pieces, each on CPU time (the process, all its threads), which moves
  far less than wall time when other jobs hold the cores: the recorder's CPU per
  collective (all_reduce of float32[1000] in a group of one rank: no peer to wait for),
  times the entries one step records (counted in the recorder); plus the watcher's CPU
  per poll (one armed with a 1 ms poll while the main thread sleeps), times the kit's 10
  polls a second over the step's wall time. That sum over the step's CPU time (and over
  its wall time) is the cost held to ``TARGETS["hangs"]``.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

from distkit.bench.method import TARGETS, Settings

POLLS_PER_S = 10  # the kit's watcher polls every 0.1 s (arm's default)
SIDES = ("off", "on")  # TORCH_FR_BUFFER_SIZE 0, and on


def _block(fn, n):
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def _recorded() -> int:
    import torch._C._distributed_c10d as c10d

    return len(json.loads(c10d._dump_fr_trace_json()).get("entries", []))


def _extra_watcher(rank):
    """Arm one more watcher; returns its stop (called outside the timing)."""
    from distkit.observe.hang_records import REQUEST, arm

    folder = tempfile.mkdtemp()
    thread = arm(folder, rank)

    def stop():
        open(os.path.join(folder, REQUEST), "w").close()
        thread.join()
        shutil.rmtree(folder, ignore_errors=True)
    return stop


def _kit_step(steps):
    import ignite.distributed as idist
    import torch

    from distkit.builtin.models import MLP
    from distkit.config import Config
    from distkit.train.training import create_trainer

    torch.manual_seed(0)
    model = idist.auto_model(MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = create_trainer(model, optimizer, torch.nn.CrossEntropyLoss(), Config())
    return trainer, [(torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))] * steps


def _alone_cpu(calls, blocks):
    """CPU seconds per all_reduce of float32[1000] in a group of this rank alone: the
    recorder's work is a larger share of the call, and no peer's delay enters it."""
    import torch
    import torch.distributed as dist

    alone, _ = dist.new_subgroups(group_size=1)
    small = torch.ones(1000)
    _block(lambda: dist.all_reduce(small, group=alone), calls)  # warm-up
    return [_block(lambda: dist.all_reduce(small, group=alone), calls)[1] for _ in range(blocks)]


def watcher_poll_cpu(polls):
    """CPU seconds of one poll of the kit's watcher (a stat of the request file, a
    sleep's wake-up, the GIL taken and given back), on a watcher armed with a 1 ms poll
    while this thread sleeps."""
    from distkit.observe.hang_records import REQUEST, arm

    folder = tempfile.mkdtemp()
    idle = time.process_time()
    time.sleep(polls * 0.001)
    idle = time.process_time() - idle
    cpu, start = time.process_time(), time.perf_counter()
    thread = arm(folder, 0, poll_s=0.001)
    time.sleep(polls * 0.001)
    armed, wall = time.process_time() - cpu, time.perf_counter() - start
    open(os.path.join(folder, REQUEST), "w").close()
    thread.join()
    shutil.rmtree(folder, ignore_errors=True)
    # polls made, at most: a busy core wakes the thread late; a negative difference is
    # noise, and 0 in its place only errs towards a larger cost
    return max(armed - idle, 0.0) / (wall / 0.001)


def _ranks(local_rank, steps, blocks, polls):
    """One launch: the kit's step in blocks with and without one more watcher, then the
    pieces (rank 0 also times the watcher's poll)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = dist.get_rank()
    trainer, data = _kit_step(steps)
    before = _recorded()
    trainer.run(data, max_epochs=1)  # warm-up; what one step records (0 with the recorder off)
    per_step = (_recorded() - before) / steps
    rows = []
    for b in range(2 * blocks):
        watcher = (b % 4) in (1, 2)
        stop = _extra_watcher(rank) if watcher else None
        dist.barrier()
        wall, cpu = _block(lambda: trainer.run(data, max_epochs=1), 1)
        rows.append({"watcher": watcher, "step_wall_s": wall / steps, "step_cpu_s": cpu / steps})
        if stop:
            stop()
    alone = _alone_cpu(10 * steps, blocks)
    dist.barrier()
    poll = watcher_poll_cpu(polls) if rank == 0 else None
    return {"rows": rows, "entries_per_step": per_step, "recorded_entries": _recorded(),
            "alone_cpu_s": alone, "watcher_poll_cpu_s": poll}


def _launch(side, settings):
    from distkit.launch.runner import run_per_rank

    before = os.environ.get("TORCH_FR_BUFFER_SIZE")
    os.environ["TORCH_FR_BUFFER_SIZE"] = "0" if side == "off" else "2000"
    try:
        return run_per_rank(_ranks, 2, "gloo", settings.hang_steps, settings.hang_blocks,
                            settings.hang_polls, timeout_s=600)[0]
    finally:
        if before is None:
            del os.environ["TORCH_FR_BUFFER_SIZE"]
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = before


def _median_of(rows, what, watcher=False):
    return statistics.median(r[what] for r in rows if r["watcher"] == watcher)


def _spread(values):
    return {"median": statistics.median(values),
            "quartiles": statistics.quantiles(values, n=4) if len(values) > 1 else None}


def whole_steps(rounds) -> dict:
    """The whole-step comparisons, rank 0, as fractions of the recorder-off step: the
    recorder by processes off and on (the round's pair), the watcher by blocks (each
    extra-watcher block against the plain block beside it, both sides' processes)."""
    out = {}
    for what in ("step_cpu_s", "step_wall_s"):
        off = [_median_of(r["off"]["rows"], what) for r in rounds]
        on = [_median_of(r["on"]["rows"], what) for r in rounds]
        pairs = []
        for r in rounds:
            for side in SIDES:
                rows = r[side]["rows"]
                for a, b in zip(rows[::2], rows[1::2]):
                    w, p = (b, a) if b["watcher"] else (a, b)
                    pairs.append(w[what] - p[what])
        out[what] = {"recorder_off_s": statistics.median(off),
                     "recorder": _spread([b / a - 1 for a, b in zip(off, on)]),
                     "watcher": _spread([d / statistics.median(off) for d in pairs])}
    return out


def pieces(rounds) -> dict:
    """The cost per step from its pieces, over the recorder-off step's CPU and wall time."""
    alone = [{side: statistics.median(r[side]["alone_cpu_s"]) for side in SIDES} for r in rounds]
    entry = statistics.median(a["on"] - a["off"] for a in alone)  # the round's pair
    entries = statistics.median(r["on"]["entries_per_step"] for r in rounds)
    poll = statistics.median(r[side]["watcher_poll_cpu_s"] for r in rounds for side in SIDES)
    step_cpu = statistics.median(_median_of(r["off"]["rows"], "step_cpu_s") for r in rounds)
    step_wall = statistics.median(_median_of(r["off"]["rows"], "step_wall_s") for r in rounds)
    recorder_s = entries * entry
    watcher_s = POLLS_PER_S * step_wall * poll
    return {"recorder_cpu_us_per_entry": 1e6 * entry, "entries_per_step": entries,
            "watcher_cpu_us_per_poll": 1e6 * poll, "polls_per_s": POLLS_PER_S,
            "step_cpu_us": 1e6 * step_cpu, "step_wall_us": 1e6 * step_wall,
            "recorder_us_per_step": 1e6 * recorder_s, "watcher_us_per_step": 1e6 * watcher_s,
            "cpu_fraction": (recorder_s + watcher_s) / step_cpu,
            "wall_fraction": (recorder_s + watcher_s) / step_wall}


def measure_hangs(settings: Settings) -> dict:
    """``hang_rounds`` rounds of two launches (recorder off and on, rotated); rank 0's
    numbers. ``cost``: the pieces' CPU per step over the step's CPU time."""
    import torch._C._distributed_c10d as c10d

    if not hasattr(c10d, "_dump_fr_trace_json"):
        return {"skipped": "this torch has no Flight Recorder dump (_dump_fr_trace_json)"}
    rounds = []
    for r in range(settings.hang_rounds):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        rounds.append({side: _launch(side, settings) for side in order})
    est = pieces(rounds)
    target = TARGETS["hangs"]
    return {"model": "mlp, 32 samples per rank", "world_size": 2, "backend": "gloo", "threads": 1,
            "steps_per_block": settings.hang_steps, "blocks_per_side": settings.hang_blocks,
            "rounds": rounds, "pieces": est, "whole_steps": whole_steps(rounds),
            "cost": est["cpu_fraction"], "wall_cost": est["wall_fraction"],
            "target_cost": target, "within_target": est["cpu_fraction"] <= target}
