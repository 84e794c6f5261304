-- prelude: now_ms
-- A listing of the schedule entries, soonest next fire first, at most `limit` of them.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- ARGV: now, limit
-- Returns {now, then per entry: name, next (ms), definition, last fire,
--          claim, fires, missed}
local now = now_ms()
local names = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[@limit]) - 1, 'WITHSCORES')
local out = {}
out[@r_now] = now
for i = 1, #names, 2 do
  local name, o = names[i], #out
  out[o + @r_name] = name
  out[o + @r_next] = names[i + 1]
  out[o + @r_definition] = redis.call('HGET', KEYS[2], name) or ''
  out[o + @r_last] = redis.call('HGET', KEYS[3], name) or ''
  out[o + @r_claim] = redis.call('HGET', KEYS[4], name) or ''
  out[o + @r_fires] = redis.call('HGET', KEYS[5], 'fires:' .. name) or ''
  out[o + @r_missed] = redis.call('HGET', KEYS[5], 'missed:' .. name) or ''
end
return out
