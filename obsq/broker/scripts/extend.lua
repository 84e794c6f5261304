-- prelude: now_ms, call_sliced, named_attempts
-- Extend the leases of a worker's running attempts.
-- KEYS: lease, active
-- ARGV: now, lease_ms, worker_id, then per task: id, fence
-- Returns the ids whose lease is no longer this attempt's.
local expires = now_ms() + tonumber(ARGV[2])
local ids, _, held = named_attempts(KEYS[2], ARGV[3], 4, 2)
local leases, lost = {}, {}
for n, id in ipairs(ids) do
  if held[n] then
    leases[#leases + 1] = expires
    leases[#leases + 1] = id
  else
    lost[#lost + 1] = id
  end
end
call_sliced('ZADD', {KEYS[1], 'XX'}, leases)
return lost
