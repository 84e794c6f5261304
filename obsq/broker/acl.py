"""The least Redis ACL rule obsq needs for one namespace (`obsq acl --namespace NS`): its
keys, the commands the broker sends itself, and every command its Lua scripts call (Redis
checks those too, inside a script), read from the scripts' source so the rule cannot fall
behind them.

At start, on Redis 7 or newer, a read-only probe script tries each command of the rule on a
key of the namespace: Redis checks the ACL before it refuses a write in a `no-writes`
script, so a denied command is found without anything being written, and the process stops
with one line instead of failing with a Lua error in the middle of its work."""

from __future__ import annotations

import re

from obsq.broker.scripts import SCRIPT_DIR

# What the broker sends outside its scripts (calls.py, inspection.py, producing.py,
# upkeep.py, working.py, scheduling.py). CONFIG is left out: reading maxmemory-policy
# falls back to INFO, and CONFIG GET would reveal the server's secrets.
BROKER_COMMANDS = ("blpop", "del", "evalsha", "exists", "expire", "get", "hexists", "hget",
                   "hgetall", "info", "lpop", "rpush", "scan", "script|load", "set",
                   "sismember", "smembers", "unlink", "wait", "zrange", "zrem", "zscore")
# A command's name is the first argument of redis.call, redis.pcall or the prelude's
# call_sliced, always a string literal (tests/test_acl.py holds the scripts to it).
SCRIPT_CALL = re.compile(r"""(?:redis\.p?call|call_sliced)\(\s*(['"])(\w+)\1""")
# What a Cluster client asks each node on connecting: the slots, and the commands' key specs.
CLUSTER_COMMANDS = ("cluster|slots", "command")
# Not callable inside a script: exercised by the probe itself, or not at all.
NOT_IN_SCRIPTS = {"blpop", "evalsha", "script|load", "wait"}

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
    return f"resetkeys ~{namespace}:* resetchannels -@all {commands}"


def probed_commands() -> list[str]:
    return [c for c in required_commands() if c not in NOT_IN_SCRIPTS]
