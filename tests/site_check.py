"""The course's site (mkdocs.yml), looked at in a real headless browser (Debian's
Chromium, driven by Playwright): used by tests/site/test_site.py.

Chromium comes from the machine's packages: :func:`chromium` installs Debian's
``chromium`` with apt-get when it is missing and this is root (CI runs as root), so the
README's test command is all it takes. Playwright's own browser download is never used
(this machine reaches no browser builds): Playwright drives ``/usr/bin/chromium``.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest

# What the machine's notes say Chromium needs here: no sandbox as root, and none of the
# background connections that a closed network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def chromium() -> str:
    """Path of a Chromium to drive; installed from Debian's packages when missing (root
    only); otherwise the test is skipped, saying how to install it."""
    found = next((p for p in CHROMIUM_PATHS if os.access(p, os.X_OK)), None)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no Chromium here and not root to install it: sudo apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr[-2000:]}"
    assert os.access(CHROMIUM_PATHS[0], os.X_OK), "apt-get installed chromium, but no /usr/bin/chromium"
    return CHROMIUM_PATHS[0]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class served:
    """``folder`` served over HTTP on 127.0.0.1 (a free port) while in the ``with``."""

    def __init__(self, folder: Path):
        handler = functools.partial(_Quiet, directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


# Run in each page: its images (decoded or not), its links, the ids anchors can target.
INSPECT = """() => ({
  title: document.title,
  images: Array.from(document.images).map(i => ({src: i.getAttribute('src').slice(0, 40),
            complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
  ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
  text: document.body.innerText,
  // mkdocs-material's navigation: the header's link home, the footer's previous / next
  home: document.querySelector('a.md-header__button.md-logo')?.getAttribute('href') ?? null,
  previous: document.querySelector('a.md-footer__link--prev')?.getAttribute('href') ?? null,
  next: document.querySelector('a.md-footer__link--next')?.getAttribute('href') ?? null,
})"""


def inspect_site(site: Path, pages: list[str], shots: Path) -> dict:
    """Open every page of ``site`` in headless Chromium: {page: what INSPECT found, plus
    the HTTP status, the console errors and failed requests, the screenshot's path}."""
    from playwright.sync_api import sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    seen = {}
    with served(site) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            for name in pages:
                seen[name] = _inspect_page(browser, url, name, shots)
        finally:
            browser.close()
    return seen


def _inspect_page(browser, url: str, name: str, shots: Path) -> dict:
    """One page in a tab of its own, so that a request the previous page left running
    (its search worker) and the browser aborts on leaving is not blamed on this one."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    # (a missing favicon.ico is the browser's own request, not the site's)
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" and "favicon" not in (m.location or {}).get("url", "") else None)
    page.on("requestfailed", lambda r: problems.append(f"request failed ({r.failure}): {r.url}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
    try:
        response = page.goto(url + name, wait_until="load")
        found = page.evaluate(INSPECT)
        shot = shots / (Path(name).stem + ".png")
        if found["images"]:  # the screenshot shows the page's first figure
            page.locator("img").first.scroll_into_view_if_needed()
        page.screenshot(path=str(shot))
        found.update(status=response.status, problems=list(problems), screenshot=shot)
        return found
    finally:
        page.close()


def search(site: Path, page_name: str, query: str, timeout_ms: int = 60_000) -> list[str]:
    """Type ``query`` into the search box of ``page_name`` (mkdocs-material's search, run
    by the browser on the site's search index) and return the links of its results."""
    from playwright.sync_api import sync_playwright

    with served(site) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url + page_name, wait_until="load")
            page.click("input.md-search__input")  # in the header at this width
            page.keyboard.type(query)
            page.wait_for_selector(".md-search-result__item a", timeout=timeout_ms)
            return page.eval_on_selector_all(".md-search-result__item a",
                                             "links => links.map(a => a.getAttribute('href'))")
        finally:
            browser.close()


def broken_links(site: Path, seen: dict) -> list[str]:
    """Links of the site that lead nowhere: a page or file missing from the site, or an
    anchor no element of its target page carries. Links off the site are only checked
    for their form (this machine reaches no other site)."""
    broken = []
    for name, found in seen.items():
        for href in found["links"]:
            target = urlparse(urljoin(f"http://site/{name}", href))
            if target.scheme in ("http", "https") and target.netloc != "site":
                if not target.netloc:
                    broken.append(f"{name}: {href}")
                continue
            if target.scheme not in ("http", "https"):
                broken.append(f"{name}: {href} (not a web link)")
                continue
            page = target.path.lstrip("/") or "index.html"
            if not (site / page).is_file():
                broken.append(f"{name}: {href} (no {page} in the site)")
            elif target.fragment and target.fragment not in seen.get(page, {}).get("ids", ()):
                broken.append(f"{name}: {href} (no #{target.fragment} in {page})")
    return broken


def shown_text(text: str) -> str:
    """Text as a page shows it and as it is compared: no ANSI colour codes, a line
    rewritten with carriage returns as its last state, runs of whitespace as one space."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    text = "\n".join(line.split("\r")[-1] for line in text.split("\n"))
    return " ".join(text.split())


class _LinksAndIds(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if attrs.get("id"):
            self.ids.append(attrs["id"])


def static_pages(site: Path) -> dict:
    """Every HTML page of ``site`` as its files hold it (no browser): {page: {"links",
    "ids"}}, the shape :func:`broken_links` reads."""
    seen = {}
    for path in sorted(site.rglob("*.html")):
        parser = _LinksAndIds()
        parser.feed(path.read_text())
        seen[path.relative_to(site).as_posix()] = {"links": parser.links, "ids": parser.ids}
    return seen


# Run in a page: how wide its column, figures and code are, as the reader sees them.
MEASURE = """() => {
  const blocks = Array.from(document.querySelectorAll('.md-content pre'))
      .filter(p => p.offsetParent !== null && !p.closest('details:not([open])'));
  const figures = Array.from(document.querySelectorAll('.md-content img'))
      .filter(i => i.naturalWidth > 300);
  return {
    column: document.querySelector('.md-content').clientWidth,
    page_scrolls: document.documentElement.scrollWidth > document.documentElement.clientWidth,
    code_blocks: blocks.length,
    code_scrolling: blocks.filter(p => p.scrollWidth > p.clientWidth + 1).length,
    figures: figures.map(i => ({natural: i.naturalWidth, shown: Math.round(i.getBoundingClientRect().width)})),
  };
}"""


def measure(site: Path, pages: list[str], shots: Path | None = None, width: int = 1280) -> dict:
    """{page: MEASURE's findings} in headless Chromium at ``width`` px; with ``shots``, a
    screenshot of each (its top, the first figure scrolled into view) there too, and
    whether a click on the first figure showed it at its natural width."""
    from playwright.sync_api import sync_playwright

    found = {}
    with served(site) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            for name in pages:
                page.goto(url + name, wait_until="load")
                found[name] = page.evaluate(MEASURE)
                figure = page.locator(".md-content img").first
                if found[name]["figures"]:
                    figure.scroll_into_view_if_needed()
                if shots is not None:
                    shots.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(shots / (name.replace("/", "_")[:-5] + ".png")))
                if found[name]["figures"]:
                    figure.click()
                    full = page.locator(".dk-figure-full img")
                    found[name]["opened"] = round(full.bounding_box()["width"]) if full.count() else None
                    page.keyboard.press("Escape")
        finally:
            browser.close()
    return found
