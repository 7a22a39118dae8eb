"""mkdocs hooks of the course's site (mkdocs.yml): the pages at the repository's own paths,
and links to the rest of the repository.

mkdocs reads the pages of ``docs_dir`` only, and a config file may not sit inside the
folder it documents. These hooks give the site the repository's layout instead:
``README.md`` (the home page, ``index.html``), ``docs/*.md``, ``notebooks/NN_*.ipynb``
(rendered by mkdocs-jupyter from their committed outputs) and ``benchmarks/README.md``,
each at its path in the repository, with the images these pages show. So a relative link written for GitHub
(``../notebooks/01_processes_and_ranks.ipynb`` in a docs page, ``../docs/colab.md`` in a
notebook) leads to the same page on the site, and mkdocs checks it (``strict``).

Each exercise has a page made at build time from its stub and its hint
(scripts/exercise_pages.py); a link to an exercise's file leads to that page, and each
notebook's page ends with links to the exercises it leads to.

A link to any other file of the repository (a source file, a recorded benchmark) leads to
that file in the repository (``[project.urls] Repository`` in pyproject.toml, as the
notebooks' badges); while that names the placeholder owner, such a link is left out (its
text stays) rather than leading to a page that does not exist. The notebooks' pages fetch
nothing from other sites: the Colab badge becomes a text link and nbconvert's MathJax
script is left out (the course writes no formulas).
"""
from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

from html import escape as html_escape

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import exercise_pages  # noqa: E402
from build_notebooks import BRANCH, REPO_URL, is_published  # noqa: E402  (pyproject.toml [project.urls])

ASSETS = ["docs/assets/site.css", "docs/assets/figures.js"]  # mkdocs.yml extra_css / extra_javascript
PAGES = ("README.md", "docs/*.md", "notebooks/[0-9][0-9]_*.ipynb", "benchmarks/README.md")
# Where a link to a file of the repository leads; None while pyproject.toml names the
# placeholder owner (such links are then left out).
BLOB = f"{REPO_URL}/blob/{BRANCH}/" if is_published(REPO_URL) else None
# [text](href), the text possibly holding an image ([![badge](src)](href))
MARKDOWN_LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|!?\[[^\]]*\]\([^)]*\))*)\]\(([^)\s]+)\)")
HTML_LINK = re.compile(r'<a\s[^>]*?href="([^"]+)"[^>]*>(.*?)</a>', re.S)
MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
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


def _notebooks(nav) -> dict[str, tuple[str, str]]:
    """{"04": (its path, its title in the nav)} for the notebooks of the nav."""
    found, stack = {}, list(nav)
    while stack:
        item = stack.pop()
        for title, value in (item.items() if isinstance(item, dict) else ()):
            if isinstance(value, list):
                stack.extend(value)
            elif str(value).startswith("notebooks/"):
                found[Path(value).name[:2]] = (value, title)
    return found


def _grading_page() -> bool:
    return (ROOT / "docs" / "grading.md").is_file()


def _nav_paths(nav) -> list[str]:
    found, stack = [], list(nav)
    while stack:
        item = stack.pop()
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            if isinstance(value, list):
                stack.extend(value)
            else:
                found.append(str(value))
    return found


def on_config(config):
    """The exercises' pages in the nav, after their index (``exercises/index.md``), and
    the page on grading a class (``docs/grading.md``) where there is one and the nav
    does not name it yet."""
    grading = "docs/grading.md" not in _nav_paths(config["nav"]) and _grading_page()
    stack = list(config["nav"] or [])
    while stack:
        item = stack.pop()
        for value in (item.values() if isinstance(item, dict) else ()):
            if isinstance(value, list):
                if exercise_pages.INDEX in value:
                    after = exercise_pages.nav_titles() + ([{"Grading a class": "docs/grading.md"}] if grading else [])
                    value[value.index(exercise_pages.INDEX) + 1:] = after
                stack.extend(value)
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which claims the notebooks
def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    kept = [f for f in files if not Path(f.abs_src_path or "/").resolve().is_relative_to(docs_dir)]
    paths = page_paths()
    pages = [File(path, str(ROOT), config["site_dir"], config["use_directory_urls"])
             for path in paths + image_paths(paths) + [a for a in ASSETS if (ROOT / a).is_file()]]
    made = exercise_pages.pages(_notebooks(config["nav"]), _grading_page())
    generated = [File.generated(config, uri, content=text) for uri, text in made.items()]
    return Files(kept + pages + generated)


