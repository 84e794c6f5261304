-- prelude: now_ms, task_key
-- Delete completed tasks past their retention, and dead and cancelled tasks past their age
-- or count limit.
-- KEYS: completed, dead, cancelled
-- ARGV: now, dead_max_age_ms, dead_max_count, batch
-- Returns the number of tasks deleted.
local now = now_ms()
local batch = tonumber(ARGV[4])
local deleted = 0
local function drop(set, ids)
  for _, id in ipairs(ids) do
    redis.call('ZREM', set, id)
    redis.call('DEL', task_key(id))
    deleted = deleted + 1
  end
end
drop(KEYS[1], redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch))
for _, set in ipairs({KEYS[2], KEYS[3]}) do
  drop(set, redis.call('ZRANGEBYSCORE', set, '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0,
                       batch))
  local excess = redis.call('ZCARD', set) - tonumber(ARGV[3])
  if excess > 0 then
    drop(set, redis.call('ZRANGE', set, 0, math.min(excess, batch) - 1))
  end
end
return deleted
