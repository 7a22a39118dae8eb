"""``distkit launch --trace`` and ``distkit launch --timeout``, with real processes.

The DDP-tutorial script (``tests/foreign/multigpu_torchrun.py``, unchanged) traced on 2
gloo ranks: the merged trace is valid JSON with one process per rank, the clocks aligned
within their bound, the all-reduces and the phases in it, the PNG drawn, the paths named
in one line and in ``results.json``. A script with no optimizer: one line, no files.
``--timeout``: the default timeout of the script's own process groups (a rendezvous
a rank never joins, a collective a rank never joins: one line within the bound; a
script's own ``timeout=`` wins).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distkit.lessons.multinode import clean_env, log_tail

REPO = Path(__file__).resolve().parents[2]
FOREIGN = REPO / "tests" / "foreign"


def launch(args, cwd, timeout=240, env=None):
    return subprocess.run([sys.executable, "-m", "distkit", "launch", *map(str, args)], cwd=cwd,
                          env=env or clean_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The tutorial script, 2 epochs of 4 steps on 2 ranks, under --trace."""
    folder = tmp_path_factory.mktemp("traced")
    for name in ("multigpu_torchrun.py", "datautils.py"):
        shutil.copy(FOREIGN / name, folder / name)
    out = launch(["--trace", "--nproc-per-node", "2", "multigpu_torchrun.py", "2", "1"], folder)
    assert out.returncode == 0, log_tail(out.stderr, 30)
    (run_dir,) = (folder / "runs").iterdir()
    return folder, out, run_dir


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_traced_script_trains_as_written_and_says_where_its_trace_is(traced):
    folder, out, run_dir = traced
    for rank in (0, 1):
        assert f"[RANK{rank}] Epoch 1 | last loss" in out.stdout, out.stdout
    assert (folder / "snapshot.pt").exists()
    last = out.stdout.strip().splitlines()[-1]
    rel = re.escape(str(run_dir.relative_to(folder)))
    assert re.fullmatch(rf"distkit: trace of 3 step\(s\) on 2 ranks: {rel}/trace/merged\.json "
                        rf"\(open it in https://ui\.perfetto\.dev\), drawn in {rel}/trace/"
                        rf"timeline\.png; paths in {rel}/results\.json", last), last
    results = json.loads((run_dir / "results.json").read_text())
    assert results["script"] == "multigpu_torchrun.py" and results["args"] == ["2", "1"]
    trace = results["trace"]
    assert trace["per_rank"] == [f"{run_dir.relative_to(folder)}/trace/rank{r}.json" for r in (0, 1)]
    for path in [trace["merged"], trace["png"], *trace["per_rank"]]:
        assert (folder / path).stat().st_size > 0, path
    assert (folder / trace["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_merged_trace_has_one_aligned_process_per_rank_with_its_collectives(traced):
    from distkit.observe import tracing

    folder, _, run_dir = traced
    merged = json.loads((run_dir / "trace" / "merged.json").read_text())  # valid JSON
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    assert {e["pid"] for e in merged["traceEvents"] if e.get("ph") == "X"} == {0, 1}
    for rank in (0, 1):
        assert len(tracing.steps(merged, rank)) == 3
        assert len(tracing.collective_spans(merged, rank, "all_reduce")) >= 3, \
            "DDP's gradient all-reduce, once a step"
        for phase in ("forward", "backward", "optimizer step"):
            assert len(tracing.spans(merged, rank, phase)) == 3, (rank, phase)
        # DDP all-reduces inside the backward: each step's all-reduce starts in its backward
        backward = tracing.spans(merged, rank, "backward")
        for a, _ in tracing.collective_spans(merged, rank, "all_reduce")[-3:]:
            assert any(b0 <= a <= b1 for b0, b1 in backward), (rank, a, backward)
    # one host, one clock: the offset found is the method's error, within its bound
    clock = merged["distkit"]["clock"]
    assert clock["error_us"][1] is not None and abs(clock["offset_us"][1]) <= clock["error_us"][1]


NO_OPTIMIZER = '''import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(8):
    dist.all_reduce(torch.ones(4))
dist.barrier()
dist.destroy_process_group()
'''


RAISES_EARLY = '''import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
if dist.get_rank() == 1:
    raise ValueError("no data")
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_script_without_an_optimizer_gets_one_line_and_no_empty_trace(tmp_path):
    (tmp_path / "no_optimizer.py").write_text(NO_OPTIMIZER)
    out = launch(["--trace", "--nproc-per-node", "2", "no_optimizer.py"], tmp_path)
    assert out.returncode == 0, log_tail(out.stderr, 30)
    assert out.stdout.strip().splitlines()[-1] == (
        "distkit: --trace recorded nothing: no_optimizer.py made no optimizer step (the trace "
        "counts torch.optim steps: a script without an optimizer has none); no trace written")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # a traced launch that fails before any step: its failure line, no folder left behind
    (tmp_path / "raises_early.py").write_text(RAISES_EARLY)
    out = launch(["--trace", "--nproc-per-node", "2", "raises_early.py"], tmp_path)
    assert out.returncode == 1
    assert _errors(out)[0].startswith("distkit: error: rank 1 (local rank 1) raised ValueError: "
                                      "no data (at raises_early.py:7)"), out.stderr
    assert "distkit: trace" not in out.stdout
    # a traced launch has a run folder: the traceback went there, and nothing else did
    (run,) = (tmp_path / "runs").iterdir()
    assert f"full traceback in {run / 'tracebacks' / 'rank1.txt'}" in _errors(out)[0], out.stderr
    files = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    assert {"tracebacks/rank1.json", "tracebacks/rank1.txt"} <= set(files), files
    assert not [f for f in files if f.endswith(".json") and not f.startswith("tracebacks/")], files  # no trace


@pytest.mark.timeout(120)
def test_trace_where_the_launcher_does_not_start_every_rank_is_refused_in_one_line(tmp_path):
    (tmp_path / "s.py").write_text("print('never')\n")
    inside = launch(["--trace", "s.py"], tmp_path, timeout=60,
                    env=clean_env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT="29999"))
    nodes = launch(["--trace", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                    "--master-addr", "127.0.0.1", "s.py"], tmp_path, timeout=60)
    for out, where in ((inside, "inside torchrun"), (nodes, "with --nnodes 2")):
        assert out.returncode != 0 and "never" not in out.stdout
        assert out.stderr.strip().splitlines() == [
            f"distkit: error: --trace {where}: distkit launch merges the traces of the ranks it "
            "starts itself, on one node: run `distkit launch --trace --nproc-per-node N SCRIPT` "
            "there, or drop --trace"], out.stderr
    assert not (tmp_path / "runs").exists()


HANGS = '''import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

how, rank = sys.argv[1], int(os.environ["RANK"])
if how == "rendezvous" and rank == 1:
    time.sleep(600)  # never joins init_process_group
kwargs = {"timeout": timedelta(seconds=3)} if how == "own" else {}
dist.init_process_group("gloo", **kwargs)
print(f"rank {rank}: default timeout {c10d._get_default_timeout('gloo').total_seconds():g}", flush=True)
if rank == 1:
    time.sleep(600)  # never joins the all-reduce
dist.all_reduce(torch.ones(1))
'''


def _errors(out):
    return [ln for ln in out.stderr.splitlines() if ln.startswith("distkit: ")]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_timeout_bounds_the_scripts_rendezvous_and_collectives_in_one_line(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    line = {how: next(i for i, text in enumerate(HANGS.splitlines(), 1) if text.startswith(code))
            for how, code in (("init", "dist.init_process_group"), ("reduce", "dist.all_reduce"))}
    # a rank that never joins the rendezvous: rank 0's init_process_group gives up
    started = time.monotonic()
    out = launch(["--timeout", "5", "--nproc-per-node", "2", "hangs.py", "rendezvous"], tmp_path)
    assert out.returncode == 1 and time.monotonic() - started < 100
    # the launcher serves the store (as torchrun's agent): rank 0 waits there for rank 1's address
    assert re.fullmatch(r"distkit: error: rank 0 \(local rank 0\) raised DistStoreError: wait timeout "
                        r"after 5000ms, keys: /default_pg/\S+/1 "
                        rf"\(at hangs\.py:{line['init']}\); full traceback in \S+; the other ranks "
                        r"were stopped", _errors(out)[0]), out.stderr
    # a rank that never joins a collective: the all-reduce gives up after --timeout
    started = time.monotonic()
    out = launch(["--timeout", "5", "--nproc-per-node", "2", "hangs.py", "collective"], tmp_path)
    assert out.returncode == 1 and time.monotonic() - started < 100
    assert "rank 0: default timeout 5" in out.stdout and "rank 1: default timeout 5" in out.stdout
    assert re.fullmatch(r"distkit: error: rank 0 \(local rank 0\) raised RuntimeError: Timed out "
                        rf"waiting 5000ms for recv operation to complete \(at hangs\.py:"
                        rf"{line['reduce']}\); full traceback in \S+; the other ranks were stopped",
                        _errors(out)[0]), out.stderr
    # no --timeout: 120 s, as distkit train (torch's own: 30 minutes); a script's own wins
    out = launch(["--nproc-per-node", "2", "hangs.py", "own"], tmp_path)
    assert out.returncode == 1
    assert "rank 0: default timeout 120" in out.stdout
    assert "raised RuntimeError: Timed out waiting 3000ms for recv operation" in _errors(out)[0]


@pytest.mark.timeout(60)
def test_a_timeout_out_of_range_is_refused_in_one_line(tmp_path):
    (tmp_path / "s.py").write_text("print('never')\n")
    for value in ("0", "nan", "1e9"):
        out = launch(["--timeout", value, "s.py"], tmp_path, timeout=50)
        assert out.returncode != 0 and "never" not in out.stdout
        assert len(out.stderr.strip().splitlines()) == 1
        assert f"--timeout {float(value)!r} must be a number of seconds > 0 and at most 86400" \
            in out.stderr, out.stderr


@pytest.mark.timeout(120)
def test_the_script_tracer_counts_optimizer_steps_and_leaves_nothing_behind(tmp_path):
    """In one process, no launch: 3 steps skipped and warmed up, 3 recorded, written as
    soon as they are; then every hook is gone and torch.autograd.backward is torch's
    own again (a reference the script kept to ours still works)."""
    import torch
    import torch.nn.modules.module as module_hooks
    import torch.optim.optimizer as optimizer_hooks

    from distkit.observe import tracing
    from distkit.observe.script_tracing import ScriptTracer

    original = torch.autograd.backward
    tracer = ScriptTracer(str(tmp_path), 0).start()
    from torch.autograd import backward as kept  # taken while traced
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(8):
            kept(model(torch.ones(2, 4)).sum())
            optimizer.step()
            if step == 5:  # the 7th forward ends the 6th step: not yet written
                assert not (tmp_path / "rank0.json").exists()
        # before any finish() of ours: the tracer finished itself after the 3 recorded steps
        assert tracer.profiler is None and (tmp_path / "rank0.json").exists()
    finally:
        tracer.finish()  # whatever happened, no hook is left in this pytest process
    assert torch.autograd.backward is original
    assert not module_hooks._global_forward_pre_hooks and not module_hooks._global_forward_hooks
    assert not optimizer_hooks._global_optimizer_pre_hooks
    assert not optimizer_hooks._global_optimizer_post_hooks
    assert (tmp_path / "rank0.steps").read_text() == "6"
    trace = tracing.merge([tracing.load(str(tmp_path / "rank0.json"))])
    assert [n for n in ("ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5")
            if tracing.spans(trace, 0, n)] == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    for phase in ("forward", "backward", "optimizer step"):
        # one each in the 3 recorded steps (the forward of the step that ended the last: untraced)
        assert len(tracing.spans(trace, 0, phase)) == 3, phase
    tracer.finish()  # idempotent: the worker calls it again when the script ends
    assert (tmp_path / "rank0.steps").read_text() == "6"
