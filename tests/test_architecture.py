"""The package's shape, checked on its source (no Redis): imports run down the layers of
DESIGN.md section 2 with no cycle (so the engine and the producer know nothing of
observability), and every Lua script is loaded with the prelude helpers it relies on.
`python3 -m pytest -q tests/test_architecture.py` is the command to check it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support import ROOT

from obsq.broker.scripts import VARIANTS, scripts

PACKAGE = ROOT / "obsq"
# The layers, top first (DESIGN.md section 2 draws them): a module imports only modules of
# its own layer and of the layers below it. A package is a layer of its own, with all its
# subpackages; "obsq" alone is the package root, the public names.
LAYERS = (
    ("obsq.__main__", "obsq.cli"),
    ("obsq.ops", "obsq.outbox", "obsq.django"),
    ("obsq", "obsq.testing", "obsq.pytest_plugin"),
    ("obsq.observability",),
    ("obsq.inspection",),
    ("obsq.engine",),
    ("obsq.producer",),
    ("obsq.app", "obsq.background"),
    ("obsq.broker",),
    ("obsq.schedule", "obsq.flow"),
    ("obsq.task", "obsq.payloads"),
    ("obsq.settings", "obsq.names", "obsq.clock", "obsq.errors",
     "obsq.redis_server", "obsq._version"),
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


def test_every_script_is_loaded_with_the_prelude_helpers_it_calls() -> None:
    """scripts.py finds in a script's text the prelude definitions it uses: each helper the
    loaded script calls is defined in it before its first call, and no helper it never
    calls; a variant leaves out what it is declared to, and only that."""
    prelude = "".join(p.read_text() for p in (PACKAGE / "broker" / "scripts").glob("_*.lua"))
    helpers = set(re.findall(r"^local function (\w+)", prelude, re.M))
    for name, script in scripts().items():
        code = re.sub(r"--.*", "", script.source)
        defined = {h: code.find(f"local function {h}(") for h in helpers}
        called = {h: found.start() for h in helpers
                  if (found := re.search(rf"(?<!function )\b{h}\(", code))}
        left_out = VARIANTS[name][1] if name in VARIANTS else frozenset()
        assert left_out <= set(called), name
        assert {h for h, at in defined.items() if at >= 0} == set(called) - left_out, name
        called = {h: at for h, at in called.items() if h not in left_out}
        assert [h for h, at in called.items() if defined[h] > at] == [], name


# redis-py below its public API, and scripts called by SHA or loaded: the runner's alone
# (obsq/broker/calls.py).
RUNNER_ONLY = re.compile(r"\b(send_packed_command|read_response|can_read\w*|pack_command|"
                         r"evalsha|script_load|is_noscript|NoScriptError)\b")


def test_only_the_runner_calls_scripts_and_drives_connections() -> None:
    runner = PACKAGE / "broker" / "calls.py"
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


def test_the_package_root_names_each_public_name_once_for_types_and_for_first_use() -> None:
    """obsq/__init__.py imports its public names at their first use: its TYPE_CHECKING
    imports (for type checkers), _PUBLIC (where `__getattr__` finds each) and __all__
    name the same things, each from the same module."""
    import obsq

    tree = ast.parse(MODULES["obsq"].read_text())
    (checking,) = [node for node in tree.body if isinstance(node, ast.If)
                   and ast.unparse(node.test) == "TYPE_CHECKING"]
    typed = {alias.name: node.module for node in checking.body
             if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert typed == obsq._MODULE_OF
    assert sorted(obsq.__all__) == sorted([*obsq._MODULE_OF, "__version__"])
    star: dict[str, object] = {}
    exec("from obsq import *", star)  # every name found where _PUBLIC says
    assert set(obsq.__all__) <= set(star)
