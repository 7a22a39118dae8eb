#!/usr/bin/env python3
"""Execute notebooks in a real Jupyter kernel and commit them with their outputs.

The notebooks in the repository carry the outputs of a recorded run, so that the course
can be read (on GitHub, on the site) before anything is installed. This script records
that run: each notebook is executed top to bottom in a fresh kernel (nbclient, as
tests/test_notebooks.py runs them), in a temporary folder, and saved in place with

- every cell's outputs;
- a markdown cell after the title that says where and when it ran (machine, cores, load,
  versions, date, seconds), the one cell that is not built from ``notebooks/src``;
- ``metadata.distkit.recorded``: the same facts and ``code_digest``, the SHA-256 of its
  code cells' sources (:func:`code_digest`), which ``tests/test_notebook_outputs.py``
  compares with the sources now: a code cell changed without a re-run fails that test.

    python scripts/record_notebooks.py            # every notebook, one after the other
    python scripts/record_notebooks.py 04 08      # notebooks 04 and 08

A notebook whose cell fails is not saved (its earlier recording stays); the script goes
on with the next one and exits 1 naming every failure. Run it with the kit importable
(``pip install -e ".[test]"``, or ``PYTHONPATH=src``): the kernel inherits the environment.
Edit a notebook in ``notebooks/src``, run ``scripts/build_notebooks.py``, then this.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT_S = 600
RECORDED_CELL_ID = "recorded-run"  # the id suffix of the recorded-run cell: NN-recorded-run


def code_digest(nb: dict) -> str:
    """SHA-256 of the notebook's code cells' sources, in order (the recorded-run cell is
    markdown, so it is not part of it): what the outputs were produced from."""
    digest = hashlib.sha256()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            digest.update(source.encode() + b"\0")
    return digest.hexdigest()


def is_recorded_cell(cell: dict) -> bool:
    return str(cell.get("id", "")).endswith(RECORDED_CELL_ID)


def machine() -> str:
    """The machine in words: CPU model, cores, memory, GPU or none."""
    model = platform.processor() or platform.machine()
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = found.group(1).strip() if found else model
    except OSError:
        pass
    memory = ""
    try:
        kib = int(re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M).group(1))
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, AttributeError):
        pass
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{model}, {os.cpu_count()} cores{memory}, {gpu}, {platform.system()}"


def versions() -> dict:
    import ignite
    import torch

    import distkit

    return {"python": platform.python_version(), "torch": torch.__version__, "ignite": ignite.__version__,
            "distkit": distkit.__version__}


def recorded_cell_source(facts: dict) -> str:
    v = facts["versions"]
    return (f"*Recorded run: the outputs below are those of one run top to bottom on "
            f"{facts['date']} ({facts['seconds']:.0f} s), on {facts['machine']} "
            f"(load average {facts['load_average']:.1f} when it started); Python {v['python']}, "
            f"torch {v['torch']}, ignite {v['ignite']}. Timings are that machine's; yours will differ. "
            f"Re-recorded by `python scripts/record_notebooks.py {facts['notebook']}`.*")


def write(nb: dict, path: Path) -> None:
    """Saved as scripts/build_notebooks.py writes notebooks (same keys, same layout)."""
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def record(path: Path, log=print) -> float:
    """Execute ``path`` and save it with its outputs; returns the seconds it took. Raises
    nbclient's error (naming the cell) if a cell fails; the file is then left as it was."""
    import nbformat
    from nbclient import NotebookClient

    original = json.loads(path.read_text())
    clean = {**original, "cells": [c for c in original["cells"] if not is_recorded_cell(c)]}
    clean["metadata"] = {k: v for k, v in original["metadata"].items() if k != "distkit"}
    nb = nbformat.reads(json.dumps(clean), as_version=4)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="distkit-record-") as folder:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": folder}}).execute()
    seconds = time.perf_counter() - start
    executed = json.loads(nbformat.writes(nb))
    cells = []
    for built, ran in zip(clean["cells"], executed["cells"]):
        cell = dict(built)
        if built["cell_type"] == "code":
            cell["execution_count"] = ran["execution_count"]
            cell["outputs"] = ran["outputs"]
        cells.append(cell)
    facts = {"notebook": path.name[:2], "date": datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"), "seconds": round(seconds, 1), "machine": machine(),
        "load_average": round(load, 2), "versions": versions()}
    note = {"cell_type": "markdown", "id": f"{path.name[:2]}-{RECORDED_CELL_ID}", "metadata": {},
            "source": recorded_cell_source(facts)}
    cells.insert(1, note)  # after the badge and title
    out = {**clean, "cells": cells,
           "metadata": {**clean["metadata"], "distkit": {"recorded": {**facts, "code_digest": code_digest(clean)}}}}
    write(out, path)
    log(f"{path.name}: recorded in {seconds:.0f} s (load average {load:.1f} at the start)")
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("numbers", nargs="*", help="notebook numbers (e.g. 04 08); default: every notebook")
    args = ap.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.numbers:
        unknown = [n for n in args.numbers if not any(p.name.startswith(f"{n}_") for p in paths)]
        if unknown:
            print(f"record_notebooks: error: no notebook numbered {', '.join(unknown)} in {NOTEBOOKS}",
                  file=sys.stderr)
            return 2
        paths = [p for p in paths if p.name[:2] in args.numbers]
    failed = []
    for path in paths:
        try:
            record(path)
        except Exception as e:  # nbclient's CellExecutionError / CellTimeoutError / DeadKernelError
            last = re.sub(r"\x1b\[[0-9;]*m", "", str(e).strip()).splitlines() or [type(e).__name__]
            print(f"record_notebooks: error: {path.name} failed ({last[-1]}); its earlier recording is kept",
                  file=sys.stderr, flush=True)
            failed.append(path.name)
    if failed:
        print(f"record_notebooks: error: {len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
