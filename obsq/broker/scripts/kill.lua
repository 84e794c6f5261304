-- A failed attempt that may not be retried goes to the dead set, kept for inspection.
-- KEYS: lease, dead, active, watched
-- ARGV: now, worker_id, id, fence, error, traceback
-- Returns 1, or 0 when the fencing token is stale.
local now = now_ms()
local id = ARGV[3]
if not holds(redis.call('HGET', KEYS[3], id), ARGV[4], ARGV[2]) then
  return 0
end
redis.call('HDEL', KEYS[3], id)
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', task_key(id), 'state', 'dead', 'error', ARGV[5], 'tb', ARGV[6], 'done', now)
redis.call('ZADD', KEYS[2], now, id)
if redis.call('SISMEMBER', KEYS[4], id) == 1 then
  notify_done(id, 'dead', ARGV[5])
end
return 1
