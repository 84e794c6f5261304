"""The site's pages, as a reader meets them: every Python block that tests/test_readme.py
does not run with checks of its own runs here as a program against a real Redis (the only
change is the Redis address), beside the README's tasks module as `myproject/tasks.py`;
every block is in a language the suite runs; every page is in the navigation; the README
stays a front door of at most 300 lines whose links resolve; the Celery migration table's
retry defaults are the code's. `mkdocs build --strict` (a step of .ci/run) fails on a
broken link or anchor."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml
from pages import (
    INCLUDED,
    PAGE_URL,
    RUN_BY_TEST_README,
    SNIPPET,
    Block,
    all_blocks,
    blocks,
    python_block,
)
from support import PYPROJECT, ROOT, obsq_env, toml

# What the suite runs: Python blocks here or in tests/test_readme.py, shell commands in
# tests/test_readme.py, each by what it is; TOML blocks (pyproject settings) here.
LANGUAGES = {"python", "sh", "toml", "yaml"}  # yaml: chart values (tests/deploy)


def standalone() -> list[Block]:
    return [b for b in blocks("python")
            if not SNIPPET.match(b.text) and not any(m in b.text for m in RUN_BY_TEST_README)]


def namespaces_of(text: str) -> set[str]:
    return set(re.findall(r'obsq\.App\(namespace="([\w.-]+)"', text))


@pytest.mark.parametrize("block", standalone(), ids=lambda b: b.where)
def test_the_python_block_runs_as_written(block: Block, tmp_path: Path,
                                          admin_redis_url: str) -> None:
    """As the admin (OBSQ_TEST_ACL restricts the tests' own user to their t* namespaces,
    and the pages' examples name theirs)."""
    redis_url = admin_redis_url
    (tmp_path / "myproject").mkdir()
    (tmp_path / "myproject" / "__init__.py").write_text("")
    (tmp_path / "myproject" / "tasks.py").write_text(
        python_block('app = obsq.App(namespace="myproject")'))
    (tmp_path / "example.py").write_text(block.text.replace(PAGE_URL, redis_url))
    try:
        result = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, text=True,
                                capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                                env=obsq_env(OBSQ_REDIS_URL=redis_url))
    finally:  # the keys of the namespaces it made, so that a rerun starts afresh
        r = redis.Redis.from_url(admin_redis_url)
        for namespace in namespaces_of(block.text) - {"myproject"}:
            for key in r.scan_iter(match=f"{namespace}:*", count=1000):
                r.unlink(key)
        r.close()
    assert result.returncode == 0, f"{block.where}\n{result.stdout}\n{result.stderr}"


def test_a_toml_block_holds_settings_this_repository_runs_with() -> None:
    """Settings a page suggests for a pyproject.toml parse, and each is the value of this
    repository's own pyproject.toml, under which the suite (and the testing guide's
    example tests) run."""
    def leaves(table: dict, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
        return [leaf for key, value in table.items() for leaf in (
            leaves(value, (*path, key)) if isinstance(value, dict) else [((*path, key), value)])]

    for block in blocks("toml"):
        for path, value in leaves(toml.loads(block.text)):
            mine: object = PYPROJECT
            for key in path:
                mine = mine.get(key) if isinstance(mine, dict) else None
            assert mine == value, f"{block.where}: {'.'.join(path)} = {value!r}, ours {mine!r}"


def test_every_block_is_in_a_language_the_suite_runs() -> None:
    others = [f"{b.where} ({b.language})" for b in all_blocks() if b.language not in LANGUAGES]
    assert not others, f"blocks no test runs: {others}"


def test_every_marker_names_one_block() -> None:
    for marker in RUN_BY_TEST_README:
        python_block(marker)


def test_an_included_file_is_one_a_test_runs() -> None:
    for block in blocks("python"):
        included = SNIPPET.match(block.text)
        if included:
            path = included[1]
            assert path in INCLUDED, f"{block.where}: {path} is run by no test named here"
            assert (ROOT / path).is_file() and (ROOT / INCLUDED[path]).is_file()
            assert Path(path).stem in (ROOT / INCLUDED[path]).read_text()


def nav_pages(entries: list) -> list[str]:
    found: list[str] = []
    for entry in entries:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            found += nav_pages(value) if isinstance(value, list) else [value]
    return found


def test_every_page_is_in_the_navigation_once() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    listed = nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(listed) == pages


def test_the_readme_stays_a_front_door() -> None:
    """At most 300 lines, every link to a file of the repository resolves (mkdocs checks the
    site's own), and it points into the site."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert [link for link in local if not (ROOT / link).exists()] == []
    assert sum(link.startswith("docs/") for link in local) >= 10


def test_getting_started_says_which_namespace_a_client_writes_to(monkeypatch) -> None:
    """An exported OBSQ_NAMESPACE reaches the `obsq` commands, not a Client in code, which
    writes to its own argument, else its App's: the page says so rather than that every
    process finds its namespace the same way."""
    import obsq

    monkeypatch.setenv("OBSQ_NAMESPACE", "exported")
    assert obsq.Client(app=obsq.App(namespace="invoicing")).namespace == "invoicing"
    assert obsq.Client("redis://localhost:6379/0", "given").namespace == "given"
    text = " ".join((ROOT / "docs" / "guides" / "getting-started.md").read_text().split())
    assert "Every process and command finds" not in text
    assert "The Client in your code reads neither variable" in text


def test_the_celery_table_says_how_long_the_default_retries_take(monkeypatch) -> None:
    """The row of Celery's retries gives obsq's default count and the time its default
    backoff spends on them before a task is dead (what a chord with a failing member waits),
    both as the code has them."""
    from obsq.engine import execution
    from obsq.settings import DEFAULT_MAX_RETRY

    def waited(jitter: float) -> float:
        monkeypatch.setattr(execution.random, "uniform", lambda low, high: jitter)
        return sum(execution.default_backoff(n) for n in range(DEFAULT_MAX_RETRY)) / 3600

    page = (ROOT / "docs" / "guides" / "migrating.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `autoretry_for="))
    assert f"{DEFAULT_MAX_RETRY} times by default" in row
    assert f"about {waited(0.5):.1f}-{waited(1.0):.0f} h before the task is dead" in row
