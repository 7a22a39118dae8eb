#!/usr/bin/env python3
"""Build a static site of the executed notebooks: read the course without running it.

    pip install -e ".[site]" && python scripts/build_site.py      # site/index.html

Each notebook is executed top to bottom in a Jupyter kernel (nbclient, as
tests/test_notebooks.py runs them: about 9 minutes for all on 2 cores), then turned into
one HTML page by nbconvert's ``HTMLExporter`` (Jupyter's own converter, the "lab"
template): every printed output and every figure (embedded in the page as a PNG), the
Colab badge as a plain link (no image fetched from outside), links between notebooks
pointing at their pages. ``index.html`` is the README's Start here, notebook map and
exercise list, converted the same way, with links into the site or, for other files of the
repository, to the repository (``[project.urls] Repository`` in pyproject.toml).

    python scripts/build_site.py --executed DIR   # use DIR/NN_topic.ipynb, already executed
                                                  # (what the notebook tests leave); run the rest
    python scripts/build_site.py --out public --only 01,05

The pages need no server and no network: open site/index.html in a browser.
"""
from __future__ import annotations

import argparse
import posixpath
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
README_SECTIONS = ("Start here", "Notebooks", "Exercises")  # the README's maps, in this order
CELL_TIMEOUT_S = 240


def repository_blob() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from build_notebooks import BRANCH, REPO_URL

    return f"{REPO_URL}/blob/{BRANCH}/"


def notebook_paths(only=None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in paths if only is None or p.name[:2] in only]


def execute(path: Path, dest: Path):
    """Run ``path`` top to bottom in a fresh kernel, in a temporary folder (what the
    notebook writes stays there); save the executed notebook as ``dest``. Returns the
    notebook and, if a cell failed, the error (the notebook then ends with that cell and
    its traceback: its page shows where it stopped)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    error = None
    with tempfile.TemporaryDirectory(prefix="distkit-site-") as folder:
        try:
            NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                           resources={"metadata": {"path": folder}}).execute()
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
            error = re.sub(r"\x1b\[[0-9;]*m", "", str(e).strip().splitlines()[-1])
    nbformat.write(nb, dest)
    return nb, error


def _link(target: str, pages: dict, blob: str, base: str) -> str:
    """Where a link of the repository points in the site: a notebook's page, or the file
    in the repository (``base``: the folder of the file the link is in); web links,
    anchors and the site's own pages unchanged."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#") or target in pages.values():
        return target
    path, _, anchor = target.partition("#")
    anchor = f"#{anchor}" if anchor else ""
    if Path(path).name in pages:
        return pages[Path(path).name] + anchor
    return blob + posixpath.normpath(posixpath.join(base, path)) + anchor


def rewrite_markdown(text: str, pages: dict, blob: str, base: str = "") -> str:
    # the Colab badge: a text link (the badge image lives on another site)
    text = re.sub(r"\[!\[Open In Colab\]\([^)]*\)\]\(([^)]+)\)", r"[Open in Colab](\1)", text)
    return re.sub(r"(?<!!)\]\(([^)\s]+)\)", lambda m: f"]({_link(m.group(1), pages, blob, base)})", text)


def readme_index(pages: dict, titles: dict, blob: str):
    """The README's title, lead and maps as one notebook of markdown cells."""
    import nbformat

    text = (ROOT / "README.md").read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    lead = parts[0].split("\n## ")[0]
    sections = {p.split("\n", 1)[0].strip(): "## " + p for p in parts[1:]}
    missing = [s for s in README_SECTIONS if s not in sections]
    if missing:
        raise SystemExit(f"README.md has no section {missing}: update README_SECTIONS in {__file__}")
    cells = [lead] + [sections[s] for s in README_SECTIONS]
    pages_list = "\n".join(f"- [{titles[name]}]({page})" for name, page in sorted(pages.items()))
    cells.insert(1, "## Executed notebooks\n\nEvery notebook below was run top to bottom on a "
                    "CPU machine (2 gloo processes); its printed results and figures are those "
                    "of that run.\n\n" + pages_list)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(rewrite_markdown(c, pages, blob))
                                         for c in cells])
    nb.metadata["title"] = "distkit: the course, executed"
    return nb


def export(nb, title: str, dest: Path) -> None:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    # No script from another site: the pages work offline. (Markdown and code are rendered
    # at build time; MathJax would only typeset $...$, which the course does not use.)
    exporter.mathjax_url = ""
    exporter.require_js_url = ""
    nb.metadata["title"] = title
    body, _ = exporter.from_notebook_node(nb)
    body = re.sub(r'<script[^>]*src="https?://[^"]*"[^>]*>\s*</script>', "", body)
    dest.write_text(body)


def build(out: Path, executed: Path | None = None, only=None, log=print) -> dict:
    """Build the site in ``out``; returns {notebook name: the error of its failed cell},
    empty when every notebook ran to its end."""
    import nbformat

    blob = repository_blob()
    paths = notebook_paths(only)
    pages = {p.name: p.stem + ".html" for p in paths}
    titles, failed = {}, {}
    out.mkdir(parents=True, exist_ok=True)
    work = out / "executed"
    work.mkdir(exist_ok=True)
    for path in paths:
        ready = executed / path.name if executed else None
        dest = work / path.name
        if ready and ready.exists():
            if ready.resolve() != dest.resolve():
                shutil.copy(ready, dest)
            nb = nbformat.read(dest, as_version=4)
            log(f"{path.name}: executed already ({ready})")
        else:
            start = time.perf_counter()
            nb, error = execute(path, dest)
            log(f"{path.name}: executed in {time.perf_counter() - start:.0f} s"
                + (f"; a cell FAILED: {error}" if error else ""))
            if error:
                failed[path.name] = error
        titles[path.name] = next(m.group(1).strip() for c in nb.cells if c.cell_type == "markdown"
                                 for m in [re.search(r"^# (.+)$", c.source, re.M)] if m)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = rewrite_markdown(cell.source, pages, blob, "notebooks")
        export(nb, f"{titles[path.name]} · distkit", out / pages[path.name])
    export(readme_index(pages, titles, blob), "distkit: the course, executed", out / "index.html")
    log(f"site: {out / 'index.html'} ({len(pages)} notebook pages)")
    return failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "site"), help="the site's folder (default: site/)")
    p.add_argument("--executed", default=None,
                   help="a folder of notebooks already executed (NN_topic.ipynb): used as they are")
    p.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 01,05")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    failed = build(Path(args.out), Path(args.executed) if args.executed else None, only)
    for name, error in failed.items():
        print(f"build_site: error: {name} stopped at a failing cell ({error}); its page ends there",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
