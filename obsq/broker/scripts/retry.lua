-- A failed attempt goes back: to pending at once, or to the retry set until it is due.
-- KEYS: lease, retry, pending, wake
-- ARGV: now, id, fence, delay_ms, error
-- Returns 1, or 0 when the fencing token is stale.
local now = now_ms()
local id = ARGV[2]
local key = task_key(id)
local f = redis.call('HMGET', key, 'fence', 'state')
if f[1] ~= ARGV[3] or f[2] ~= 'active' then
  return 0
end
redis.call('ZREM', KEYS[1], id)
redis.call('HINCRBY', key, 'retried', 1)
local due = now + tonumber(ARGV[4])
if due > now then
  redis.call('HSET', key, 'state', 'retry', 'error', ARGV[5], 'due', due)
  redis.call('ZADD', KEYS[2], due, id)
else
  redis.call('HSET', key, 'state', 'pending', 'error', ARGV[5], 'due', now)
  redis.call('LPUSH', KEYS[3], id)
  wake(KEYS[4], 1)
end
return 1
