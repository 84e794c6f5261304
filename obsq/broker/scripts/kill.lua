-- A failed attempt that may not be retried goes to the dead set, kept for inspection.
-- KEYS: lease, dead
-- ARGV: now, id, fence, error
-- Returns 1, or 0 when the fencing token is stale.
local now = now_ms()
local id = ARGV[2]
local key = task_key(id)
local f = redis.call('HMGET', key, 'fence', 'state')
if f[1] ~= ARGV[3] or f[2] ~= 'active' then
  return 0
end
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', key, 'state', 'dead', 'error', ARGV[4], 'done', now)
redis.call('HDEL', key, 'wid')
redis.call('ZADD', KEYS[2], now, id)
notify_done(key, id, 'dead', ARGV[4])
return 1
