-- Claim the next fires of an entry for one scheduler: the entry's next fire moves from
-- `expected` to `following` and, when `fire` (the first claimed) is given, the fires are
-- recorded as claimed, with the definition they run, until confirm_fire. Refused when
-- another scheduler moved the entry on, its definition changed or went, or a fire of it is
-- still claimed: so each fire is claimed once, whatever the lock did. `missed` fires are
-- counted.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 when claimed, else 0.
local definition = redis.call('HGET', KEYS[@k_entries], ARGV[@name])
if not definition or redis.sha1hex(definition) ~= ARGV[@digest] then
  return 0
end
if tonumber(redis.call('ZSCORE', KEYS[@k_next], ARGV[@name])) ~= tonumber(ARGV[@expected]) then
  return 0
end
if redis.call('HEXISTS', KEYS[@k_firing], ARGV[@name]) == 1 then
  return 0
end
redis.call('ZADD', KEYS[@k_next], ARGV[@following], ARGV[@name])
if ARGV[@fire] ~= '0' then
  redis.call('HSET', KEYS[@k_firing], ARGV[@name], ARGV[@claim])
end
if tonumber(ARGV[@missed]) > 0 then
  redis.call('HINCRBY', KEYS[@k_counts], 'missed:' .. ARGV[@name], ARGV[@missed])
end
return 1
