"""The whole run: every measurement asked for, in turn, with the machine and versions
recorded beside the numbers; JSON and chart written atomically."""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import asdict
from datetime import datetime

from distkit.bench import MEASUREMENTS
from distkit.bench.method import MODES, TARGETS, load_average, machine
from distkit.host.files import whole, write_json
from distkit.errors import DistkitError
from distkit.observe.reporting import versions

def run_benchmarks(mode: str = "quick", output_dir: str | None = "benchmarks/results",
                   only=MEASUREMENTS, note: str = "", threads: int | None = None,
                   log=print) -> dict:
    """Run the measurements of ``mode`` (tiny, quick, full); write
    ``bench-<mode>.json`` and ``bench-<mode>.png`` under ``output_dir`` (unless None);
    return the results. ``threads``: torch threads of the 1-process measurements
    (overhead, data); default: all cores, the kit's rule for one process."""
    if mode not in MODES:
        raise DistkitError(f"unknown benchmark mode {mode!r}: use one of {', '.join(MODES)}")
    if threads is not None and threads < 1:
        raise DistkitError(f"--threads must be >= 1, got {threads}")
    unknown = set(only) - set(MEASUREMENTS)
    if unknown:
        raise DistkitError(f"unknown measurement {', '.join(sorted(unknown))}: choose from "
                           f"{', '.join(MEASUREMENTS)}")
    if output_dir is not None:
        _check_output_dir(output_dir)  # fail now, not after minutes of measuring
    settings = MODES[mode]
    started, t0 = datetime.now().isoformat(timespec="seconds"), time.perf_counter()
    results = {"mode": mode, "started": started, "note": note, "machine": machine(),
               "versions": versions(), "settings": asdict(settings), "targets": TARGETS,
               "method": "warm-up runs discarded; sides interleaved in rotated order each round; "
                         "median samples/s over rounds; ratio = kit median / hand-written median"}
    previous_disable = logging.root.manager.disable
    logging.disable(logging.INFO)  # ignite logs every auto_dataloader at INFO
    try:
        if "overhead" in only:
            with _phase(results, "overhead", log, "1/7 overhead: kit vs hand-written loop, 1 process"):
                from distkit.bench.overhead import measure_overhead

                results["overhead"] = measure_overhead(settings, threads)
        if "ddp" in only or "scaling" in only:
            tasks = [t for t in ("ddp", "scaling") if t in only]
            with _phase(results, "processes", log,
                        f"2-3/7 {' and '.join(tasks)}: a pool of gloo processes"):
                from distkit.bench.processes import measure_processes

                procs = measure_processes(settings, tasks)
            for t in tasks:
                results[t] = procs.pop(t)
            results["pool"] = procs
        if "data" in only:
            with _phase(results, "data", log, "4/7 data pipeline: loader vs compute"):
                from distkit.bench.data import measure_data

                results["data"] = measure_data(settings, threads)
        if "gpu" in only:
            with _phase(results, "gpu", log, "5/7 gpu"):
                from distkit.bench.gpu import measure_gpu

                results["gpu"] = measure_gpu(settings)
        if "peers" in only:
            with _phase(results, "peers", log, "6/7 peers: whole commands, round by round"):
                from distkit.bench.peers import measure_peers

                results["peers"] = measure_peers(settings, log=log)
        if "hangs" in only:
            with _phase(results, "hangs", log, "7/7 hang records: Flight Recorder and watcher, per step"):
                from distkit.bench.hangs import measure_hangs

                results["hangs"] = measure_hangs(settings)
    finally:
        logging.disable(previous_disable)
    results["machine"]["load_average_end"] = load_average()
    results["duration_s"] = time.perf_counter() - t0
    if output_dir is not None:
        results["files"] = write_outputs(results, output_dir)
    return results


@contextlib.contextmanager
def _phase(results, name, log, what):
    log(f"{what} ...")
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    results.setdefault("phase_seconds", {})[name] = round(seconds, 1)
    log(f"    ({seconds:.0f} s)")


def _check_output_dir(output_dir: str) -> None:
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise DistkitError(f"cannot create --output {output_dir!r} ({e.strerror}): pass a "
                           "writable folder") from None
    if not os.access(output_dir, os.W_OK):
        raise DistkitError(f"--output {output_dir!r} is not writable: pass a writable folder")


def write_outputs(results: dict, output_dir: str) -> dict:
    """``bench-<mode>.json`` and ``bench-<mode>.png``, each written to a temporary file
    first and then renamed, so a reader never sees half a file."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from distkit.observe.plots import benchmark_chart

    _check_output_dir(output_dir)
    base = os.path.join(output_dir, f"bench-{results['mode']}")
    files = {"json": base + ".json", "png": base + ".png"}
    fig = benchmark_chart(results)
    try:
        with whole(files["png"]) as partial:
            fig.savefig(partial, dpi=110, format="png")
    finally:
        plt.close(fig)
    write_json(files["json"], {**results, "files": files}, dump={"indent": 2, "default": str})
    return files

