#!/usr/bin/env python3
"""Build notebooks/NN_topic.ipynb from notebooks/src/NN_topic.py.

Notebooks are written as plain Python files with cell markers, so they diff and review
like code; this script turns each into a clean .ipynb (no outputs) and prepends the two
cells every notebook needs: the Open-in-Colab badge and the install cell. Both are
generated from the repository named in pyproject.toml ([project.urls] Repository), the
one place that names it; never hand-copied.

    python scripts/build_notebooks.py          # rebuild every notebook
    python scripts/build_notebooks.py --check  # exit 1 if a notebook is out of date

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


REPO_URL = repository_url()
REPO = REPO_URL.removeprefix("https://github.com/")  # owner/name, for the Colab badge

INSTALL_CELL = f'''# Installs distkit and what the runtime lacks (on Colab: pytorch-ignite). The runtime's own
# torch and torchvision are pinned, so pip can neither replace nor upgrade them, and the
# Jupyter stack is not a dependency. Locally, where distkit is installed, it does nothing.
import importlib, importlib.metadata, importlib.util, os, subprocess, sys, tempfile
REPO_URL = "{REPO_URL}"
# DISTKIT_INSTALL_SPEC: install from a local checkout or a wheel instead (how CI tests this cell)
SPEC = os.environ.get("DISTKIT_INSTALL_SPEC") or f"git+{{REPO_URL}}@{BRANCH}"
if importlib.util.find_spec("distkit") is None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as keep:
        keep.write("\\n".join(f"{{p}}=={{importlib.metadata.version(p)}}" for p in ("torch", "torchvision")
                              if importlib.util.find_spec(p)))
    # pip install SPEC -c <the pins>: distkit and pytorch-ignite, torch left as it is
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", SPEC, "-c", keep.name], check=True)
    importlib.invalidate_caches()  # so this kernel finds the package it just installed'''


def badge(name: str) -> str:
    url = f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/{name}.ipynb"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


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


def build(src: Path) -> str:
    name = src.stem
    cells = parse(src.read_text())
    if not cells or cells[0][0] != "markdown":
        raise SystemExit(f"{src}: the first cell must be a markdown title")
    title_kind, title = cells[0]
    cells = [("markdown", badge(name) + "\n\n" + title), ("code", INSTALL_CELL)] + cells[1:]
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
        cell["id"] = f"{name[:2]}-{i:02d}"
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a notebook is out of date")
    args = ap.parse_args()
    stale = []
    for src in sorted(SRC.glob("[0-9][0-9]_*.py")):
        target = OUT / f"{src.stem}.ipynb"
        text = build(src)
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        else:
            target.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/build_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
