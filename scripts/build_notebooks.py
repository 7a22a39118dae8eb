#!/usr/bin/env python3
"""Build notebooks/NN_topic.ipynb from notebooks/src/NN_topic.py.

Notebooks are written as plain Python files with cell markers, so they diff and review
like code; this script turns each into a clean .ipynb (no outputs) and prepends the two
cells every notebook needs: the Open-in-Colab badge (in the title cell) and the install
cell. Both are generated from the repository named in pyproject.toml ([project.urls]
Repository), the one place that names it; never hand-copied. While it names the
placeholder owner ``OWNER``, there is no badge, and the install cell says to set its
``REPO_URL`` (or upload a wheel). The install cell is left out of the recorded runs'
code digest (scripts/record_notebooks.py), so changing it keeps their outputs.

    python scripts/build_notebooks.py          # rebuild every notebook that is out of date
    python scripts/build_notebooks.py --check  # exit 1 if a notebook is out of date

The notebooks in the repository also carry the outputs of a recorded run
(scripts/record_notebooks.py): those are not part of what is built, so the check compares
a notebook without them (:func:`normalized`). A rebuilt notebook whose code cells are
unchanged (only prose edited) keeps its outputs; one whose code changed is written without
outputs, to be recorded again (tests/notebooks/test_notebook_outputs.py says so).

Cell markers in the source: ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown
cell whose lines are written as ``# text``. The first markdown cell should be the title.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # record_notebooks, beside this file
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
BRANCH = "main"


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``Repository`` under ``[project.urls]`` in pyproject.toml (read as text: tomllib is
    Python 3.11+, and the kit supports 3.10)."""
    text = pyproject.read_text()
    urls = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = urls and re.search(r'^Repository\s*=\s*"(https://github\.com/[^/"]+/[^/"]+?)/?"', urls.group(1), re.M)
    if not found:
        raise SystemExit(f"{pyproject}: no Repository = \"https://github.com/OWNER/NAME\" under [project.urls]")
    return found.group(1)


# pyproject.toml names this owner until the repository is published: then the notebooks
# show no Colab badge (it would open a 404) and their install cell asks for the address.
PLACEHOLDER_OWNER = "OWNER"


def is_published(url: str) -> bool:
    return url.removeprefix("https://github.com/").split("/")[0] != PLACEHOLDER_OWNER


def torch_floor(requirements: Path = ROOT / "requirements.txt") -> str:
    """The oldest torch the kit runs on (``torch>=2.9`` in requirements.txt): "2.9"."""
    found = re.search(r"^torch>=([\d.]+)", requirements.read_text(), re.M)
    if not found:
        raise SystemExit(f"{requirements}: no torch>=X line")
    return found.group(1)


# The install cell's id ends so: scripts/record_notebooks.py leaves it out of the code
# digest, so that a new address or a better cell does not void every recorded run. It
# prints nothing where distkit is importable, as when the notebooks were recorded.
from record_notebooks import INSTALL_CELL_ID  # noqa: E402


def install_cell(url: str) -> str:
    """The notebooks' first code cell, for the repository ``url``."""
    repo = f'"{url}"' if is_published(url) else "None  # this copy names no published repository: docs/colab.md"
    floor = torch_floor()
    return f'''# Installs distkit and pytorch-ignite from the course's repository where the runtime lacks them
# (Colab); does nothing where distkit is installed. torch stays as it is when new enough.
UPGRADE_TORCH = False  # True: let pip replace a torch older than {floor} (then restart the runtime)
REPO_URL = {repo}
import glob, importlib, importlib.metadata, importlib.util, os, subprocess, sys, tempfile
class InstallError(Exception):  # a notebook shows its one line, not a traceback
    def _render_traceback_(self):
        return [f"InstallError: {{self}}"]
version = lambda name: importlib.metadata.version(name) if importlib.util.find_spec(name) else None  # noqa: E731
if importlib.util.find_spec("distkit") is None:
    wheels = sorted(glob.glob("distkit-*.whl"))  # a wheel uploaded to this session's folder
    spec = (os.environ.get("DISTKIT_INSTALL_SPEC") or (wheels[-1] if wheels else None)
            or (f"git+{{REPO_URL}}@{BRANCH}" if REPO_URL else None))
    if spec is None:
        raise InstallError("distkit is not installed and this copy names no repository to install it from: "
                           "set REPO_URL above to the course's repository, or upload a wheel "
                           "(`pip wheel --no-deps -w dist .` in a clone) and run this cell again (docs/colab.md)")
    torch = version("torch")
    old = torch is not None and tuple(int(n) for n in torch.split("+")[0].split(".")[:2]) < {tuple(int(n) for n in floor.split("."))}
    if old and not UPGRADE_TORCH:
        raise InstallError(f"this runtime's torch {{torch}} is older than {floor}, which distkit needs: set "
                           "UPGRADE_TORCH = True at the top of this cell and run it again (pip installs a newer "
                           "torch, about 2 GB), or pick a newer runtime")
    kept = [] if old else [f"{{p}}=={{version(p)}}" for p in ("torch", "torchvision") if version(p)]
    print(f"[1/3] torch {{torch or 'not installed'}}: " + ("kept" if kept else f"pip installs torch >= {floor}"))
    pins = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False); pins.write("\\n".join(kept)); pins.close()
    print(f"[2/3] pip install {{spec}} (and pytorch-ignite): about a minute", flush=True)
    pip = subprocess.Popen([sys.executable, "-m", "pip", "install", "--progress-bar", "off", spec, "-c", pins.name],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    for line in pip.stdout:  # pip's own steps, as it takes them
        said.append(line.strip())
        if line.startswith(("Collecting", "Building", "Installing", "Successfully")):
            print("      " + line.strip()[:120], flush=True)
    if pip.wait() != 0:
        last = [ln for ln in said if ln and not ln.startswith("[notice]")] or ["no output"]
        raise InstallError(f"pip could not install {{spec}}: {{last[-1]}}")
    importlib.invalidate_caches()  # so this kernel finds the package it just installed
    print(f"[3/3] distkit {{version('distkit')}} installed, torch {{version('torch')}}"
          + (": restart the runtime (Runtime > Restart session), then run the notebook" if old else ""))'''


