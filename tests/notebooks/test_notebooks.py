"""Every notebook is in sync with its source, teaches its ignite calls in its own cells,
launches on a free port, and runs top to bottom in a real Jupyter kernel (nbclient) on
this CPU-only machine, leaving nothing in its folder. (Its committed outputs, those of a
recorded run, are checked by tests/notebooks/test_notebook_outputs.py; the site built from them by
tests/site/test_site.py.)"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 240

# The ignite / torch.distributed calls each notebook's topic names, which must be typed
# in its own code cells (not hidden in a distkit helper). "a.b" matches a call written
# ``a.b(...)`` (or ``x.a.b(...)``); a bare name matches any call whose last part it is.
REQUIRED_CALLS = {
    "01": ["idist.Parallel", "parallel.run", "idist.all_reduce", "idist.all_gather", "idist.broadcast",
           "idist.barrier", "idist.one_rank_first", "idist.get_rank", "idist.get_world_size"],
    "02": ["idist.auto_dataloader", "idist.auto_model", "idist.auto_optim", "idist.device",
           "idist.all_reduce"],
    "04": ["idist.Parallel", "idist.auto_dataloader", "idist.auto_model", "idist.auto_optim", "Engine",
           "set_epoch", "create_supervised_evaluator", "Accuracy", "ConfusionMatrix", "Checkpoint",
           "DiskSaver", "global_step_from_engine", "setup_logger", "trainer.run", "DistributedSampler"],
    "05": ["idist.auto_dataloader", "DistributedSampler"],
    "06": ["HandlersTimeProfiler", "BasicTimeProfiler", "attach", "get_results", "print_results",
           "RunningAverage", "Average", "Engine", "idist.auto_dataloader"],
    "07": ["Timer", "attach", "add_event_handler", "value"],
    "08": ["EarlyStopping", "PiecewiseLinear.simulate_values", "add_event_handler", "DistributedSampler"],
    "09": ["idist.Parallel", "DiskSaver", "_setup_ddp_vars_from_slurm_env"],
    # 03's launch runs only on a TPU runtime, but it is typed in its cell all the same
    "03": ["idist.Parallel", "parallel.run"],
    # the transformer track (issue 23)
    "12": ["init_device_mesh", "parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
           "PrepareModuleInput", "CommDebugMode"],
    "13": ["dist.batch_isend_irecv", "dist.P2POp", "F.scaled_dot_product_attention", "FlopCounterMode"],
    "14": ["init_device_mesh", "parallelize_module", "ColwiseParallel", "RowwiseParallel", "PipelineStage",
           "ScheduleGPipe", "fully_shard", "idist.auto_model", "Engine", "engine.run", "dist.all_reduce",
           "SequenceParallel", "PrepareModuleInput", "full_tensor"],
    # profiler traces of every rank (issue 34)
    "15": ["idist.Parallel", "parallel.run", "profile", "schedule", "record_function", "export_chrome_trace",
           "no_sync", "fully_shard"],
    # hangs read from torch's Flight Recorder, then the kit's verdict
    "16": ["idist.Parallel", "parallel.run", "_dump_fr_trace_json", "dist.all_reduce", "dist.broadcast",
           "dist.set_debug_level", "distkit.launch_function"],
}
# Notebooks whose cells leave files behind (runs, checkpoints, CSVs: 03 on a TPU, 04, 06,
# 08, 09) write them in a folder of their own made by tempfile.mkdtemp, new at every run,
# so that "Restart & Run All" never meets an earlier run's checkpoints (01 writes only
# inside `with tempfile.TemporaryDirectory()` blocks, gone when they end). Those four
# used to run twice in one folder to show it; the second runs cost about 4 min of CI on
# 2 cores and could only meet what the test below rules out.
WRITE_CALLS = re.compile(r"output_dir|DiskSaver|write_csv|savefig|torch\.save|open\([^)]*[\"']w")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_that_writes_files_writes_them_into_a_fresh_folder_per_run(path):
    source = "\n".join("".join(c["source"]) for c in code_cells(path))
    if not WRITE_CALLS.search(source):
        return  # writes nothing
    assert "tempfile.mkdtemp(" in source or "tempfile.TemporaryDirectory(" in source, \
        f"{path.name} writes files but makes no fresh folder for them"
    # no fixed place: every path it writes is built from that folder
    fixed = re.search(r"""(output_dir["']?\s*[=:]|DiskSaver\(|open\()\s*f?["'/]""", source)
    assert not fixed, f"{path.name} writes to a fixed path: {fixed.group(0)!r}"


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def calls_in(path) -> list[ast.Call]:
    calls = []
    for cell in code_cells(path):
        source = "".join(cell["source"])
        source = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("!", "%")))
        calls += [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    return calls


def matches(required: str, name: str) -> bool:
    return name == required or name.endswith("." + required)


def test_notebooks_are_built_from_their_sources():
    result = subprocess.run([sys.executable, "scripts/build_notebooks.py", "--check"],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("number", sorted(REQUIRED_CALLS))
def test_notebook_types_the_ignite_calls_of_its_topic(number):
    path = next(p for p in NOTEBOOKS if p.name.startswith(number + "_"))
    names = {dotted(c.func) for c in calls_in(path)} - {None}
    missing = [req for req in REQUIRED_CALLS[number] if not any(matches(req, n) for n in names)]
    assert not missing, f"{path.name}: no code cell calls {missing}"


def test_required_calls_catch_a_notebook_without_them():
    # the check itself: a notebook whose cells only call distkit helpers fails it
    names = {"collectives.run_per_rank", "run", "print"}
    assert not any(matches("idist.all_reduce", n) for n in names)
    assert matches("idist.all_reduce", "idist.all_reduce") and matches("attach", "basic.attach")
    assert not matches("Average", "RunningAverage")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_parallel_launch_picks_a_free_port(path):
    # ignite's default master_port is a fixed 2222: taken by anything else, the launch fails
    launches = [c for c in calls_in(path) if (dotted(c.func) or "").endswith("idist.Parallel")]
    # (xla-tpu is exempt: PJRT finds its peers itself and takes no master_port)
    fixed = [ast.unparse(c) for c in launches if "master_port" not in {k.arg for k in c.keywords}
             and "backend='xla-tpu'" not in ast.unparse(c)]
    assert not fixed, f"{path.name}: idist.Parallel without master_port: {fixed}"


# Run after the notebook's own cells: every figure it drew (kept open by the first cell
# below) has a label on each axis that carries numbers; an axis of named categories
# (bar labels) speaks for itself. Image grids with their axes switched off are exempt.
KEEP_FIGURES = "%config InlineBackend.close_figures = False"
CHECK_AXES = r"""
import matplotlib.pyplot as plt

def _numeric(labels):
    for t in labels:
        text = t.get_text()
        for junk in ("$", "\\mathdefault", "{", "}", "^"):
            text = text.replace(junk, "")
        text = text.replace("\u2212", "-").strip()
        if text:
            try:
                float(text)
            except ValueError:
                return False  # named categories
    return True

_unlabelled = []
for _num in plt.get_fignums():
    _fig = plt.figure(_num)
    _fig.canvas.draw()
    for _ax in _fig.axes:
        if not _ax.axison or _ax.get_label() == "<colorbar>":
            continue
        if not (_ax.lines or _ax.patches or _ax.images or _ax.collections):
            continue
        for _which, _label, _ticks in (("x", _ax.get_xlabel(), _ax.get_xticklabels()),
                                       ("y", _ax.get_ylabel(), _ax.get_yticklabels())):
            if not _label and _numeric(_ticks):
                _unlabelled.append(f"figure {_num} '{_ax.get_title()}': no {_which} label")
print(f"{len(plt.get_fignums())} figure(s) checked")
assert not _unlabelled, _unlabelled
"""


def execute(path, folder):
    """Run the notebook in a real kernel in ``folder`` (its committed outputs, those of
    the recorded run, are replaced by this run's in memory; the file is not written)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells = [nbformat.v4.new_code_cell(KEEP_FIGURES), *nb.cells, nbformat.v4.new_code_cell(CHECK_AXES)]
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails


@pytest.mark.slow
@pytest.mark.timeout(900)  # notebook 09 took 178 s under load (pyproject's default is 300 s per test)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    # the notebook's own temporary folders (tempfile.mkdtemp(prefix="distkit-NN-...")):
    # its last cell removes them, so a run leaves nothing in /tmp either
    own = f"distkit-{path.name[:2]}-*"
    before = set(Path(tempfile.gettempdir()).glob(own))
    execute(path, tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not left, f"{path.name} left {left} in the folder it ran in"
    left_in_tmp = sorted(str(p) for p in set(Path(tempfile.gettempdir()).glob(own)) - before)
    assert not left_in_tmp, f"{path.name} left {left_in_tmp}"
