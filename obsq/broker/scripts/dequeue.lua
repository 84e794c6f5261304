-- Take up to ARGV[3] pending tasks of one queue under a lease, each with a new fencing token.
-- KEYS: pending, lease, wake, paused
-- ARGV: now, lease_ms, count, worker_id
-- Returns {now, dropped, then per task: id, fence, type, payload, headers, options, retried, due}.
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {0, 0}
end
local now = now_ms()
local out = {now, 0}
local ids = redis.call('RPOP', KEYS[1], ARGV[3])
if not ids then
  redis.call('DEL', KEYS[3])
  return out
end
local expires = now + tonumber(ARGV[2])
local dropped = 0
for _, id in ipairs(ids) do
  local key = task_key(id)
  local f = redis.call('HMGET', key, 'type', 'payload', 'headers', 'opts', 'retried', 'due')
  if f[1] then
    local fence = redis.call('HINCRBY', key, 'fence', 1)
    redis.call('HSET', key, 'state', 'active', 'wid', ARGV[4])
    redis.call('ZADD', KEYS[2], expires, id)
    out[#out + 1] = id
    out[#out + 1] = fence
    for j = 1, 6 do
      out[#out + 1] = f[j] or ''
    end
  else
    dropped = dropped + 1  -- its hash was deleted behind obsq's back: nothing left to run
  end
end
out[2] = dropped
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[3])
end
return out
