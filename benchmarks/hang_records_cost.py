"""What the hang records cost per step: torch's Flight Recorder and the kit's watcher
thread (:func:`distkit.observe.hang_records.arm`), the two parts of the hang doctor that
are on in every run the kit starts. 2 gloo ranks, 1 torch thread each (the launcher pins
each rank's threads to its share of the cores), the kit's MLP and step (``create_trainer``,
DDP), 32 samples per rank; also one all_reduce of float32[1000].

- **The Flight Recorder** cannot be turned off for one group only: gloo records into the
  process's one recorder, whose size ``TORCH_FR_BUFFER_SIZE`` sets when the first group is
  made (0: off). Tried: a second group made with the variable at 0 still recorded every
  collective (the run prints the entries per group). So each round starts the ranks twice,
  recorder off and on, in rotated order, and the cost is the median over rounds of the
  round's difference (on - off).
- **The watcher** is measured inside each process: the kit arms one per rank; blocks with
  one MORE watcher armed (stopped after the block, outside the timing) alternate with
  blocks without it, so its cost is a paired difference in the same process.
- Wall and CPU time (the process, all its threads) per step. On a loaded machine CPU time
  is the number to read: wall time there is mostly waiting for a core.
- Then the pieces, which a loaded machine resolves where whole steps do not: the
  recorder's CPU per all_reduce on ONE rank (no peer to wait for; again processes off and
  on in rotated rounds), times the entries one step records (counted), over the step's CPU;
  and the watcher's CPU per poll (armed with a 1 ms poll while the main thread sleeps),
  times its 10 polls a second.

    python benchmarks/hang_records_cost.py [rounds] [steps per block] [blocks per side]
"""
import json
import os
import statistics
import sys
import tempfile
import time


def _block(fn, n):
    cpu, start = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def _recorded() -> int:
    import torch._C._distributed_c10d as c10d

    return len(json.loads(c10d._dump_fr_trace_json()).get("entries", []))


def _extra_watcher(rank):
    """Arm one more watcher; returns its stop (outside the timing)."""
    from distkit.observe.hang_records import REQUEST, arm

    folder = tempfile.mkdtemp()
    thread = arm(folder, rank)

    def stop():
        open(os.path.join(folder, REQUEST), "w").close()
        thread.join()
    return stop


def measure(local_rank, steps, blocks):
    import torch
    import torch.distributed as dist

    from distkit import Config
    from distkit.builtin.models import MLP
    from distkit.train.training import create_trainer

    import ignite.distributed as idist

    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = idist.auto_model(MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = create_trainer(model, optimizer, torch.nn.CrossEntropyLoss(), Config())
    data = [(torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,)))] * steps
    small = torch.ones(1000)
    before = _recorded()
    trainer.run(data, max_epochs=1)  # warm-up; what one step records (0 with the recorder off)
    per_step = (_recorded() - before) / steps
    dist.all_reduce(small)
    rows = []
    for b in range(2 * blocks):  # plain, watcher, watcher, plain, ...: rotated pairs
        watcher = (b % 4) in (1, 2)
        stop = _extra_watcher(rank) if watcher else None
        dist.barrier()
        wall, cpu = _block(lambda: trainer.run(data, max_epochs=1), 1)
        ar_wall, ar_cpu = _block(lambda: dist.all_reduce(small), 10 * steps)
        rows.append({"watcher": watcher, "step_wall": wall / steps, "step_cpu": cpu / steps,
                     "ar_wall": ar_wall, "ar_cpu": ar_cpu})
        if stop:
            stop()
    return {"rows": rows, "recorded_entries": _recorded(), "entries_per_step": per_step}


