"""The least Redis ACL rule obsq needs for one namespace (`obsq acl --namespace NS`): its
keys, the commands the broker sends itself, and every command its Lua scripts call (Redis
checks those too, inside a script), read from the scripts' source so the rule cannot fall
behind them.

At start, on Redis 7 or newer, a read-only probe script tries each command of the rule on a
key of the namespace: Redis checks the ACL before it refuses a write in a `no-writes`
script, so a denied command is found without anything being written; the few commands a
script may not call (BLPOP, WAIT, SCRIPT LOAD) are sent beside it, each doing nothing. The
process then stops with one line instead of failing in the middle of its work."""

from __future__ import annotations

import re

from obsq.broker.scripts import SCRIPT_DIR
from obsq.names import validate_namespace

# What the broker sends outside its scripts, by the commands' names (tests/test_acl.py reads
# the redis-py calls of obsq/broker and holds them to this list and the two below).
BROKER_COMMANDS = ("blpop", "del", "evalsha", "exists", "expire", "get", "hexists", "hget",
                   "hgetall", "hmget", "info", "lpop", "rpush", "scan", "script|load", "set",
                   "smembers", "unlink", "wait", "zrange", "zrem", "zscore")
# Sent, and not granted: CONFIG GET, tried once per process for maxmemory-policy (INFO
# answers instead, and CONFIG GET would reveal the server's secrets); HELLO, the version
# where INFO is denied (Redis lets every user run it).
UNGRANTED_COMMANDS = ("config|get", "hello")
# Not callable in a script: the start-up check sends them beside its probe script (which is
# the EVALSHA), each doing nothing (RedisCalls._outside_probes).
OUTSIDE_SCRIPTS = ("blpop", "script|load", "wait")
# Granted, and gone without where denied: INFO (the eviction check warns once, enqueues go
# without the memory share), so the start-up check does not ask for it.
OPTIONAL_COMMANDS = ("info",)
# A command's name is the first argument of redis.call, redis.pcall or the prelude's
# call_sliced, always a string literal (tests/test_acl.py holds the scripts to it).
SCRIPT_CALL = re.compile(r"""(?:redis\.p?call|call_sliced)\(\s*(['"])(\w+)\1""")
# What a Cluster client asks each node on connecting: the slots, and the commands' key specs.
CLUSTER_COMMANDS = ("cluster|slots", "command")
PROBE = """#!lua flags=no-writes
-- Each command of ARGV, called on KEYS[1] with as few arguments as its arity allows (Redis
-- checks the arity, then the ACL, then refuses a write here): returns those denied.
local denied = {}
for _, name in ipairs(ARGV) do
  local args = {}
  for _ = 0, 7 do
    local reply = redis.pcall(name, unpack(args))
    local err = type(reply) == 'table' and reply.err and string.lower(reply.err) or ''
    if not string.find(err, 'number of arg', 1, true) then
      if string.find(err, "can't run", 1, true) or string.find(err, 'noperm', 1, true)
          or string.find(err, 'no permissions', 1, true) then
        denied[#denied + 1] = name
      end
      break
    end
    args[#args + 1] = KEYS[1]
  end
end
return denied
"""


def script_commands() -> set[str]:
    """Every command the Lua scripts call, lower case."""
    found = set()
    for path in SCRIPT_DIR.iterdir():
        if path.name.endswith(".lua"):
            found |= {m.group(2).lower() for m in SCRIPT_CALL.finditer(path.read_text())}
    return found


def required_commands(cluster: bool = False) -> list[str]:
    return sorted(script_commands() | set(BROKER_COMMANDS)
                  | set(CLUSTER_COMMANDS if cluster else ()))


def acl_rule(namespace: str, cluster: bool = False) -> str:
    """The ACL rules of a user that may run obsq on `namespace` and nothing else, for
    `ACL SETUSER name on >password RULES` or a users.acl line `user name on #sha RULES`
    (`cluster`: with what a Redis Cluster client needs as well)."""
    commands = " ".join(f"+{c}" for c in required_commands(cluster))
    return f"resetkeys ~{validate_namespace(namespace)}:* resetchannels -@all {commands}"


def probed_commands() -> list[str]:
    """The commands the probe script calls: the rule's, less those called beside it."""
    outside = {*OUTSIDE_SCRIPTS, "evalsha", *OPTIONAL_COMMANDS}
    return [c for c in required_commands() if c not in outside]
