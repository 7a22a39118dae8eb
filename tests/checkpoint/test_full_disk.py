"""A finished run is never lost (issue 31): a real small tmpfs, filled by another writer
at two phases of a real 2-process run: after the last epoch (room for results.json, not
for the plot) and mid-run (nothing left). Each ends non-zero with the kit's one line naming the folder, leaves
no .tmp and no 0-byte file, results.json whole where training finished, and the newest
complete checkpoint loads. Needs root to mount a tmpfs; skipped, saying so, elsewhere."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from support import subprocess_env

FILLER_TASK = '''
import os
import shutil

import ignite.distributed as idist
from ignite.engine import Events

from distkit import Task
from distkit.tasks import BUILTIN_TASKS


def fill(config):
    """Another writer takes the disk, leaving task_settings['leave'] bytes free."""
    disk = os.path.dirname(os.path.abspath(config.output_dir))
    leave = int(config.task_settings["leave"])
    with open(os.path.join(disk, "filler"), "ab") as f:
        try:
            while shutil.disk_usage(disk).free > leave:
                f.write(b"\\0" * min(65536, max(4096, shutil.disk_usage(disk).free - leave)))
                f.flush()
        except OSError:
            pass


def handlers(trainer, evaluator, config):
    if idist.get_rank() != 0:
        return
    at = config.task_settings["fill_at"]
    if at == "end":
        trainer.add_event_handler(Events.COMPLETED, lambda e: fill(config))
    else:  # mid-run: in the middle of epoch 2
        trainer.add_event_handler(Events.ITERATION_COMPLETED(once=int(at)), lambda e: fill(config))


base = BUILTIN_TASKS[("digits", "mlp")]
task = Task(datasets=base.datasets, model=base.model, name="digits/mlp-filled",
            score=base.score, handlers=handlers, settings={"fill_at": "end", "leave": 0})
'''


@pytest.fixture
def tmpfs(tmp_path):
    """A 16 MiB tmpfs: room for a few digits/mlp checkpoints."""
    path = tmp_path / "disk"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (mount -t tmpfs)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def train(tmp_path, disk, fill_at, leave):
    (tmp_path / "filler_task.py").write_text(FILLER_TASK)
    cmd = [sys.executable, "-m", "distkit", "train", "--task", "filler_task:task",
           "--set", f"fill_at={fill_at}", "--set", f"leave={leave}", "--nproc-per-node", "2",
           "--epochs", "2", "--checkpoint-every", "5", "--no-progress",
           "--output-dir", str(disk / "runs"), "--timeout", "30"]
    return subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True,
                          text=True, timeout=170)


def assert_nothing_half_written(runs):
    files = [p for p in runs.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.endswith((".tmp", ".partial")) or p.name.startswith("tmp")], files
    assert not [p for p in files if p.stat().st_size == 0], files


def assert_kit_line(result, disk):
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode != 0, result.stderr[-3000:]
    assert lines and re.match(rf"distkit: error: (rank 0: )?no space left on '{re.escape(str(disk))}"
                              r"/runs/[^']+' while writing the run", lines[-1]), result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "unexpected pos" not in result.stderr
    assert len(lines) <= 3, result.stderr
    return lines[-1]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_disk_full_after_the_last_epoch_keeps_the_results(tmp_path, tmpfs):
    result = train(tmp_path, tmpfs, "end", 12 * 1024)  # room for results.json, not the plot
    line = assert_kit_line(result, tmpfs)
    assert "results.json is whole, learning_curves.png was not written" in line, line
    (run_dir,) = (tmpfs / "runs").iterdir()
    assert f"distkit plot {run_dir}" in line
    results = json.loads((run_dir / "results.json").read_text())  # whole
    assert results["epochs_completed"] == 2
    assert not (run_dir / "learning_curves.png").exists()
    assert_nothing_half_written(tmpfs / "runs")
    os.remove(tmpfs / "filler")  # space again: the plot is redrawn from results.json
    redraw = subprocess.run([sys.executable, "-m", "distkit", "plot", str(run_dir)],
                            env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert redraw.returncode == 0, redraw.stderr
    assert (run_dir / "learning_curves.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_disk_full_mid_run_leaves_the_newest_complete_checkpoint(tmp_path, tmpfs):
    """Filled in epoch 2 with nothing left. ignite's Checkpoint removes its oldest file
    before it writes the next (n_saved=2), so same-size checkpoints keep fitting in the
    space each removal frees; the run trains to its end and results.json is what cannot
    be written: the kit's line, no .tmp (the probe found an empty results.json.tmp), and
    the newest checkpoint is complete and loads. (A checkpoint that does not fit at all:
    test_failure.py::test_full_disk_while_saving_is_one_line_naming_the_disk.)"""
    from distkit.checkpoint.saver import latest_checkpoint, load_checkpoint

    result = train(tmp_path, tmpfs, "27", 0)  # epoch 2 of 23 iterations; saves every 5
    assert_kit_line(result, tmpfs)
    assert not list((tmpfs / "runs").glob("*/results.json"))
    assert_nothing_half_written(tmpfs / "runs")
    newest = latest_checkpoint(tmpfs / "runs")
    assert newest is not None and newest.endswith("_46.pt"), newest
    assert load_checkpoint(newest)["trainer"]["iteration"] == 46
