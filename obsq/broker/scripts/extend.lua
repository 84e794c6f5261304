-- Extend the leases of a worker's running attempts.
-- KEYS: lease, active
-- ARGV: now, lease_ms, worker_id, then per task: id, fence
-- Returns the ids whose lease is no longer this attempt's.
local expires = now_ms() + tonumber(ARGV[2])
local ids = {}
for i = 4, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local owners = redis.call('HMGET', KEYS[2], unpack(ids))
local leases, lost = {}, {}
for n, id in ipairs(ids) do
  if holds(owners[n], ARGV[4 + (n - 1) * 2 + 1], ARGV[3]) then
    leases[#leases + 1] = expires
    leases[#leases + 1] = id
  else
    lost[#lost + 1] = id
  end
end
if #leases > 0 then
  redis.call('ZADD', KEYS[1], 'XX', unpack(leases))
end
return lost
