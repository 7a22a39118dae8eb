"""A rank that raises keeps its cause: one ``distkit:`` line with the exception's type,
its first line and the file:line in the user's code; the full traceback in a file whose
path the line gives. Under the kit's launcher, under ``launch_function`` (whose messages
name its parameters, not ``distkit train``'s flags) and under torchrun (one line per
node from the workers, the cause in torchrun's error file and summary, no traceback
wall)."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import distkit
from support import subprocess_env
from distkit.errors import DistkitError
from distkit.observe.failures import cause, for_function_callers, raise_site
from distkit.host.facts import free_port

# A course whose model raises a three-line ValueError on rank 1's third step.
COURSE = '''
import torch.nn as nn
import ignite.distributed as idist
from distkit import Task
from distkit.builtin.data import get_datasets


class Boom(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if idist.get_rank() == 1 and self.calls == 3:
            raise ValueError("the batch had a bad shape\\nsecond line\\nthird line")  # line 16
        return self.fc(x)


def model(config):
    return Boom()


task = Task(datasets=get_datasets, model=model)


def training(local_rank, where):
    import ignite.distributed as idist

    idist.barrier()
    if idist.get_rank() == 1:
        raise KeyError("step")  # line 32
    idist.barrier()
'''
RAISE_LINE, FUNCTION_RAISE_LINE = 16, 32
KIT_FRAME = re.compile(r'File "' + re.escape(str(Path(distkit.__file__).parent)))
LINE = re.compile(r"distkit: error: rank 1 \(local rank \d(?:, node 1 of 2)?\) raised ValueError: the batch had a "
                  r"bad shape \(at course_fail\.py:16\); full traceback in (\S+\.txt)(;|$)")


@pytest.fixture
def course(tmp_path):
    path = tmp_path / "course_fail.py"
    path.write_text(COURSE.lstrip("\n"))
    lines = path.read_text().splitlines()
    assert "line 16" in lines[RAISE_LINE - 1] and "line 32" in lines[FUNCTION_RAISE_LINE - 1]
    return path


def train_cmd(*args):
    return [sys.executable, "-m", "distkit", "train", "--task", "course_fail.py:task",
            "--epochs", "1", "--no-progress", *map(str, args)]


def torchrun_cmd(*args):
    return [sys.executable, "-m", "torch.distributed.run", *map(str, args)]


def distkit_lines(out):
    return [ln for ln in out.splitlines() if ln.startswith("distkit: error:")]


def check_traceback_file(path: Path):
    text = path.read_text()
    assert text.startswith("Traceback (most recent call last):")
    assert "ValueError: the batch had a bad shape\nsecond line\nthird line" in text
    assert f'course_fail.py", line {RAISE_LINE}, in forward' in text


# --- the cause of an exception, in one line ---------------------------------------------

def test_the_cause_is_the_type_first_line_and_the_users_raise_site(tmp_path, monkeypatch):
    (tmp_path / "usercode.py").write_text(textwrap.dedent('''
        import json

        def parse(text):
            return json.loads(text)          # line 5: raised inside the standard library

        def fail():
            raise RuntimeError("first\\nsecond")  # line 8
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import usercode

    with pytest.raises(RuntimeError) as raised:
        usercode.fail()
    assert cause(raised.value) == "RuntimeError: first (at usercode.py:8)"
    with pytest.raises(ValueError) as raised:
        usercode.parse("{")
    site = raise_site(raised.value)
    assert (Path(site[0]).name, site[1]) == ("usercode.py", 5)  # not json/decoder.py
    assert cause(raised.value).startswith("JSONDecodeError: Expecting property name")
    # gloo's C++ location is not the user's business
    assert cause(RuntimeError("[/x/gloo/transport/tcp/pair.cc:561] Connection closed by peer")) \
        == "RuntimeError: Connection closed by peer"


def test_launch_function_messages_name_its_parameters_not_train_flags():
    assert for_function_callers(
        "rank 1 (local rank 1) was killed by SIGKILL; the other processes were stopped. Resume "
        "with --resume-from latest (the newest checkpoint under --output-dir)") == \
        "rank 1 (local rank 1) was killed by SIGKILL; the other processes were stopped"
    assert for_function_callers(
        "--nproc-per-node 2 inside a torchrun/SLURM launch, which starts the processes itself: "
        "drop --nproc-per-node (torchrun's --nproc_per_node sets the count), or run distkit "
        "train without torchrun") == (
        "nproc_per_node=2 inside a torchrun/SLURM launch, which starts the processes itself: "
        "drop nproc_per_node (torchrun's --nproc_per_node sets the count), or call "
        "launch_function outside torchrun")
    assert for_function_callers("--master-port 29500 is already in use on this machine: pick "
                                "another port, or omit --master-port to use a free one") == \
        ("master_port=29500 is already in use on this machine: pick another port, or omit "
         "master_port to use a free one")
    assert for_function_callers("--backend nccl needs CUDA GPUs and none is visible here: use "
                                "--backend gloo (CPU) or --backend auto") == \
        "backend='nccl' needs CUDA GPUs and none is visible here: use backend='gloo' (CPU) or backend='auto'"


# --- the kit's own launcher ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(120)
def test_launch_function_reports_a_raise_with_its_cause_and_traceback(course, monkeypatch, capfd):
    from distkit import launch_function

    monkeypatch.syspath_prepend(str(course.parent))
    monkeypatch.chdir(course.parent)
    import course_fail

    with pytest.raises(DistkitError) as raised:
        launch_function(course_fail.training, "x", backend="gloo", nproc_per_node=2,
                        threads_per_process=1, timeout_s=20, verbose=True)
    line = str(raised.value)
    m = re.fullmatch(r"rank 1 \(local rank 1\) raised KeyError: 'step' \(at course_fail\.py:32\); "
                     r"full traceback in (\S+rank1\.txt)", line)
    assert m, line
    assert "--" not in line  # nothing of distkit train's flags
    text = Path(m.group(1)).read_text()
    assert f'course_fail.py", line {FUNCTION_RAISE_LINE}, in training' in text
    assert text in capfd.readouterr().err  # verbose=True printed it


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_spawned_rank_raising_is_one_line_and_verbose_prints_the_traceback(course, tmp_path):
    out = subprocess.run(train_cmd("--nproc-per-node", 2, "--checkpoint-every", 1, "--verbose",
                                   "--output-dir", "runs"),
                         cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stderr[-3000:]
    lines = distkit_lines(out.stderr)
    assert len(lines) == 1 and lines[0] == out.stderr.strip().splitlines()[-1], out.stderr[-3000:]
    m = LINE.match(lines[0])
    assert m, lines[0]
    # rank 0 may finish epoch 2's checkpoint after rank 1's line was written: the line
    # names a complete checkpoint that exists, of epoch 1 or 2
    named = lines[0].rsplit("last complete checkpoint: ", 1)[1]
    assert re.fullmatch(r"runs/[^/]+/checkpoints/training_checkpoint_[12]\.pt", named), lines[0]
    assert (tmp_path / named).is_file(), lines[0]
    check_traceback_file(tmp_path / m.group(1))
    assert (tmp_path / m.group(1)).read_text() in out.stderr  # --verbose printed it


# --- under torchrun ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_rank_raising_is_one_line_and_names_the_cause_in_the_summary(course, tmp_path):
    out = subprocess.run(torchrun_cmd("--standalone", "--nproc_per_node=2", "--monitor-interval=0.5",
                                      *train_cmd("--output-dir", "runs")[1:]),
                         cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                         timeout=120)
    both = out.stdout + out.stderr
    assert out.returncode != 0, both[-3000:]
    lines = distkit_lines(both)
    assert len(lines) == 1, both[-4000:]
    m = LINE.match(lines[0])
    assert m, lines[0]
    check_traceback_file(tmp_path / m.group(1))
    assert "[rank1]:" not in both and "second line" not in both  # no worker traceback
    assert "terminating due to exception" not in both  # ignite's own report, dropped
    assert not re.search(KIT_FRAME, both), both[-3000:]
    root_cause = both.split("Root Cause")[-1]
    assert f"traceback : {lines[0]}" in root_cause, both[-3000:]
    assert "To enable traceback" not in both


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_torchrun_two_nodes_one_line_per_node(course, tmp_path):
    """Two torchrun launches (nodes) on 127.0.0.1, one process each: node 1's rank
    raises, node 0's rank loses its peer. Each node prints one line; both exit non-zero."""
    port = free_port()
    procs = [subprocess.Popen(
        torchrun_cmd("--nnodes=2", f"--node_rank={r}", "--nproc_per_node=1",
                     "--master_addr=127.0.0.1", f"--master_port={port}", "--monitor-interval=0.5",
                     *train_cmd("--timeout", 30, "--output-dir", "runs")[1:]),
        cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=170)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode != 0 for p in procs] == [True, True], outs
    node0, node1 = (distkit_lines(o) for o in outs)
    assert len(node1) == 1 and LINE.match(node1[0]), outs[1][-3000:]
    # node 0 names the rank that raised and its last words (its traceback, in the shared
    # run folder), then itself as the rank that lost it (issue 31)
    assert len(node0) == 1 and node0[0].startswith(
        "distkit: error: rank 1 (node 1 of 2) raised ValueError: the batch had a bad shape "
        "(its traceback: "), outs[0][-3000:]
    assert "; rank 0 (local rank 0, node 0 of 2) then lost it" in node0[0], node0[0]
    for o in outs:  # torchrun's own closing traceback is torchrun's; no worker frame shows
        assert "[rank" not in o and not re.search(KIT_FRAME, o), o[-3000:]


