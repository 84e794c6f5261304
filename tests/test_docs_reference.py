"""The reference pages of the site held to the code, so that they cannot drift: the command
line page to the `obsq` parser, the configuration page to every `OBSQ_*` variable the
package reads, the metrics page to every metric the package registers, every span
attribute it sets and the observability contract of DESIGN.md, and the Kubernetes guide to
every alert of alerts/obsq.rules.yml, and the API page to `obsq.__all__`. No Redis."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re

from support import ROOT

from obsq.cli import build_parser
from obsq.observability.tracing import RECORDED_KEY, SPAN_KEY
from obsq.settings import SchedulerSettings, WorkerSettings

REFERENCE = ROOT / "docs" / "reference"
PACKAGE = ROOT / "obsq"


def string_constants(*paths) -> set[str]:
    return {node.value for path in paths for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def sections(text: str, prefix: str) -> dict[str, str]:
    """`## obsq NAME` -> the text up to the next heading of that level."""
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {part.split("\n", 1)[0].removeprefix(prefix): part for part in parts
            if part.startswith(prefix)}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def arguments(parser: argparse.ArgumentParser) -> list[str]:
    """How the page names each argument: its option strings, or a positional's name."""
    names = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        names += action.option_strings or [action.metavar or action.dest]
    return names


def test_the_cli_page_has_every_command_and_flag() -> None:
    page = sections((REFERENCE / "cli.md").read_text(), "obsq ")
    commands = subcommands()
    assert sorted(page) == sorted(commands), "commands on the page differ from the parser's"
    for name, parser in commands.items():
        missing = [a for a in arguments(parser) if f"`{a}`" not in page[name]]
        assert not missing, f"obsq {name}: {missing} are not on the page"


def test_the_cli_page_names_no_flag_the_parser_lacks() -> None:
    page = sections((REFERENCE / "cli.md").read_text(), "obsq ")
    for name, parser in subcommands().items():
        table = page[name][page[name].index("| argument |"):]
        named = set(re.findall(r"^\| `(--[\w-]+)`", table, re.M))
        stale = named - set(arguments(parser))
        assert not stale, f"obsq {name}: the page names {sorted(stale)}, the parser has none"


def env_settings() -> list[type]:
    """Every settings class that reads `OBSQ_<FIELD>` (an EnvSettings), wherever it is."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "EnvSettings" for b in node.bases):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append(getattr(importlib.import_module(module), node.name))
    assert WorkerSettings in found and SchedulerSettings in found
    return found


def test_the_configuration_page_lists_every_variable_the_package_reads() -> None:
    page = (REFERENCE / "configuration.md").read_text()
    read = {c for c in string_constants(*PACKAGE.rglob("*.py"))
            if re.fullmatch(r"OBSQ_[A-Z0-9_]+", c)}
    read |= {f"OBSQ_{f.name.upper()}" for settings in env_settings()
             for f in dataclasses.fields(settings)}
    missing = sorted(v for v in read if f"`{v}`" not in page)
    assert "OBSQ_REDIS_URL" in read and not missing, missing


def test_the_worker_table_gives_each_setting_its_row() -> None:
    page = (REFERENCE / "configuration.md").read_text()
    start = page.index("| `--redis-url` |")
    table = page[start:page.index("\n\n", start)]
    missing = [f"OBSQ_{f.name.upper()}" for f in dataclasses.fields(WorkerSettings)
               if f"`OBSQ_{f.name.upper()}`" not in table]
    assert not missing, missing


def metrics_on_page() -> set[str]:
    page = (REFERENCE / "metrics.md").read_text()
    start = page.index("| `obsq_tasks_enqueued_total`")
    return set(re.findall(r"`(obsq_\w+)`", page[start:page.index("\n\n", start)]))


def test_the_metrics_page_lists_every_metric_the_package_registers() -> None:
    registered = {c for c in string_constants(*(PACKAGE / "observability").glob("*.py"))
                  if re.fullmatch(r"obsq_[a-z_]+", c)}
    listed = metrics_on_page()
    # prometheus-client names a counter's samples <name>_total
    missing = sorted(m for m in registered if m not in listed and f"{m}_total" not in listed)
    assert "obsq_tasks_processed" in registered and not missing, missing


def test_the_metrics_page_lists_every_metric_of_the_design() -> None:
    design = (ROOT / "DESIGN.md").read_text()
    contract = {m for row in design.splitlines() if row.startswith("| `obsq_")
                for m in re.findall(r"`(obsq_\w+)`", row.split(" | ")[0])}
    assert contract and contract <= metrics_on_page(), sorted(contract - metrics_on_page())


def test_the_metrics_page_lists_every_span_attribute() -> None:
    page = (REFERENCE / "metrics.md").read_text()
    spans = page[page.index("## Spans"):]
    attributes = {c for c in string_constants(PACKAGE / "observability" / "tracing.py")
                  if re.fullmatch(r"(messaging|obsq|server|error)\.[a-z_.]+", c)}
    attributes -= {SPAN_KEY, RECORDED_KEY}  # keys of the task's context, not attributes
    missing = sorted(a for a in attributes if f"`{a}`" not in spans)
    assert "messaging.system" in attributes and not missing, missing
    for name in ("send {queue}", "create {queue}", "process {queue}"):
        assert f"`{name}`" in spans


def test_the_kubernetes_guide_lists_every_alert_with_its_runbook_section() -> None:
    import yaml

    rules = yaml.safe_load((ROOT / "alerts" / "obsq.rules.yml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    page = (ROOT / "docs" / "guides" / "kubernetes.md").read_text()
    missing = [a for a in alerts if f"[{a}](../runbook.md#{a.lower()})" not in page]
    assert alerts and not missing, missing


def test_the_api_page_shows_every_public_name() -> None:
    import obsq

    page = (REFERENCE / "api.md").read_text()
    missing = [n for n in obsq.__all__ if n != "__version__" and not re.search(rf"\b{n}\b", page)]
    assert not missing, missing
