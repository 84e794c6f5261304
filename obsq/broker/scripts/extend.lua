-- Extend the leases of a worker's running attempts.
-- KEYS: lease
-- ARGV: now, lease_ms, then per task: id, fence
-- Returns the ids whose lease is no longer this attempt's.
local now = now_ms()
local expires = now + tonumber(ARGV[2])
local lost = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', task_key(id), 'fence') == ARGV[i + 1]
      and redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], expires, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
