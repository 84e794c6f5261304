-- Add members to a registry: the namespace's queues (a set), its workers (a zset, each
-- scored) or its queues' partition counts (a hash). They are removed first, a write that
-- cannot grow memory, so a Redis at maxmemory runs the whole script: a worker starts and
-- heartbeats on a full Redis, and drains it.
-- A registry whose key holds another type (written outside obsq) holds no registration:
-- it is replaced, and its readers read it as empty meanwhile (calls.py's junk_registry).
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local kind = ARGV[@kind]
local registry = (kind == 'set' and KEYS[@k_queues]) or (kind == 'hash' and KEYS[@k_partitions])
                 or KEYS[@k_workers]
local found = redis.call('TYPE', registry).ok
if found ~= 'none' and found ~= kind then
  redis.call('DEL', registry)
end
local members, pairs_ = {}, {}
if kind == 'set' then
  for i = @members, #ARGV do
    members[#members + 1] = ARGV[i]
  end
  call_sliced('SREM', KEYS[@k_queues], members)
  call_sliced('SADD', KEYS[@k_queues], members)
else  -- pairs: a hash's (field, value), a zset's (score, member)
  local hash = kind == 'hash'
  for i = @items, #ARGV, @stride do
    members[#members + 1] = ARGV[i + (hash and @field or @member)]
    pairs_[#pairs_ + 1] = ARGV[i + (hash and @field or @score)]
    pairs_[#pairs_ + 1] = ARGV[i + (hash and @value or @member)]
  end
  if hash then
    call_sliced('HDEL', KEYS[@k_partitions], members)
    call_sliced('HSET', KEYS[@k_partitions], pairs_)
  else
    call_sliced('ZREM', KEYS[@k_workers], members)
    call_sliced('ZADD', KEYS[@k_workers], pairs_)
  end
end
return 1
