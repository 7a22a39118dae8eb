"""mkdocs hooks of the course's site (mkdocs.yml): the pages at the repository's own paths,
and links to the rest of the repository.

mkdocs reads the pages of ``docs_dir`` only, and a config file may not sit inside the
folder it documents. These hooks give the site the repository's layout instead:
``README.md`` (the home page, ``index.html``), ``docs/*.md``, ``notebooks/NN_*.ipynb``
(rendered by mkdocs-jupyter from their committed outputs) and ``benchmarks/README.md``,
each at its path in the repository, with the images these pages show. So a relative link written for GitHub
(``../notebooks/01_processes_and_ranks.ipynb`` in a docs page, ``../docs/colab.md`` in a
notebook) leads to the same page on the site, and mkdocs checks it (``strict``).

A link to any other file of the repository (an exercise, a source file, a recorded
benchmark) leads to that file in the repository (``[project.urls] Repository`` in
pyproject.toml, as the notebooks' badges). The notebooks' pages fetch nothing from other
sites: the Colab badge becomes a text link and nbconvert's MathJax script is left out
(the course writes no formulas).
"""
from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_notebooks import BRANCH, REPO_URL  # noqa: E402  (pyproject.toml [project.urls])

PAGES = ("README.md", "docs/*.md", "notebooks/[0-9][0-9]_*.ipynb", "benchmarks/README.md")
BLOB = f"{REPO_URL}/blob/{BRANCH}/"
MARKDOWN_LINK = re.compile(r"(?<!!)\]\(([^)\s]+)\)")
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HREF = re.compile(r'href="([^"]+)"')
COLAB_BADGE = re.compile(r'<img[^>]*src="https://colab\.research\.google\.com/assets/colab-badge\.svg"[^>]*/?>')
EXTERNAL_SCRIPT = re.compile(r'<script[^>]*src="https?://[^"]*"[^>]*>\s*</script>')


def page_paths(root: Path = ROOT) -> list[str]:
    """The site's pages, as paths in the repository."""
    return sorted({p.relative_to(root).as_posix() for pattern in PAGES for p in root.glob(pattern)})


def image_paths(pages: list[str], root: Path = ROOT) -> list[str]:
    """The repository's images that the markdown pages show (``![...](results/x.png)``)."""
    found = set()
    for page in pages:
        if page.endswith(".md"):
            for target in MARKDOWN_IMAGE.findall((root / page).read_text()):
                resolved = _target(target, page)
                if resolved and not resolved[0].startswith("..") and (root / resolved[0]).is_file():
                    found.add(resolved[0])
    return sorted(found)


@event_priority(100)  # before mkdocs-jupyter's on_files, which claims the notebooks
def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    kept = [f for f in files if not Path(f.abs_src_path or "/").resolve().is_relative_to(docs_dir)]
    paths = page_paths()
    pages = [File(path, str(ROOT), config["site_dir"], config["use_directory_urls"])
             for path in paths + image_paths(paths)]
    return Files(kept + pages)


def _target(href: str, page_uri: str) -> tuple[str, str] | None:
    """(path in the repository, '#anchor' or '') of a relative link on the page whose
    repository path is ``page_uri``; None for web links, mail, in-page anchors."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith(("#", "/")):
        return None
    path, _, anchor = href.partition("#")
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), path)), f"#{anchor}" if anchor else ""


def _elsewhere(href: str, page_uri: str, files: Files) -> str:
    """``href`` unchanged if it leads to a page or file of the site (or is not relative);
    the file in the repository if it leads to one that the site has not."""
    found = _target(href, page_uri)
    if found is None or files.get_file_from_path(found[0]) is not None:
        return href
    path, anchor = found
    if path.startswith("..") or not (ROOT / path).exists():
        return href  # leads nowhere: mkdocs (strict) or the browser check says so
    return BLOB + path + anchor


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    uri = page.file.src_uri
    return MARKDOWN_LINK.sub(lambda m: f"]({_elsewhere(m.group(1), uri, files)})", markdown)


HEADING_ID = re.compile(r'<h[1-6][^>]* id="([^"]+)"')


def _toc_to_heading_ids(page, html: str) -> None:
    """mkdocs-jupyter's table of contents (from the notebook converted to markdown) names
    each heading by the markdown slug, nbconvert's page by its own id
    ("1.-Starting-processes-with-idist.Parallel"): both list the markdown cells' headings
    in order, so the contents are given the page's ids."""
    items, stack = [], list(page.toc)[::-1]
    while stack:
        item = stack.pop()
        items.append(item)
        stack.extend(list(item.children)[::-1])
    ids = HEADING_ID.findall(html)
    if len(items) != len(ids):
        raise ValueError(f"{page.file.src_uri}: {len(items)} headings in its contents, {len(ids)} on its page")
    for item, heading_id in zip(items, ids):
        item.id = heading_id


def on_page_content(html: str, page, config, files: Files) -> str:
    """A notebook's page (mkdocs-jupyter's HTML, which mkdocs does not rewrite): links to
    pages of the site as their URLs, others to the repository; no script or image from
    another site."""
    uri = page.file.src_uri
    if not uri.endswith(".ipynb"):
        return html

    def link(m):
        href = m.group(1)
        found = _target(href, uri)
        page_file = files.get_file_from_path(found[0]) if found else None
        if page_file is not None:
            return f'href="{get_relative_url(page_file.url, page.url)}{found[1]}"'
        return f'href="{_elsewhere(href, uri, files)}"'

    _toc_to_heading_ids(page, html)
    html = COLAB_BADGE.sub("Open in Colab", html)
    html = EXTERNAL_SCRIPT.sub("", html)
    return HREF.sub(link, html)
