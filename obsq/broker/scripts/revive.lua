-- prelude: now_ms, task_key, wake
-- Put tasks of the dead, retry or scheduled set back into pending now (obsq requeue).
-- A revived dead task starts with a fresh retry count.
-- KEYS: source set, pending, wake
-- ARGV: now, reset_retries (1/0), then ids (none: every task in the set, up to 10,000)
-- Returns the number of tasks moved.
local now = now_ms()
local ids = {}
if #ARGV > 2 then
  for i = 3, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
else
  ids = redis.call('ZRANGE', KEYS[1], 0, 9999)
end
local moved = 0
for _, id in ipairs(ids) do
  local key = task_key(id)
  if redis.call('ZREM', KEYS[1], id) == 1 and redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'state', 'pending', 'due', now)
    redis.call('HDEL', key, 'done', 'recov')
    if ARGV[2] == '1' then
      redis.call('HDEL', key, 'retried')
    end
    redis.call('PERSIST', key)
    redis.call('LPUSH', KEYS[2], id)
    moved = moved + 1
  end
end
if moved > 0 then
  wake(KEYS[3], moved)
end
return moved
