-- Mark a batch of attempts of one queue completed.
-- KEYS: lease, completed
-- ARGV: now, then per task: id, fence, retention_ms, result
-- Returns per task 1, or 0 when the fencing token is stale (the lease was taken over).
local now = now_ms()
local out = {}
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  local key = task_key(id)
  local f = redis.call('HMGET', key, 'fence', 'state', 'uniq')
  if f[1] ~= ARGV[i + 1] or f[2] ~= 'active' then
    out[#out + 1] = 0
  else
    redis.call('ZREM', KEYS[1], id)
    if f[3] then
      local lock = prefix .. 'unique:' .. f[3]
      if redis.call('GET', lock) == id then
        redis.call('DEL', lock)
      end
    end
    notify_done(key, id, 'completed', ARGV[i + 3])
    local retention = tonumber(ARGV[i + 2])
    if retention > 0 then
      redis.call('HSET', key, 'state', 'completed', 'result', ARGV[i + 3], 'done', now)
      redis.call('HDEL', key, 'wid')
      redis.call('ZADD', KEYS[2], now + retention, id)
      redis.call('PEXPIRE', key, retention + 60000)
    else
      redis.call('DEL', key)
    end
    out[#out + 1] = 1
  end
end
return out
