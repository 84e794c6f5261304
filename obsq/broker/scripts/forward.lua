-- Move due tasks from the scheduled or retry set to pending.
-- KEYS: source set (scheduled or retry), pending, wake
-- ARGV: now, batch
-- Returns {moved, due time of the next task in the set or -1}.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local moved = 0
for i = 1, #due, 2 do
  local id = due[i]
  redis.call('ZREM', KEYS[1], id)
  local key = task_key(id)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'state', 'pending', 'due', due[i + 1])
    redis.call('LPUSH', KEYS[2], id)
    moved = moved + 1
  end
end
if moved > 0 then
  wake(KEYS[3], moved)
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {moved, next_due[2] or -1}
