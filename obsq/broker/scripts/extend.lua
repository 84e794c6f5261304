-- prelude: now_ms, call_sliced, hmget_sliced
-- Extend the leases of a worker's running attempts.
-- KEYS: lease, active
-- ARGV: now, lease_ms, worker_id, then per task: id, fence
-- Returns the ids whose lease is no longer this attempt's.
local expires = now_ms() + tonumber(ARGV[2])
local ids = {}
for i = 4, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local owners = hmget_sliced(KEYS[2], ids)
local leases, lost = {}, {}
for n, id in ipairs(ids) do
  if owners[n] == ARGV[4 + (n - 1) * 2 + 1] .. ':' .. ARGV[3] then
    leases[#leases + 1] = expires
    leases[#leases + 1] = id
  else
    lost[#lost + 1] = id
  end
end
call_sliced('ZADD', {KEYS[1], 'XX'}, leases)
return lost
