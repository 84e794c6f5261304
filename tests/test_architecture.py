"""The package's shape, checked on its source (no Redis): imports run down the layers of
DESIGN.md section 2 with no cycle (so the engine and the producer know nothing of
observability), the old public paths of moved names still import, no module grows past 400
lines, every Lua script names the prelude helpers it relies on, and each part calls only
what its role of the broker (obsq/broker/roles.py) names. `python3 -m pytest -q
tests/test_architecture.py` is the command to check it."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from support import ROOT

from obsq.broker import Broker, roles

PACKAGE = ROOT / "obsq"
MAX_LINES = 400
# Public paths of names that moved into a layer, each kept as a re-export (DESIGN.md
# section 2): `module: name`. Nothing in the package imports them.
OLD_PATHS = {"obsq.producer_chain": "sync_safe", "obsq.flow_client": "ClientFlows",
             "obsq.pools.child": "on_child_start"}
# The layers, top first (DESIGN.md section 2 draws them): a module imports only modules of
# its own layer and of the layers below it. A package is a layer of its own, with all its
# subpackages; "obsq" alone is the package root, the public names.
LAYERS = (
    ("obsq.__main__", "obsq.cli"),
    ("obsq.ops",),
    ("obsq", "obsq.testing", "obsq.pytest_plugin", "obsq.producer_chain", "obsq.flow_client",
     "obsq.pools"),
    ("obsq.observability",),
    ("obsq.inspection",),
    ("obsq.engine",),
    ("obsq.producer",),
    ("obsq.app", "obsq.loop"),
    ("obsq.broker",),
    ("obsq.schedule", "obsq.flow"),
    ("obsq.task",),
    ("obsq.settings", "obsq.names", "obsq.seconds", "obsq.partitions", "obsq.patterns",
     "obsq.priority", "obsq.progress_call", "obsq.clock", "obsq.errors", "obsq.redis_server",
     "obsq._version"),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(module: str) -> set[str]:
    """The obsq modules `module` imports, anywhere in it (lazy imports too), except under
    `if TYPE_CHECKING:`; `from obsq import x` counts as importing obsq.x when x is a
    module, else as importing the package root."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names if a.name.split(".")[0] == "obsq")

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level or not node.module or node.module.split(".")[0] != "obsq":
                return
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)

    Visitor().visit(ast.parse(MODULES[module].read_text()))
    return {m for m in found if m in MODULES and m != module}


GRAPH = {module: imports_of(module) for module in MODULES}


def test_the_import_graph_has_no_cycle() -> None:
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dependency in sorted(GRAPH[module]):
            if state.get(dependency) == "open":
                cycle = [*path[path.index(dependency):], dependency]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dependency not in state:
                visit(dependency, [*path, dependency])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


def layer_of(module: str) -> int | None:
    for index, members in enumerate(LAYERS):
        for member in members:
            if module == member or (member != "obsq" and module.startswith(member + ".")):
                return index
    return None


def test_every_module_has_a_layer() -> None:
    assert sorted(m for m in MODULES if layer_of(m) is None) == []


def test_imports_run_down_the_layers() -> None:
    upward = sorted(
        f"{module} imports {dependency}" for module, deps in GRAPH.items()
        for dependency in deps if (layer_of(dependency) or 0) < (layer_of(module) or 0))
    assert upward == []


def test_the_old_public_paths_import_what_moved() -> None:
    import importlib

    for path, name in OLD_PATHS.items():
        old = getattr(importlib.import_module(path), name)
        assert old.__module__ != path and getattr(importlib.import_module(old.__module__),
                                                  name) is old
    assert sorted(f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps
                  if d.startswith(tuple(OLD_PATHS))) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_grows_past_400_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_every_script_names_the_prelude_helpers_it_uses() -> None:
    scripts = PACKAGE / "broker" / "scripts"
    prelude = "".join(p.read_text() for p in scripts.glob("_*.lua"))
    helpers = set(re.findall(r"^local function (\w+)", prelude, re.M))
    for path in sorted(scripts.glob("[!_]*.lua")):
        text = path.read_text()
        header = re.match(r"-- prelude:(.*\n(?:--   .*\n)*)", text)
        assert header, f"{path.name} does not name its helpers on its first line(s)"
        body = text[header.end():]
        named = set(re.findall(r"\w+", header[1])) - {"none"}
        used = {h for h in helpers if re.search(rf"\b{h}\(", body)}
        assert named == used, f"{path.name}: names {sorted(named)}, uses {sorted(used)}"


