-- prelude: (none)
-- The namespace's flows, under the hash tag `{flows}`: `index` (zset flow id -> when it was
-- written, ms: the listing) and `look` (zset flow id -> when the flow sweep looks at it next,
-- ms). A flow is added before it is written; the sweep launches the steps it left
-- launching, then sets its next look (a running flow's a minute on, an ended one's ten);
-- a flow found gone is removed.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, 'add' id written look | 'due' until count | 'page' offset count
--       | 'set' look id ... | 'remove' id ...
-- Returns 'due': the ids due (at most count); 'page': {total, then ids, latest first}.
local mode = ARGV[@mode]
if mode == 'add' then
  redis.call('ZADD', KEYS[1], ARGV[@written], ARGV[@id])
  return redis.call('ZADD', KEYS[2], ARGV[@look], ARGV[@id])
elseif mode == 'due' then
  return redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[@until], 'LIMIT', 0, ARGV[@count])
elseif mode == 'page' then
  local first = tonumber(ARGV[@offset])
  local out = {[@r_total] = redis.call('ZCARD', KEYS[1])}
  for _, id in ipairs(redis.call('ZREVRANGE', KEYS[1], first,
                                 first + tonumber(ARGV[@count]) - 1)) do
    out[#out + @r_id] = id
  end
  return out
elseif mode == 'set' then
  for i = @ids, #ARGV do
    redis.call('ZADD', KEYS[2], 'XX', ARGV[@to], ARGV[i])
  end
  return 1
end
for i = @gone, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('ZREM', KEYS[2], ARGV[i])
end
return 1