def badge(name: str, url: str) -> str:
    """The Open-in-Colab badge of notebook ``name``, opening it in Colab from the published
    repository; no badge while ``url`` is the placeholder (it would open nothing)."""
    if not is_published(url):
        return ""
    repo = url.removeprefix("https://github.com/")
    return ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{repo}/blob/{BRANCH}/notebooks/{name}.ipynb)")


REPO_URL = repository_url()
REPO = REPO_URL.removeprefix("https://github.com/")  # owner/name
INSTALL_CELL = install_cell(REPO_URL)


def parse(text: str) -> list[tuple[str, str]]:
    cells, kind, lines = [], None, []

    def flush():
        if kind is not None:
            body = "\n".join(lines).strip("\n")
            if kind == "markdown":
                body = "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body.splitlines())
            if body.strip():
                cells.append((kind, body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def to_source(body: str) -> list[str]:
    lines = body.split("\n")
    return [ln + "\n" for ln in lines[:-1]] + [lines[-1]]


def build(src: Path, url: str = REPO_URL) -> str:
    name = src.stem
    cells = parse(src.read_text())
    if not cells or cells[0][0] != "markdown":
        raise SystemExit(f"{src}: the first cell must be a markdown title")
    title_kind, title = cells[0]
    shown = badge(name, url)
    cells = [("markdown", (shown + "\n\n" if shown else "") + title), ("code", install_cell(url))] + cells[1:]
    nb = {
        "cells": [
            {"cell_type": k, "metadata": {}, "source": to_source(b),
             **({"execution_count": None, "outputs": []} if k == "code" else {})}
            for k, b in cells
        ],
        "metadata": {
            "accelerator": "GPU" if "gpu" in name else ("TPU" if "tpu" in name else None),
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    if nb["metadata"]["accelerator"] is None:
        del nb["metadata"]["accelerator"]
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"{name[:2]}-{INSTALL_CELL_ID if i == 1 else f'{i:02d}'}"
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def normalized(nb: dict) -> dict:
    """``nb`` as :func:`build` writes it: without the recorded run's outputs, execution
    counts, its recorded-run cell and ``metadata.distkit`` (scripts/record_notebooks.py)."""
    from record_notebooks import is_recorded_cell

    cells = []
    for cell in nb["cells"]:
        if is_recorded_cell(cell):
            continue
        if cell["cell_type"] == "code":
            cell = {**cell, "execution_count": None, "outputs": []}
        cells.append(cell)
    return {**nb, "cells": cells, "metadata": {k: v for k, v in nb["metadata"].items() if k != "distkit"}}


def with_outputs_of(built: dict, recorded: dict) -> dict:
    """``built`` with the outputs of ``recorded`` when their code cells are the same
    (only prose changed); ``built`` as it is otherwise (to be recorded again)."""
    from record_notebooks import code_digest, is_recorded_cell

    if "distkit" not in recorded.get("metadata", {}) or code_digest(built) != code_digest(normalized(recorded)):
        return built
    ran = iter(c for c in recorded["cells"] if c["cell_type"] == "code")
    cells = [{**c, **({k: v for k, v in next(ran).items() if k in ("execution_count", "outputs")}
                      if c["cell_type"] == "code" else {})} for c in built["cells"]]
    cells[1:1] = [c for c in recorded["cells"] if is_recorded_cell(c)]
    return {**built, "cells": cells, "metadata": {**built["metadata"], "distkit": recorded["metadata"]["distkit"]}}


def read_committed(target: Path) -> dict | None:
    """The notebook as committed; None if there is none or it is not JSON (a merge left
    conflict markers in it: it is then built again from its source, without outputs)."""
    if not target.exists():
        return None
    try:
        return json.loads(target.read_text())
    except json.JSONDecodeError:
        print(f"{target.name}: not a notebook (merge conflict markers?): built again from its source",
              file=sys.stderr)
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    args = ap.parse_args()
    stale = []
    for src in sorted(SRC.glob("[0-9][0-9]_*.py")):
        target = OUT / f"{src.stem}.ipynb"
        built = json.loads(build(src))
        committed = read_committed(target)
        if committed is not None and normalized(committed) == built:
            continue  # up to date (with or without recorded outputs)
        if args.check:
            stale.append(target.name)
        else:
            nb = with_outputs_of(built, committed) if committed is not None else built
            target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            print(f"{target.name}: rebuilt" + ("" if "distkit" in nb["metadata"] else
                  f"; its code changed: record it with python scripts/record_notebooks.py {target.name[:2]}"))
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/build_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
