-- The namespace's flows, under the hash tag `{flows}`: `index` (zset flow id -> when it was
-- written, ms: the listing) and `look` (zset flow id -> when the flow sweep looks at it next,
-- ms). A flow is added before it is written; the sweep launches the steps it left
-- launching, then sets its next look (a running flow's a minute on, an ended one's ten);
-- a flow found gone is removed.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns for 'due': the ids due (at most `count`).
local mode = ARGV[@mode]
if mode == 'add' then
  redis.call('ZADD', KEYS[@k_flows], ARGV[@written], ARGV[@id])
  return redis.call('ZADD', KEYS[@k_flow_look], ARGV[@look], ARGV[@id])
elseif mode == 'due' then
  return redis.call('ZRANGEBYSCORE', KEYS[@k_flow_look], '-inf', ARGV[@until], 'LIMIT', 0,
                    ARGV[@count])
elseif mode == 'page' then
  local first = tonumber(ARGV[@offset])
  local out = {[@r_total] = redis.call('ZCARD', KEYS[@k_flows])}
  for _, id in ipairs(redis.call('ZREVRANGE', KEYS[@k_flows], first,
                                 first + tonumber(ARGV[@count]) - 1)) do
    out[#out + @r_id] = id
  end
  return out
elseif mode == 'set' then
  for i = @ids, #ARGV do
    redis.call('ZADD', KEYS[@k_flow_look], 'XX', ARGV[@to], ARGV[i])
  end
  return 1
end
for i = @gone, #ARGV do
  redis.call('ZREM', KEYS[@k_flows], ARGV[i])
  redis.call('ZREM', KEYS[@k_flow_look], ARGV[i])
end
return 1
