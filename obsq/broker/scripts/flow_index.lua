-- The namespace's flows, under the hash tag `{flows}`: `index` (zset flow id -> when it was
-- written, ms: the listing), `look` (zset flow id -> when the flow sweep looks at it next,
-- ms) and `flowjunk` (hash flow id -> "<ms> <why>": the flows set aside, whose record cannot
-- be read, or was gone before they ended). A flow is added before it is written; the sweep
-- launches the steps it left launching, then sets its next look (a running flow's a minute
-- on, an ended one's ten); a flow found gone after its end is removed, one found gone before
-- it, or unreadable, is set aside: out of the index, into `flowjunk`.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns for 'due': the ids due (at most `count`); for 'junk': 1 when the flow was not set
-- aside before; for 'junked': {cursor, id, "<ms> <why>", ...}.
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
elseif mode == 'junk' then
  redis.call('ZREM', KEYS[@k_flows], ARGV[@id])
  redis.call('ZREM', KEYS[@k_flow_look], ARGV[@id])
  return redis.call('HSETNX', KEYS[@k_flow_junk], ARGV[@id], now_text() .. ' ' .. ARGV[@why])
elseif mode == 'junked' then
  local scan = redis.call('HSCAN', KEYS[@k_flow_junk], ARGV[@cursor], 'COUNT', ARGV[@count])
  local out = {scan[1]}
  for _, v in ipairs(scan[2]) do
    out[#out + 1] = v
  end
  return out
end
for i = @gone, #ARGV do
  redis.call('ZREM', KEYS[@k_flows], ARGV[i])
  redis.call('ZREM', KEYS[@k_flow_look], ARGV[i])
  redis.call('HDEL', KEYS[@k_flow_junk], ARGV[i])
end
return 1
