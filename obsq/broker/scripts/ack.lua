-- Mark a batch of one worker's attempts of one queue completed.
-- KEYS: lease, completed, active, watched
-- ARGV: now, worker_id, then per task: id, fence, retention_ms, result, unique digest or ''
-- Returns per task 1, or 0 when the fencing token is stale (the lease was taken over).
local now = now_ms()
local ids = {}
for i = 3, #ARGV, 5 do
  ids[#ids + 1] = ARGV[i]
end
local owners = redis.call('HMGET', KEYS[3], unpack(ids))
local watched = redis.call('SMISMEMBER', KEYS[4], unpack(ids))
local out, done, gone = {}, {}, {}
for n, id in ipairs(ids) do
  local i = 3 + (n - 1) * 5
  if not holds(owners[n], ARGV[i + 1], ARGV[2]) then
    out[n] = 0
  else
    out[n] = 1
    done[#done + 1] = id
    local key = task_key(id)
    if ARGV[i + 4] ~= '' then
      local lock = prefix .. 'unique:' .. ARGV[i + 4]
      if redis.call('GET', lock) == id then
        redis.call('DEL', lock)
      end
    end
    if watched[n] == 1 then
      notify_done(id, 'completed', ARGV[i + 3])
    end
    local retention = tonumber(ARGV[i + 2])
    if retention > 0 then
      redis.call('HSET', key, 'state', 'completed', 'result', ARGV[i + 3], 'done', now)
      redis.call('ZADD', KEYS[2], now + retention, id)
      redis.call('PEXPIRE', key, retention + 60000)
    else
      gone[#gone + 1] = key
    end
  end
end
if #done > 0 then
  redis.call('HDEL', KEYS[3], unpack(done))
  redis.call('ZREM', KEYS[1], unpack(done))
end
if #gone > 0 then
  redis.call('DEL', unpack(gone))
end
return out