def _target(href: str, page_uri: str) -> tuple[str, str] | None:
    """(path in the repository, '#anchor' or '') of a relative link on the page whose
    repository path is ``page_uri``; None for web links, mail, in-page anchors."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith(("#", "/")):
        return None
    path, _, anchor = href.partition("#")
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), path)), f"#{anchor}" if anchor else ""


def _site_file(path: str, files: Files):
    """The site's file for a path of the repository: the page itself, or an exercise's
    page for its stub (``exercises/01_collectives.py``); None if the site has neither."""
    found = files.get_file_from_path(path)
    if found is None and re.fullmatch(r"exercises/\d\d_\w+\.py", path):
        found = files.get_file_from_path(path[:-3] + ".md")
    return found


def _elsewhere(href: str, page_uri: str, files: Files) -> str | None:
    """Where ``href`` on the page ``page_uri`` leads: unchanged if it leads to a page or
    file of the site (or is not relative); the exercise's page for an exercise's file;
    the file in the repository for another file of the repository, or None while the
    repository is not published (the link is then left out)."""
    found = _target(href, page_uri)
    if found is None or files.get_file_from_path(found[0]) is not None:
        return href
    path, anchor = found
    page = _site_file(path, files)
    if page is not None:
        return posixpath.relpath(page.src_uri, posixpath.dirname(page_uri) or ".") + anchor
    if path.startswith("..") or not (ROOT / path).exists():
        return href  # leads nowhere: mkdocs (strict) or the browser check says so
    return BLOB + path + anchor if BLOB else None


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    uri = page.file.src_uri

    def link(m):
        href = _elsewhere(m.group(2), uri, files)
        return m.group(1) if href is None else f"[{m.group(1)}]({href})"

    return MARKDOWN_LINK.sub(link, markdown)


HEADING = re.compile(r'<h([1-6])[^>]* id="([^"]+)"[^>]*>(.*?)</h\1>', re.S)
ANCHOR_LINK = re.compile(r'<a class="anchor-link"[^>]*>.*?</a>', re.S)


def _toc_from_headings(page, html: str) -> None:
    """mkdocs-jupyter's table of contents (from the notebook converted to markdown) names
    each heading by the markdown slug, nbconvert's page by its own id
    ("1.-Starting-processes-with-idist.Parallel"), and titles it by the heading's text
    less its `code` (Python-Markdown's toc drops the code spans' placeholders: "1. What
    did" for "1. What `auto_dataloader` did", an empty entry for a heading that is all
    code). Both list the markdown cells' headings in order, so the contents are given
    the page's ids, and its headings' text with their code."""
    items, stack = [], list(page.toc)[::-1]
    while stack:
        item = stack.pop()
        items.append(item)
        stack.extend(list(item.children)[::-1])
    headings = HEADING.findall(html)
    if len(items) != len(headings):
        raise ValueError(f"{page.file.src_uri}: {len(items)} headings in its contents, {len(headings)} on its page")
    for item, (_, heading_id, inner) in zip(items, headings):
        item.id = heading_id
        item.title = " ".join(re.sub(r"<[^>]+>", "", ANCHOR_LINK.sub("", inner)).split())


def _exercises_after(notebook_uri: str, page, files: Files) -> str:
    """The end of a notebook's page: links to the exercises that practise its topic."""
    number = Path(notebook_uri).name[:2]
    links = []
    for ex, stub in exercise_pages.stubs().items():
        target = files.get_file_from_path(exercise_pages.page_uri(stub))
        if number in exercise_pages.LEADS_TO.get(ex, ()) and target is not None:
            title = exercise_pages.task_and_code(stub)[0]
            links.append(f'<li><a href="{get_relative_url(target.url, page.url)}">Exercise {ex} · {html_escape(title)}</a></li>')
    if not links:
        return ""
    return ('<div class="admonition tip"><p class="admonition-title">Practise it</p>'
            f'<ul>{"".join(links)}</ul></div>')


def on_page_content(html: str, page, config, files: Files) -> str:
    """A notebook's page (mkdocs-jupyter's HTML, which mkdocs does not rewrite): links to
    pages of the site as their URLs, others to the repository (or left out, see
    :func:`_elsewhere`); no script or image from another site; the exercises it leads to
    at its end."""
    uri = page.file.src_uri
    if not uri.endswith(".ipynb"):
        return html

    def link(m):
        href, text = m.group(1), m.group(2)
        found = _target(href, uri)
        page_file = _site_file(found[0], files) if found else None
        if page_file is not None:
            return m.group(0).replace(f'href="{href}"', f'href="{get_relative_url(page_file.url, page.url)}{found[1]}"')
        where = _elsewhere(href, uri, files)
        return text if where is None else m.group(0).replace(f'href="{href}"', f'href="{where}"')

    _toc_from_headings(page, html)
    html = COLAB_BADGE.sub("Open in Colab", html)
    html = EXTERNAL_SCRIPT.sub("", html)
    return HTML_LINK.sub(link, html) + _exercises_after(uri, page, files)
