-- A listing of the schedule entries, soonest next fire first, at most `limit` of them.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
local now = now_ms()
local names = redis.call('ZRANGE', KEYS[@k_next], 0, tonumber(ARGV[@limit]) - 1, 'WITHSCORES')
local out = {}
out[@r_now] = now
for i = 1, #names, 2 do
  local name, o = names[i], #out
  out[o + @r_name] = name
  out[o + @r_next] = names[i + 1]
  out[o + @r_definition] = redis.call('HGET', KEYS[@k_entries], name) or ''
  out[o + @r_last] = redis.call('HGET', KEYS[@k_last], name) or ''
  out[o + @r_claim] = redis.call('HGET', KEYS[@k_firing], name) or ''
  out[o + @r_fires] = redis.call('HGET', KEYS[@k_counts], 'fires:' .. name) or ''
  out[o + @r_missed] = redis.call('HGET', KEYS[@k_counts], 'missed:' .. name) or ''
end
return out
