"""The course's site: ``mkdocs build`` (mkdocs.yml: mkdocs-material, the notebooks rendered
by mkdocs-jupyter from their committed outputs, never executed) builds with no warning,
every page is in it with the navigation and the search index, every notebook's page
shows what its recorded run printed and drew; then the pages opened in headless Chromium
(slow: the browser) load with no error, their figures decoded, their links leading
somewhere, previous / next / home on every page, and the search box finding pages.

One build per test session (a module fixture): 7.5 s, and 24 s for the browser test, on the
2-core VM at load average 5 (26 Nov 2026)."""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO_ROOT
from site_check import broken_links, static_pages

sys.path.insert(0, str(REPO_ROOT / "scripts"))
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))


def page_of(path: Path) -> str:
    """The site's page of a file of the repository (use_directory_urls: false)."""
    rel = path.relative_to(REPO_ROOT).as_posix()
    if rel.endswith("README.md"):
        return rel[: -len("README.md")] + "index.html"
    return re.sub(r"\.(md|ipynb)$", ".html", rel)


STUBS = sorted((REPO_ROOT / "exercises").glob("[0-9][0-9]_*.py"))
EXERCISE_PAGES = ["exercises/index.html"] + [f"exercises/{p.stem}.html" for p in STUBS]
PAGES = ([page_of(REPO_ROOT / "README.md")] + [page_of(p) for p in NOTEBOOKS + DOCS] + ["benchmarks/index.html"]
         + EXERCISE_PAGES)


def repository_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """The site built once: (its folder, what the build left in the repository)."""
    out = tmp_path_factory.mktemp("site") / "site"
    before = repository_state()
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    # .hypothesis/ is the test suite's own cache, written by the tests that run meanwhile
    written = sorted(line for line in set(repository_state().splitlines()) - set(before.splitlines())
                     if not line[3:].startswith(".hypothesis/"))
    assert built.returncode == 0, built.stderr[-4000:]
    # strict: a warning fails the build; and none is printed (a broken link or anchor, a
    # page missing from the nav, a notebook mkdocs-jupyter could not read)
    warnings = [ln for ln in built.stderr.splitlines() if ln.startswith("WARNING")]
    assert not warnings, warnings
    return out, written


@pytest.fixture(scope="module")
def site(build):
    return build[0]


def test_every_page_is_built_from_the_repository_without_writing_into_it(build):
    site, written = build
    missing = [p for p in PAGES if not (site / p).is_file()]
    assert not missing, missing
    assert not written, written  # no cache, no site/ beside the sources


