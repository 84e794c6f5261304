-- End a claim of `count` fires: their tasks are enqueued ('fired': the entry's last fire
-- moves on to `fire`, the latest, and its count by `count`), they came too late to be
-- enqueued again ('missed'), or the claim was not readable ('dropped'). Only the claim as it
-- was made ends it, so of two schedulers finishing the same fires one counts them.
-- KEYS, ARGV and the reply: declared in obsq/broker/wire.py
-- Returns 1 when this call ended the claim, else 0.
if redis.call('HGET', KEYS[@k_firing], ARGV[@name]) ~= ARGV[@claim] then
  return 0
end
redis.call('HDEL', KEYS[@k_firing], ARGV[@name])
if ARGV[@outcome] == 'dropped' or redis.call('HEXISTS', KEYS[@k_entries], ARGV[@name]) == 0 then
  return 1
end
if ARGV[@outcome] == 'missed' then
  redis.call('HINCRBY', KEYS[@k_counts], 'missed:' .. ARGV[@name], ARGV[@count])
  return 1
end
local last = tonumber(redis.call('HGET', KEYS[@k_last], ARGV[@name]) or '0') or 0
if tonumber(ARGV[@fire]) > last then
  redis.call('HSET', KEYS[@k_last], ARGV[@name], ARGV[@fire])
end
redis.call('HINCRBY', KEYS[@k_counts], 'fires:' .. ARGV[@name], ARGV[@count])
return 1
