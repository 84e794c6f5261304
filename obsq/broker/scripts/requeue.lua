-- Hand a worker's unfinished attempts back to the head of pending (graceful shutdown).
-- KEYS: lease, pending, wake, active
-- ARGV: now, worker_id, then per task: id, fence
-- Returns per task 1, or 0 when the fencing token is stale.
local now = now_ms()
local out = {}
local pushed = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if not holds(redis.call('HGET', KEYS[4], id), ARGV[i + 1], ARGV[2]) then
    out[#out + 1] = 0
  else
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('HSET', task_key(id), 'state', 'pending', 'due', now)
    redis.call('RPUSH', KEYS[2], id)
    pushed = pushed + 1
    out[#out + 1] = 1
  end
end
if pushed > 0 then
  wake(KEYS[3], pushed)
end
return out
