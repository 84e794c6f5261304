"""The pages whose code blocks the suite runs: README.md and every page of the site
(docs/**/*.md). A block is found by its language and, for the blocks a test runs with
checks of its own, by a marker: a string found in that block and no other."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
# The address the pages write; a test swaps in its own Redis.
PAGE_URL = "redis://localhost:6379/0"
# A block that is one snippet line: the site shows that file of the repository, and the
# test named here runs it.
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\n$')
INCLUDED = {"examples/webapp.py": "tests/observability/test_examples.py",
            "examples/typed_tasks.py": "tests/test_typing.py",
            "examples/fastapi_outbox.py": "tests/outbox/test_examples.py",
            **{f"examples/testing/{name}.py": "tests/test_testing.py"
               for name in ("shop", "conftest", "test_tasks")},
            **{f"examples/django/{name}.py": "tests/test_django.py"
               for name in ("mysite/settings", "orders/tasks", "orders/views", "conftest",
                            "test_orders")}}
# The blocks that tests/test_readme.py runs with checks of their own (their output, or a
# worker beside them), by marker; tests/test_docs.py runs every other Python block.
RUN_BY_TEST_README = (
    'app = obsq.App(namespace="myproject")',  # the tasks module of the project
    "asyncio.run(main())\n\nwith obsq.SyncClient(",  # the README's producer
    "obsq.Inspector(",
    "ordering_key=\"acct-42\"",
    "app.aggregate(",
    "blob:store",
    "client.schedule(",
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def included(source: str) -> str:
    """The page as the site shows it: a line `--8<-- "FILE.md:SECTION"` (or a whole
    FILE.md) replaced by that part of the file, unless the file is a page itself (its
    blocks are counted there)."""
    def part(match: re.Match[str]) -> str:
        path, _, section = match[1].partition(":")
        if ROOT / path in PAGES:
            return match[0]
        text = (ROOT / path).read_text()
        if section:
            start = text.index(f"--8<-- [start:{section}]")
            text = text[text.index("\n", start) + 1:text.index(f"--8<-- [end:{section}]")]
        return text
    return re.sub(r'^--8<-- "([^"]+\.md(?::[\w-]+)?)"$', part, source, flags=re.M)


def all_blocks() -> list[Block]:
    """Every fenced block of every page (with what it includes of other files)."""
    found = []
    for page in PAGES:
        source = included(page.read_text())
        for match in BLOCK.finditer(source):
            line = source.count("\n", 0, match.start()) + 1
            found.append(Block(page, line, match[1], match[2]))
    return found


def blocks(language: str) -> list[Block]:
    return [b for b in all_blocks() if b.language == language]


def python_block(marker: str) -> str:
    """The one Python block holding `marker`, wherever it is."""
    assert marker in RUN_BY_TEST_README, f"{marker!r} is not in RUN_BY_TEST_README"
    found = [b.text for b in blocks("python") if marker in b.text]
    assert len(found) == 1, f"{len(found)} Python blocks hold {marker!r}"
    return found[0]


def shell_commands() -> list[str]:
    """Each command of the shell blocks, each once; a block's `export` lines count as one
    command."""
    commands: list[str] = []
    for block in blocks("sh"):
        lines = [line.strip() for line in block.text.splitlines()
                 if line.strip() and not line.startswith("#")]
        exports = [line.removeprefix("export ") for line in lines if line.startswith("export ")]
        if exports:
            commands.append("export " + " ".join(exports))
        commands += [line for line in lines if not line.startswith("export ")]
    return list(dict.fromkeys(commands))


def page_text(name: str) -> str:
    return (ROOT / name).read_text()