def test_search_index_holds_every_page(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    located = {doc["location"].split("#")[0] or "index.html" for doc in index["docs"]}
    assert set(PAGES) <= located, sorted(set(PAGES) - located)
    # a notebook's page is searchable by its code and prose: the call it teaches
    text = " ".join(d["text"] for d in index["docs"] if d["location"].startswith("notebooks/01_"))
    assert "all_reduce" in text


def test_links_to_exercises_lead_to_their_pages_and_none_to_the_placeholder(site):
    from build_notebooks import REPO_URL, is_published

    home = (site / "index.html").read_text()
    assert 'href="exercises/01_collectives.html"' in home  # "Do exercise 01", the exercises' table
    assert 'href="notebooks/01_processes_and_ranks.html"' in home and 'href="docs/course.html"' in home
    # a notebook's links to the docs and to the next notebook are the site's pages
    page = (site / page_of(NOTEBOOKS[0])).read_text()
    assert 'href="../docs/colab.html"' in page and "colab-badge.svg" not in page
    assert not re.search(r'href="[^"]*\.(ipynb|md)(#[^"]*)?"', page.replace(f'href="{NOTEBOOKS[0].name}"', ""))
    if not is_published(REPO_URL):  # no link anywhere to the placeholder's pages
        linked = {name: [h for h in found["links"] if "github.com/OWNER" in h]
                  for name, found in static_pages(site).items()}
        assert not any(linked.values()), {k: v for k, v in linked.items() if v}


def test_no_link_leads_to_a_missing_page_or_anchor(site):
    """Every link of every page as built (mkdocs' own, the hooks', mkdocs-jupyter's HTML,
    the generated exercise pages) leads to a file of the site and an id on it."""
    seen = static_pages(site)
    assert set(PAGES) <= set(seen)
    assert not broken_links(site, seen)


@pytest.mark.parametrize("stub", STUBS, ids=lambda p: p.stem)
def test_every_exercise_has_a_page_with_its_task_code_check_and_hint(site, stub):
    """Made from the stub and exercises/hints.md at build time: the page holds the
    docstring's task, the stub's code, its check command and its hint behind a click
    (a <details> closed until clicked), and a notebook's page links to it."""
    import ast

    import exercise_pages
    from distkit.commands.check import hint_for

    number = stub.name[:2]
    page = (site / f"exercises/{stub.stem}.html").read_text()
    shown = plain(html.unescape(re.sub(r"<[^>]+>", " ", page)))
    doc = ast.get_docstring(ast.parse(stub.read_text()))
    task = next(ln for ln in doc.splitlines()[2:] if len(ln) > 40)  # a line of the task's prose
    as_text = plain(html.unescape(re.sub(r"<[^>]+>", "", page)))  # highlighted code: a span per token
    assert plain(re.sub(r"``|:class:|\*", "", task))[:40] in as_text, task
    code = exercise_pages.task_and_code(stub)[2]
    defs = [ln.strip() for ln in code.splitlines() if ln.startswith("def ")]
    assert defs and all(plain(d) in as_text for d in defs), defs
    assert f"distkit check {number}" in shown
    hint = hint_for(REPO_ROOT / "exercises", number).split("\n", 1)[1]
    closed = re.search(r"<details[^>]*>(.*?)</details>", page, re.S)
    assert closed and " open" not in page[closed.start():closed.start() + 30]
    first = next(ln for ln in hint.splitlines() if len(ln.strip()) > 20 and not ln.startswith("`"))
    hidden = plain(html.unescape(re.sub(r"<[^>]+>", "", closed.group(1))))
    assert plain(re.sub(r"[`*]|^- ", "", first.strip()))[:20] in hidden, first
    leading = [p for p in NOTEBOOKS if f"../exercises/{stub.stem}.html" in (site / page_of(p)).read_text()]
    assert leading, f"no notebook page links to exercise {number}"


def nav_sections() -> dict[str, list[str]]:
    """{section of mkdocs.yml's nav: the site's pages in it} (Home is its own section;
    the exercises' pages, added by the hooks, are the Exercises section's)."""
    import yaml

    sections = {}
    for item in yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())["nav"]:
        ((title, value),) = item.items()
        paths = [value] if isinstance(value, str) else [
            v if isinstance(v, str) else next(iter(v.values())) for v in value]
        sections[title] = [page_of(REPO_ROOT / p) if not p.startswith("exercises/") else p[:-3] + ".html"
                           for p in paths]
    sections["Exercises"] = sorted(set(sections.get("Exercises", []) + EXERCISE_PAGES))
    return sections


LEARNER_SECTIONS = ("Home", "Notebooks", "Exercises", "Course")
# What only a maintainer needs to read: the kit's history and the machinery of its checks.
HISTORY = re.compile(r"\bissue #?\d+|\bturn \d", re.I)  # not "TP issues 4 all-reduces"
INTERNAL = re.compile(r"\bharness\b|KNOWN_STDERR|conftest|code_digest", re.I)


def article(page_html: str) -> str:
    """The text of a page's content (not the nav, whose titles name every page)."""
    found = re.search(r"<article[^>]*>(.*)</article>", page_html, re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1) if found else page_html))


def test_learner_pages_carry_no_issue_numbers_history_or_internals(site):
    """The learner's sections (home, notebooks, exercises, the course) say nothing of the
    kit's issues, its turns or its checks' insides; the pages of "Using distkit" carry
    no issue numbers either; the maintainers' section holds the rest."""
    sections = nav_sections()
    assert set(LEARNER_SECTIONS) <= set(sections) and "Maintainers" in sections
    assert "docs/exercises.html" in sections["Maintainers"]
    found = {}
    for section, pages in sections.items():
        if section == "Maintainers":
            continue
        for name in pages:
            text = article((site / name).read_text())
            bad = HISTORY.findall(text) + (INTERNAL.findall(text) if section in LEARNER_SECTIONS else [])
            if bad:
                found[name] = bad
    assert not found, found
    # the check can fail: the maintainers' page on the checks names the harness and issues
    maintainers = article((site / "docs/exercises.html").read_text())
    assert HISTORY.search(maintainers) and INTERNAL.search(maintainers)