def measure_alone(local_rank, calls, blocks):
    """One rank: CPU time per all_reduce of float32[1000] with nobody to wait for, so the
    recorder's work is a larger share of the call and no peer's delay enters it."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    small = torch.ones(1000)
    _block(lambda: dist.all_reduce(small), calls)  # warm-up
    return [_block(lambda: dist.all_reduce(small), calls)[1] for _ in range(blocks)]


def watcher_poll_cpu(polls=2000):
    """CPU seconds of one poll of the kit's watcher (a stat of the request file, a sleep's
    wake-up, the GIL taken and given back), measured on a watcher armed with a 1 ms poll
    while this thread sleeps; the kit polls every 0.1 s."""
    from distkit.observe.hang_records import REQUEST, arm

    folder = tempfile.mkdtemp()
    idle_cpu, start = time.process_time(), time.perf_counter()
    time.sleep(polls * 0.001)
    idle = time.process_time() - idle_cpu
    cpu, start = time.process_time(), time.perf_counter()
    thread = arm(folder, 0, poll_s=0.001)
    time.sleep(polls * 0.001)
    armed, wall = time.process_time() - cpu, time.perf_counter() - start
    open(os.path.join(folder, REQUEST), "w").close()
    thread.join()
    done = wall / 0.001  # polls made, at most (a loaded machine wakes the thread late)
    return {"cpu_per_poll_us": 1e6 * (armed - idle) / done, "polls_at_most": round(done)}


WHATS = ("step_wall", "step_cpu", "ar_wall", "ar_cpu")


def _median(rows, what, watcher):
    return statistics.median(r[what] for r in rows if r["watcher"] == watcher)


def summarize(rounds) -> dict:
    """``rounds``: per round ``{"off": rank 0's result, "on": ...}``."""
    out = {}
    for what in WHATS:
        off = [_median(r["off"]["rows"], what, False) for r in rounds]
        on = [_median(r["on"]["rows"], what, False) for r in rounds]
        pairs = []  # the watcher's: each extra-watcher block minus the plain block beside it
        for r in rounds:
            for side in ("off", "on"):
                rows = r[side]["rows"]
                for a, b in zip(rows[::2], rows[1::2]):  # (plain, watcher) or (watcher, plain)
                    w, p = (b, a) if b["watcher"] else (a, b)
                    pairs.append(w[what] - p[what])
        watcher = pairs
        out[what] = {"recorder_off_us": round(1e6 * statistics.median(off), 1),
                     "recorder_extra_us": round(1e6 * statistics.median(b - a for a, b in zip(off, on)), 1),
                     "recorder_extra_pct": round(100 * statistics.median(b / a - 1 for a, b in zip(off, on)), 2),
                     "recorder_pct_quartiles": [round(100 * q, 1) for q in
                                                statistics.quantiles([b / a - 1 for a, b in zip(off, on)], n=4)],
                     "watcher_extra_us": round(1e6 * statistics.median(watcher), 2),
                     "watcher_extra_pct": round(100 * statistics.median(watcher) / statistics.median(off), 3)}
    return out


def main():
    from distkit.launch.runner import run_per_rank

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    os.environ["OMP_NUM_THREADS"] = "1"
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg(),
          os.cpu_count(), "cores;", f"{rounds} rounds, blocks of {steps} steps, {blocks} per side",
          flush=True)
    results = []
    for r in range(rounds):
        got = {}
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            os.environ["TORCH_FR_BUFFER_SIZE"] = "0" if side == "off" else "2000"
            got[side] = run_per_rank(measure, 2, "gloo", steps, blocks, timeout_s=600)[0]
        results.append(got)
        print(f"round {r + 1}: recorder entries off/on:", got["off"]["recorded_entries"],
              got["on"]["recorded_entries"], "load", os.getloadavg()[0], flush=True)
    summary = summarize(results)
    print("rank 0:", json.dumps(summary, indent=1))
    per_step = statistics.median(r["on"]["entries_per_step"] for r in results)
    alone = []
    for r in range(rounds):  # one rank, recorder off and on, rotated
        got = {}
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            os.environ["TORCH_FR_BUFFER_SIZE"] = "0" if side == "off" else "2000"
            got[side] = statistics.median(run_per_rank(measure_alone, 1, "gloo", 20 * steps, blocks)[0])
        alone.append(got)
    extra = statistics.median(a["on"] - a["off"] for a in alone)
    print("one rank, CPU us per all_reduce float32[1000]: recorder off",
          round(1e6 * statistics.median(a["off"] for a in alone), 2), "on",
          round(1e6 * statistics.median(a["on"] for a in alone), 2), "median paired extra",
          round(1e6 * extra, 2), "quartiles", [round(1e6 * q, 2) for q in statistics.quantiles(
              [a["on"] - a["off"] for a in alone], n=4)])
    step_cpu = summary["step_cpu"]["recorder_off_us"]
    print(f"recorder entries per step (the kit's MLP step under DDP): {per_step:g}; their CPU, "
          f"{per_step:g} x {1e6 * extra:.2f} us = {per_step * 1e6 * extra:.1f} us, is "
          f"{100 * per_step * 1e6 * extra / step_cpu:.2f} % of the step's {step_cpu:g} us of CPU")
    poll = watcher_poll_cpu()
    print(f"watcher: {poll['cpu_per_poll_us']:.1f} us of CPU per poll ({poll['polls_at_most']} polls at "
          f"most), 10 polls a second: {100 * 10 * poll['cpu_per_poll_us'] / 1e6:.4f} % of one core")
    print("load after", os.getloadavg())


if __name__ == "__main__":
    main()
