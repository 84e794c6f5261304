-- prelude: call_sliced
-- Add members to a registry: the namespace's queues (a set), its workers (a zset, each
-- scored) or its queues' partition counts (a hash). They are removed first, a write that cannot grow memory, so a Redis at
-- maxmemory runs the whole script: a worker starts and heartbeats on a full Redis, and
-- drains it.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, 'set', 'zset' or 'hash', then the members (for a zset: score, member pairs;
-- for a hash: field, value pairs)
local members, pairs_ = {}, {}
if ARGV[@kind] == 'set' then
  for i = @members, #ARGV do
    members[#members + 1] = ARGV[i]
  end
  call_sliced('SREM', KEYS[1], members)
  call_sliced('SADD', KEYS[1], members)
else  -- pairs: a hash's (field, value), a zset's (score, member)
  local hash = ARGV[@kind] == 'hash'
  for i = @items, #ARGV, @stride do
    members[#members + 1] = ARGV[i + (hash and @field or @member)]
    pairs_[#pairs_ + 1] = ARGV[i + (hash and @field or @score)]
    pairs_[#pairs_ + 1] = ARGV[i + (hash and @value or @member)]
  end
  if hash then
    call_sliced('HDEL', KEYS[1], members)
    call_sliced('HSET', KEYS[1], pairs_)
  else
    call_sliced('ZREM', KEYS[1], members)
    call_sliced('ZADD', KEYS[1], pairs_)
  end
end
return 1