# redis-py below its public API, and scripts called by SHA or loaded: the runner's alone.
RUNNER_ONLY = re.compile(r"\b(send_packed_command|read_response|can_read\w*|pack_command|"
                         r"evalsha|script_load|is_noscript|NoScriptError)\b")


def test_only_the_runner_calls_scripts_and_drives_connections() -> None:
    runner = PACKAGE / "broker" / "runner.py"
    offenders = {
        path.name: sorted(set(RUNNER_ONLY.findall(_code(path))))
        for path in PACKAGE.rglob("*.py") if path != runner}
    assert {name: words for name, words in offenders.items() if words} == {}


def _code(path: Path) -> str:
    """A module's code without its comments and strings (acl.py names commands)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.unparse(tree)


# -- the broker's roles (obsq/broker/roles.py) ---------------------------------------------

ROLES = {name: cls for name, cls in vars(roles).items()
         if isinstance(cls, type) and cls.__module__ == roles.__name__}
# Parts held to a role that they do not name: those that keep the Broker they make (or the
# worker's own, or hand it to a Client), and the forwarder, whose broker is its LockedLoop's.
OWNERS = {"obsq.producer.client": "ProducerBroker", "obsq.producer.sync_client": "ProducerBroker",
          "obsq.engine.worker": "WorkerBroker", "obsq.engine.fetching": "WorkerBroker",
          "obsq.engine.settlement": "WorkerBroker", "obsq.engine.aggregation": "WorkerBroker",
          "obsq.engine.scheduler": "UpkeepBroker",
          "obsq.engine.maintenance.forwarder": "UpkeepBroker",
          "obsq.inspection.inspector": "InspectionBroker"}


def role_members(role: type) -> set[str]:
    """What a role names, its bases' included: methods and attributes."""
    return {name for cls in role.__mro__ if cls.__module__ == roles.__name__
            for name in (*vars(cls).get("__annotations__", {}),
                         *(n for n, v in vars(cls).items() if inspect.isfunction(v)))
            if not name.startswith("_")}


def broker_uses(module: str) -> set[str]:
    """The attributes a module reads of a broker: `broker.x`, `self.broker.x`,
    `self._broker.x`, `client.broker.x`."""
    used = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id in ("broker", "_broker")) or (
                    isinstance(owner, ast.Attribute) and owner.attr in ("broker", "_broker")):
                used.add(node.attr)
    return used


def test_each_role_names_the_brokers_methods_as_the_broker_has_them() -> None:
    broker = Broker("redis://127.0.0.1:1/0", "roles")  # no connection is made
    for name, role in ROLES.items():
        for member in role_members(role):
            assert hasattr(broker, member), f"{name}.{member}: the Broker has no {member}"
            declared = getattr(role, member, None)
            if inspect.isfunction(declared):
                real = getattr(Broker, member)
                assert inspect.signature(declared) == inspect.signature(real), (
                    f"{name}.{member}{inspect.signature(declared)} differs from the "
                    f"Broker's {member}{inspect.signature(real)}")
                assert inspect.iscoroutinefunction(declared) == (
                    inspect.iscoroutinefunction(real)), f"{name}.{member}"


def test_each_part_calls_only_what_its_role_of_the_broker_names() -> None:
    held = dict(OWNERS)
    for module in MODULES:
        named = {n.id for n in ast.walk(ast.parse(MODULES[module].read_text()))
                 if isinstance(n, ast.Name) and n.id in ROLES}
        if named and not module.startswith("obsq.broker"):
            assert len(named) == 1, f"{module} names several roles of the broker: {named}"
            held[module] = named.pop()
    assert len(held) > len(OWNERS)
    beyond = {module: sorted(broker_uses(module) - role_members(ROLES[role]))
              for module, role in held.items()}
    assert {m: names for m, names in beyond.items() if names} == {}