def _fails_in_a_run(local_rank, run_dir):
    from distkit.observe.failures import training_in

    if run_dir:
        training_in(run_dir)  # as training says it when it starts
    raise ValueError("bad batch")


@pytest.mark.parametrize("in_a_run", [True, False])
def test_a_failure_names_the_run_it_happened_in_and_no_earlier_one(tmp_path, in_a_run):
    """A rank's failure line names the folder of the run it trains in (its last checkpoint,
    its traceback there); a function that starts no run, in a process where an earlier
    run failed (a notebook's kernel), names none of that run."""
    from distkit.launch.entry import launch_function
    from distkit.observe.failures import training_in

    earlier, run = tmp_path / "earlier-run", tmp_path / "run"
    earlier.mkdir()
    run.mkdir()
    training_in(str(earlier))  # the earlier run failed in this process
    with pytest.raises(DistkitError) as raised:
        launch_function(_fails_in_a_run, str(run) if in_a_run else None, backend="gloo",
                        nproc_per_node=1, timeout_s=20)
    line = str(raised.value)
    assert "earlier-run" not in line, line
    assert ("no checkpoint had been written yet" in line) == in_a_run, line
    assert (f"full traceback in {run}/tracebacks/rank0.txt" in line) == in_a_run, line


REPORT_AS = '''
import signal, sys
from distkit.observe.failures import RankFailed, report_from_worker
signal.signal(signal.SIGTERM, lambda *a: print("asked to stop", flush=True))  # as training's handler
print("reporting", flush=True)
report_from_worker(RankFailed("rank 0 (local rank 0) raised RuntimeError: Connection reset by peer",
                              kind=sys.argv[1]))
print("reported", flush=True)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["lost", "raised"])
def test_under_torchrun_a_witness_waits_for_the_agent_and_a_cause_reports_at_once(tmp_path, kind):
    """A worker of torchrun (its variables, a real SIGTERM as the agent sends it) whose
    failure only lost a peer writes no error file and prints nothing before the agent
    stops it, and the SIGTERM ends it even where training's handler would only ask for a
    stop; one that raised records its line for torchrun's summary and returns."""
    import json
    import signal
    import time

    error_file = tmp_path / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    env = subprocess_env(TORCHELASTIC_RUN_ID="witness", TORCHELASTIC_ERROR_FILE=error_file, WORLD_SIZE=2,
                         LOCAL_WORLD_SIZE=2, RANK=0, LOCAL_RANK=0, MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=free_port())
    proc = subprocess.Popen([sys.executable, "-c", REPORT_AS, kind], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if kind == "lost":
        assert proc.stdout.readline() == "reporting\n"
        time.sleep(2.0)  # inside the witness's wait
        proc.send_signal(signal.SIGTERM)  # what torchrun's agent sends the workers left
    out, err = proc.communicate(timeout=60)
    if kind == "lost":  # ended by the signal itself, not asked to stop at a later iteration
        assert proc.returncode == -signal.SIGTERM, (out, err)
        assert not error_file.exists() and "distkit: error" not in err and out == "", (out, err)
    else:
        assert proc.returncode == 0 and out == "reporting\nreported\n", (out, err)
        line = "distkit: error: rank 0 (local rank 0) raised RuntimeError: Connection reset by peer"
        assert err.splitlines() == [line]
        assert json.loads(error_file.read_text())["message"]["message"] == line
