"""The rest of the Python-Lua contract (obsq/broker/wire.py, keys.py): each script's KEYS
against every call in the broker and read by name in the script, the key names a script
builds from a prefix, the task hash's fields, and ARGV positions taken from the
declaration, never counted by hand."""

from __future__ import annotations

import ast
import re

import pytest
from support import ROOT

from obsq.broker import keys as key_layout
from obsq.broker import scripts as script_loading
from obsq.broker import wire
from obsq.broker.calls import BlockingRunner
from obsq.broker.keys import KEY_NAMES, TASK_FIELDS, QueueKeys
from obsq.broker.wire import KEYS, LAYOUTS, Layout, key_constants, key_shapes

SCRIPT_DIR = ROOT / "obsq" / "broker" / "scripts"
BODIES = {p.stem: p.read_text() for p in sorted(SCRIPT_DIR.glob("[!_]*.lua"))}
ALL_LUA = {p.name: p.read_text() for p in sorted(SCRIPT_DIR.glob("*.lua"))}
COMMENT = re.compile(r"--.*$", re.M)
KEY_CLASSES = [getattr(key_layout, n) for n in ("QueueKeys", "GlobalKeys", "ScheduleKeys",
                                                  "FlowKeys", "EventKeys")]
CALLER_NAMED = {"key", "counter"}  # keys the caller names (wire.KEYS says which)


def _code(text: str) -> str:
    return COMMENT.sub("", text)


# --- ARGV positions -------------------------------------------------------------------

def computed_positions(code: str) -> list[str]:
    """The definitions of the variables a script indexes ARGV with (`ARGV[i + @x]`) that
    count with a number of their own: a position must come from the layout's `@items` and
    `@stride` (0 and 1 count items, not positions). A loop over something else than ARGV
    may reuse the name."""
    indices = set(re.findall(r"ARGV\[\s*([A-Za-z_]\w*)", code))
    found = []
    for name in indices:
        for loop, expr in re.findall(rf"(for\s+)?\b{name}\s*=\s*([^\n]+)", code):
            if loop and "ARGV" not in expr:
                continue
            if re.search(r"(?<![\w@.])(?:[2-9]|\d\d+)(?![\w.])", expr):
                found.append(f"{name} = {expr.strip()}")
    return found


@pytest.mark.parametrize("name", sorted(BODIES))
def test_no_argv_position_is_counted_by_hand(name: str) -> None:
    assert computed_positions(_code(BODIES[name])) == [], name


def test_a_position_counted_from_literals_is_found() -> None:
    assert computed_positions("for n = 1, 3 do\n  local i = 6 + (n - 1) * 8\n"
                              "  x = ARGV[i + @type]\nend") == ["i = 6 + (n - 1) * 8"]
    assert computed_positions("local i = @items + (n - 1) * @stride\nx = ARGV[i + @a]") == []


def argv_mismatch(code: str, layout: Layout, reply: wire.Reply | None) -> set[str]:
    """The `@name` positions a script reads or its declaration names, but not both (its
    keys, `@k_<name>`, are the KEYS tests')."""
    declared = {**layout.constants, **(reply.constants if reply else {})}
    read = {n for n in re.findall(r"@(\w+)", code) if not n.startswith("k_")}
    return read - {f"key_{n}" for n in KEY_NAMES} ^ set(declared)


@pytest.mark.parametrize("name", [n for n, layout in sorted(LAYOUTS.items())
                                  if any(item for _, item, _ in layout.variants.values())])
def test_a_field_added_to_a_record_without_the_lua_fails(name: str) -> None:
    code = _code(BODIES[name])
    assert argv_mismatch(code, LAYOUTS[name], wire.REPLIES.get(name)) == set()
    fixed, item, _ = next(v for v in LAYOUTS[name].variants.values() if v[1])
    packed = {field: " ".join(names) for field, names in LAYOUTS[name].packed.items()}
    grown = Layout(" ".join(fixed) + f" *({' '.join(item)} added)", packed=packed) if len(
        LAYOUTS[name].variants) == 1 else None
    if grown is not None:
        assert argv_mismatch(code, grown, wire.REPLIES.get(name)) == {"added"}


def test_ack_reads_its_completions_by_the_declared_stride(raw_redis, namespace,
                                                          monkeypatch) -> None:
    """A field added in the middle of ack's completions moves every field after it: the
    script still stores the result as the result and keeps it for the retention."""
    monkeypatch.setitem(LAYOUTS, "ack", Layout(
        "worker resent window share *(id fence added retention result own type slot "
        "ordering)"))
    ack = script_loading.load_scripts()["ack"]
    k = QueueKeys(namespace, "q")
    for task_id in ("t1", "t2"):
        raw_redis.hset(k.task(task_id), mapping={"state": "pending", "type": "x"})
        raw_redis.hset(k.active, task_id, "7:w1")
        raw_redis.zadd(k.lease, {task_id: 1})
    args = wire.argv("ack", [(task_id, "7", "junk", 60000, f'"{task_id} done"', "", "x", "", "")
                             for task_id in ("t1", "t2")],
                     worker="w1", resent="0", window=0, share=1)
    runner = BlockingRunner(lambda: raw_redis, now=lambda: 1_000_000)
    assert runner.call(ack, [k.lease, k.completed, k.active, k.watched], args) == [1, 1]
    for task_id in ("t1", "t2"):
        assert raw_redis.hget(k.task(task_id), "result") == f'"{task_id} done"'.encode()
        assert raw_redis.zscore(k.completed, task_id) == 1_060_000


