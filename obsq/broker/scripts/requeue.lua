-- Hand unfinished attempts back to the head of pending (graceful shutdown).
-- KEYS: lease, pending, wake
-- ARGV: now, then per task: id, fence
-- Returns per task 1, or 0 when the fencing token is stale.
local now = now_ms()
local out = {}
local pushed = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  local key = task_key(id)
  local f = redis.call('HMGET', key, 'fence', 'state')
  if f[1] ~= ARGV[i + 1] or f[2] ~= 'active' then
    out[#out + 1] = 0
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HINCRBY', key, 'fence', 1)
    redis.call('HSET', key, 'state', 'pending', 'due', now)
    redis.call('HDEL', key, 'wid')
    redis.call('RPUSH', KEYS[2], id)
    pushed = pushed + 1
    out[#out + 1] = 1
  end
end
if pushed > 0 then
  wake(KEYS[3], pushed)
end
return out
