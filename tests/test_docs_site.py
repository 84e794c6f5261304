"""The documentation site as built by `mkdocs build`, read in a real chromium: its search
finds the words a team coming from Celery types (the tokenizer splits at punctuation), it
reads from files (file://) with no directory listing in the way, and a long code line wraps
at 1280 px rather than being cut. Screenshots under the test's tmp dir."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, missing_tool

VIEWPORT = {"width": 1280, "height": 800}
# what a Celery user searches for: the migration guide answers each
CELERY_WORDS = ("acks_late", "countdown", "django", "eta", "time_limit")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mkdocs = shutil.which("mkdocs")
    if not mkdocs:
        missing_tool("mkdocs is not installed (pip install -e '.[docs]')")
    built = tmp_path_factory.mktemp("site")
    result = subprocess.run([mkdocs, "build", "--strict", "--quiet", "--site-dir", str(built)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    return built


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site over HTTP on a free port of 127.0.0.1 (its search loads its index by fetch,
    which a page opened from a file may not)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


async def test_search_finds_what_a_celery_user_types(served: str, browser, tmp_path: Path
                                                      ) -> None:
    page = await (await browser.new_context(viewport=VIEWPORT)).new_page()
    found: dict[str, list[str]] = {}
    for word in CELERY_WORDS:
        await page.goto(served + "/index.html")
        await _search_says(page, "Type to start searching")  # its index is loaded
        await page.click("input.md-search__input")  # typed as a reader types it
        await page.keyboard.type(word)
        await _search_says(page, "matching")
        await page.screenshot(path=tmp_path / f"search-{word}-1280.png")
        found[word] = await _every_result(page)
    missing = [w for w, links in found.items()
               if not any("guides/migrating" in link for link in links)]
    assert not missing, f"the Celery migration guide is not found for {missing}: {found}"
    assert any("guides/django" in link for link in found["django"]), found["django"]


def test_every_link_of_the_site_opens_a_file(site: Path) -> None:
    """Opened from files, a link to a directory shows its listing: every link between pages
    names a file."""
    broken = []
    for page in set(site.rglob("*.html")) - {site / "404.html"}:  # a server's, by design
        for target in re.findall(r'href="([^"#?]*)', page.read_text()):
            if not target or re.match(r"[a-z]+:", target):
                continue  # an anchor of the page itself, or another site
            if not (page.parent / target).is_file():
                broken.append(f"{page.relative_to(site)} -> {target}")
    assert not broken, broken[:20]


async def test_the_site_reads_from_files(site: Path, browser, tmp_path: Path) -> None:
    page = await (await browser.new_context(viewport=VIEWPORT)).new_page()
    await page.goto((site / "index.html").as_uri())
    await page.locator("nav.md-nav--primary a", has_text="Coming from Celery").first.click()
    await page.wait_for_load_state()
    assert page.url.endswith("/guides/migrating.html")
    assert (await page.inner_text("h1")).startswith("Coming from Celery")
    await page.screenshot(path=tmp_path / "migrating-file-1280.png")


async def test_a_long_code_line_wraps_at_1280_px(served: str, browser, tmp_path: Path
                                                  ) -> None:
    page = await (await browser.new_context(viewport=VIEWPORT)).new_page()
    cut: dict[str, list[str]] = {}
    for name in ("guides/kubernetes.html", "guides/console.html", "guides/workers.html",
                 "guides/tasks.html"):
        assert (await page.goto(f"{served}/{name}")).ok
        cut[name] = await page.eval_on_selector_all(
            "pre > code", "codes => codes.filter(c => c.scrollWidth > c.clientWidth)"
                          ".map(c => c.textContent.split('\\n')[0])")
        await page.screenshot(path=tmp_path / f"{Path(name).stem}-1280.png", full_page=True)
    assert not any(cut.values()), cut


async def _every_result(page: Any) -> list[str]:
    """The links of every result: the list shows ten more each time it is scrolled to its
    end."""
    links: list[str] = []
    while True:
        shown = await page.eval_on_selector_all(
            ".md-search-result__item > a", "links => links.map(a => a.getAttribute('href'))")
        if len(shown) == len(links):
            return links
        links = shown
        await page.locator(".md-search-result__item").last.scroll_into_view_if_needed()
        await page.wait_for_timeout(300)


async def _search_says(page: Any, words: str) -> None:
    await page.wait_for_function(
        "words => document.querySelector('.md-search-result__meta').textContent"
        ".toLowerCase().includes(words)", arg=words.lower())