# --- KEYS ------------------------------------------------------------------------------

def _key_name(node: ast.expr) -> str:
    """The name a key of a call is built by: k.lease -> lease, k.task(id) -> task, a
    parameter -> its name."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    if isinstance(node, ast.Name):
        return node.id
    return f"? {ast.unparse(node)}"


def _key_names(node: ast.expr, scope: ast.AST, functions: dict[str, ast.AST]) -> list[str]:
    """A call's keys by name: a literal tuple, a variable assigned one in the same function,
    or a module function returning one."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return [_key_name(e) for e in node.elts]
    if isinstance(node, ast.Name):
        for found in ast.walk(scope):
            if isinstance(found, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == node.id for t in found.targets):
                return _key_names(found.value, scope, functions)
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in functions:
        function = functions[node.func.id]
        [returned] = [r for r in ast.walk(function) if isinstance(r, ast.Return)]
        return _key_names(returned.value, function, functions)
    return [f"? {ast.unparse(node)}"]


def key_calls() -> list[tuple[str, str, list[str]]]:
    """(where, script, its keys by name) of every script call in the broker: `_script`,
    `_producer_script`, `_failure_call` and ("name", keys, args) call tuples."""
    calls = []
    for path in sorted((ROOT / "obsq" / "broker").glob("*.py")):
        tree = ast.parse(path.read_text())
        functions = {f.name: f for f in ast.walk(tree)
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for function in functions.values():
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                        "_script", "_producer_script", "_failure_call") and len(
                        node.args) == 3:
                    script, keys, _ = node.args
                elif isinstance(node, ast.Tuple) and len(node.elts) == 3:
                    script, keys, _ = node.elts
                else:
                    continue
                if isinstance(script, ast.Constant) and script.value in LAYOUTS:
                    calls.append((f"{path.name}:{function.name}", script.value,
                                  _key_names(keys, function, functions)))
    return calls


def matches_a_shape(script: str, names: list[str]) -> bool:
    return any(len(shape) == len(names) and all(n in allowed for n, allowed in
                                                  zip(names, shape))
               for shape in key_shapes(script))


def test_every_call_passes_the_keys_its_script_declares() -> None:
    calls = key_calls()
    assert {script for _, script, _ in calls} == set(KEYS) == set(BODIES)
    wrong = [(where, script, names) for where, script, names in calls
             if not matches_a_shape(script, names)]
    assert wrong == []


def test_a_call_with_a_key_too_many_or_out_of_place_is_found() -> None:
    assert matches_a_shape("extend", ["lease", "active"])
    assert not matches_a_shape("extend", ["lease", "active", "wake"])
    assert not matches_a_shape("extend", ["active", "lease"])
    assert matches_a_shape("register", ["workers"])


def test_every_declared_key_is_built_by_the_key_layout() -> None:
    built = {name for cls in KEY_CLASSES for name in dir(cls) if not name.startswith("_")}
    declared = {n for script in KEYS for shape in key_shapes(script) for position in shape
                for n in position}
    assert declared - built == CALLER_NAMED


# A key read otherwise than by its name: KEYS[3], KEYS[i], KEYS[i + 1]
NOT_BY_NAME = re.compile(r"KEYS\[(?!\s*@k_\w+\s*\])[^\]]*\]")


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_script_reads_its_keys_by_their_declared_names(name: str) -> None:
    code = _code(BODIES[name])
    assert NOT_BY_NAME.findall(code) == [], f"{name}.lua reads a key by its number"
    read = {f"k_{n}" for n in re.findall(r"@k_(\w+)", code)}
    assert read <= set(key_constants(name)), (
        f"{name}.lua reads {sorted(read - set(key_constants(name)))}, not declared")


def test_only_the_prelude_reads_the_first_key_by_its_number() -> None:
    """The prefix of the keys a script builds is its first key's, whatever that key's name
    (_prelude.lua); no other prelude line reads a key."""
    read = {file: NOT_BY_NAME.findall(_code(text)) for file, text in ALL_LUA.items()}
    assert {file: found for file, found in read.items() if found} == {
        "_prelude.lua": ["KEYS[1]"]}


