-- prelude: (none)
-- The namespace's flows, under the hash tag `{flows}`: `index` (zset flow id -> when it was
-- written, ms: the listing) and `look` (zset flow id -> when the flow sweep looks at it next,
-- ms). A flow is added before it is written; the sweep launches the steps it left
-- launching, then sets its next look (a running flow's a minute on, an ended one's ten);
-- a flow found gone is removed.
-- KEYS: index, look
-- ARGV: now, 'add' id written look | 'due' until count | 'page' offset count
--       | 'set' look id ... | 'remove' id ...
-- Returns 'due': the ids due (at most count); 'page': {total, then ids, latest first}.
local mode = ARGV[2]
if mode == 'add' then
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
  return redis.call('ZADD', KEYS[2], ARGV[5], ARGV[3])
elseif mode == 'due' then
  return redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3], 'LIMIT', 0, ARGV[4])
elseif mode == 'page' then
  local first = tonumber(ARGV[3])
  local ids = redis.call('ZREVRANGE', KEYS[1], first, first + tonumber(ARGV[4]) - 1)
  table.insert(ids, 1, redis.call('ZCARD', KEYS[1]))
  return ids
elseif mode == 'set' then
  for i = 4, #ARGV do
    redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[i])
  end
  return 1
end
for i = 3, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('ZREM', KEYS[2], ARGV[i])
end
return 1
