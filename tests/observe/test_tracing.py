"""``distkit train --trace``: torch.profiler on every rank of a real 2-process run, the
ranks' traces merged into one Chrome trace (one process row per rank, clocks aligned),
drawn, and named in results.json; under ddp, fsdp and the GPT. Also the merge and the
interval arithmetic on traces built by hand, where the answer is known."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from distkit.observe import tracing

PHASES_OF_THE_KITS_STEP = ("data wait", "forward", "backward", "optimizer step")


@pytest.fixture(scope="module")
def traced_runs(tmp_path_factory):
    """Three tiny traced runs on 2 gloo ranks, run once for every test below."""
    import subprocess
    import sys

    from support import subprocess_env

    out = tmp_path_factory.mktemp("traced")
    runs = {
        # 3 steps per epoch: the recorded steps 4-6 span an epoch's end, so validation shows
        "ddp": ["--dataset", "synthetic", "--dataset-size", "256", "--batch-size", "64",
                "--model", "mlp", "--epochs", "3"],
        "fsdp": ["--dataset", "synthetic", "--dataset-size", "256", "--batch-size", "64",
                 "--model", "mlp", "--epochs", "1", "--max-iters", "3", "--strategy", "fsdp"],
        "gpt": ["--dataset", "text", "--model", "gpt", "--max-iters", "6"],
    }
    found = {}
    for name, args in runs.items():
        done = subprocess.run(
            [sys.executable, "-m", "distkit", "train", "--trace", "--nproc-per-node", "2",
             "--no-progress", "--output-dir", str(out / name), *args],
            cwd=out, env=subprocess_env(), capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, (name, done.stderr[-3000:])
        (run_dir,) = (out / name).iterdir()
        found[name] = json.loads((run_dir / "results.json").read_text())
        found[name]["stdout"] = done.stdout
    return found


def _names(trace, rank):
    return {e.get("name") for e in trace["traceEvents"] if e.get("pid") == rank}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("run", ["ddp", "fsdp", "gpt"])
def test_merged_trace_has_one_row_per_rank_with_its_collectives_and_phases(traced_runs, run):
    results = traced_runs[run]
    paths = results["trace"]
    assert {"merged", "per_rank", "png"} <= set(paths)
    assert f"trace of every rank: {paths['merged']}" in results["stdout"]  # the summary says where
    assert len(paths["per_rank"]) == 2 and all(Path(p).is_file() for p in paths["per_rank"])
    trace = json.loads(Path(paths["merged"]).read_text())  # valid JSON, Chrome trace format
    events = trace["traceEvents"]
    assert all({"ph", "name"} <= set(e) for e in events)
    assert all(isinstance(e["ts"], (int, float)) and e.get("dur", 0) >= 0
               for e in events if e["ph"] == "X")
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "process_name"}
    assert rows == {0: "rank 0", 1: "rank 1"}  # one process row per rank, nothing else
    assert {e["pid"] for e in events} == {0, 1}
    kind = {"ddp": "all_reduce", "fsdp": "all_gather", "gpt": "all_reduce"}[run]
    for rank in (0, 1):
        names = _names(trace, rank)
        assert any(tracing.is_collective(n) and kind in n for n in names), (run, rank, sorted(names))
        assert set(PHASES_OF_THE_KITS_STEP) <= names, (run, rank)
        # bounded: only the active steps (a 3-step run records 2 after its warm-up step)
        assert len(tracing.steps(trace, rank)) == tracing.schedule_for(results["iterations"])[2]
    if run == "fsdp":
        for rank in (0, 1):
            backward = tracing.spans(trace, rank, "backward")
            forward = tracing.spans(trace, rank, "forward")
            # gradients reduce-scattered in the backward (gloo runs it as an all-reduce) ...
            asked = tracing.spans(trace, rank, "c10d::_reduce_scatter_base_")
            assert asked and tracing.overlap(asked, backward) == tracing.total(asked)
            assert tracing.overlap(tracing.collective_spans(trace, rank, "all_reduce"), backward) > 0
            # ... parameters all-gathered in the forward, before each unit computes
            assert tracing.overlap(tracing.collective_spans(trace, rank, "all_gather"), forward) > 0
    if run == "ddp":
        assert all("validation" in _names(trace, r) for r in (0, 1))
    # the clocks: rank 0 is the reference; rank 1's offset is bounded by a measured error
    clock = paths["clock"]
    assert clock["offset_us"][0] == 0 and clock["error_us"][1] is not None
    assert 0 <= clock["error_us"][1] < 50_000
    # on one host the ranks share one clock: the offset found is the method's own error
    assert abs(clock["offset_us"][1]) <= clock["error_us"][1] + 1.0
    # the drawing: a PNG, and not a blank one
    png = Path(paths["png"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 800 and height >= 200 and len(png) > 15_000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_without_trace_writes_no_trace(run_cli, tmp_path):
    done = run_cli("train", "--dataset", "synthetic", "--dataset-size", "256", "--model", "mlp",
                   "--epochs", "1", "--max-iters", "2", "--nproc-per-node", "2", "--no-progress",
                   "--output-dir", tmp_path / "runs", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "trace" not in json.loads((run_dir / "results.json").read_text())
    assert not (run_dir / "trace").exists()
    assert "profiler_start" not in done.stderr


def test_tracing_off_makes_no_profiler_and_no_ranges():
    """The kit's step without --trace calls the model, backward and step directly."""
    import torch

    from distkit import Config
    from distkit.train.training import create_trainer

    seen = []
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = create_trainer(model, opt, torch.nn.MSELoss(), Config(backend="none"))
    with torch.profiler.profile() as prof:
        trainer.run([(torch.zeros(4, 2), torch.zeros(4, 1))], max_epochs=1)
    seen = {e.name for e in prof.events()}
    assert not seen & set(tracing.PHASES)
    traced = create_trainer(model, opt, torch.nn.MSELoss(), Config(backend="none", trace=True))
    with torch.profiler.profile() as prof:
        traced.run([(torch.zeros(4, 2), torch.zeros(4, 1))], max_epochs=1)
    assert {"forward", "backward", "optimizer step"} <= {e.name for e in prof.events()}


