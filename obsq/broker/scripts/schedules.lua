-- prelude: now_ms
-- A listing of the schedule entries, soonest next fire first, at most `limit` of them.
-- KEYS: next, entries, last, firing, counts
-- ARGV: now, limit
-- Returns {now, then per entry: name, next (ms), definition, last fire,
--          claim, fires, missed}
local now = now_ms()
local names = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[@limit]) - 1, 'WITHSCORES')
local out = {now}
for i = 1, #names, 2 do
  local name = names[i]
  out[#out + 1] = name
  out[#out + 1] = names[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], name) or ''
  out[#out + 1] = redis.call('HGET', KEYS[3], name) or ''
  out[#out + 1] = redis.call('HGET', KEYS[4], name) or ''
  out[#out + 1] = redis.call('HGET', KEYS[5], 'fires:' .. name) or ''
  out[#out + 1] = redis.call('HGET', KEYS[5], 'missed:' .. name) or ''
end
return out
