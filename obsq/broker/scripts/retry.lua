-- A failed attempt goes back: to pending at once, or to the retry set until it is due.
-- KEYS: lease, retry, pending, wake, active
-- ARGV: now, worker_id, id, fence, delay_ms, error, traceback
-- Returns 1, or 0 when the fencing token is stale.
local now = now_ms()
local id = ARGV[3]
if not holds(redis.call('HGET', KEYS[5], id), ARGV[4], ARGV[2]) then
  return 0
end
redis.call('HDEL', KEYS[5], id)
redis.call('ZREM', KEYS[1], id)
local key = task_key(id)
redis.call('HINCRBY', key, 'retried', 1)
local due = now + tonumber(ARGV[5])
if due > now then
  redis.call('HSET', key, 'state', 'retry', 'error', ARGV[6], 'tb', ARGV[7], 'due', due)
  redis.call('ZADD', KEYS[2], due, id)
else
  redis.call('HSET', key, 'state', 'pending', 'error', ARGV[6], 'tb', ARGV[7], 'due', now)
  redis.call('LPUSH', KEYS[3], id)
  wake(KEYS[4], 1)
end
return 1