# --- the merge and the arithmetic, on traces whose answer is known ----------------------

def _rank_trace(base_ns, marks, events):
    """A rank's Chrome trace: ``marks`` ping-pong times (us, this rank's clock), events
    ``(name, ts, dur)``."""
    evs = [{"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 4242, "tid": 1}
           for name, ts, dur in events]
    evs += [{"ph": "X", "name": f"{tracing.CLOCK_SYNC} 1", "ts": t, "dur": 0.1, "pid": 4242,
             "tid": 1} for t in marks]
    evs.append({"ph": "M", "name": "process_name", "pid": 4242, "args": {"name": "python"}})
    return {"baseTimeNanoseconds": base_ns, "traceEvents": evs}


def test_merge_aligns_a_rank_whose_clock_runs_ahead():
    # rank 1's clock is 5000 us ahead: rank 0 sends at A=100, 1 receives at B=5150 (its
    # clock), rank 0 receives back at C=200: offset = 5150 - 150 = 5000, error 50; a slower
    # round (A=300, B=5400, C=700) must not be the one kept
    r0 = _rank_trace(0, [100, 200, 300, 700], [("gloo:all_reduce", 1000, 50)])
    r1 = _rank_trace(0, [5150, 5400], [("gloo:all_reduce", 6000, 50)])
    merged = tracing.merge([r0, r1])
    assert merged["distkit"]["clock"] == {"offset_us": [0.0, 5000.0], "error_us": [0.0, 50.0]}
    (a0,) = tracing.collective_spans(merged, 0)
    (a1,) = tracing.collective_spans(merged, 1)
    assert a0 == a1  # the same collective, at the same aligned time
    names = [e for e in merged["traceEvents"] if e["name"] == "process_name"]
    assert [(e["pid"], e["args"]["name"]) for e in names] == [(0, "rank 0"), (1, "rank 1")]


def test_interval_arithmetic():
    assert tracing.union([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert tracing.total([(0, 2), (1, 3), (5, 7)]) == 5
    assert tracing.overlap([(0, 10)], [(2, 3), (9, 12)]) == 2
    assert tracing.overlap([(0, 1)], [(1, 2)]) == 0


def test_a_short_run_still_records_what_it_has():
    assert tracing.schedule_for(None) == (tracing.WAIT, tracing.WARMUP, tracing.ACTIVE)
    assert tracing.schedule_for(100) == (tracing.WAIT, tracing.WARMUP, tracing.ACTIVE)
    for n in range(1, 7):
        wait, warmup, active = tracing.schedule_for(n)
        assert wait + warmup + active <= n and active >= 1, n