def outputs(path: Path) -> tuple[list[str], int]:
    """What the notebook's recorded run printed (stdout, each output's text) and how many
    figures it drew."""
    nb = json.loads(path.read_text())
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    printed = ["".join(o["text"]) for o in outs if o.get("name") == "stdout"]
    figures = sum("image/png" in o.get("data", {}) for o in outs)
    return printed, figures


def plain(text: str) -> str:
    """Text as a page shows it, compared without markup, ANSI colours or spacing."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    return " ".join(text.split())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_page_shows_its_recorded_outputs(site, path):
    page = (site / page_of(path)).read_text()
    printed, figures = outputs(path)
    assert page.count('src="data:image/png;base64,') == figures, path.name
    shown = plain(html.unescape(re.sub(r"<[^>]+>", "", page)))
    missing = [t[:100] for t in printed if plain(t) not in shown]
    assert not missing, (path.name, missing)
    assert "Recorded run: the outputs below are those of one run" in shown
    # its title is the nav's (mkdocs.yml), whole: "07 · Timing with Timer", not the
    # heading with its `code` dropped
    nav = re.search(rf"^\s*- ({path.name[:2]} · [^:]+): notebooks/{path.name}$",
                    (REPO_ROOT / "mkdocs.yml").read_text(), re.M)
    assert nav and f"<title>{html.escape(nav.group(1), quote=False)} - distkit</title>" in page, path.name


def toc_titles(page_html: str) -> list[str]:
    """The entries of a page's table of contents, as shown."""
    toc = page_html[page_html.index("md-nav--secondary"):]
    toc = toc[:toc.index("</ul>\n  \n</nav>") if "</ul>\n  \n</nav>" in toc else len(toc)]
    return [" ".join(html.unescape(t).split())
            for t in re.findall(r'class="md-nav__link">\s*<span class="md-ellipsis">(.*?)</span>', toc, re.S)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_contents_keep_the_code_of_their_headings(site, path):
    """Every heading of the notebook's markdown cells (but its title) is an entry of the
    page's table of contents, its `code` included, none empty."""
    nb = json.loads(path.read_text())
    headings = [" ".join(re.sub(r"`|\*\*", "", ln.lstrip("#")).split())
                for c in nb["cells"] if c["cell_type"] == "markdown"
                for ln in "".join(c["source"]).splitlines() if re.match(r"#{2,6} ", ln)]
    titles = toc_titles((site / page_of(path)).read_text())
    assert all(titles), titles
    missing = [h for h in headings if h not in titles]
    assert not missing, (missing, titles)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pages_fit_a_1280_px_window_and_figures_open_at_full_size(site, tmp_path):
    """At 1280 px in headless Chromium: no page scrolls sideways; of the notebooks' code
    cells at most 3 in 100 do, and at most 1 in 5 on any page (a typical cell fits the
    column: 5 of 389 scrolled when this was written, lines of 120 characters and more); a figure drawn
    1290 px wide is shown at least 800 px wide (it was 583 px in a 600 px column), and a
    click on it shows it at its natural width."""
    from site_check import measure

    pages = ["index.html", "exercises/01_collectives.html"] + [page_of(p) for p in NOTEBOOKS]
    found = measure(site, pages)
    for name, m in found.items():
        assert not m["page_scrolls"], name
        assert m["code_scrolling"] <= m["code_blocks"] / 5, (name, m["code_scrolling"], m["code_blocks"])
        for figure in m["figures"]:
            assert figure["shown"] >= min(800, figure["natural"]), (name, figure)
        if m["figures"]:
            assert m["opened"] == m["figures"][0]["natural"], (name, m["opened"], m["figures"][0])
    assert sum(len(m["figures"]) for m in found.values()) >= 10
    cells = [found[page_of(p)] for p in NOTEBOOKS]
    assert sum(m["code_scrolling"] for m in cells) <= 0.03 * sum(m["code_blocks"] for m in cells)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_site_in_a_browser_loads_navigates_shows_figures_and_searches(site, tmp_path):
    """Every page in headless Chromium: loads with no console error or failed request
    (nothing fetched from another site), every figure an image the browser decoded, a
    screenshot that is not blank, no link leading nowhere, a link home and previous /
    next in the nav's order on every page; the search box finds the notebook that
    teaches ``all_gather``."""
    from site_check import inspect_site, search

    seen = inspect_site(site, PAGES, tmp_path / "screenshots")
    for name, found in seen.items():
        assert found["status"] == 200 and not found["problems"], (name, found["problems"])
        assert all(i["complete"] and i["width"] > 0 and i["height"] > 0 for i in found["images"]), name
        assert found["screenshot"].stat().st_size > 10_000, name  # a page drawn, not a blank one
    assert not broken_links(site, seen)
    for path in NOTEBOOKS:
        figures = outputs(path)[1]
        shown = [i for i in seen[page_of(path)]["images"] if i["src"].startswith("data:image/png")]
        assert len(shown) == figures, (path.name, len(shown), figures)
    # the nav's order (mkdocs.yml): home, every notebook, then the docs pages, walked by
    # following each page's "next" link; each page's "previous" leads back
    walked, page = [], "index.html"
    while page and page not in walked:
        walked.append(page)
        found = seen[page]
        assert found["home"] is not None and _resolve(page, found["home"]) == "index.html", page
        page = _resolve(page, found["next"]) if found["next"] else None
        if page:
            assert _resolve(page, seen[page]["previous"]) == walked[-1], (page, seen[page]["previous"])
    assert sorted(walked) == sorted(PAGES), sorted(set(PAGES) - set(walked))
    assert walked[1:1 + len(NOTEBOOKS)] == [page_of(p) for p in NOTEBOOKS]
    results = search(site, "index.html", "all_gather")
    assert any("notebooks/01_processes_and_ranks.html" in r for r in results), results


def _resolve(page: str, href: str) -> str:
    from posixpath import dirname, join, normpath

    return normpath(join(dirname(page), href.split("#")[0]))


def test_hooks_send_a_link_to_a_page_to_the_page_and_others_to_the_repository(tmp_path, monkeypatch):
    """scripts/site_hooks.py on a notebook's links: a notebook or docs page of the site is
    its page; an exercise's file is the exercise's page; another file of the repository is
    that file in the published repository, or no link while the repository is the
    placeholder; a link that leads nowhere is left as written, for the checks to find."""
    from mkdocs.structure.files import File, Files

    import site_hooks

    files = Files([File(p, str(REPO_ROOT), str(tmp_path), False) for p in site_hooks.page_paths()]
                  + [File(p, str(REPO_ROOT), str(tmp_path), False) for p in ("exercises/01_collectives.md",)])
    here = "notebooks/01_processes_and_ranks.ipynb"
    assert site_hooks._elsewhere("02_gpus_with_nccl.ipynb#x", here, files) == "02_gpus_with_nccl.ipynb#x"
    assert site_hooks._elsewhere("../exercises/01_collectives.py", here, files) == "../exercises/01_collectives.md"
    assert site_hooks._elsewhere("exercises/01_collectives.py", "README.md", files) == "exercises/01_collectives.md"
    monkeypatch.setattr(site_hooks, "BLOB", None)  # the placeholder: left out
    assert site_hooks._elsewhere("../src/distkit/config.py", here, files) is None
    assert site_hooks.MARKDOWN_LINK.sub(lambda m: m.group(1), "see [`config.py`](../src/distkit/config.py).") \
        == "see `config.py`."
    monkeypatch.setattr(site_hooks, "BLOB", "https://github.com/someone/fork/blob/main/")
    assert site_hooks._elsewhere("../src/distkit/config.py#L3", here, files) == \
        "https://github.com/someone/fork/blob/main/src/distkit/config.py#L3"
    for nowhere in ("../docs/no_such_page.md", "../../outside.md", "https://pytorch.org", "#anchor"):
        assert site_hooks._elsewhere(nowhere, here, files) == nowhere
    assert "benchmarks/results/bench-quick.png" in site_hooks.image_paths(site_hooks.page_paths())


def test_site_page_recording_times_are_the_notebooks_own():
    """docs/site.md's table of recorded runs says what each notebook's metadata says."""
    text = (REPO_ROOT / "docs" / "site.md").read_text()
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^\| (\d\d) · [^|]+\| (\d+) \| ([\d.]+) \| ([\d-]+ [\d:]+) \|$", text, re.M)}
    assert sorted(rows) == [p.name[:2] for p in NOTEBOOKS], sorted(rows)
    for path in NOTEBOOKS:
        recorded = json.loads(path.read_text())["metadata"]["distkit"]["recorded"]
        want = (f"{recorded['seconds']:.0f}", f"{recorded['load_average']:.1f}", recorded["date"].removesuffix(" UTC"))
        assert rows[path.name[:2]] == want, (path.name, rows[path.name[:2]], want)
