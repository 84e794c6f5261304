-- prelude: (none)
-- End a claimed fire: its task is enqueued ('fired': the entry's last fire and count move
-- on), it came too late to be enqueued again ('missed'), or the claim was not readable
-- ('dropped'). Only the claim as it was made ends it, so of two schedulers finishing the
-- same fire one counts it.
-- KEYS: firing, entries, last, counts
-- ARGV: now, name, claim, fire (ms), outcome
-- Returns 1 when this call ended the claim, else 0.
if redis.call('HGET', KEYS[1], ARGV[2]) ~= ARGV[3] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[2])
if ARGV[5] == 'dropped' or redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then
  return 1
end
if ARGV[5] == 'missed' then
  redis.call('HINCRBY', KEYS[4], 'missed:' .. ARGV[2], 1)
  return 1
end
local last = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0') or 0
if tonumber(ARGV[4]) > last then
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
end
redis.call('HINCRBY', KEYS[4], 'fires:' .. ARGV[2], 1)
return 1
