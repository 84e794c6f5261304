-- prelude: now_ms, task_key, call_sliced
-- Take up to ARGV[3] pending tasks of one queue under a lease, each with a new fencing token.
-- KEYS: pending, lease, wake, paused, active, fence counter
-- ARGV: now, lease_ms, count, worker_id
-- Returns {now, dropped, then per task: id, fence, type, payload, headers, options, retried, due,
-- unique digest}. The pop comes first, so a Redis at maxmemory lets the script finish.
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
local fence = redis.call('INCRBY', KEYS[6], #ids) - #ids
local expires = now + tonumber(ARGV[2])
local leases, owners = {}, {}
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', task_key(id), 'type', 'payload', 'headers', 'opts', 'retried',
                       'due', 'uniq')
  if f[1] then
    fence = fence + 1
    leases[#leases + 1] = expires
    leases[#leases + 1] = id
    owners[#owners + 1] = id
    owners[#owners + 1] = fence .. ':' .. ARGV[4]
    out[#out + 1] = id
    out[#out + 1] = fence
    for j = 1, 7 do
      out[#out + 1] = f[j] or ''
    end
  else
    out[2] = out[2] + 1  -- its hash was deleted behind obsq's back: nothing left to run
  end
end
call_sliced('ZADD', {KEYS[2]}, leases)
call_sliced('HSET', {KEYS[5]}, owners)
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[3])
end
return out