def test_a_key_read_by_a_number_is_found() -> None:
    assert NOT_BY_NAME.findall("redis.call('GET', KEYS[3])\nKEYS[i + 1]") == [
        "KEYS[3]", "KEYS[i + 1]"]
    assert NOT_BY_NAME.findall("redis.call('GET', KEYS[@k_lease])") == []


def test_a_key_has_one_position_in_every_shape(monkeypatch) -> None:
    assert key_constants("extend") == {"k_lease": 1, "k_active": 2}
    assert key_constants("register") == {"k_queues": 1, "k_partitions": 1, "k_workers": 1}
    assert key_constants("page") == {"k_by_state": 1, "k_group_types": 1, "k_group": 2}
    monkeypatch.setitem(KEYS, "page", ("by_state", "group by_state"))
    with pytest.raises(ValueError, match="two positions"):
        key_constants("page")


# --- key names built from a prefix ------------------------------------------------------

@pytest.mark.parametrize("file", sorted(ALL_LUA))
def test_every_key_a_script_builds_is_declared(file: str) -> None:
    code = _code(ALL_LUA[file])
    assert not re.findall(r"prefix\s*\.\.\s*['\"]", code), f"{file} spells a key name"
    used = set(re.findall(r"@key_(\w+)", code))
    assert used <= set(KEY_NAMES), f"{file} builds {sorted(used - set(KEY_NAMES))}"


def test_a_built_key_keeps_the_hash_tag_of_the_first_key() -> None:
    """The scripts build keys only as `prefix .. @key_<name>`, the prefix the first key's,
    up to its last colon, so a built key shares its hash tag (DESIGN.md section 3) as long
    as no name brings a tag of its own."""
    assert not [text for text in KEY_NAMES.values() if set(text) & set("{}")]
    prelude = _code(ALL_LUA["_prelude.lua"])
    assert "local prefix = string.match(KEYS[1], '^.*:')" in prelude


def test_python_and_the_scripts_spell_a_key_alike() -> None:
    k = QueueKeys("ns", "q")
    assert k.task("t1") == "ns:{q}:t:t1" and k.held("p") == "ns:{q}:hold:p"
    source = script_loading.load_scripts()["ack"].source
    assert f"prefix .. '{KEY_NAMES['task']}' .. id" in source


# --- the task hash's fields -------------------------------------------------------------

HASH_CALL = re.compile(r"redis\.p?call\('(H[A-Z]+)',")


def _arguments(code: str, start: int) -> list[str]:
    """The arguments of the call whose first argument starts at `start`, split at the
    commas of its own level."""
    depth, parts, current = 0, [], ""
    for char in code[start:]:
        if char in "({":
            depth += 1
        elif char in ")}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def task_fields_written(code: str) -> set[str]:
    """The fields a script reads or writes by name in a task's hash: its hash calls on
    `task_key(...)` or a variable set to one (`key`, unless set to another key), and the
    field lists it builds to write one (`fields`, enqueue.lua and group.lua)."""
    task_vars = set(re.findall(r"local (\w+) = task_key\(", code))
    if not re.search(r"local key = (?!task_key\()", code):
        task_vars.add("key")
    found = set()
    for call in HASH_CALL.finditer(code):
        key, *args = _arguments(code, call.end())
        if not (key.startswith("task_key(") or key in task_vars):
            continue
        if call[1] == "HSET":  # field, value, ...
            args = args[::2]
        elif call[1] == "HINCRBY":
            args = args[:1]
        found.update(re.findall(r"'(\w+)'", " ".join(args)))
    for table in re.findall(r"local fields = \{([^}]*)\}", code):
        found.update(a.strip().strip("'") for a in table.split(",")[::2]
                     if a.strip().startswith("'"))
    found.update(re.findall(r"fields\[#fields \+ 1\] = '(\w+)'\n\s+fields\[#fields \+ 1\]",
                            code))
    return found


def test_every_task_field_a_script_reads_or_writes_is_declared() -> None:
    used = {f: task_fields_written(_code(text)) for f, text in ALL_LUA.items()}
    undeclared = {f: sorted(fields - set(TASK_FIELDS.values()))
                  for f, fields in used.items() if fields - set(TASK_FIELDS.values())}
    assert undeclared == {}
    assert set().union(*used.values()) == set(TASK_FIELDS.values())


def test_an_undeclared_field_is_found() -> None:
    assert task_fields_written("local key = task_key(id)\n"
                               "redis.call('HSET', key, 'state', 'x', 'surprise', 1)") == {
        "state", "surprise"}


def test_the_python_readers_read_declared_fields_only() -> None:
    for path in ("obsq/task.py", "obsq/inspection/inspected.py"):
        read = set(re.findall(r'f(?:\.get\()?\[?\(?b"(\w+)"', (ROOT / path).read_text()))
        read |= set(re.findall(r'text\(b"(\w+)"\)', (ROOT / path).read_text()))
        assert read and read <= set(TASK_FIELDS.values()), (path, read)
